# nemo-muon on top of the NeMo Framework container ("Megatron-Bridge 26.02" = nvcr.io/nvidia/nemo:26.02).
#
# The base keeps its torch, Transformer Engine, Megatron-Core, Megatron-Bridge, NeMo and NeMo-Run: we add our
# wheel with --no-deps plus the short pinned list of packages the base lacks (nemo_muon/versions.py, the one
# table of versions per release), and the build fails if any package of the base changed.
#
#   docker build -t nemo-muon:26.02 .                                  # default release 26.02
#   containers/build.sh --release 26.06                                # another release: args from the table
#   docker run --gpus all --rm nemo-muon:26.02 nemo-muon doctor
#
# BASE_IMAGE and NEMO_MUON_RELEASE must name the same release (containers/build.sh derives both from the table;
# tests/test_containers.py checks these defaults against it).
ARG BASE_IMAGE=nvcr.io/nvidia/nemo:26.02

# ---- builder: our wheel, and the pinned extras of the release (read from the versions table) ----
FROM ${BASE_IMAGE} AS builder
ARG NEMO_MUON_RELEASE=26.02
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nemo_muon ./nemo_muon
COPY recipes ./recipes
COPY launchers ./launchers
# Building the wheel ignores the base's pip constraints (NGC sets PIP_CONSTRAINT; its pins would also bind the
# isolated build backend, e.g. an older setuptools): this stage is thrown away, the runtime stage keeps them.
# PIP_BREAK_SYSTEM_PACKAGES: a base whose system Python is marked externally managed (PEP 668) is still ours to extend.
RUN env -u PIP_CONSTRAINT PIP_BREAK_SYSTEM_PACKAGES=1 \
      python3 -m pip wheel --no-deps --no-cache-dir --quiet --wheel-dir /wheels . \
 && PYTHONPATH=/src python3 -m nemo_muon.versions extras "${NEMO_MUON_RELEASE}" > /wheels/extras.txt \
 && PYTHONPATH=/src python3 -m nemo_muon.versions minimums > /wheels/minimums.txt

# ---- runtime: the base image plus our layer ----
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG NEMO_MUON_RELEASE=26.02
ARG NEMO_MUON_VERSION=0.1.0
ARG SOURCE_URL=unknown
ARG VCS_REF=unknown
LABEL org.opencontainers.image.title="nemo-muon" \
      org.opencontainers.image.description="Muon and SOAP for NeMo / Megatron-Core / Megatron-Bridge pretraining" \
      org.opencontainers.image.version="${NEMO_MUON_VERSION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.nemo-muon.release="${NEMO_MUON_RELEASE}"

# GB300 defaults of the Megatron-Bridge perf recipes (nemo_muon.recipes.environment; a test keeps them equal).
# Model-specific variables (HybridEP domain, cuDNN norms) and HF offline switches come from each recipe's env.
ENV NEMO_MUON_RELEASE=${NEMO_MUON_RELEASE} \
    CUDA_DEVICE_MAX_CONNECTIONS=32 \
    NCCL_GRAPH_REGISTER=0 \
    NCCL_NVLS_ENABLE=0 \
    NVTE_BWD_LAYERNORM_SM_MARGIN=20 \
    NVTE_FWD_LAYERNORM_SM_MARGIN=20 \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    TORCH_NCCL_AVOID_RECORD_STREAMS=1 \
    TORCH_NCCL_HIGH_PRIORITY=1

COPY --from=builder /wheels /tmp/nemo-muon-wheels
COPY containers/install_into_base.py containers/entrypoint.sh /opt/nemo-muon/
# The build refuses a stack that cannot run the optimizers the image must run (Megatron-Core 0.16's Muon with
# emerging-optimizers >= 0.2, SOAP before Megatron-Core 0.18: nemo_muon.megatron.shared.stack names the fix).
ARG NEMO_MUON_REQUIRE_OPTIMIZERS=muon
RUN chmod 0755 /opt/nemo-muon/entrypoint.sh \
 && PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 /opt/nemo-muon/install_into_base.py \
      --wheel-dir /tmp/nemo-muon-wheels --requirements /tmp/nemo-muon-wheels/extras.txt \
      --minimums /tmp/nemo-muon-wheels/minimums.txt \
 && rm -rf /tmp/nemo-muon-wheels \
 && python3 -P -m nemo_muon.megatron.shared.stack --require "${NEMO_MUON_REQUIRE_OPTIMIZERS}"

# Health: Python, torch and the stack's versions against the release (exit code 1 on a broken install). GPUs are
# hidden from the periodic check so that it never touches a running job's devices; `nemo-muon doctor` run by hand
# checks them too.
HEALTHCHECK --interval=10m --timeout=2m --start-period=1m --retries=1 \
  CMD ["env", "CUDA_VISIBLE_DEVICES=", "nemo-muon", "doctor"]

# Runs any command (`nemo llm pretrain ...`, `nemo-muon ...`, `torchrun ...`), through the NGC entrypoint if any.
ENTRYPOINT ["/opt/nemo-muon/entrypoint.sh"]
CMD ["/bin/bash"]
