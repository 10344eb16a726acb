#!/usr/bin/env bash
# Make rootful podman/buildah work on a CI VM without a Docker engine (idempotent).
# Installs podman, buildah, runc and debootstrap from apt if any is missing, then writes
# /etc/containers/containers.conf: runc instead of crun (crun rejects hybrid cgroups) and ulimits the
# VM allows (the default RLIMIT_NOFILE/NPROC cannot be raised without CAP_SYS_RESOURCE).
# Usage: sudo scripts/oci_setup.sh        (root is required; prints what it did)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" != 0 ]; then
  echo "oci_setup.sh: must run as root (rootful podman); uid is $(id -u)" >&2
  exit 1
fi
missing=()
for tool in podman buildah runc debootstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "oci_setup.sh: installing ${missing[*]} (apt)"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends podman buildah runc uidmap slirp4netns fuse-overlayfs \
    debootstrap ca-certificates >/dev/null
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
