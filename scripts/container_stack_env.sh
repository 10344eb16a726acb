#!/usr/bin/env bash
# Create or refresh the container-stack test environment: NGC nemo:26.02's Python stack (Megatron-Core 0.16,
# Megatron-Bridge 0.3.0, NeMo 2.7, NeMo-Run 0.8, torch 2.10, numpy < 2) from the exact lock file, no resolver,
# then nemo-muon itself without dependencies (as the container image installs it).
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
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --no-deps -r "$lock"
"$venv/bin/python" -m pip install --quiet --no-deps -e .
