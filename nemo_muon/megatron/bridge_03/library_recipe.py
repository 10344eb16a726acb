"""Megatron-Bridge 0.3 (NGC nemo:26.02): the base `ConfigContainer` of a megatron recipe.

Bridge 0.3 keeps its performance configs outside the wheel (``scripts/performance/``): the base is Bridge's own
library recipe for the model family (model provider, tokenizer, kernels; `bridge_recipe_kwargs`, the precision
preset resolved to its `MixedPrecisionConfig`, since a preset *name* would stay a `str` until `pretrain()` and could
not be adjusted), and, for a recipe on one of Bridge's perf presets, every field those scripts set (r0.3.0 for
Qwen3-30B-A3B, r0.3.1 for Kimi K2: `BRIDGE_PERF_COMMON_FIELDS`, `BRIDGE_PERF_MODEL_FIELDS`, the preset's knobs),
mirrored field by field (`perf_script_fields`). Where ours differ on purpose the field is in
`DELIBERATE_DIFFERENCES` (docs/recipes.md prints that table). `nemo_muon.megatron.bridge.container` sets ours on top.
"""

from __future__ import annotations

import importlib
from typing import Any

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.megatron.bridge.container import DeliberateDifference, check_supported, parallel_sizes, set_fields
from nemo_muon.megatron.bridge.hf_config import recipe_hf_config
from nemo_muon.megatron.bridge.perf_presets import BRIDGE_PERF_LAYOUTS
from nemo_muon.registry import spec_for

LIBRARY_OPTIMIZER_TYPES: tuple[str, ...] = ("adam", "muon")
"""What Bridge 0.3's Kimi K2 library recipe takes as ``optimizer_type`` (it raises on anything else); the base's
optimizer is replaced by ours afterwards (`nemo_muon.megatron.bridge.container`)."""
BRIDGE_BASE_RECIPES: dict[str, str] = {
    "kimi_k2": "megatron.bridge.recipes.kimi.kimi_k2:kimi_k2_pretrain_config",
    "qwen3_30b_a3b": "megatron.bridge.recipes.qwen.qwen3_moe:qwen3_30b_a3b_pretrain_config",
}
"""Bridge 0.3.0 library recipe per model (ModelSpec.name) that provides the model provider and kernel defaults."""
PRECISION_TO_BRIDGE: dict[str, str] = {
    "bf16": "bf16_mixed",
    "fp8_cs": "bf16_with_fp8_current_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
}
"""`megatron.bridge.training.mixed_precision` presets; fp32 training is not offered by the megatron backend."""


def library_optimizer_type(recipe: TrainingRecipe) -> str:
    """The library recipe's ``optimizer_type`` nearest the recipe's optimizer: its Megatron family name where the
    library recipe takes it (AdamW's 'adam', Muon's and its variants' 'muon'), else 'muon' (any layer-wise one)."""
    name = spec_for(recipe.optimizer).megatron.bridge_name
    return name if name in LIBRARY_OPTIMIZER_TYPES else "muon"


def bridge_recipe_kwargs(recipe: TrainingRecipe) -> dict[str, Any]:
    """Keyword arguments of the Bridge 0.3.0 library recipe (`BRIDGE_BASE_RECIPES`) for this recipe. No learning
    rate: the library recipe's optimizer config is replaced by ours (`bridge.container.bridge_optimizer_config`), the
    one place the rate is mapped onto Megatron's config, and its scheduler config holds none."""
    check_supported(recipe)
    par, tr = recipe.parallelism, recipe.trainer
    kw: dict[str, Any] = {
        "name": recipe.logging.run_name or recipe.name,
        "dir": recipe.logging.root,
        "mock": recipe.data.kind == "mock",
        **parallel_sizes(par),
        "train_iters": tr.max_steps,
        "global_batch_size": tr.global_batch_size,
        "micro_batch_size": tr.micro_batch_size,
        "seq_length": tr.seq_length,
        "lr_warmup_iters": recipe.scheduler.warmup_steps,
        "precision_config": PRECISION_TO_BRIDGE[recipe.precision.kind],
    }
    if recipe.data.kind == "indexed":
        kw["data_paths"] = [recipe.data.path]
    if recipe.model.name == "kimi_k2":
        kw["optimizer_type"] = library_optimizer_type(recipe)
    else:
        kw["expert_tensor_parallel_size"] = par.etp
    return kw


