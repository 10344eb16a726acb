#!/usr/bin/env bash
# Print the path of a Python 3.12 interpreter (the NGC 26.02 container's Python), or fail with a reason.
# Order: $PYTHON, python3.12 / python3 on PATH, then pyenv and uv if present. No machine-specific paths.
set -u
is312() { "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)' >/dev/null 2>&1; }
resolve() { "$1" -c 'import sys; print(sys.executable)'; }
if [ -n "${PYTHON:-}" ]; then
  if is312 "$PYTHON"; then resolve "$PYTHON"; exit 0; fi
  echo "PYTHON=$PYTHON is not a Python 3.12 interpreter" >&2; exit 1
fi
for cand in python3.12 python3; do
  if command -v "$cand" >/dev/null 2>&1 && is312 "$cand"; then resolve "$cand"; exit 0; fi
done
if command -v pyenv >/dev/null 2>&1; then
  v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -n 1)
  if [ -n "$v" ]; then
    p="$(pyenv prefix "$v")/bin/python3.12"
    if is312 "$p"; then resolve "$p"; exit 0; fi
  fi
fi
if command -v uv >/dev/null 2>&1; then
  p=$(uv python find 3.12 2>/dev/null) && is312 "$p" && { resolve "$p"; exit 0; }
fi
echo "no Python 3.12 found: install it (pyenv install 3.12, uv python install 3.12, or your distribution) or set PYTHON=/path/to/python3.12" >&2
exit 1
