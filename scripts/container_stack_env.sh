#!/usr/bin/env bash
# Create or refresh the container-stack test environment: NGC nemo:26.02's Python stack (Megatron-Core 0.16,
# Megatron-Bridge 0.3.0, NeMo 2.7, NeMo-Run 0.8, torch 2.10, numpy < 2) from the exact lock file, no resolver,
# then nemo-muon itself without dependencies (as the container image installs it).
#
# Disk: the CUDA build of torch 2.10 and its nvidia-* libraries are about 7 GB installed. uv installs from the cache
# that .venv was installed from, hard-linked (UV_CACHE_DIR, UV_LINK_MODE=hardlink, set by the Makefile), and .venv
# pins that CUDA stack at the same versions (tests/test_dependencies.py), so it is on disk once for both.
# Usage: scripts/container_stack_env.sh VENV_DIR LOCK_FILE UV
set -euo pipefail
venv=${1:?usage: container_stack_env.sh VENV_DIR LOCK_FILE UV}
lock=${2:?usage: container_stack_env.sh VENV_DIR LOCK_FILE UV}
uv=${3:?usage: container_stack_env.sh VENV_DIR LOCK_FILE UV}
cd "$(dirname "$0")/.."
# The Makefile's uv cache (hard links into it: one copy of what the environments pin alike) when run by hand too.
export UV_CACHE_DIR=${UV_CACHE_DIR:-$PWD/.cache/uv} UV_LINK_MODE=${UV_LINK_MODE:-hardlink}
# Made afresh each time (make runs this only when an input changed; from uv's cache it takes well under a minute):
# nothing the lock no longer lists stays behind, and every file is a link into the cache, not a copy an earlier
# installer made.
py=$(scripts/find_python.sh)
rm -rf "$venv"
echo "creating $venv with $py"
"$py" -m venv "$venv"
# pip stays in the venv: tests/container_stack/test_install_beside_container.py asks it what it would change.
"$venv/bin/python" -m pip install --quiet --no-cache-dir --upgrade pip
install=("$uv" pip install --quiet --python "$venv/bin/python" --no-deps)
"${install[@]}" -r "$lock"
"${install[@]}" -e .