BRIDGE_PERF_MODEL_FIELDS: dict[str, dict[str, dict[str, Any]]] = {
    # scripts/performance/configs/kimi/kimi_llm_pretrain.py (r0.3.1) set_kimi_k2_common_configs + the GB300 builder
    "kimi_k2": {
        "model": {"moe_router_fusion": True, "recompute_granularity": "selective"},
        "dist": {"enable_megatron_core_experimental": True},
        "comm_overlap": {"overlap_grad_reduce": True},
    },
    # scripts/performance/configs/qwen/qwen3_llm_pretrain.py (r0.3.0) set_qwen3_common_configs: recompute cleared
    # for every preset (Bridge's Qwen library recipe defaults to full recompute), bias-activation fusion on; the
    # GB300 builder passes comm_overlap_config=CommOverlapConfig(tp_comm_overlap=True) to the library recipe
    "qwen3_30b_a3b": {
        "model": {"moe_router_fusion": True, "bias_activation_fusion": True, "recompute_granularity": None,
                  "recompute_method": None, "recompute_num_layers": None},
        "comm_overlap": {"tp_comm_overlap": True},
    },
}
"""Per-model fields Bridge's perf scripts set on top of the library recipe (applied to every perf recipe)."""
BRIDGE_PERF_COMMON_FIELDS: dict[str, dict[str, Any]] = {
    # scripts/performance/utils/overrides.py _set_common_perf_overrides (both refs) and the models' common configs
    "model": {"apply_rope_fusion": True, "cross_entropy_fusion_impl": "te", "use_transformer_engine_op_fuser": False},
    "mixed_precision": {"grad_reduce_in_fp32": False},
    "ddp": {"grad_reduce_in_fp32": False, "check_for_large_grads": False},
    # perf_plugins.py PerfEnvPlugin: Hydra overrides train.manual_gc=true train.manual_gc_interval=100
    "train": {"manual_gc": True, "manual_gc_interval": 100},
}
"""Fields every Bridge perf run sets, whatever the model."""
HYBRIDEP_NUM_SMS = 32
"""`moe_hybridep_num_sms` of Bridge's perf runs with the HybridEP flex backend (overrides.py; Megatron's default 16)."""


DELIBERATE_DIFFERENCES: tuple[DeliberateDifference, ...] = (
    DeliberateDifference(
        "scheduler.start_weight_decay / end_weight_decay", "0.033 (optimizer.weight_decay 0.1 is overwritten every "
        "step by the constant weight-decay schedule)", "optimizer.weight_decay (0.1)",
        "the weight decay a recipe states is the one applied; 0.033 was a silent override"),
    DeliberateDifference(
        "ddp.check_for_nan_in_grad / rerun_state_machine.check_for_nan_in_loss", "False / False",
        "True / True", "optimizer.nonfinite='raise': a diverged run stops at the step it diverges instead of "
                       "benchmarking NaNs (one all-reduced flag per step); with nonfinite='skip' (engine nemo_muon) "
                       "False / False, as Bridge: the global gradient norm skips the step on every rank"),
    DeliberateDifference(
        "optimizer.muon_tp_mode", "blockwise", "duplicated",
        "updates independent of the TP size (identical at TP=1, where every GB300 recipe runs)"),
    DeliberateDifference(
        "optimizer.adam_beta2 (Adam part of Muon: embeddings, output layer, 1-D params)",
        "0.999 (Megatron-Core's default; Bridge's Muon helper does not set it)", "0.95",
        "the same betas as the AdamW baseline of the same model, so the comparison changes only the matrix updates"),
    DeliberateDifference(
        "model.moe_token_dispatcher_type / moe_flex_dispatcher_backend / moe_shared_expert_overlap",
        "'flex' / 'hybridep' / False, only if the GPU the config is built on passes apply_flex_dispatcher_backend's "
        "check", "'flex' / 'hybridep' / False, always",
        "the config does not depend on the machine that builds it (a login node); Bridge's validate() still "
        "refuses HybridEP / DeepEP on a GPU generation that lacks it"),
    DeliberateDifference(
        "model.qk_clip", "False (Kimi K2's perf scripts: off until a Megatron-Core fix)",
        "recipe.qk_clip: True in kimi_k2_muon_qk_clip only", "that recipe measures MuonClip; the others keep False"),
    DeliberateDifference(
        "checkpoint.save / load", "None / <cwd>/nemo_experiments/default/checkpoints",
        "recipe.checkpoint.dir when save_interval > 0 / when resume, else None", "no stray load path"),
    DeliberateDifference(
        "logger.tensorboard_dir", "None", "<logging.root>/tensorboard when logging.tensorboard", "recipe setting"),
)


