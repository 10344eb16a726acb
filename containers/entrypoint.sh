#!/bin/bash
# Entrypoint of the nemo-muon image: runs any command, e.g.
#   docker run --gpus all IMAGE nemo llm pretrain --factory kimi_k2_muon --yes
#   docker run --gpus all IMAGE nemo-muon doctor
# It hands over to the NGC base's entrypoint when there is one (banner, driver and shared-memory checks);
# with no command it starts a shell.
set -euo pipefail
if [ "$#" -eq 0 ]; then
  set -- /bin/bash
fi
if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
  exec /opt/nvidia/nvidia_entrypoint.sh "$@"
fi
exec "$@"
