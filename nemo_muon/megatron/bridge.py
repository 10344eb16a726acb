"""The megatron backend: a `TrainingRecipe` -> Megatron-Bridge `ConfigContainer` -> Bridge's `pretrain`.

Written against Megatron-Bridge 0.3.0 (NGC nemo:26.02) and checked against it: the container-stack test environment
builds every megatron recipe's real `ConfigContainer` here and runs what Bridge's `pretrain()` runs on it first
(`runtime_config_update`: mixed precision, comm overlap, `validate()`). The mapping is data (`bridge_recipe_kwargs`,
`bridge_field_overrides`, `BRIDGE_PERF_MODEL_FIELDS`); `build_config_container` and `pretrain` import Bridge lazily:

1. Bridge's own library recipe for the model family builds the base container (model provider, tokenizer, kernels),
   with the precision preset resolved to its `MixedPrecisionConfig` (a preset *name* would stay a `str` until
   `pretrain()` and could not be adjusted);
2. our layout, batch, schedule, data, checkpoint and logging settings, and for perf recipes every field Bridge's
   own performance scripts set (`scripts/performance/`, r0.3.0 for Qwen3-30B-A3B, r0.3.1 for Kimi K2), are set
   field by field (a field the installed Bridge lacks raises; nothing is dropped). Where ours differ on purpose the
   field is in `DELIBERATE_DIFFERENCES` (docs/recipes.md prints that table);
3. the optimizer is replaced by our mapping (`nemo_muon.megatron.optimizer_config`), and the scheduler's weight
   decay is set to the recipe's value (Bridge's optimizer helpers pin it at 0.033).

What the installed stack cannot run is refused before anything is built (`nemo_muon.megatron.stack`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Any

from nemo_muon.config.optimizer import OptimizerConfig
from nemo_muon.config.recipe import ParallelismConfig, TrainingRecipe
from nemo_muon.megatron.bridge_presets import BRIDGE_PERF_LAYOUTS
from nemo_muon.megatron.optimizer_config import (
    ENGINE_NEMO_MUON,
    MegatronOptimizerSpec,
    ddp_flags,
    megatron_optimizer_spec,
)
from nemo_muon.megatron.stack import check_recipe_bridge, optimizer_engine
from nemo_muon.registry import spec_for
from nemo_muon.versions import BRIDGE_HOOK, BRIDGE_PROVIDE, bridge_integration

FULL_ITERATION_GRAPH = "full_iteration"
"""``model.cuda_graph_impl`` that captures the whole step (Bridge 0.6's Qwen3 MXFP8 perf recipes)."""

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
        kw["optimizer_type"] = "adam" if spec_for(recipe.optimizer).matrix is None else "muon"
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


@dataclass(frozen=True)
class DeliberateDifference:
    """A field where a perf recipe differs from Bridge's perf scripts on purpose (docs/recipes.md prints these)."""

    field: str
    bridge: str
    ours: str
    why: str


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


def deliberate_differences_markdown() -> str:
    """The table of docs/recipes.md: every field where a perf recipe differs from Bridge's perf scripts on purpose."""
    lines = ["| field | Bridge's perf scripts | ours | why |", "|---|---|---|---|"]
    lines += [f"| `{d.field}` | {d.bridge} | {d.ours} | {d.why} |" for d in DELIBERATE_DIFFERENCES]
    return "\n".join(lines) + "\n"


def _perf_model_fields(recipe: TrainingRecipe, knobs: Any) -> dict[str, dict[str, Any]]:
    """What Bridge's perf scripts set for this (model, gpu) preset, section by section."""
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


def bridge_field_overrides(recipe: TrainingRecipe, *, bridge_knobs: Any = None,
                           cost_layout: bool = False) -> dict[str, dict[str, Any]]:
    """ConfigContainer section -> {field: value} set on top of the Bridge base recipe (optimizer excluded).

    ``bridge_knobs`` is the `bridge_presets.BridgePerfLayout` row of the recipe's (model, gpu), if any: then every
    field Bridge's perf scripts set is included (`BRIDGE_PERF_*`), and ours win only where listed in
    `DELIBERATE_DIFFERENCES`. ``cost_layout``: DDP on the reduce-scatter layout owned by update cost
    (`nemo_muon.megatron.bridge_layout`; engine 'nemo_muon' on Bridge 0.5 / 0.6).
    """
    _check_supported(recipe)
    par, tr, sch, opt = recipe.parallelism, recipe.trainer, recipe.scheduler, recipe.optimizer
    is_adam = spec_for(opt).matrix is None  # element-wise: Megatron's distributed optimizer
    out: dict[str, dict[str, Any]] = _perf_model_fields(recipe, bridge_knobs) if bridge_knobs is not None else {}

    def merge(section: str, values: dict[str, Any]) -> None:
        out.setdefault(section, {}).update(values)

    merge("model", {
        **_parallel_sizes(par),
        "expert_tensor_parallel_size": par.etp,
        "seq_length": tr.seq_length,
        "pipeline_model_parallel_layout": pipeline_layout(recipe),
        "qk_clip": recipe.qk_clip,
        "qk_clip_threshold": recipe.qk_clip_threshold,
        "qk_clip_alpha": recipe.qk_clip_alpha,
    })
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
    merge("scheduler", scheduler)
    if recipe.precision.kind == "mxfp8" and not is_adam:
        # Bridge's WAR: MXFP8 param all-gather needs the standard distributed optimizer, not the layer-wise one.
        merge("mixed_precision", {"fp8_param_gather": False, "reuse_grad_buf_for_mxfp8_param_ag": False})
    merge("train", {
        "train_iters": tr.max_steps,
        "global_batch_size": tr.global_batch_size,
        "micro_batch_size": tr.micro_batch_size,
        "eval_interval": tr.eval_interval or None,
        "eval_iters": tr.eval_iters,
    })
    ddp = ddp_flags(opt, cost_layout=cost_layout)
    # the param all-gather of a layout (AdamW's, or the cost layout) overlaps the next forward; the legacy
    # layer-wise path gathers after the step
    merge("ddp", {**ddp, "overlap_param_gather": ddp["use_distributed_optimizer"]})
    merge("rerun_state_machine", {"check_for_nan_in_loss": ddp["check_for_nan_in_grad"]})
    merge("dataset", {"sequence_length": tr.seq_length})
    merge("checkpoint", {
        # stated, not inherited: every save its own iter_<n> folder; the layer-wise optimizer's torch-format file
        # outside it is Megatron-Bridge #2307 (docs/megatron_cpu.md, "What a checkpoint guarantees")
        "ckpt_format": "torch_dist",
        "save_interval": recipe.checkpoint.save_interval or None,
        "save": recipe.checkpoint.dir if recipe.checkpoint.save_interval else None,
        "load": recipe.checkpoint.dir if recipe.checkpoint.resume else None,
    })
    merge("logger", {
        "log_interval": tr.log_interval,
        "tensorboard_dir": os.path.join(recipe.logging.root, "tensorboard") if recipe.logging.tensorboard else None,
    })
    merge("rng", {"seed": tr.seed})
    # a stalled rank fails every collective after this long (whole minutes: recipe_rules refuses others)
    merge("dist", {"distributed_timeout_minutes": int(recipe.system.collective_timeout // 60)})
    return out


def _set_fields(container: Any, overrides: dict[str, dict[str, Any]]) -> None:
    for section_name, values in overrides.items():
        section = getattr(container, section_name, None)
        if section is None:
            if values:
                raise ValueError(f"ConfigContainer.{section_name} is None in the Bridge base recipe; cannot set "
                                 f"{sorted(values)}")
            continue
        if not dataclasses.is_dataclass(section):
            raise TypeError(f"ConfigContainer.{section_name} is a {type(section).__name__}, not a config dataclass; "
                            f"cannot set {sorted(values)}")
        names = {f.name for f in dataclasses.fields(section)}
        for name, value in values.items():
            if name not in names:
                raise ValueError(f"{type(section).__name__} (ConfigContainer.{section_name}) has no field {name!r} "
                                 f"in the installed Megatron-Bridge (expected {BRIDGE_VERSION})")
            setattr(section, name, value)


def build_config_container(recipe: TrainingRecipe) -> Any:
    """The Bridge `ConfigContainer` of ``recipe`` (imports Megatron-Bridge: the NeMo container or the container-stack
    test environment). Raises before building if the installed stack cannot run the recipe's optimizer."""
    from nemo_muon.megatron.stack import check_installed_stack, optimizer_engine

    recipe.validate()
    check_installed_stack(recipe.optimizer.name, optimizer_engine(recipe.optimizer))
    return config_container(recipe)


def config_container(recipe: TrainingRecipe) -> Any:
    """The `ConfigContainer` alone, without asking whether the installed optimizer stack can build the optimizer it
    names (`build_config_container` asks first; this is what it builds, and what the config tests validate)."""
    recipe.validate()
    # the rule every entry point applies before launch: Bridge 0.4 / 0.5 refused, hf_config required from 0.4
    check_recipe_bridge(recipe, importlib.metadata.version("megatron-bridge"), where="the installed stack")
    if installed_bridge_integration() == BRIDGE_HOOK:
        container = _library_recipe_container(recipe)
        knobs = BRIDGE_PERF_LAYOUTS.get((recipe.model.name, recipe.system.gpu))
    else:  # Bridge >= 0.6: its own perf recipe is the base, with its perf fields already set
        from nemo_muon.megatron.bridge_perf_recipes import perf_recipe_container

        _check_supported(recipe)
        container, knobs = perf_recipe_container(recipe), None
    container.optimizer = bridge_optimizer_config(recipe.optimizer, bridge_optimizer_spec(recipe))
    overrides = bridge_field_overrides(recipe, bridge_knobs=knobs, cost_layout=_routes_cost_layout(recipe))
    if container.comm_overlap is None and "comm_overlap" in overrides:  # Qwen's library recipe leaves it None
        from megatron.bridge.training.comm_overlap import CommOverlapConfig

        container.comm_overlap = CommOverlapConfig(**overrides.pop("comm_overlap"))
    _set_fields(container, overrides)
    if getattr(container.model, "cuda_graph_impl", None) == FULL_ITERATION_GRAPH:
        # Bridge refuses the loss's NaN check inside a full-iteration CUDA graph (Bridge 0.6's Qwen3 MXFP8 recipes);
        # DDP's gradient check (ddp.check_for_nan_in_grad) still stops a diverged run at the step it diverges
        container.rerun_state_machine.check_for_nan_in_loss = False
    return container


def _routes_cost_layout(recipe: TrainingRecipe) -> bool:
    """Whether Bridge's DDP is built on the cost layout for ``recipe`` (`nemo_muon.megatron.bridge_layout.routes`)."""
    from nemo_muon.megatron.bridge_layout import routes

    return routes(recipe.optimizer)


def installed_bridge_integration() -> str:
    """How engine 'nemo_muon' enters the installed Megatron-Bridge (`nemo_muon.versions.bridge_integration`)."""
    return bridge_integration(importlib.metadata.version("megatron-bridge"))


def bridge_optimizer_config(opt: OptimizerConfig, spec: MegatronOptimizerSpec) -> Any:
    """``ConfigContainer.optimizer`` for ``opt`` (mapped to ``spec``) on the installed Bridge.

    Engine 'nemo_muon' on Bridge >= 0.4: an `EngineOptimizerConfig`, whose ``provide()`` Bridge's setup_optimizer
    calls. Otherwise Bridge's own `OptimizerConfig`, with the name Bridge dispatches on (on Bridge 0.3 engine
    'nemo_muon' is then built by the hook `pretrain` installs, `nemo_muon.megatron.bridge_hook`).
    """
    if optimizer_engine(opt) == ENGINE_NEMO_MUON and installed_bridge_integration() == BRIDGE_PROVIDE:
        from nemo_muon.megatron.bridge_provider import engine_optimizer_config

        return engine_optimizer_config(opt, spec.kwargs)
    from megatron.bridge.training.config import OptimizerConfig as BridgeOptimizerConfig

    config = BridgeOptimizerConfig(**spec.kwargs)
    config.optimizer = spec.bridge_optimizer  # Bridge dispatches Megatron's Muon / SOAP on this name
    return config


def _library_recipe_container(recipe: TrainingRecipe) -> Any:
    """Bridge 0.3's library recipe of the model family (`BRIDGE_BASE_RECIPES`) with `bridge_recipe_kwargs`."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    module_name, fn_name = BRIDGE_BASE_RECIPES[recipe.model.name].split(":")
    kwargs = bridge_recipe_kwargs(recipe)
    kwargs["precision_config"] = get_mixed_precision_config(kwargs["precision_config"])
    return getattr(importlib.import_module(module_name), fn_name)(**kwargs)


def pretrain(recipe: TrainingRecipe) -> None:
    """Train ``recipe`` with Megatron-Bridge (NeMo container; one process per GPU, launched by the executor).
    On resume, the checkpoint Bridge will load is checked first (`checkpoint_files.check_resume_folder`).

    The recipe's environment variables are set where the launcher has not set them already (the launcher wins)."""
    for name, value in recipe.env.items():
        os.environ.setdefault(name, value)
    if recipe.checkpoint.resume and recipe.checkpoint.dir:  # a cut or missing shard is refused by name before Bridge loads into the model
        from nemo_muon.megatron.checkpoint_files import check_resume_folder

        check_resume_folder(recipe.checkpoint.dir)
    container = build_config_container(recipe)
    if optimizer_engine(recipe.optimizer) == ENGINE_NEMO_MUON and installed_bridge_integration() == BRIDGE_HOOK:
        from nemo_muon.megatron import bridge_hook

        bridge_hook.install(recipe.optimizer)  # Bridge 0.3's setup_optimizer then builds ours (no provide() there)
    if _routes_cost_layout(recipe):  # Bridge 0.5 / 0.6: DDP on the reduce-scatter layout owned by update cost
        from nemo_muon.megatron import bridge_layout

        bridge_layout.install(container.model, recipe.optimizer)
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain as bridge_pretrain

    bridge_pretrain(container, forward_step)