def perf_script_fields(recipe: TrainingRecipe, knobs: Any) -> dict[str, dict[str, Any]]:
    """What Bridge 0.3's perf scripts set for this (model, gpu) preset (``knobs``: its `BridgePerfLayout` row),
    section by section."""
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in BRIDGE_PERF_COMMON_FIELDS.items()}
    for section, values in BRIDGE_PERF_MODEL_FIELDS.get(recipe.model.name, {}).items():
        out.setdefault(section, {}).update(values)
    model = out["model"]
    if knobs.moe_flex_dispatcher_backend is not None:
        # flex_dispatcher_backend.py apply_flex_dispatcher_backend: exactly these three fields
        model.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=knobs.moe_flex_dispatcher_backend,
                     moe_shared_expert_overlap=False)
        if knobs.moe_flex_dispatcher_backend == "hybridep":
            model["moe_hybridep_num_sms"] = HYBRIDEP_NUM_SMS
    if knobs.recompute_modules:  # overrides.py _set_recompute_overrides
        model.update(recompute_modules=list(knobs.recompute_modules), recompute_granularity="selective")
    # overrides.py _set_cuda_graph_overrides: TE CUDA graphs need the TE RNG tracker
    model["cuda_graph_impl"] = knobs.cuda_graph_impl
    model["cuda_graph_scope"] = list(knobs.cuda_graph_scope)
    te_rng = knobs.cuda_graph_impl != "none" or knobs.te_rng_tracker
    model["use_te_rng_tracker"] = te_rng
    out.setdefault("rng", {})["te_rng_tracker"] = te_rng
    if recipe.data.kind == "mock":
        model["moe_router_force_load_balancing"] = True  # Bridge perf runs: balanced routing on mock data
    if recipe.precision.kind == "fp8_cs":
        # utils/precision.py get_precision_config("fp8_cs"): the perf runs keep no BF16 first / last layers (the
        # library preset bf16_with_fp8_current_scaling_mixed keeps one of each)
        out["mixed_precision"]["first_last_layers_bf16"] = False
    return out


def library_recipe_container(recipe: TrainingRecipe) -> Any:
    """This generation's base (`nemo_muon.megatron.generations.BridgeGeneration.base_container`): Bridge 0.3's
    library recipe of the model family (`BRIDGE_BASE_RECIPES`) with `bridge_recipe_kwargs` and, for a recipe on a
    perf preset's (model, GPU), its perf scripts' fields (`perf_script_fields`) set field by field; ours are set on
    top (`nemo_muon.megatron.bridge.container.bridge_field_overrides`)."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    module_name, fn_name = BRIDGE_BASE_RECIPES[recipe.model.name].split(":")
    kwargs = bridge_recipe_kwargs(recipe)
    kwargs["precision_config"] = get_mixed_precision_config(kwargs["precision_config"])
    with recipe_hf_config(recipe):  # Qwen3's library recipe reads the Hub's config.json: the shipped one here
        container = getattr(importlib.import_module(module_name), fn_name)(**kwargs)
    knobs = BRIDGE_PERF_LAYOUTS.get((recipe.model.name, recipe.system.gpu))
    if knobs is not None:
        fields = perf_script_fields(recipe, knobs)
        if container.comm_overlap is None and "comm_overlap" in fields:  # Qwen's library recipe leaves it None
            from megatron.bridge.training.comm_overlap import CommOverlapConfig

            container.comm_overlap = CommOverlapConfig(**fields.pop("comm_overlap"))
        set_fields(container, fields)
    return container
