"""Megatron-Bridge 0.4 / 0.5 (NGC 26.04 / 26.06): the base `ConfigContainer` of a megatron recipe.

These releases keep their performance configs outside the wheel, but their library recipes are in it
(``megatron.bridge.recipes.kimi.kimi_k2:kimi_k2_pretrain_config(optimizer_type=...)``,
``megatron.bridge.recipes.qwen.qwen3_moe:qwen3_30b_a3b_pretrain_config()``: no size arguments; the model provider is
built from the Hugging Face config, read here from the one nemo-muon ships or ``recipe.hf_config``,
`nemo_muon.megatron.bridge.hf_config.recipe_hf_config`). The base is that library recipe with the precision preset
of the perf scripts and every field the release's perf run sets for the recipe's (model, GPU, precision) preset
(`nemo_muon.megatron.bridge_04_05.perf_scripts`); `nemo_muon.megatron.bridge.container` sets ours on top. Where ours
differ on purpose the field is in `DELIBERATE_DIFFERENCES_04` / `DELIBERATE_DIFFERENCES_05` (docs/recipes.md prints
them; tests/newest_stack/test_bridge_recipes_04_05.py compares every field with the release's perf run).
"""

from __future__ import annotations

import importlib
from typing import Any

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.megatron.bridge.container import (
    SAME_LAYOUT_ON_EVERY_RELEASE,
    DeliberateFields,
    check_supported,
    set_fields,
)
from nemo_muon.megatron.bridge.hf_config import recipe_hf_config
from nemo_muon.megatron.bridge_04_05.perf_scripts import BRIDGE_04, BRIDGE_05, Minor, perf_script_fields, workload
from nemo_muon.megatron.generations import installed_bridge_generation
from nemo_muon.registry import spec_for

LIBRARY_RECIPES: dict[str, str] = {
    "kimi_k2": "megatron.bridge.recipes.kimi.kimi_k2:kimi_k2_pretrain_config",
    "qwen3_30b_a3b": "megatron.bridge.recipes.qwen.qwen3_moe:qwen3_30b_a3b_pretrain_config",
}
"""The library recipe each model family's perf builders start from (both tags)."""
KIMI_PIPELINE_LAYOUT = "megatron.bridge.recipes.kimi.kimi_k2:_get_kimi_k2_pipeline_layout"
"""Bridge's Kimi K2 layout for a (PP, VP) preset, which its perf builders set (ours: the planner's, equal)."""
KIMI_OPTIMIZER_TYPES: dict[str, str] = {"adam": "adam", "muon": "dist_muon"}
"""The Kimi K2 library recipe's ``optimizer_type`` -> the optimizer name it builds (it raises on other types)."""
PRECISION_PRESETS: dict[str, str] = {
    "bf16": "bf16_mixed",
    "fp8_cs": "bf16_with_fp8_current_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
}
"""utils/precision.py ``get_precision_config``: our precision kinds -> Bridge's mixed-precision preset (FP8 current
scaling without BF16 first / last layers)."""


def kimi_optimizer_type(recipe: TrainingRecipe) -> str:
    """The Kimi K2 library recipe's ``optimizer_type`` nearest the recipe's optimizer (its Megatron family name where
    the recipe takes it: AdamW's 'adam', Muon's 'muon'; else 'muon', any layer-wise one), as the perf runs choose."""
    name = spec_for(recipe.optimizer).megatron.bridge_name
    return name if name in KIMI_OPTIMIZER_TYPES else "muon"


