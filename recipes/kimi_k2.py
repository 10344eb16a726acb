"""Kimi K2 (1T MoE, MLA, 384 experts top-8) on 256 GB300: the Megatron-Bridge 26.02 perf configuration.

TP1 PP4 VP4 CP1 EP64, GBS 4096, MBS 2, seq 4096, MXFP8 and Muon by default (numbers in `nemo_muon/megatron/bridge/perf_presets.py`,
architecture in `nemo_muon.models.specs.KIMI_K2`). Other systems: `bridge_perf_recipe(..., gpu=..., num_gpus=...)`.
"""

from __future__ import annotations

import dataclasses

from nemo_muon.recipes import recipe
from nemo_muon.recipes.systems import bridge_perf_recipe

from nemo_muon.accounting.ns_split import DEFAULT_BALANCE_TARGET
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.specs import KIMI_K2


def _kimi_k2(name: str, optimizer: str, precision: str = "mxfp8", gpu: str = "gb300") -> TrainingRecipe:
    """Bridge's preset with ``optimizer``, on the least-patched path of every stack (Megatron's own gradient and
    parameter wiring: ``optimizer.collectives='all_reduce'``, whole-tensor ownership)."""
    return bridge_perf_recipe(name, KIMI_K2, optimizer=optimizer, gpu=gpu, precision=precision)


@recipe
def kimi_k2_muon() -> TrainingRecipe:
    """Kimi K2, 256 GB300, MXFP8, layer-wise distributed Muon (the blog's 1,080 TFLOP/s/GPU configuration)."""
    return _kimi_k2("kimi_k2_muon", "muon")


@recipe
def kimi_k2_muon_split() -> TrainingRecipe:
    """kimi_k2_muon with split ownership (opt in after ``nemo-muon preflight`` passed on the allocation): the largest
    matrices' Newton–Schulz split over blocks of DP ranks until each stage's NS load is within
    ``DEFAULT_BALANCE_TARGET`` (2%) of its mean (1.108 whole-tensor: ``nemo-muon plan --recipe kimi_k2_muon --json``,
    ``ns_split``), gradients reduced to their owners (the split lives in DDP's cost layout on Megatron-Core >= 0.18).
    Both are collectives of ours that have run on gloo here, not yet on NCCL."""
    base = _kimi_k2("kimi_k2_muon_split", "muon")
    return base.replace(optimizer=dataclasses.replace(base.optimizer, ns_split_target=DEFAULT_BALANCE_TARGET,
                                                      collectives="reduce_scatter"))


@recipe
def kimi_k2_adamw() -> TrainingRecipe:
    """Kimi K2, 256 GB300, MXFP8, distributed AdamW (the blog's 1,051 TFLOP/s/GPU baseline)."""
    return _kimi_k2("kimi_k2_adamw", "adamw")


@recipe
def kimi_k2_soap() -> TrainingRecipe:
    """Kimi K2, 256 GB300, MXFP8, layer-wise SOAP."""
    return _kimi_k2("kimi_k2_soap", "soap")


@recipe
def kimi_k2_muon_bf16() -> TrainingRecipe:
    """kimi_k2_muon in BF16."""
    return _kimi_k2("kimi_k2_muon_bf16", "muon", precision="bf16")


@recipe
def kimi_k2_muon_fp8_cs() -> TrainingRecipe:
    """kimi_k2_muon with FP8 current scaling."""
    return _kimi_k2("kimi_k2_muon_fp8_cs", "muon", precision="fp8_cs")


@recipe
def kimi_k2_adamw_bf16() -> TrainingRecipe:
    """kimi_k2_adamw in BF16."""
    return _kimi_k2("kimi_k2_adamw_bf16", "adamw", precision="bf16")


@recipe
def kimi_k2_adamw_fp8_cs() -> TrainingRecipe:
    """kimi_k2_adamw with FP8 current scaling."""
    return _kimi_k2("kimi_k2_adamw_fp8_cs", "adamw", precision="fp8_cs")


@recipe
def kimi_k2_muon_qk_clip() -> TrainingRecipe:
    """kimi_k2_muon with MuonClip: query/key rescaled when a head's max logit exceeds the threshold."""
    return _kimi_k2("kimi_k2_muon_qk_clip", "muon").replace(qk_clip=True)


# --- other systems: Bridge's perf presets for them (megatron/bridge_presets.py) ---


@recipe
def kimi_k2_muon_gb200() -> TrainingRecipe:
    """Kimi K2 on Bridge's GB200 preset, MXFP8, Muon."""
    return _kimi_k2("kimi_k2_muon_gb200", "muon", gpu="gb200")


@recipe
def kimi_k2_adamw_gb200() -> TrainingRecipe:
    """Kimi K2 on Bridge's GB200 preset, MXFP8, AdamW."""
    return _kimi_k2("kimi_k2_adamw_gb200", "adamw", gpu="gb200")


@recipe
def kimi_k2_muon_b200() -> TrainingRecipe:
    """Kimi K2 on Bridge's B200 preset, MXFP8, Muon."""
    return _kimi_k2("kimi_k2_muon_b200", "muon", gpu="b200")


@recipe
def kimi_k2_adamw_b200() -> TrainingRecipe:
    """Kimi K2 on Bridge's B200 preset, MXFP8, AdamW."""
    return _kimi_k2("kimi_k2_adamw_b200", "adamw", gpu="b200")
