#!/usr/bin/env bash
# Build a local stand-in for the NGC base image (nvcr.io/nvidia/nemo cannot be pulled on CI) and print its name.
# It has what our Dockerfile relies on in the real base: python3 (>= 3.12: Debian trixie has 3.13), pip usable
# system-wide (Debian's PEP 668 marker is kept, so our pip steps must cope with it as they would on a strict
# base), click and pyyaml (present in the NGC image), bash, and an /opt/nvidia/nvidia_entrypoint.sh that, like
# NGC's, prints a banner and runs its arguments, and a pip constraint file as NGC images have had since 25.03
# (PIP_CONSTRAINT=/etc/pip/constraint.txt: every package of the image at its version) plus an old setuptools pin,
# so a build that lets the base's constraints leak into building our wheel fails here as it could on NGC.
# No torch, no GPU stack: it proves our own layers only.
# It trusts the extra CA certificates this host trusts (/usr/local/share/ca-certificates: CI egress proxies
# re-sign TLS), as a cluster's own base image would, so pip inside the build reaches PyPI.
# The image is tagged by the hash of this script and of those certificates, so a second run reuses it.
# Usage: scripts/standin_base.sh            (root, after scripts/oci_setup.sh; prints the image name on stdout)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_DIR=/usr/local/share/ca-certificates
mapfile -t CERTS < <(find "$CA_DIR" -maxdepth 1 -name '*.crt' 2>/dev/null | sort)
HASH=$(cat "$0" ${CERTS[@]+"${CERTS[@]}"} | sha256sum | cut -c1-12)
IMAGE="localhost/nemo-muon-standin:${HASH}"
# One build at a time (parallel test runs share the image): the second waits, then reuses it.
exec 9>/var/lock/nemo-muon-standin.lock
flock 9
if podman image exists "$IMAGE"; then
  echo "$IMAGE"
  exit 0
fi
WORK=$(mktemp -d /var/tmp/nemo-muon-standin.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ROOTFS="$WORK/rootfs"
# The host's debootstrap may predate trixie's script: trixie bootstraps with the same script as sid.
SCRIPT=/usr/share/debootstrap/scripts/$SUITE
[ -e "$SCRIPT" ] || SCRIPT=/usr/share/debootstrap/scripts/sid
echo "standin_base.sh: debootstrap $SUITE (minbase + python3, pip, click, yaml) ..." >&2
failed() {
  echo "standin_base.sh: debootstrap $1 failed; last lines of its log:" >&2
  tail -20 "$WORK/debootstrap.log" >&2
  exit 1
}
# Two stages, so that dpkg runs with force-unsafe-io (no fsync per file: the stand-in is thrown away on error).
debootstrap --foreign --variant=minbase --include=python3,python3-pip,python3-click,python3-yaml,ca-certificates \
  "$SUITE" "$ROOTFS" "$MIRROR" "$SCRIPT" >"$WORK/debootstrap.log" 2>&1 || failed "first stage"
mkdir -p "$ROOTFS/etc/dpkg/dpkg.cfg.d"
echo force-unsafe-io > "$ROOTFS/etc/dpkg/dpkg.cfg.d/unsafe-io"
chroot "$ROOTFS" /debootstrap/debootstrap --second-stage >>"$WORK/debootstrap.log" 2>&1 || failed "second stage"
rm -f "$ROOTFS/etc/dpkg/dpkg.cfg.d/unsafe-io"
if [ "${#CERTS[@]}" -gt 0 ]; then
  cp "${CERTS[@]}" "$ROOTFS$CA_DIR/"
  chroot "$ROOTFS" update-ca-certificates >/dev/null 2>&1
fi
mkdir -p "$ROOTFS/etc/pip"
{ chroot "$ROOTFS" python3 -m pip freeze --all 2>/dev/null; echo "setuptools==68.1.2"; } > "$ROOTFS/etc/pip/constraint.txt"
mkdir -p "$ROOTFS/opt/nvidia"
cat > "$ROOTFS/opt/nvidia/nvidia_entrypoint.sh" <<'ENTRY'
#!/bin/bash
# Stand-in for the NGC entrypoint: banner on stderr, then run the command.
echo "== stand-in NGC base (nemo-muon CI) ==" >&2
exec "$@"
ENTRY
chmod 0755 "$ROOTFS/opt/nvidia/nvidia_entrypoint.sh"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | podman import --quiet \
  --change 'ENV PIP_CONSTRAINT=/etc/pip/constraint.txt' \
  --change 'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]' --change 'CMD ["/bin/bash"]' \
  - "$IMAGE" >/dev/null
# Older stand-ins (other hashes) are dead weight: remove them (images in use by a container are kept).
for old in $(podman images --format '{{.Repository}}:{{.Tag}}' localhost/nemo-muon-standin); do
  [ "$old" = "$IMAGE" ] || podman rmi "$old" >/dev/null 2>&1 || true
done
echo "$IMAGE"
