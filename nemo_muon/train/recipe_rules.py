"""What the torch backend (`nemo_muon.train`: loop, HF model builder, tokenizer) refuses, torch-free: called by
`nemo_muon.run_checks.check_run` when a recipe is built and by the loop before it trains, so both word it alike."""

from __future__ import annotations

from nemo_muon.config.recipe import TORCH_PRECISIONS, TrainingRecipe

TOKENIZER_MIN_VOCAB = 257
"""data.kind='stdlib_text' trains a byte-level BPE: 256 byte tokens + the EOS token (`train.tokenizer`)."""


def check_torch_backend(recipe: TrainingRecipe) -> None:
    """What `nemo_muon.train` (loop, HF model builder, tokenizer) refuses, as it words it."""
    if not recipe.layerwise:
        raise ValueError("recipe.layerwise must be True for backend 'torch' (every optimizer runs through the "
                         "whole-tensor optimizer: one optimizer state and checkpoint format); got False")
    p = recipe.parallelism
    for name in ("tp", "pp", "cp", "ep", "etp", "vp"):
        if getattr(p, name) != 1:
            raise ValueError(f"parallelism.{name} must be 1 for backend 'torch' (data parallelism only); "
                             f"got {getattr(p, name)}")
    if p.sequence_parallel or p.pipeline_layout is not None:
        raise ValueError(f"parallelism.sequence_parallel must be False and parallelism.pipeline_layout None for "
                         f"backend 'torch' (data parallelism only); got {p.sequence_parallel} and {p.pipeline_layout!r}")
    if recipe.qk_clip:
        raise ValueError("recipe.qk_clip must be False for backend 'torch' (MuonClip runs in the 'megatron' backend); "
                         "got True")
    if recipe.precision.kind not in TORCH_PRECISIONS:
        raise ValueError(f"precision.kind must be one of {TORCH_PRECISIONS} for backend 'torch'; "
                         f"got {recipe.precision.kind!r}")
    spec = recipe.model
    if spec.family == "deepseek_v3" and not spec.num_experts:
        raise ValueError("model.num_experts must be >= 1 for family 'deepseek_v3' (the HF DeepseekV3 model); got 0")
    if spec.family == "qwen3_moe" and spec.num_shared_experts:
        raise ValueError(f"model.num_shared_experts must be 0 for family 'qwen3_moe' (no shared expert); "
                         f"got {spec.num_shared_experts}")
    if recipe.data.kind == "stdlib_text" and spec.vocab_size < TOKENIZER_MIN_VOCAB:
        raise ValueError(f"model.vocab_size must be >= {TOKENIZER_MIN_VOCAB} with data.kind='stdlib_text' (a "
                         f"byte-level BPE: 256 bytes + EOS); got {spec.vocab_size}")
