#!/usr/bin/env bash
# Build the nemo-muon image for one container release; every version comes from nemo_muon/versions.py.
#
#   containers/build.sh                                   # 26.02 -> nemo-muon:26.02
#   containers/build.sh --release 26.06                   # FROM nvcr.io/nvidia/nemo:26.06
#   containers/build.sh --tag registry.example.com/team/nemo-muon:26.02 --push
#   containers/build.sh --base-image localhost/my-base:1  # any base with python3 + pip (CI uses a stand-in)
#
# Arguments after `--` go to the engine's build command unchanged (e.g. -- --no-cache).
# Options: --release TAG (default: the table's DEFAULT_RELEASE), --base-image IMAGE (default: the release's),
# --tag NAME (default nemo-muon:<release>), --engine docker|podman|buildah (default: docker if its daemon
# answers, else podman, else buildah), --push (push --tag after the build), --require-optimizers LIST (what the
# image must run, default muon: the build stops where the stack cannot, e.g. adamw for a 26.02 AdamW-only image).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
versions() { PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m nemo_muon.versions "$@"; }

RELEASE="" BASE="" TAG="" ENGINE="" PUSH=0 REQUIRE=muon
while [ "$#" -gt 0 ]; do
  case "$1" in
    --release) RELEASE=$2; shift 2 ;;
    --base-image) BASE=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --engine) ENGINE=$2; shift 2 ;;
    --push) PUSH=1; shift ;;
    --require-optimizers) REQUIRE=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "build.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
RELEASE=${RELEASE:-$(PYTHONPATH="$ROOT" "$PY" -c 'from nemo_muon.versions import DEFAULT_RELEASE; print(DEFAULT_RELEASE)')}
versions image "$RELEASE" >/dev/null   # unknown release: the table's error lists the known ones
BASE=${BASE:-$(versions image "$RELEASE")}
TAG=${TAG:-nemo-muon:$RELEASE}
if [ -z "$ENGINE" ]; then
  # docker only if its daemon answers (a docker CLI without a daemon is common on CI machines)
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v podman >/dev/null; then ENGINE=podman
  elif command -v buildah >/dev/null; then ENGINE=buildah
  fi
fi
case "$ENGINE" in
  docker|podman) BUILD=("$ENGINE" build) ;;
  buildah) BUILD=(buildah bud) ;;
  "") echo "build.sh: no container engine found (docker, podman or buildah)" >&2; exit 1 ;;
  *) echo "build.sh: --engine must be one of docker, podman, buildah; got '$ENGINE'" >&2; exit 2 ;;
esac
# podman/buildah default to the OCI format, which drops HEALTHCHECK: build the Docker format instead.
[ "$ENGINE" = docker ] || BUILD+=(--format docker)
VERSION=$(PYTHONPATH="$ROOT" "$PY" -c 'import nemo_muon; print(nemo_muon.__version__)')
SOURCE_URL=$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo unknown)
VCS_REF=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$VCS_REF" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ]; then VCS_REF="$VCS_REF-dirty"; fi

echo "build.sh: $TAG from $BASE (release $RELEASE, nemo-muon $VERSION, $ENGINE)" >&2
"${BUILD[@]}" \
  --build-arg "BASE_IMAGE=$BASE" \
  --build-arg "NEMO_MUON_RELEASE=$RELEASE" \
  --build-arg "NEMO_MUON_VERSION=$VERSION" \
  --build-arg "SOURCE_URL=$SOURCE_URL" \
  --build-arg "VCS_REF=$VCS_REF" \
  --build-arg "NEMO_MUON_REQUIRE_OPTIMIZERS=$REQUIRE" \
  -t "$TAG" -f "$ROOT/Dockerfile" "$@" "$ROOT"
if [ "$PUSH" = 1 ]; then
  "$ENGINE" push "$TAG"
fi
