"""Megatron-Bridge performance presets as data: Bridge's perf workload layouts and kernel knobs per (model, GPU).

`BRIDGE_PERF_LAYOUTS` holds, once, the numbers of Bridge's perf workload presets (r0.3.1 = NGC nemo:26.02.01;
Kimi K2: `scripts/performance/configs/kimi/kimi_workload_base_configs.py`, Qwen3: `.../qwen/
qwen3_workload_base_configs.py`, identical in r0.3.0 = nemo:26.02). The megatron backend sets a row's Bridge-only
knobs (`nemo_muon.megatron.bridge_03.library_recipe.perf_script_fields`, on Bridge 0.3); `recipes/systems.py` builds
recipes from a row, on every release. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_muon._validation import check_choice


@dataclass(frozen=True, kw_only=True)
class BridgePerfLayout:
    """One Bridge perf preset: the layout and batch, plus the Bridge-only kernel knobs the megatron backend sets."""

    model: str
    gpu: str
    num_gpus: int
    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    global_batch_size: int
    micro_batch_size: int = 1
    seq_length: int = 4096
    moe_flex_dispatcher_backend: str | None = None
    """'hybridep' / 'deepep' (token_dispatcher 'flex'), None = Bridge's alltoall dispatcher."""
    moe_a2a_overlap: bool = False
    recompute_modules: tuple[str, ...] = ()
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    pp_layout: str | None = None
    """Explicit Megatron pipeline layout string; None = derived from (pp, vp) for Kimi K2 as Bridge does."""
    te_rng_tracker: bool = False
    """Force the TE RNG tracker on without CUDA graphs (Bridge: Kimi K2's GB300 builder, kimi_llm_pretrain.py)."""
    cudnn_norm: bool = False
    """Keep TE's cuDNN norms (Bridge: Kimi K2 with MXFP8 on GB200/GB300 only)."""


_KIMI = dict(model="kimi_k2", recompute_modules=("mla_up_proj",), etp=1)
_QWEN = dict(model="qwen3_30b_a3b", ep=8, etp=1, global_batch_size=512, cuda_graph_impl="transformer_engine",
             cuda_graph_scope=("moe_router", "moe_preprocess"))

BRIDGE_PERF_LAYOUTS: dict[tuple[str, str], BridgePerfLayout] = {
    (row.model, row.gpu): row
    for row in (
        BridgePerfLayout(**_KIMI, gpu="gb300", num_gpus=256, pp=4, vp=4, ep=64, global_batch_size=4096,
                         micro_batch_size=2, moe_flex_dispatcher_backend="hybridep", cudnn_norm=True,
                         te_rng_tracker=True),
        BridgePerfLayout(**_KIMI, gpu="gb200", num_gpus=256, pp=4, vp=4, ep=64, global_batch_size=2048,
                         moe_flex_dispatcher_backend="hybridep", cuda_graph_impl="transformer_engine",
                         cuda_graph_scope=("moe_router", "moe_preprocess"), cudnn_norm=True),
        BridgePerfLayout(**_KIMI, gpu="b200", num_gpus=256, pp=16, ep=16, global_batch_size=2048),
        # Bridge's Kimi K2 H100 preset (1024 GPUs, TP8 PP16 VP2 EP64, GBS 8192, layout "Et|(tt|)*30L") ends in a
        # loss-only virtual stage, which accounting.layout.validate_layout does not accept yet: not offered.
        BridgePerfLayout(**_QWEN, gpu="gb300", num_gpus=8, micro_batch_size=8, moe_flex_dispatcher_backend="hybridep"),
        BridgePerfLayout(**{**_QWEN, "cuda_graph_scope": ("attn", "moe_router", "moe_preprocess")}, gpu="gb200",
                         num_gpus=8, micro_batch_size=4, moe_flex_dispatcher_backend="hybridep"),
        BridgePerfLayout(**_QWEN, gpu="b200", num_gpus=8),
        BridgePerfLayout(**{**_QWEN, "global_batch_size": 1024}, gpu="h100", num_gpus=16, pp=2, vp=12,
                         moe_a2a_overlap=True, moe_flex_dispatcher_backend="deepep"),
    )
}


def perf_layout(model: str, gpu: str) -> BridgePerfLayout:
    """The Bridge preset for ``model`` on ``gpu`` (raises listing the systems Bridge has for that model)."""
    gpus = tuple(g for (m, g) in BRIDGE_PERF_LAYOUTS if m == model)
    if not gpus:
        models = tuple(sorted({m for m, _ in BRIDGE_PERF_LAYOUTS}))
        raise ValueError(f"model must be one of {models} (models with a Bridge perf preset); got {model!r}")
    check_choice(f"system.gpu (Bridge presets for {model})", gpu, gpus)
    return BRIDGE_PERF_LAYOUTS[(model, gpu)]
