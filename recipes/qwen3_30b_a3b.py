"""Qwen3-30B-A3B (128 experts top-8, GQA) on 8 GB300: the Megatron-Bridge 26.02 perf configuration.

TP1 PP1 EP8, GBS 512, MBS 8, seq 4096, MXFP8 (numbers in `nemo_muon/megatron/bridge/perf_presets.py`, architecture in
`nemo_muon.models.specs.QWEN3_30B_A3B`). NVIDIA ships AdamW only for this model; the Muon and SOAP variants are ours.
"""

from __future__ import annotations

from nemo_muon.recipes import recipe
from nemo_muon.recipes.systems import bridge_perf_recipe

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.specs import QWEN3_30B_A3B


def _qwen3_30b_a3b(name: str, optimizer: str, precision: str = "mxfp8", gpu: str = "gb300") -> TrainingRecipe:
    return bridge_perf_recipe(name, QWEN3_30B_A3B, optimizer=optimizer, gpu=gpu, precision=precision)


@recipe
def qwen3_30b_a3b_muon() -> TrainingRecipe:
    """Qwen3-30B-A3B, 8 GB300, MXFP8, layer-wise distributed Muon (the blog's 721 TFLOP/s/GPU configuration)."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_muon", "muon")


@recipe
def qwen3_30b_a3b_adamw() -> TrainingRecipe:
    """Qwen3-30B-A3B, 8 GB300, MXFP8, distributed AdamW (Bridge's shipped optimizer; the blog's 713 baseline)."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_adamw", "adamw")


@recipe
def qwen3_30b_a3b_soap() -> TrainingRecipe:
    """Qwen3-30B-A3B, 8 GB300, MXFP8, layer-wise SOAP."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_soap", "soap")


@recipe
def qwen3_30b_a3b_muon_bf16() -> TrainingRecipe:
    """qwen3_30b_a3b_muon in BF16."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_muon_bf16", "muon", precision="bf16")


@recipe
def qwen3_30b_a3b_adamw_bf16() -> TrainingRecipe:
    """qwen3_30b_a3b_adamw in BF16."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_adamw_bf16", "adamw", precision="bf16")


# --- other systems: Bridge's perf presets for them (megatron/bridge_presets.py); Hopper has no MXFP8 ---


@recipe
def qwen3_30b_a3b_muon_gb200() -> TrainingRecipe:
    """Qwen3-30B-A3B on Bridge's GB200 preset, MXFP8, Muon."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_muon_gb200", "muon", gpu="gb200")


@recipe
def qwen3_30b_a3b_adamw_gb200() -> TrainingRecipe:
    """Qwen3-30B-A3B on Bridge's GB200 preset, MXFP8, AdamW."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_adamw_gb200", "adamw", gpu="gb200")


@recipe
def qwen3_30b_a3b_muon_b200() -> TrainingRecipe:
    """Qwen3-30B-A3B on Bridge's B200 preset, MXFP8, Muon."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_muon_b200", "muon", gpu="b200")


@recipe
def qwen3_30b_a3b_adamw_b200() -> TrainingRecipe:
    """Qwen3-30B-A3B on Bridge's B200 preset, MXFP8, AdamW."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_adamw_b200", "adamw", gpu="b200")


@recipe
def qwen3_30b_a3b_muon_h100() -> TrainingRecipe:
    """Qwen3-30B-A3B on Bridge's H100 preset, FP8 current scaling, Muon."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_muon_h100", "muon", precision="fp8_cs", gpu="h100")


@recipe
def qwen3_30b_a3b_adamw_h100() -> TrainingRecipe:
    """Qwen3-30B-A3B on Bridge's H100 preset, FP8 current scaling, AdamW."""
    return _qwen3_30b_a3b("qwen3_30b_a3b_adamw_h100", "adamw", precision="fp8_cs", gpu="h100")
