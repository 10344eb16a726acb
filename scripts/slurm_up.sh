#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine (Debian slurm-wlm + munge), for tests and local trials.
# Idempotent: re-running with daemons up is a no-op; a changed generated slurm.conf restarts them.
# Installs slurm-wlm + munge with apt-get when missing (scripts/system_deps.sh slurm); --no-install only checks
# (what the tests use: `make system-deps` installs before the suites). Exit 77 = not installed and not installable
# here (not root / no apt, or --no-install): callers may skip with that reason (on stderr).
# Stop with scripts/slurm_down.sh (by pid file, never by name).
# Usage: scripts/slurm_up.sh [--no-install]      Env: SLURM_STATE_DIR (default /tmp/slurm).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
STATE=${SLURM_STATE_DIR:-/tmp/slurm}
deps=(slurm)
case "${1:-}" in
  "") ;;
  --no-install) deps=(--check slurm) ;;
  *) echo "slurm_up.sh: unknown argument '$1' (usage: slurm_up.sh [--no-install])" >&2; exit 2 ;;
esac
"$(dirname "$0")/system_deps.sh" "${deps[@]}" >&2 || exit $?
HOST=$(hostname -s)
CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)   # nproc obeys OMP_NUM_THREADS; slurmd must not
TOPO=$(slurmd -C | head -1 | grep -o "Boards=.* ThreadsPerCore=[0-9]*")
MEM=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 * 8 / 10 ))   # 80% of RAM in MB
mkdir -p "$STATE"/{ctld,d,log} /etc/slurm /run/munge /var/log/munge /var/lib/munge
NEWCONF=$(cat <<CONF
ClusterName=ci
SlurmctldHost=${HOST}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/d
SlurmctldPidFile=${STATE}/slurmctld.pid
SlurmdPidFile=${STATE}/slurmd.pid
SlurmctldLogFile=${STATE}/log/slurmctld.log
SlurmdLogFile=${STATE}/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${STATE}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} ${TOPO} RealMemory=${MEM} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if [ "$NEWCONF" != "$(cat /etc/slurm/slurm.conf 2>/dev/null)" ]; then
  for pf in "$STATE/slurmd.pid" "$STATE/slurmctld.pid"; do   # config changed: restart the daemons
    if alive "$pf"; then p=$(cat "$pf"); kill "$p"; while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; fi
  done
  printf '%s\n' "$NEWCONF" > /etc/slurm/slurm.conf
fi
rm -f /etc/slurm/cgroup.conf   # 22.05 has no CgroupPlugin=disabled; autodetect works with proctrack/linuxproc
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1   # daemons must not hold the caller's pipes
  for _ in $(seq 1 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
alive "$STATE/slurmctld.pid" || slurmctld -i </dev/null >>"$STATE/log/slurmctld.stdout" 2>&1
alive "$STATE/slurmd.pid"    || slurmd </dev/null >>"$STATE/log/slurmd.stdout" 2>&1
st=""
for i in $(seq 1 120); do   # wait until the node is idle (at most 60 s)
  st=$(sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null || true)
  case "$st" in idle|mixed|allocated) echo "slurm up: node $HOST $st"; exit 0;; esac
  if [ $((i % 20)) -eq 0 ]; then scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true; fi
  sleep 0.5
done
echo "slurm did not come up; state='$st'" >&2
tail -20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2
exit 1
