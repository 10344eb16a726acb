#!/usr/bin/env bash
# Make rootful podman/buildah work on a CI VM without a Docker engine (idempotent).
# Installs podman, buildah, runc and debootstrap from apt if any is missing (scripts/system_deps.sh oci;
# --no-install only checks: what the tests use, `make system-deps` installs before the suites), then writes
# /etc/containers/containers.conf: runc instead of crun (crun rejects hybrid cgroups) and ulimits the
# VM allows (the default RLIMIT_NOFILE/NPROC cannot be raised without CAP_SYS_RESOURCE).
# Usage: sudo scripts/oci_setup.sh [--no-install]   (root is required; prints what it did)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
deps=(oci)
case "${1:-}" in
  "") ;;
  --no-install) deps=(--check oci) ;;
  *) echo "oci_setup.sh: unknown argument '$1' (usage: oci_setup.sh [--no-install])" >&2; exit 2 ;;
esac
if [ "$(id -u)" != 0 ]; then
  echo "oci_setup.sh: must run as root (rootful podman); uid is $(id -u)" >&2
  exit 1
fi
if ! "$(dirname "$0")/system_deps.sh" "${deps[@]}"; then
  echo "oci_setup.sh: podman/buildah/runc/debootstrap are not installed" >&2
  exit 1
fi
mkdir -p /etc/containers
NOFILE=$(ulimit -Hn)
[ "$NOFILE" = unlimited ] && NOFILE=65536
NEWCONF=$(cat <<CONF
[containers]
default_ulimits = ["nofile=${NOFILE}:${NOFILE}", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
)
if [ "$NEWCONF" != "$(cat /etc/containers/containers.conf 2>/dev/null)" ]; then
  printf '%s\n' "$NEWCONF" > /etc/containers/containers.conf
  echo "oci_setup.sh: wrote /etc/containers/containers.conf (runc, nofile=${NOFILE}, nproc=32768)"
fi
echo "oci_setup.sh: $(podman --version), $(buildah --version | cut -d' ' -f1-3), $(runc --version | head -1)"
