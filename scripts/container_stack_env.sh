#!/usr/bin/env bash
# Create or refresh the container-stack test environment: NGC nemo:26.02's Python stack (Megatron-Core 0.16,
# Megatron-Bridge 0.3.0, NeMo 2.7, NeMo-Run 0.8, torch 2.10, numpy < 2) from the exact lock file, no resolver,
# then nemo-muon itself without dependencies (as the container image installs it).
#
# Disk: the CUDA build of torch and its nvidia-* libraries are about 6 GB installed and 3.5 GB of wheels. CI machines
# have little free disk beside .venv, so nothing is cached (--no-cache-dir) and the lock is installed in two passes,
# torch's CUDA stack first, so the downloaded wheels of one pass are deleted before the next pass downloads.
# Usage: scripts/container_stack_env.sh VENV_DIR LOCK_FILE
set -euo pipefail
venv=${1:?usage: container_stack_env.sh VENV_DIR LOCK_FILE}
lock=${2:?usage: container_stack_env.sh VENV_DIR LOCK_FILE}
cd "$(dirname "$0")/.."
if [ ! -x "$venv/bin/python" ]; then
  py=$(scripts/find_python.sh)
  echo "creating $venv with $py"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --no-cache-dir)
"${pip[@]}" --upgrade pip
heavy='^(torch|triton|nvidia-[a-z-]*-cu12)=='
passes=$(mktemp -d)
trap 'rm -rf "$passes"' EXIT
grep -E "$heavy" "$lock" >"$passes/cuda_stack.txt"
grep -v -E "$heavy" "$lock" >"$passes/rest.txt"
"${pip[@]}" --no-deps -r "$passes/cuda_stack.txt"
"${pip[@]}" --no-deps -r "$passes/rest.txt"
"${pip[@]}" --no-deps -e .
