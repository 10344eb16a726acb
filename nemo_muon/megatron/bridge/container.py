"""The megatron backend on every Megatron-Bridge generation: a `TrainingRecipe` -> Bridge's `ConfigContainer` ->
Bridge's `pretrain`.

The container-stack test environments build every megatron recipe's real `ConfigContainer` and run what Bridge's
`pretrain()` runs on it first (`runtime_config_update`: mixed precision, comm overlap, `validate()`).
`build_config_container` and `pretrain` import Bridge lazily:

1. the installed Bridge generation's base (`nemo_muon.megatron.generations.BridgeGeneration.base_container`):
   the library recipe with the release's perf-script fields mirrored as data on Bridge 0.3
   (`nemo_muon.megatron.bridge_03.library_recipe`) and 0.4 / 0.5 (`nemo_muon.megatron.bridge_04_05.library_recipe`),
   Bridge 0.6's own perf recipe (`nemo_muon.megatron.bridge_06.perf_recipes`); the model read offline from the
   Hugging Face config nemo-muon ships, or ``recipe.hf_config`` (`nemo_muon.megatron.bridge.hf_config`);
2. our layout, batch, schedule, data, checkpoint and logging settings (`bridge_field_overrides`) are set field by
   field (a field the installed Bridge lacks raises; nothing is dropped); where ours differ on purpose from the base
   the field is in that generation's deliberate-differences table (docs/recipes.md prints them);
3. the optimizer is replaced by our mapping (`nemo_muon.megatron.shared.optimizer_config`), as the generation's
   engine entry wants it, and the scheduler's weight decay is set to the recipe's value (Bridge's optimizer helpers
   pin it at 0.033).

What the installed stack cannot run is refused before anything is built (`nemo_muon.megatron.shared.stack`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Any

from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.config.recipe import ParallelismConfig, TrainingRecipe
from nemo_muon.megatron.generations import bridge_generation, entry, installed_bridge_generation
from nemo_muon.megatron.shared.optimizer_config import (
    ENGINE_NEMO_MUON,
    MegatronOptimizerSpec,
    ddp_flags,
    megatron_optimizer_spec,
)
from nemo_muon.megatron.shared.stack import check_recipe_bridge, optimizer_engine
from nemo_muon.registry import spec_for

FULL_ITERATION_GRAPH = "full_iteration"
"""``model.cuda_graph_impl`` that captures the whole step (Bridge 0.6's Qwen3 MXFP8 perf recipes)."""

SCHEDULER_TO_BRIDGE: dict[str, str] = {"cosine": "cosine", "wsd": "WSD", "constant": "constant"}
MEGATRON_MODELS: tuple[str, ...] = ("kimi_k2", "qwen3_30b_a3b")
"""Model families with a Bridge base on every supported generation (each generation's folder maps them)."""
MEGATRON_PRECISIONS: tuple[str, ...] = ("bf16", "fp8_cs", "mxfp8")
"""Precisions with a Bridge preset; fp32 training is not offered by the megatron backend."""


def check_supported(recipe: TrainingRecipe) -> None:
    """Refuse a model family or precision the megatron backend has no Bridge base for, naming what it has."""
    if recipe.model.name not in MEGATRON_MODELS:
        raise ValueError(f"model must be one of {MEGATRON_MODELS} for the megatron backend (a Megatron-Bridge recipe "
                         f"of that family); got {recipe.model.name!r}")
    if recipe.precision.kind not in MEGATRON_PRECISIONS:
        raise ValueError(f"precision.kind must be one of {MEGATRON_PRECISIONS} for the megatron backend; "
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


def parallel_sizes(par: ParallelismConfig) -> dict[str, Any]:
    """The parallel sizes under the names both the Bridge library recipe and its model provider use."""
    return {
        "tensor_model_parallel_size": par.tp,
        "pipeline_model_parallel_size": par.pp,
        "virtual_pipeline_model_parallel_size": par.vp if par.vp > 1 else None,
        "context_parallel_size": par.cp,
        "expert_model_parallel_size": par.ep,
        "sequence_parallel": par.sequence_parallel,
    }


def bridge_optimizer_spec(recipe: TrainingRecipe, fields: set[str] | None = None) -> MegatronOptimizerSpec:
    """Our optimizer mapped onto Megatron-Core's `OptimizerConfig` of the installed release (``fields``: its field
    names; default: read from the installed one)."""
    if fields is None:
        from megatron.core.optimizer import OptimizerConfig as MCoreOptimizerConfig

        fields = {f.name for f in dataclasses.fields(MCoreOptimizerConfig)}
    return megatron_optimizer_spec(
        recipe.optimizer, fields=fields, grad_clip=recipe.trainer.grad_clip,
        min_lr=recipe.optimizer.lr * recipe.scheduler.min_lr_ratio, layerwise=recipe.layerwise,
        bf16=recipe.precision.kind != "fp32",
    )


@dataclass(frozen=True)
class DeliberateDifference:
    """A field where a perf recipe differs from Bridge's perf scripts on purpose (docs/recipes.md prints these)."""

    field: str
    bridge: str
    ours: str
    why: str


@dataclass(frozen=True)
class DeliberateFields:
    """Fields where our `ConfigContainer` differs on purpose from what a Bridge release's perf run sets (Bridge >= 0.4;
    docs/recipes.md prints each release's table)."""

    fields: tuple[str, ...]
    """``section.field`` names this row covers (the newest-stack tests compare every field of both containers)."""
    bridge: str
    ours: str
    why: str


SAME_LAYOUT_ON_EVERY_RELEASE = ("one recipe name runs one layout on every release, so a comparison across containers "
                                "changes the software only (the 26.02 preset, Bridge r0.3's workload configs)")
"""Why a recipe keeps its layout and batch where a later release's perf preset changed them (Bridge >= 0.4 tables)."""


def bridge_field_overrides(recipe: TrainingRecipe, *, cost_layout: bool = False) -> dict[str, dict[str, Any]]:
    """ConfigContainer section -> {field: value} set on top of the generation's base container (optimizer excluded):
    where ours differ from what the base set, the field is in that generation's deliberate differences.
    ``cost_layout``: DDP on the reduce-scatter layout owned by update cost (`routes_cost_layout`).
    """
    check_supported(recipe)
    par, tr, sch, opt = recipe.parallelism, recipe.trainer, recipe.scheduler, recipe.optimizer
    is_adam = spec_for(opt).matrix is None  # element-wise: Megatron's distributed optimizer
    out: dict[str, dict[str, Any]] = {}

    def merge(section: str, values: dict[str, Any]) -> None:
        out.setdefault(section, {}).update(values)

    merge("model", {
        **parallel_sizes(par),
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
    dataset: dict[str, Any] = {"sequence_length": tr.seq_length}
    if recipe.data.kind == "indexed":  # Megatron's blend of one prefix: what Bridge 0.3's library recipe builds from
        dataset["blend"] = ([recipe.data.path], None)  # data_paths; the bases of 0.4 onwards take no data argument
    merge("dataset", dataset)
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


def set_fields(container: Any, overrides: dict[str, dict[str, Any]]) -> None:
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
                                 f"in the installed Megatron-Bridge {importlib.metadata.version('megatron-bridge')}")
            setattr(section, name, value)


def build_config_container(recipe: TrainingRecipe) -> Any:
    """The Bridge `ConfigContainer` of ``recipe`` (imports Megatron-Bridge: the NeMo container or the container-stack
    test environment). Raises before building if the installed stack cannot run the recipe's optimizer."""
    from nemo_muon.megatron.shared.stack import check_installed_stack, optimizer_engine

    recipe.validate()
    check_installed_stack(recipe.optimizer.name, optimizer_engine(recipe.optimizer))
    return config_container(recipe)


def config_container(recipe: TrainingRecipe) -> Any:
    """The `ConfigContainer` alone, without asking whether the installed optimizer stack can build the optimizer it
    names (`build_config_container` asks first; this is what it builds, and what the config tests validate)."""
    recipe.validate()
    # the rule every entry point applies before launch: a Bridge with a base, a Hugging Face config to read
    check_recipe_bridge(recipe, importlib.metadata.version("megatron-bridge"), where="the installed stack")
    check_supported(recipe)
    container = entry(installed_bridge_generation().base_container)(recipe)
    container.optimizer = bridge_optimizer_config(recipe.optimizer, bridge_optimizer_spec(recipe))
    overrides = bridge_field_overrides(recipe, cost_layout=routes_cost_layout(recipe.optimizer))
    set_fields(container, overrides)
    if getattr(container.model, "cuda_graph_impl", None) == FULL_ITERATION_GRAPH:
        # Bridge refuses the loss's NaN check inside a full-iteration CUDA graph (Bridge 0.6's Qwen3 MXFP8 recipes);
        # DDP's gradient check (ddp.check_for_nan_in_grad) still stops a diverged run at the step it diverges
        container.rerun_state_machine.check_for_nan_in_loss = False
    return container


def routes_cost_layout(opt: BaseOptimizerConfig, bridge_version: str | None = None) -> bool:
    """Whether ``opt`` trains on the cost layout inside Bridge ``bridge_version`` (default: the installed one): a
    matrix optimizer with engine 'nemo_muon' and ``collectives='reduce_scatter'`` (opted in), on a Bridge generation
    with a cost-layout entry (0.5 / 0.6); else Megatron's legacy layer-wise path (all-reduce, uneven all-gather)."""
    if optimizer_engine(opt) != ENGINE_NEMO_MUON or spec_for(opt).matrix is None:
        return False
    if getattr(opt, "collectives", "all_reduce") != "reduce_scatter":
        return False
    generation = installed_bridge_generation() if bridge_version is None else bridge_generation(bridge_version)
    return generation.cost_layout is not None


def bridge_optimizer_config(opt: BaseOptimizerConfig, spec: MegatronOptimizerSpec) -> Any:
    """``ConfigContainer.optimizer`` for ``opt`` (mapped to ``spec``) on the installed Bridge.

    Engine 'nemo_muon' where the generation's engine entry is ``provide`` (Bridge >= 0.4): the generation's
    `engine_optimizer_config` (an `EngineOptimizerConfig`, whose ``provide()`` Bridge's setup_optimizer calls).
    Otherwise Bridge's own `OptimizerConfig`, with the name Bridge dispatches on (on Bridge 0.3 engine 'nemo_muon' is
    then built by the hook `pretrain` installs, the generation's `install_engine`).
    """
    generation = installed_bridge_generation()
    if optimizer_engine(opt) == ENGINE_NEMO_MUON and generation.engine_optimizer_config is not None:
        return entry(generation.engine_optimizer_config)(opt, spec.kwargs)
    from megatron.bridge.training.config import OptimizerConfig as BridgeOptimizerConfig

    config = BridgeOptimizerConfig(**spec.kwargs)
    config.optimizer = spec.bridge_optimizer  # Bridge dispatches Megatron's Muon / SOAP on this name
    return config


def pretrain(recipe: TrainingRecipe) -> None:
    """Train ``recipe`` with Megatron-Bridge (NeMo container; one process per GPU, launched by the executor), its
    engine entered as the installed generation says. On resume, the checkpoint Bridge will load is checked first
    (`checkpoint_files.check_resume_folder`).

    The recipe's environment variables are set where the launcher has not set them already (the launcher wins)."""
    for name, value in recipe.env.items():
        os.environ.setdefault(name, value)
    if recipe.checkpoint.resume and recipe.checkpoint.dir:  # a cut or missing shard is refused by name before Bridge loads into the model
        from nemo_muon.megatron.shared.checkpoint_files import check_resume_folder

        check_resume_folder(recipe.checkpoint.dir)
    container = build_config_container(recipe)
    generation = installed_bridge_generation()
    if optimizer_engine(recipe.optimizer) == ENGINE_NEMO_MUON and generation.install_engine is not None:
        entry(generation.install_engine)(recipe.optimizer)  # Bridge 0.3: its setup_optimizer then builds ours
    if routes_cost_layout(recipe.optimizer):  # Bridge 0.5 / 0.6: DDP on the reduce-scatter layout owned by cost
        entry(generation.cost_layout)(container.model, recipe.optimizer)
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain as bridge_pretrain

    bridge_pretrain(container, forward_step)