def library_recipe_container(recipe: TrainingRecipe, minor: Minor | None = None) -> Any:
    """This generation's base (`nemo_muon.megatron.generations.BridgeGeneration.base_container`): the library recipe
    of the model family, its model read offline, with the precision preset and the perf run's fields of the installed
    Bridge release (``minor``: default the installed one) set field by field; ours are set on top."""
    from megatron.bridge.training.comm_overlap import CommOverlapConfig
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    check_supported(recipe)
    minor = installed_bridge_generation().minor if minor is None else minor
    w = workload(recipe, minor)  # refuses a (model, GPU, precision) without a preset before anything is built
    module_name, function = LIBRARY_RECIPES[recipe.model.name].split(":")
    build = getattr(importlib.import_module(module_name), function)
    kwargs: dict[str, Any] = {}
    if recipe.model.name == "kimi_k2":
        kwargs["optimizer_type"] = kimi_optimizer_type(recipe)
    with recipe_hf_config(recipe):
        container = build(**kwargs)
    container.mixed_precision = get_mixed_precision_config(PRECISION_PRESETS[recipe.precision.kind])
    if recipe.precision.kind == "fp8_cs":
        container.mixed_precision.first_last_layers_bf16 = False
    if recipe.model.name == "kimi_k2":
        module_name, function = KIMI_PIPELINE_LAYOUT.split(":")
        layout = getattr(importlib.import_module(module_name), function)(w.pp, w.vp)
        container.model.pipeline_model_parallel_layout = layout
    else:  # the Qwen3 builders replace the library's (absent) comm-overlap config
        container.comm_overlap = CommOverlapConfig(tp_comm_overlap=True)
    set_fields(container, perf_script_fields(recipe, minor, base_optimizer=container.optimizer.optimizer))
    return container


_OPTIMIZER_WHY = ("Muon, SOAP and AdamW run on the same model and layout to compare optimizers; the muon_* fields of a "
                  "non-Muon config keep Megatron's defaults, which nothing reads")
_PERF_RUN_OPTIMIZER = ("the perf run's optimizer: Kimi K2's library recipe with optimizer_type 'muon' ('dist_muon', "
                       "Bridge's Muon helper) or 'adam'; distributed Adam for Qwen3-30B-A3B (eps 1e-8), which has no Muon "
                       "run")
_AS_NEMO_MUON = ("engine 'nemo_muon' as an EngineOptimizerConfig that Bridge's setup_optimizer asks through provide()), or "
                 "AdamW on the distributed optimizer (eps 1e-5 for Qwen3, the 26.02 library recipe's)")


def _rows(optimizer: DeliberateFields, nan_checks: str) -> tuple[DeliberateFields, ...]:
    """A release's table: its optimizer row, the rows both releases share, ``nan_checks`` our value of the NaN row."""
    return (
        optimizer,
        DeliberateFields(
            ("mixed_precision.fp8_param", "mixed_precision.fp8_param_gather",
             "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"),
            "True / True / True for Qwen3-30B-A3B (its run is Adam's, MXFP8)", "False / False / False with Muon or SOAP",
            "Bridge's own workaround in its Kimi K2 Muon run: MXFP8's param all-gather needs the distributed "
            "optimizer, not the layer-wise one"),
        DeliberateFields(
            ("optimizer.muon_tp_mode",), "blockwise", "duplicated",
            "updates independent of the TP size (identical at TP=1, where every perf preset here runs)"),
        DeliberateFields(
            ("optimizer.adam_beta2",), "0.999 (Megatron-Core's default; Bridge's Muon helper does not set it)", "0.95",
            "the same betas as the AdamW baseline of the same model, so the comparison changes only the matrix "
            "updates"),
        DeliberateFields(
            ("scheduler.start_weight_decay", "scheduler.end_weight_decay"),
            "0.033 (overwrites optimizer.weight_decay 0.1 every step)", "optimizer.weight_decay (0.1)",
            "the weight decay a recipe states is the one applied"),
        DeliberateFields(
            ("ddp.check_for_nan_in_grad", "rerun_state_machine.check_for_nan_in_loss"), "False / False", nan_checks,
            "a diverged run stops at the step it diverges instead of benchmarking NaNs; with 'skip' (engine "
            "nemo_muon) the global gradient norm skips the step on every rank"),
        DeliberateFields(
            ("optimizer.use_precision_aware_optimizer",), "True for the BF16 runs of Adam (set_post_overrides)",
            "False", "the AdamW baseline keeps one optimizer at every precision: Megatron's distributed Adam with fp32 "
                     "main parameters and moments"),
        DeliberateFields(
            ("optimizer.overlap_param_gather_with_optimizer_step", "comm_overlap.overlap_param_gather_with_optimizer_step"),
            "True / True for Kimi K2's Adam at BF16 and FP8-CS (DP, PP and VP > 1; set_post_overrides)",
            "False / None", "Bridge's own communication-overlap defaults leave it off for an issue with checkpointing "
                            "(training/comm_overlap.py); recipes save and resume checkpoints"),
        DeliberateFields(
            ("checkpoint.save_interval", "checkpoint.load"),
            "the library recipe's: 2000 (Kimi K2) / 500 (Qwen3) and <cwd>/nemo_experiments/default/checkpoints",
            "recipe.checkpoint.save_interval (None when 0) / recipe.checkpoint.dir when resume, else None",
            "no stray load path; saving is the recipe's choice"),
        DeliberateFields(
            ("logger.save_config_filepath",), "/nemo_run/configs/ConfigContainer.yaml (set_user_overrides)", "None",
            "a file in the job folder of Bridge's own launcher, which our launches have not: Bridge writes it at start "
            "and fails where the folder is missing"),
        DeliberateFields(
            ("model.qk_clip",), "False (Kimi K2's perf builder: off until a Megatron-Core fix)",
            "recipe.qk_clip: True in kimi_k2_muon_qk_clip only", "that recipe measures MuonClip; the others keep False"),
        DeliberateFields(
            ("train.micro_batch_size",), "4 for Qwen3-30B-A3B on 8 B200", "1", SAME_LAYOUT_ON_EVERY_RELEASE),
        DeliberateFields(
            ("model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size",
             "model.expert_model_parallel_size"),
            "Qwen3-30B-A3B on 16 H100: PP1, EP16", "PP2 VP12 EP8", SAME_LAYOUT_ON_EVERY_RELEASE),
    )


