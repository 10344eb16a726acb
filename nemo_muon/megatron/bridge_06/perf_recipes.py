"""Megatron-Bridge >= 0.6 (NGC 26.08): a megatron recipe's base `ConfigContainer` is Bridge's own perf recipe.

From 0.6 Bridge ships its performance configs in the wheel (``megatron.bridge.perf_recipes``: one function per
model, system and precision, no arguments), where 0.3 kept them in ``scripts/performance/`` (which
`nemo_muon.megatron.bridge.container` mirrors field by field). So on 0.6 the base is the function itself
(`perf_recipe_target`), and `nemo_muon.megatron.bridge.container` sets our layout, batch, schedule, data, checkpoint,
logging and optimizer on it; where ours differ from the function on purpose the field is in
`DELIBERATE_DIFFERENCES_06` (docs/recipes.md prints it).

Bridge >= 0.4 builds the model provider from the model's Hugging Face config (``AutoBridge.from_hf_pretrained`` of a
Hub id the recipe names). Clusters and this project's machines reach no Hub, so the function runs with that id read
from the config.json nemo-muon ships, or the folder ``recipe.hf_config`` names
(`nemo_muon.megatron.bridge.hf_config.recipe_hf_config`: Bridge's ``AutoBridge.from_hf_pretrained`` is wrapped for the
duration of the call and restored after; nothing else). Torch-free until a function is called.
"""

from __future__ import annotations

import importlib
from typing import Any

from nemo_muon._validation import check_choice
from nemo_muon.megatron.bridge.container import SAME_LAYOUT_ON_EVERY_RELEASE, DeliberateFields
from nemo_muon.megatron.bridge.hf_config import recipe_hf_config

PERF_RECIPE_MODULES: dict[str, str] = {
    "kimi_k2": "megatron.bridge.perf_recipes.kimi.{gpu}.kimi_k2",
    "qwen3_30b_a3b": "megatron.bridge.perf_recipes.qwen.{gpu}.qwen3_moe",
}
PERF_RECIPE_FUNCTIONS: dict[str, str] = {
    "kimi_k2": "kimi_k2_pretrain_{num_gpus}gpu_{gpu}_{precision}_config",
    "qwen3_30b_a3b": "qwen3_30b_a3b_pretrain_{num_gpus}gpu_{gpu}_{precision}_config",
}
PRECISION_SUFFIXES: dict[str, str] = {"bf16": "bf16", "fp8_cs": "fp8cs", "mxfp8": "fp8mx"}
"""Our precision kinds -> the suffix of Bridge 0.6's perf recipe functions."""


def perf_recipe_target(recipe: Any) -> str:
    """``"module:function"`` of Bridge 0.6's perf recipe for ``recipe``'s (model, system, GPU count, precision)."""
    model, gpu = recipe.model.name, recipe.system.gpu
    check_choice("model (Bridge 0.6 perf recipes)", model, PERF_RECIPE_MODULES)
    check_choice("precision.kind (Bridge 0.6 perf recipes)", recipe.precision.kind, PRECISION_SUFFIXES)
    module = PERF_RECIPE_MODULES[model].format(gpu=gpu)
    function = PERF_RECIPE_FUNCTIONS[model].format(num_gpus=recipe.system.world_size, gpu=gpu,
                                                   precision=PRECISION_SUFFIXES[recipe.precision.kind])
    return f"{module}:{function}"


def perf_recipe_function(recipe: Any) -> Any:
    """The installed Bridge's perf recipe function of `perf_recipe_target`; a ValueError names what has none."""
    target = perf_recipe_target(recipe)
    module_name, function = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if not e.name or not module_name.startswith(e.name):
            raise
        module = None
    if module is None or not hasattr(module, function):
        raise ValueError(f"system.gpu={recipe.system.gpu!r} with precision.kind={recipe.precision.kind!r} and "
                         f"{recipe.system.world_size} GPUs has no Megatron-Bridge perf recipe for model "
                         f"{recipe.model.name!r} in the installed Bridge (looked for {target})")
    return getattr(module, function)


