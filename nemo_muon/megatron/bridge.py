"""The megatron backend: a `TrainingRecipe` -> Megatron-Bridge `ConfigContainer` -> Bridge's `pretrain`.

Written against Megatron-Bridge 0.3.0 (NGC nemo:26.02). The mapping is data (`bridge_recipe_kwargs`,
`bridge_field_overrides`): plain dicts computed without importing Bridge, tested on CPU against Bridge 0.3.0's field
names. `build_config_container` and `pretrain` import Bridge lazily, so they only run where Bridge and Transformer
Engine import (the container):

1. Bridge's own library recipe for the model family builds the base container (model provider, tokenizer, kernels);
2. our layout, batch, schedule, data, precision, checkpoint and logging settings are set field by field (a field the
   installed Bridge lacks raises; nothing is dropped);
3. the optimizer is replaced by our mapping (`nemo_muon.megatron.optimizer_config`), and the scheduler's weight
   decay is set to the recipe's value (Bridge's optimizer helpers pin it at 0.033).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

from nemo_muon.config.optimizer import AdamWConfig
from nemo_muon.config.recipe import ParallelismConfig, TrainingRecipe
from nemo_muon.megatron.optimizer_config import MegatronOptimizerSpec, megatron_optimizer_spec

BRIDGE_VERSION = "0.3.0"
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
SCHEDULER_TO_BRIDGE: dict[str, str] = {"cosine": "cosine", "wsd": "WSD", "constant": "constant"}


def _check_supported(recipe: TrainingRecipe) -> None:
    if recipe.model.name not in BRIDGE_BASE_RECIPES:
        raise ValueError(f"model must be one of {tuple(BRIDGE_BASE_RECIPES)} for the megatron backend (a Bridge "
                         f"{BRIDGE_VERSION} library recipe); got {recipe.model.name!r}")
    if recipe.precision.kind not in PRECISION_TO_BRIDGE:
        raise ValueError(f"precision.kind must be one of {tuple(PRECISION_TO_BRIDGE)} for the megatron backend; "
                         f"got {recipe.precision.kind!r}")


def pipeline_layout(recipe: TrainingRecipe) -> list[list[str]] | None:
    """Megatron's explicit pipeline layout (one list per virtual stage) when layers do not split evenly, else None.

    Built from the planner's stage split, which equals Bridge's Kimi K2 layouts (e.g. PP4 VP4: 15 x 4 + 1 layers).
    """
    from nemo_muon.accounting.layout import validate_layout

    lay = validate_layout(recipe)
    if not lay.uneven:
        return None
    stages = [["decoder"] * n for n in lay.stage_layers]
    stages[0].insert(0, "embedding")
    stages[-1].append("loss")
    return stages


def _parallel_sizes(par: ParallelismConfig) -> dict[str, Any]:
    """The parallel sizes under the names both the Bridge library recipe and its model provider use."""
    return {
        "tensor_model_parallel_size": par.tp,
        "pipeline_model_parallel_size": par.pp,
        "virtual_pipeline_model_parallel_size": par.vp if par.vp > 1 else None,
        "context_parallel_size": par.cp,
        "expert_model_parallel_size": par.ep,
        "sequence_parallel": par.sequence_parallel,
    }


def bridge_recipe_kwargs(recipe: TrainingRecipe) -> dict[str, Any]:
    """Keyword arguments of the Bridge 0.3.0 library recipe (`BRIDGE_BASE_RECIPES`) for this recipe."""
    _check_supported(recipe)
    par, tr = recipe.parallelism, recipe.trainer
    kw: dict[str, Any] = {
        "name": recipe.logging.run_name or recipe.name,
        "dir": recipe.logging.root,
        "mock": recipe.data.kind == "mock",
        **_parallel_sizes(par),
        "train_iters": tr.max_steps,
        "global_batch_size": tr.global_batch_size,
        "micro_batch_size": tr.micro_batch_size,
        "seq_length": tr.seq_length,
        "lr": recipe.optimizer.lr,
        "min_lr": recipe.optimizer.lr * recipe.scheduler.min_lr_ratio,
        "lr_warmup_iters": recipe.scheduler.warmup_steps,
        "precision_config": PRECISION_TO_BRIDGE[recipe.precision.kind],
    }
    if recipe.data.kind == "indexed":
        kw["data_paths"] = [recipe.data.path]
    if recipe.model.name == "kimi_k2":
        kw["optimizer_type"] = "adam" if isinstance(recipe.optimizer, AdamWConfig) else "muon"
    else:
        kw["expert_tensor_parallel_size"] = par.etp
    return kw


def bridge_optimizer_spec(recipe: TrainingRecipe, fields: set[str] | None = None) -> MegatronOptimizerSpec:
    """Our optimizer mapped onto the OptimizerConfig of the Megatron-Core in the container (0.16 for Bridge 0.3.0)."""
    if fields is None:
        from megatron.core.optimizer import OptimizerConfig

        fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    return megatron_optimizer_spec(
        recipe.optimizer, fields=fields, grad_clip=recipe.trainer.grad_clip,
        min_lr=recipe.optimizer.lr * recipe.scheduler.min_lr_ratio, layerwise=recipe.layerwise,
        bf16=recipe.precision.kind != "fp32",
    )


def bridge_field_overrides(recipe: TrainingRecipe, *, bridge_knobs: Any = None) -> dict[str, dict[str, Any]]:
    """ConfigContainer section -> {field: value} set on top of the Bridge base recipe (optimizer excluded).

    ``bridge_knobs`` is the `recipes.systems.BridgePerfLayout` row of the recipe's (model, gpu), if any: its
    dispatcher / recompute / CUDA-graph settings are applied as Bridge's perf scripts apply them.
    """
    _check_supported(recipe)
    par, tr, sch, opt = recipe.parallelism, recipe.trainer, recipe.scheduler, recipe.optimizer
    is_adam = isinstance(opt, AdamWConfig)
    model: dict[str, Any] = {
        **_parallel_sizes(par),
        "expert_tensor_parallel_size": par.etp,
        "seq_length": tr.seq_length,
        "pipeline_model_parallel_layout": pipeline_layout(recipe),
        "qk_clip": recipe.qk_clip,
        "qk_clip_threshold": recipe.qk_clip_threshold,
        "qk_clip_alpha": recipe.qk_clip_alpha,
    }
    if bridge_knobs is not None:
        if bridge_knobs.moe_flex_dispatcher_backend is not None:
            model["moe_token_dispatcher_type"] = "flex"
            model["moe_flex_dispatcher_backend"] = bridge_knobs.moe_flex_dispatcher_backend
        model["recompute_modules"] = list(bridge_knobs.recompute_modules) or None
        model["cuda_graph_impl"] = bridge_knobs.cuda_graph_impl
        model["cuda_graph_scope"] = list(bridge_knobs.cuda_graph_scope)
        if recipe.data.kind == "mock":
            model["moe_router_force_load_balancing"] = True  # Bridge perf runs: balanced routing on mock data
    scheduler: dict[str, Any] = {
        "lr_decay_style": SCHEDULER_TO_BRIDGE[sch.kind],
        "lr_warmup_iters": sch.warmup_steps,
        "lr_decay_iters": tr.max_steps,
        "start_weight_decay": opt.weight_decay,
        "end_weight_decay": opt.weight_decay,
        "weight_decay_incr_style": "constant",
    }
    if sch.kind == "wsd":
        scheduler["lr_wsd_decay_iters"] = max(1, round(tr.max_steps * sch.wsd_decay_fraction))
    mixed_precision: dict[str, Any] = {}
    if recipe.precision.kind == "mxfp8" and not is_adam:
        # Bridge's WAR: MXFP8 param all-gather needs the standard distributed optimizer, not the layer-wise one.
        mixed_precision = {"fp8_param_gather": False, "reuse_grad_buf_for_mxfp8_param_ag": False}
    return {
        "model": model,
        "train": {
            "train_iters": tr.max_steps,
            "global_batch_size": tr.global_batch_size,
            "micro_batch_size": tr.micro_batch_size,
            "eval_interval": tr.eval_interval or None,
            "eval_iters": tr.eval_iters,
        },
        "scheduler": scheduler,
        "ddp": {
            # Bridge: AdamW uses the distributed optimizer with param-gather overlap; Muon/SOAP need both off
            "use_distributed_optimizer": is_adam,
            "overlap_param_gather": is_adam,
            "check_for_nan_in_grad": getattr(opt, "nonfinite", "raise") == "raise",
        },
        "mixed_precision": mixed_precision,
        "dataset": {"sequence_length": tr.seq_length},
        "checkpoint": {
            "save_interval": recipe.checkpoint.save_interval or None,
            "save": recipe.checkpoint.dir,
            "load": recipe.checkpoint.dir if recipe.checkpoint.resume else None,
        },
        "logger": {
            "log_interval": tr.log_interval,
            **({"tensorboard_dir": os.path.join(recipe.logging.root, "tensorboard")} if recipe.logging.tensorboard
               else {}),
        },
        "rng": {"seed": tr.seed},
    }


def _set_fields(container: Any, overrides: dict[str, dict[str, Any]]) -> None:
    for section_name, values in overrides.items():
        section = getattr(container, section_name, None)
        if section is None:
            if values:
                raise ValueError(f"ConfigContainer.{section_name} is None in the Bridge base recipe; cannot set "
                                 f"{sorted(values)}")
            continue
        names = {f.name for f in dataclasses.fields(section)}
        for name, value in values.items():
            if name not in names:
                raise ValueError(f"{type(section).__name__} (ConfigContainer.{section_name}) has no field {name!r} "
                                 f"in the installed Megatron-Bridge (expected {BRIDGE_VERSION})")
            setattr(section, name, value)


def build_config_container(recipe: TrainingRecipe) -> Any:
    """The Bridge `ConfigContainer` of ``recipe`` (imports Megatron-Bridge: inside the NeMo container only)."""
    from megatron.bridge.training.config import OptimizerConfig as BridgeOptimizerConfig

    from nemo_muon.recipes.systems import BRIDGE_PERF_LAYOUTS

    recipe.validate()
    module_name, fn_name = BRIDGE_BASE_RECIPES[recipe.model.name].split(":")
    container = getattr(importlib.import_module(module_name), fn_name)(**bridge_recipe_kwargs(recipe))
    spec = bridge_optimizer_spec(recipe)
    container.optimizer = BridgeOptimizerConfig(**spec.kwargs)
    container.optimizer.optimizer = spec.bridge_optimizer  # Bridge 0.3.0 dispatches Muon on this name
    knobs = BRIDGE_PERF_LAYOUTS.get((recipe.model.name, recipe.system.gpu))
    _set_fields(container, bridge_field_overrides(recipe, bridge_knobs=knobs))
    return container


def pretrain(recipe: TrainingRecipe) -> None:
    """Train ``recipe`` with Megatron-Bridge (NeMo container; one process per GPU, launched by the executor).

    The recipe's environment variables are set where the launcher has not set them already (the launcher wins)."""
    for name, value in recipe.env.items():
        os.environ.setdefault(name, value)
    container = build_config_container(recipe)
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain as bridge_pretrain

    bridge_pretrain(container, forward_step)
