"""Environment variables of the Megatron-Bridge performance recipes, grouped and commented.

Sources (Megatron-Bridge r0.3.1 = NGC nemo:26.02.01, same values in 0.3.0 where the file exists):
`scripts/performance/utils/executors.py::PERF_ENV_VARS`, `scripts/performance/perf_plugins.py`
(`_set_cuda_device_max_connections`, `_set_model_specific_environment_variables`, `_set_layernorm_sm_margin`,
`_set_nvl_domain_size`), `recipes/utils/environment_utils.py::COMMON_RECIPE_ENV_VARS`. Launchers apply a recipe's
`env` before training is imported (as Bridge's `bootstrap.py` does). Torch-free.
"""

from __future__ import annotations

from nemo_muon._validation import check_choice, check_positive_int

# --- NCCL / PyTorch memory: every Bridge perf run ---
NCCL_PERF_ENV: dict[str, str] = {
    "TORCH_NCCL_HIGH_PRIORITY": "1",  # NCCL streams at high priority (COMMON_PERF_ENV_VARS)
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",  # free NCCL buffers eagerly instead of caching them per stream
    "NCCL_NVLS_ENABLE": "0",  # NVLink SHARP off: it costs memory
    "NCCL_GRAPH_REGISTER": "0",  # no NCCL buffer registration for CUDA graphs (library recipe default)
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",  # less fragmentation with MoE's uneven tensors
}

# --- Hugging Face: the perf runs use mock data and never download ---
HF_OFFLINE_ENV: dict[str, str] = {
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "False",  # silences fork warnings
    "HF_HUB_OFFLINE": "0",
}

# --- Transformer Engine: leave SMs to overlapped communication in LayerNorm kernels ---
LAYERNORM_SM_MARGIN_ENV: dict[str, str] = {
    "NVTE_FWD_LAYERNORM_SM_MARGIN": "20",
    "NVTE_BWD_LAYERNORM_SM_MARGIN": "20",
}

# --- Transformer Engine: cuDNN norms, kept by Bridge only for Kimi K2 with MXFP8 on GB200/GB300 ---
CUDNN_NORM_ENV: dict[str, str] = {
    "NVTE_NORM_FWD_USE_CUDNN": "1",
    "NVTE_NORM_BWD_USE_CUDNN": "1",
}

# --- GB200 only: GPUDirect RDMA through the Grace C2C link (NCCL >= 2.25 / 2.26) ---
GB200_NET_ENV: dict[str, str] = {
    "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_NET_GDR_C2C": "1",
}

NVL72_GPUS: tuple[str, ...] = ("gb300", "gb200")
"""Systems whose NVLink domain is a 72-GPU rack (HybridEP spans it); others are 8-GPU NVLink boxes."""
SM100_OR_NEWER: tuple[str, ...] = ("gb300", "gb200", "b200")
ENV_GPUS: tuple[str, ...] = ("gb300", "gb200", "b200", "h200", "h100")


def cuda_device_max_connections(gpu: str, *, tp: int, cp: int, hybrid_ep: bool) -> str:
    """CUDA_DEVICE_MAX_CONNECTIONS as Bridge sets it: 32 on Blackwell or with HybridEP/DeepEP (streams must not
    serialize), 1 on Hopper with TP/CP comm overlap (kernel queue order = launch order), else 8."""
    if gpu in SM100_OR_NEWER or hybrid_ep:
        return "32"
    return "1" if (tp > 1 or cp > 1) else "8"


def hybrid_ep_env(gpu: str, ep: int) -> dict[str, str]:
    """HybridEP token dispatcher: NVLink domain shape and the EP ranks that share one domain."""
    check_positive_int("parallelism.ep", ep)
    if gpu in NVL72_GPUS:
        if ep > 72:
            raise ValueError(f"parallelism.ep must be <= 72 for HybridEP inside one NVL72 domain on {gpu}; got {ep}")
        return {"NVLINK_DOMAIN_SIZE": "72", "USE_MNNVL": "1", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": str(ep)}
    return {"NVLINK_DOMAIN_SIZE": "8", "USE_MNNVL": "0", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": str(min(ep, 8))}


def perf_env(
    gpu: str,
    *,
    tp: int = 1,
    cp: int = 1,
    ep: int = 1,
    hybrid_ep: bool = False,
    cudnn_norm: bool = False,
) -> dict[str, str]:
    """The full environment of one Bridge perf run on ``gpu`` (sorted, all values strings).

    ``cudnn_norm`` keeps TE's cuDNN LayerNorm/RMSNorm (Bridge keeps it for Kimi K2 with MXFP8 on GB200/GB300 and
    drops it elsewhere); ``hybrid_ep`` adds the HybridEP NVLink-domain variables for the given ``ep``.
    """
    check_choice("system.gpu", gpu, ENV_GPUS)
    env = {**NCCL_PERF_ENV, **HF_OFFLINE_ENV, **LAYERNORM_SM_MARGIN_ENV}
    env["CUDA_DEVICE_MAX_CONNECTIONS"] = cuda_device_max_connections(gpu, tp=tp, cp=cp, hybrid_ep=hybrid_ep)
    if hybrid_ep:
        env.update(hybrid_ep_env(gpu, ep))
    if cudnn_norm:
        env.update(CUDNN_NORM_ENV)
    if gpu == "gb200":
        env.update(GB200_NET_ENV)
    return dict(sorted(env.items()))
