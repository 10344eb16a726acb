#!/usr/bin/env bash
# The one command a lent GPU session runs (bench/gpu/README.md): the device tool with command
# `bash bench/gpu/run_all.sh` and carry [".whl"], .whl filled here first by scripts/gpu_wheels.sh.
# It installs .whl into /tmp/site, runs every bench/gpu script in a fixed order, each under its own timeout (all of
# them together end well inside 9 minutes), tees each one's output to $OUT/<name>.log (./gpu-out without $OUT), goes
# on after a failure, and ends with one line per script, also in $OUT/summary.txt (after the install's lines and the
# machine). 8 files in all (the tool returns 8).
# Exit status: 0 when every script passed, 1 otherwise, 2 when the wheels could not be installed.
# Test hook: GPU_RUN_STEPS (lines "name|timeout_s|command") replaces the install and the steps below.
set -u
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-gpu-out}
mkdir -p "$out"
: >"$out/summary.txt"  # the install and the machine first, the steps' lines last
export PYTHONUNBUFFERED=1   # a script stopped by its timeout still leaves what it printed
PY=${PYTHON:-python3}

# name|timeout_s|command, in order: quick checks first, the long NS table last (its rows print as they finish).
# Timeouts sum to 445 s, plus at most 5 s per kill; a minute of margin for the install and the tool.
STEPS="doctor_gpu|25|$PY bench/gpu/doctor_gpu.py
layerwise_nccl|80|$PY -m torch.distributed.run --standalone --nproc-per-node 1 bench/gpu/layerwise_nccl.py --steps 5 --dim 1024
megatron_tiny|95|$PY bench/gpu/megatron_tiny.py --spec tiny_kimi_k2 --optimizer muon --steps 10
preflight_gpu|50|$PY bench/gpu/preflight_gpu.py --recipe kimi_k2_muon --steps 6
owner_pack|30|$PY -m torch.distributed.run --standalone --nproc-per-node 1 bench/gpu/owner_pack.py --reps 20
step_time_ns|90|$PY bench/gpu/step_time_ns.py --reps 3
ns_syrk|75|$PY bench/gpu/ns_syrk.py --reps 3"

if [ -n "${GPU_RUN_STEPS:-}" ]; then
  STEPS=$GPU_RUN_STEPS
else
  # The wheels (no network there): nemo_muon (recipes/launchers mapped in), megatron-core, emerging-optimizers.
  {
    ls -l .whl/*.whl &&
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  } >>"$out/summary.txt" 2>&1 || {
    cat "$out/summary.txt"
    echo "run_all.sh: installing .whl failed: run scripts/gpu_wheels.sh here and carry [\".whl\"]" | tee -a "$out/summary.txt"
    exit 2
  }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  { # the machine, for bench/RESULTS.md
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PY" -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
    "$PY" -m pip list 2>/dev/null | grep -iE '^(nemo.muon|megatron.core|emerging.optimizers|numpy|transformers) '
  } 2>&1 | tee -a "$out/summary.txt"
fi

summary=()
failed=0
while IFS='|' read -r name limit cmd; do
  [ -n "$name" ] || continue
  echo "=== $name (timeout ${limit}s): $cmd"
  start=$SECONDS
  timeout -k 5 "$limit" bash -c "$cmd" </dev/null 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out after ${limit}s"; failed=1 ;;
    *) status="failed rc=$rc"; failed=1 ;;
  esac
  summary+=("$(printf '%-15s %s (%ds)' "$name" "$status" $((SECONDS - start)))")
done <<<"$STEPS"

echo "=== summary (logs in $out)"
printf '%s\n' "${summary[@]}" | tee -a "$out/summary.txt"
exit "$failed"