def perf_recipe_container(recipe: Any) -> Any:
    """Bridge 0.6's own perf `ConfigContainer` for ``recipe``, its model read offline (`recipe_hf_config`)."""
    function = perf_recipe_function(recipe)
    with recipe_hf_config(recipe):
        return function()


DELIBERATE_DIFFERENCES_06: tuple[DeliberateFields, ...] = (
    DeliberateFields(
        ("optimizer.optimizer", "optimizer.use_layer_wise_distributed_optimizer", "optimizer.use_distributed_optimizer",
         "ddp.use_distributed_optimizer", "ddp.overlap_param_gather", "optimizer.adam_eps", "optimizer.muon_nesterov",
         "optimizer.engine_config"),
        "the model's own optimizer: Muon for Kimi K2 ('dist_muon', Bridge's name dispatch), distributed Adam for "
        "Qwen3-30B-A3B (eps 1e-8)",
        "the recipe's optimizer: Muon / SOAP inside the layer-wise optimizer ('muon' / 'soap' with "
        "use_layer_wise_distributed_optimizer, Megatron-Core >= 0.18's spelling; engine 'nemo_muon' as an "
        "EngineOptimizerConfig that Bridge's setup_optimizer asks through provide()), or AdamW on the distributed "
        "optimizer (eps 1e-5 for Qwen3, the 26.02 library recipe's)",
        "Muon, SOAP and AdamW run on the same model and layout to compare optimizers; the muon_* fields of a "
        "non-Muon config keep Megatron's defaults, which nothing reads"),
    DeliberateFields(
        ("mixed_precision.fp8_param", "mixed_precision.fp8_param_gather",
         "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"),
        "True / True / True for Qwen3-30B-A3B (Adam, MXFP8)", "False / False / False with Muon or SOAP",
        "Bridge's own workaround in its Kimi K2 Muon recipe: MXFP8's param all-gather needs the distributed "
        "optimizer, not the layer-wise one"),
    DeliberateFields(
        ("optimizer.muon_tp_mode",), "blockwise", "duplicated",
        "updates independent of the TP size (identical at TP=1, where the GB300 recipes run)"),
    DeliberateFields(
        ("optimizer.adam_beta2",), "0.999 (Megatron-Core's default; Bridge's Muon helper does not set it)", "0.95",
        "the same betas as the AdamW baseline of the same model, so the comparison changes only the matrix updates"),
    DeliberateFields(
        ("scheduler.start_weight_decay", "scheduler.end_weight_decay"),
        "0.033 (overwrites optimizer.weight_decay 0.1 every step)", "optimizer.weight_decay (0.1)",
        "the weight decay a recipe states is the one applied"),
    DeliberateFields(
        ("ddp.check_for_nan_in_grad", "rerun_state_machine.check_for_nan_in_loss"), "False / False",
        "True / True with optimizer.nonfinite='raise' (the loss check False under a full-iteration CUDA graph, "
        "which Bridge refuses beside it); False / False with 'skip'",
        "a diverged run stops at the step it diverges (DDP's gradient check alone inside a full-iteration graph); "
        "with 'skip' (engine nemo_muon) the global gradient norm skips the step on every rank"),
    DeliberateFields(
        ("checkpoint.save_interval", "checkpoint.load"), "2000 / <cwd>/nemo_experiments/default/checkpoints",
        "recipe.checkpoint.save_interval (None when 0) / recipe.checkpoint.dir when resume, else None",
        "no stray load path; saving is the recipe's choice"),
    DeliberateFields(
        ("model.qk_clip",), "False", "recipe.qk_clip: True in kimi_k2_muon_qk_clip only",
        "that recipe measures MuonClip; the others keep False"),
    DeliberateFields(
        ("train.micro_batch_size",), "4 for Qwen3-30B-A3B on 8 B200", "1", SAME_LAYOUT_ON_EVERY_RELEASE),
    DeliberateFields(
        ("model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size",
         "model.expert_model_parallel_size"),
        "Qwen3-30B-A3B on 16 H100: PP1, EP16", "PP2 VP12 EP8", SAME_LAYOUT_ON_EVERY_RELEASE),
)


