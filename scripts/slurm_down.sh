#!/usr/bin/env bash
# Stop the single-node Slurm cluster started by scripts/slurm_up.sh: cancels our jobs, then stops each daemon
# by its pid file (never by process name). --purge-state also removes the state folder.
STATE=${SLURM_STATE_DIR:-/tmp/slurm}
if command -v scancel >/dev/null; then timeout 5 scancel --user="$(id -un)" 2>/dev/null || true; fi
stop() {
  [ -s "$1" ] || return 0
  local p; p=$(cat "$1"); kill "$p" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true; rm -f "$1"
}
stop "$STATE/slurmd.pid"
stop "$STATE/slurmctld.pid"
stop /run/munge/munged.pid
if [ "${1:-}" = --purge-state ]; then rm -rf "$STATE"; fi
echo "slurm stopped"
