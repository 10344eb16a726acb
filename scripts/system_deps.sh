#!/usr/bin/env bash
# Install the system tools the system tests use (docs/testing.md), so that no test body installs anything.
# Groups (default: all):
#   slurm  slurm-wlm + munge                                   tests/test_slurm_e2e.py (scripts/slurm_up.sh)
#   oci    podman, buildah, runc, debootstrap (+ uidmap, slirp4netns, fuse-overlayfs, ca-certificates)
#                                                              tests/test_containers.py (scripts/oci_setup.sh)
# A group whose commands are all on PATH is left alone (no apt call: quick when installed). Missing groups are
# installed with apt-get, one `apt-get update` for all of them, then one `apt-get install` per group (a group that
# fails to install does not stop the others), only when root and apt-get exist.
# Usage: scripts/system_deps.sh [--check] [slurm|oci ...]   (`make system-deps` runs it with no arguments)
#   --check: install nothing, only report what is missing.
# Exit: 0 = every asked group is present; 77 = something is missing and was not installed here (not root, no
# apt-get, --check, or apt-get failed): the line above names it; 2 = bad usage.
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive
check_only=0
groups=()
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    slurm|oci) groups+=("$arg") ;;
    *) echo "system_deps.sh: unknown argument '$arg' (usage: system_deps.sh [--check] [slurm|oci ...])" >&2; exit 2 ;;
  esac
done
[ "${#groups[@]}" -gt 0 ] || groups=(slurm oci)

commands_of() {   # what the scripts and tests run: a group counts as installed when all of these are on PATH
  case "$1" in
    slurm) echo slurmctld munged sbatch ;;
    oci) echo podman buildah runc debootstrap ;;
  esac
}
packages_of() {
  case "$1" in
    slurm) echo slurm-wlm munge ;;
    oci) echo podman buildah runc uidmap slirp4netns fuse-overlayfs debootstrap ca-certificates ;;
  esac
}
missing_of() {   # the group's commands not on PATH
  local out=() c
  for c in $(commands_of "$1"); do command -v "$c" >/dev/null 2>&1 || out+=("$c"); done
  echo "${out[*]}"
}

todo=()
for g in "${groups[@]}"; do
  [ -z "$(missing_of "$g")" ] || todo+=("$g")
done
if [ "${#todo[@]}" -eq 0 ]; then
  echo "system_deps.sh: present: ${groups[*]}"
  exit 0
fi
report_missing() {   # $1: why nothing (more) is installed
  local g
  for g in "${todo[@]}"; do
    local m; m=$(missing_of "$g")
    [ -z "$m" ] || echo "system_deps.sh: $g: missing $m (apt packages: $(packages_of "$g")); $1" >&2
  done
}
if [ "$check_only" = 1 ]; then
  report_missing "run 'make system-deps' (root) to install them"
  exit 77
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  report_missing "cannot install here (needs root and apt-get)"
  exit 77
fi
echo "system_deps.sh: installing ${todo[*]} with apt-get"
if ! apt-get update -qq; then
  report_missing "apt-get update failed"
  exit 77
fi
rc=0
for g in "${todo[@]}"; do
  # shellcheck disable=SC2046  # the package list is meant to split
  if ! apt-get install -y -qq --no-install-recommends $(packages_of "$g") >/dev/null; then
    echo "system_deps.sh: apt-get install $(packages_of "$g") failed" >&2
  fi
  if [ -n "$(missing_of "$g")" ]; then rc=77; fi
done
# The downloaded .deb files are not needed once installed; CI disks are small (docs/testing.md).
apt-get clean
if [ "$rc" != 0 ]; then
  report_missing "apt-get did not install them"
  exit "$rc"
fi
echo "system_deps.sh: installed ${todo[*]}"
