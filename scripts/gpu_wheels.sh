#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with exactly the wheels a lent GPU machine lacks for bench/gpu/run_all.sh: this project's
# wheel plus the packages in WHEELS at the versions pinned in requirements/cpu-dev.txt. The machine has no network;
# the device tool carries .whl (carry [".whl"]) and run_all.sh installs it. See bench/gpu/README.md.
# Usage (repo root or anywhere): scripts/gpu_wheels.sh   [PYTHON=... to pick the interpreter that runs pip]
set -euo pipefail
cd "$(dirname "$0")/.."

# What bench/gpu needs that the GPU image ('cuda', /work/.library/device/KINDS.md "Python packages already there",
# read 2026-11-17) lacks. Versions come from requirements/cpu-dev.txt only.
WHEELS="megatron-core emerging-optimizers"
# What the image already has and the project wheel, WHEELS' Requires-Dist (no extras) and the bench/gpu scripts
# import; tests/test_gpu_runner.py checks that every such need is in WHEELS or here (this script does not read it).
# shellcheck disable=SC2034
IMAGE_HAS="torch triton numpy packaging absl-py click pyyaml matplotlib transformers tokenizers"
LIMIT_MIB=48   # the whole travelling working tree may be 64 MiB
# manylinux tags the x86-64 GPU machine accepts (pip matches each N exactly); megatron-core's wheel is manylinux_2_28
PLATFORMS="manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64"

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

# The pinned version of $1 in requirements/cpu-dev.txt (names compared as PEP 503: case and -_. alike).
pinned() {
  local want line
  want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  while IFS= read -r line; do
    case "$line" in \#*|'') continue ;; esac
    if [ "$(echo "${line%%==*}" | tr 'A-Z_.' 'a-z--')" = "$want" ]; then echo "${line#*==}"; return 0; fi
  done < requirements/cpu-dev.txt
  echo "gpu_wheels.sh: $1 has no '==' line in requirements/cpu-dev.txt" >&2
  return 1
}

rm -rf .whl && mkdir .whl
plat_args=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in $PLATFORMS; do plat_args+=(--platform "$p"); done
for name in $WHEELS; do
  version=$(pinned "$name")
  "$PY" -m pip download -q --no-deps "${plat_args[@]}" -d .whl "$name==$version"
done

# The project wheel, built from a copy of what the image build also reads (.dockerignore's allow-list), so that no
# build/ or *.egg-info lands in the checkout and no stale build/lib file gets into the wheel.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml README.md nemo_muon recipes launchers \
  | tar -C "$tmp" -xf -
isolation=()
"$PY" -c 'import setuptools' 2>/dev/null && isolation=(--no-build-isolation)   # no network needed then
"$PY" -m pip wheel -q --no-deps "${isolation[@]}" -w .whl "$tmp"

count=$(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l)
expected=$(( $(echo "$WHEELS" | wc -w) + 1 ))
[ "$count" -eq "$expected" ] || { echo "gpu_wheels.sh: $count wheels in .whl, expected $expected" >&2; exit 1; }
for w in .whl/*.whl; do printf '%10d  %s\n' "$(wc -c <"$w")" "$w"; done
total=$(cat .whl/*.whl | wc -c)
echo "total: $total bytes ($(( total / 1048576 )) MiB; limit $LIMIT_MIB MiB)"
if [ "$total" -gt $(( LIMIT_MIB * 1048576 )) ]; then
  echo "gpu_wheels.sh: .whl is over $LIMIT_MIB MiB; the working tree that travels may be 64 MiB in all" >&2
  exit 1
fi
