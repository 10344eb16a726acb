#!/usr/bin/env bash
# Turn a nemo-muon image into an enroot squashfs (.sqsh) for Slurm + pyxis (srun --container-image=FILE.sqsh).
#
#   containers/enroot_import.sh nemo-muon:26.02                               # local image (docker daemon or podman)
#   containers/enroot_import.sh 'docker://registry.example.com#team/nemo-muon:26.02' /lustre/images/nemo-muon-26.02.sqsh
#   containers/enroot_import.sh --dry-run nemo-muon:26.02                     # print the command only
#
# SOURCE is an enroot URI (docker://[USER@][REGISTRY#]IMAGE[:TAG], dockerd://IMAGE, podman://IMAGE) or a plain
# local image name, which is read from the docker daemon if it answers, else from podman. OUTPUT defaults to
# <image>-<tag>.sqsh in the current directory. Registry credentials: ~/.config/enroot/.credentials (enroot docs).
set -euo pipefail
DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
if [ "$#" -lt 1 ] || [ "$#" -gt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"
  [ "$#" -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && exit 0
  exit 2
fi
SOURCE=$1
case "$SOURCE" in
  docker://*|dockerd://*|podman://*) URI=$SOURCE ;;
  *://*) echo "enroot_import.sh: SOURCE must be docker://, dockerd://, podman:// or a local image name; got '$SOURCE'" >&2
         exit 2 ;;
  *) if command -v docker >/dev/null && docker info >/dev/null 2>&1; then URI="dockerd://$SOURCE"
     else URI="podman://$SOURCE"; fi ;;
esac
NAME=${SOURCE##*/}        # strip scheme, registry and namespace
NAME=${NAME##*#}
OUTPUT=${2:-${NAME//:/-}.sqsh}
CMD=(enroot import --output "$OUTPUT" "$URI")
if [ "$DRY" = 1 ]; then
  echo "${CMD[*]}"
  exit 0
fi
command -v enroot >/dev/null || { echo "enroot_import.sh: enroot is not installed (https://github.com/NVIDIA/enroot)" >&2; exit 1; }
"${CMD[@]}"
echo "enroot_import.sh: wrote $OUTPUT; use it with: srun --container-image=$(realpath "$OUTPUT") ..." >&2