DELIBERATE_DIFFERENCES_04: tuple[DeliberateFields, ...] = _rows(
    DeliberateFields(
        ("optimizer.optimizer", "optimizer.use_distributed_optimizer", "ddp.use_distributed_optimizer",
         "ddp.overlap_param_gather", "optimizer.adam_eps", "optimizer.muon_use_nesterov", "optimizer.engine_config"),
        _PERF_RUN_OPTIMIZER,
        "the recipe's optimizer: Muon / SOAP inside the layer-wise optimizer ('dist_muon' / 'dist_soap', Megatron-Core "
        "0.17's names; " + _AS_NEMO_MUON, _OPTIMIZER_WHY),
    "True / True with optimizer.nonfinite='raise'; False / False with 'skip'")
"""Where our containers differ on purpose from Bridge 0.4.2's perf runs (docs/recipes.md prints it)."""
DELIBERATE_DIFFERENCES_05: tuple[DeliberateFields, ...] = _rows(
    DeliberateFields(
        ("optimizer.optimizer", "optimizer.use_layer_wise_distributed_optimizer", "optimizer.use_distributed_optimizer",
         "ddp.use_distributed_optimizer", "ddp.overlap_param_gather", "optimizer.adam_eps", "optimizer.muon_nesterov",
         "optimizer.engine_config"),
        _PERF_RUN_OPTIMIZER,
        "the recipe's optimizer: Muon / SOAP inside the layer-wise optimizer ('muon' / 'soap' with "
        "use_layer_wise_distributed_optimizer, Megatron-Core >= 0.18's spelling; " + _AS_NEMO_MUON, _OPTIMIZER_WHY),
    "True / True with optimizer.nonfinite='raise' (the loss check False under Qwen3's full-iteration CUDA graph, which "
    "Bridge refuses beside it); False / False with 'skip'")
"""Where our containers differ on purpose from Bridge 0.5.1's perf runs (docs/recipes.md prints it)."""
DELIBERATE_DIFFERENCES: dict[Minor, tuple[DeliberateFields, ...]] = {
    BRIDGE_04: DELIBERATE_DIFFERENCES_04, BRIDGE_05: DELIBERATE_DIFFERENCES_05}
