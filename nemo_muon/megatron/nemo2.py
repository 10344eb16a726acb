"""NeMo 2 (NeMo 2.7, NGC 26.02) optimizer modules and optimizer recipes for every registered optimizer.

In NeMo's own idiom (``nemo/collections/llm/recipes/optim/adam.py``): a recipe function returns
``run.Config[EmergingOptimizerModule]`` with the LR scheduler inside, so it serializes with NeMo-Run (YAML, zlib-JSON)
and NeMo's ``io_dump`` (a checkpoint's ``context/``), and the schedule travels with it::

    from nemo.collections import llm
    from nemo_muon.megatron.nemo2 import muon_with_cosine_annealing

    recipe = llm.llama3_8b.pretrain_recipe(num_nodes=1, num_gpus_per_node=8)
    recipe.optim = muon_with_cosine_annealing(max_lr=3e-4, warmup_steps=2000)

NeMo's `MegatronStrategy` copies ``use_distributed_optimizer`` from the module's Megatron config to its DDP config
(off for Muon/SOAP, which own whole matrices per data-parallel rank; on for AdamW), as for NeMo's own Adam.

The recipes ``<name>_with_cosine_annealing`` and ``<name>_with_wsd`` are generated for every optimizer of the registry
(`optimizer_recipes`, `OPTIMIZER_RECIPES`: ``muon_*``, ``soap_*``, ``adamw_*``, ``normuon_*``, ...); an optimizer
added to the registry needs no line here.

`EmergingOptimizerModule` is a module-level `MegatronOptimizerModule` subclass. Its arguments are our validated
optimizer config (`MuonConfig` / `SoapConfig` / `AdamWConfig` / ..., the single source of every optimizer value), the
scheduler and the clip; the Megatron-Core `OptimizerConfig` NeMo's machinery reads (``self.config``) is derived from
them by the tested mapping (`nemo_muon.megatron.shared.optimizer_config`). ``optimizers()`` builds through
`nemo_muon.megatron.shared.build`, never through NeMo 2.7's ``setup_megatron_optimizer`` (it passes
``no_weight_decay_cond`` / ``scale_lr_cond`` / ``lr_mult``, which neither Megatron-Core 0.16.0 nor 0.19.2 accepts).

No ``from __future__ import annotations`` here: NeMo-Run evaluates a factory's return annotation itself.
This module needs NeMo 2.7 (``import nemo_muon.megatron.nemo2`` raises ImportError naming what to install otherwise).
"""

import dataclasses
import inspect
from typing import Any

from nemo_muon.config.optimizer import DEFAULT_WEIGHT_DECAY, BaseOptimizerConfig
from nemo_muon.megatron.shared.build import build_from_megatron_config, mpu_process_groups
from nemo_muon.megatron.shared.optimizer_config import ddp_flags, to_megatron_optimizer_config
from nemo_muon.registry import OptimizerSpec, is_registered, specs

try:
    import nemo_run as run
    from nemo.core.optim import McoreDistributedOptimizer
    from nemo.lightning.pytorch.optim.base import OptimizerModule
    from nemo.lightning.pytorch.optim.lr_scheduler import CosineAnnealingScheduler, WarmupHoldAnnealScheduler
    from nemo.lightning.pytorch.optim.megatron import MegatronOptimizerModule
except ImportError as e:  # pragma: no cover - exercised in environments without NeMo
    raise ImportError(
        "nemo_muon.megatron.nemo2 needs NeMo 2.7 with its LLM collection (nemo_toolkit 2.7.x and nemo_run, as in the "
        f"NGC nemo:26.02 container); importing it failed: {e}"
    ) from e

WSD_DECAY_SCHEDULES: tuple[str, ...] = ("linear", "one_minus_square_root")
"""Decay shapes of NeMo's WarmupHoldAnnealScheduler (warmup-stable-decay)."""


class MegatronCoreOptimizer(McoreDistributedOptimizer):
    """NeMo's wrapper of a Megatron-Core optimizer; checkpoint keyword arguments are passed only where accepted.

    NeMo's strategy calls ``sharded_state_dict(..., metadata=...)``; Megatron-Core's optimizers of 0.16 and 0.19
    differ in which of ``metadata`` / ``sharding_type`` they take, so unknown ones are dropped here rather than
    raising a TypeError at the first checkpoint.
    """

    def sharded_state_dict(self, model_sharded_state_dict: Any, optimizer_state_dict: Any = None,
                           is_loading: bool = False, dist_ckpt_parallel_save: Any = None, **kwargs: Any) -> Any:
        params = inspect.signature(self.mcore_optimizer.sharded_state_dict).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        accepted = {k: v for k, v in kwargs.items() if takes_any or k in params}
        return self.mcore_optimizer.sharded_state_dict(model_sharded_state_dict, is_loading=is_loading, **accepted)


def apply_param_group_multipliers(param_groups: list[dict[str, Any]]) -> None:
    """Fold Megatron's per-group ``lr_mult`` / ``wd_mult`` into ``lr`` / ``weight_decay`` once.

    NeMo's schedulers set ``lr`` on each group and know nothing of the multipliers Megatron-Core puts on param
    groups (its own scheduler applies them); like NeMo's AdamW path (``nemo.lightning._strategy_lib``), the multiplier
    is applied to the base values, which are kept as ``pre_mult_lr`` / ``pre_mult_wd``, and the multipliers move to
    ``pre_lr_mult`` / ``pre_wd_mult``, where Megatron-Core's checkpoint load matches param groups by them. A group
    that already has them (a resumed optimizer) is left.
    """
    for group in param_groups:
        if "pre_mult_lr" in group:
            continue
        group["pre_mult_lr"], group["pre_mult_wd"] = group["lr"], group["weight_decay"]
        group["pre_lr_mult"], group["pre_wd_mult"] = group.pop("lr_mult", 1.0), group.pop("wd_mult", 1.0)
        group["lr"] = group["lr"] * group["pre_lr_mult"]
        group["weight_decay"] = group["weight_decay"] * group["pre_wd_mult"]


class EmergingOptimizerModule(MegatronOptimizerModule):
    """NeMo 2 optimizer module for nemo-muon's optimizer configs on Megatron-Core (0.16 and 0.18+).

    Args:
        optimizer: a registered optimizer config (`nemo_muon.registry`: Muon, SOAP, AdamW, NorMuon, ...).
        lr_scheduler: a NeMo LR scheduler module (NeMo's recipes put one here; None keeps lr constant).
        grad_clip: global gradient-norm clip.
        min_lr: Megatron's ``min_lr`` field (the scheduler module has its own).
        layerwise: Muon/SOAP with whole matrices per data-parallel rank (Megatron's layer-wise optimizer).
        bf16: the model's parameters are bf16 (NeMo's ``bf16-mixed``).
    """

    def __init__(self, optimizer: BaseOptimizerConfig, lr_scheduler: Any = None, grad_clip: float = 1.0,
                 min_lr: float | None = None, layerwise: bool = True, bf16: bool = True) -> None:
        if not is_registered(optimizer):
            raise ValueError(f"optimizer must be a registered optimizer config (nemo_muon.registry); got {optimizer!r}")
        config, self.spec = to_megatron_optimizer_config(optimizer, grad_clip=grad_clip, min_lr=min_lr,
                                                         layerwise=layerwise, bf16=bf16)
        super().__init__(config, lr_scheduler=lr_scheduler)
        self.optimizer_config = optimizer

    def optimizers(self, model: Any) -> list[Any]:
        """Build the Megatron-Core optimizer over the model's DDP-wrapped chunks (``[m.module for m in model]``)."""
        chunks = [m.module for m in model]
        flags = ddp_flags(self.optimizer_config)
        want = flags["use_distributed_optimizer"]
        for chunk in chunks:
            ddp_config = getattr(chunk, "ddp_config", None)
            have = getattr(ddp_config, "use_distributed_optimizer", want)
            if have != want:
                raise ValueError(
                    f"trainer.strategy.ddp.use_distributed_optimizer must be {want} for optimizer "
                    f"{self.optimizer_config.name!r} ({'ZeRO-1 Adam' if want else 'whole matrices per DP rank'}); "
                    f"got {have} (NeMo's MegatronStrategy copies it from optim.config.use_distributed_optimizer="
                    f"{self.config.use_distributed_optimizer}; something changed it afterwards)")
            if not flags["check_for_nan_in_grad"] and getattr(ddp_config, "check_for_nan_in_grad", False):
                raise ValueError(
                    f"trainer.strategy.ddp.check_for_nan_in_grad must be False for {self.optimizer_config.name}."
                    "nonfinite='skip'; got True: DDP's check raises on the one rank that sees a NaN gradient, "
                    "before the step could be skipped on every rank (set it False in the strategy's "
                    "DistributedDataParallelConfig, or use nonfinite='raise')")
        # the layer-wise optimizer's groups come from Megatron's parallel_state, which NeMo's strategy initialized
        # (Megatron-Core 0.16's own Muon builder reads them itself)
        pg_collection = (mpu_process_groups()
                         if self.spec.layer_wise and self.spec.builder != "get_megatron_muon_optimizer" else None)
        mcore_opt = build_from_megatron_config(self.optimizer_config, self.config, self.spec, chunks,
                                               pg_collection=pg_collection)
        apply_param_group_multipliers(mcore_opt.param_groups)
        return [MegatronCoreOptimizer(mcore_opt)]


def optimizer_recipe(fn: Any) -> Any:
    """Register an optimizer recipe with NeMo-Run for NeMo's ``optim`` arguments (annotated `OptimizerModule`), so
    ``nemo llm pretrain --factory llama3_8b optim=muon_with_cosine_annealing`` finds it."""
    return run.cli.factory(fn, target=OptimizerModule)


def _module(optimizer: run.Config, sched: run.Config, clip_grad: float, precision: str,
            layerwise: bool) -> run.Config[EmergingOptimizerModule]:
    if precision != "bf16-mixed":
        raise ValueError(f"precision must be 'bf16-mixed' (Megatron-Core's layer-wise optimizer is verified with bf16 "
                         f"parameters only); got {precision!r}")
    return run.Config(EmergingOptimizerModule, optimizer=optimizer, lr_scheduler=sched, grad_clip=clip_grad,
                      layerwise=layerwise, bf16=precision == "bf16-mixed")


def _cosine(max_lr: float, warmup_steps: int, constant_steps: int, min_lr: float | None,
            max_steps: int | None) -> run.Config[CosineAnnealingScheduler]:
    kwargs: dict[str, Any] = {"warmup_steps": warmup_steps, "constant_steps": constant_steps,
                              "min_lr": min_lr if min_lr is not None else 0.1 * max_lr}
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    return run.Config(CosineAnnealingScheduler, **kwargs)


def _wsd(max_lr: float, warmup_ratio: float, hold_ratio: float, decay_schedule: str, min_lr: float | None,
         max_steps: int | None) -> run.Config[WarmupHoldAnnealScheduler]:
    if decay_schedule not in WSD_DECAY_SCHEDULES:
        raise ValueError(f"decay_schedule must be one of {WSD_DECAY_SCHEDULES}; got {decay_schedule!r}")
    if not (0 <= warmup_ratio and 0 <= hold_ratio and warmup_ratio + hold_ratio <= 1):
        raise ValueError(f"warmup_ratio + hold_ratio must lie in [0, 1] with both >= 0; got warmup_ratio={warmup_ratio}"
                         f", hold_ratio={hold_ratio}")
    kwargs: dict[str, Any] = {"warmup_ratio": warmup_ratio, "hold_ratio": hold_ratio, "decay_schedule": decay_schedule,
                              "min_lr": min_lr if min_lr is not None else 0.1 * max_lr}
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    return run.Config(WarmupHoldAnnealScheduler, **kwargs)


def optimizer_config(spec: OptimizerSpec, max_lr: float, weight_decay: float, adam_beta1: float | None,
                     adam_beta2: float | None, adam_eps: float | None, fields: dict[str, Any]) -> run.Config:
    """``run.Config`` of ``spec``'s config, validated now (naming the field) rather than when the trainer builds it:
    the registry entry's megatron ``recipe_defaults``, the rate and weight decay, NeMo's Adam arguments on the fields
    of Megatron's Adam (``spec.megatron.adam_fields``; None keeps the config's), then the config ``fields`` given."""
    values: dict[str, Any] = {**spec.megatron.recipe_defaults, "lr": max_lr, "weight_decay": weight_decay}
    betas_field, eps_field = spec.megatron.adam_fields
    if adam_beta1 is not None or adam_beta2 is not None:
        defaults = {f.name: f.default for f in dataclasses.fields(spec.config_class)}[betas_field]
        values[betas_field] = (defaults[0] if adam_beta1 is None else adam_beta1,
                               defaults[1] if adam_beta2 is None else adam_beta2)
    if adam_eps is not None:
        values[eps_field] = adam_eps
    values.update(fields)
    spec.config_class(**values)
    return run.Config(spec.config_class, **values)


def _described(spec: OptimizerSpec, schedule: str) -> str:
    what = (f"Layer-wise {spec.label} (Megatron's Adam for embeddings, output layer, norms, biases)"
            if spec.matrix is not None else f"Megatron's distributed (ZeRO-1) {spec.label}, the baseline")
    return (f"{what} with {schedule}. Generated from its registry entry (`nemo_muon.registry`): ``adam_beta1`` / "
            f"``adam_beta2`` / ``adam_eps`` set Megatron's Adam (None: the config's), any other keyword is a field "
            f"of `{spec.config_class.__name__}`; ``layerwise`` applies to a matrix optimizer.")


def optimizer_recipes(spec: OptimizerSpec) -> tuple[Any, Any]:
    """``<name>_with_cosine_annealing`` and ``<name>_with_wsd`` of a registered optimizer (NeMo's idiom: like
    ``distributed_fused_adam_with_cosine_annealing``), not yet registered with NeMo-Run (`optimizer_recipe`)."""

    def with_cosine_annealing(
        precision: str = "bf16-mixed",
        warmup_steps: int = 2000,
        constant_steps: int = 0,
        max_lr: float = 1e-4,
        min_lr: float | None = None,
        weight_decay: float = DEFAULT_WEIGHT_DECAY,
        adam_beta1: float | None = None,
        adam_beta2: float | None = None,
        adam_eps: float | None = None,
        clip_grad: float = 1.0,
        max_steps: int | None = None,
        layerwise: bool = True,
        **fields: Any,
    ) -> run.Config[EmergingOptimizerModule]:
        config = optimizer_config(spec, max_lr, weight_decay, adam_beta1, adam_beta2, adam_eps, fields)
        return _module(config, _cosine(max_lr, warmup_steps, constant_steps, min_lr, max_steps), clip_grad,
                       precision, layerwise and spec.matrix is not None)

    def with_wsd(
        precision: str = "bf16-mixed",
        warmup_ratio: float = 0.01,
        hold_ratio: float = 0.79,
        decay_schedule: str = "linear",
        max_lr: float = 1e-4,
        min_lr: float | None = None,
        weight_decay: float = DEFAULT_WEIGHT_DECAY,
        adam_beta1: float | None = None,
        adam_beta2: float | None = None,
        adam_eps: float | None = None,
        clip_grad: float = 1.0,
        max_steps: int | None = None,
        layerwise: bool = True,
        **fields: Any,
    ) -> run.Config[EmergingOptimizerModule]:
        config = optimizer_config(spec, max_lr, weight_decay, adam_beta1, adam_beta2, adam_eps, fields)
        return _module(config, _wsd(max_lr, warmup_ratio, hold_ratio, decay_schedule, min_lr, max_steps), clip_grad,
                       precision, layerwise and spec.matrix is not None)

    for fn, kind, schedule in (
            (with_cosine_annealing, "with_cosine_annealing", "warmup and cosine annealing to ``min_lr`` (default "
                                                             "0.1 x max_lr)"),
            (with_wsd, "with_wsd", "warmup-stable-decay (NeMo's WarmupHoldAnnealScheduler): linear warmup over "
                                   "``warmup_ratio`` of the steps, ``max_lr`` held for ``hold_ratio``, then decay to "
                                   "``min_lr``")):
        fn.__name__ = fn.__qualname__ = f"{spec.name}_{kind}"
        fn.__module__ = __name__
        fn.__doc__ = _described(spec, schedule)
    return with_cosine_annealing, with_wsd


def _publish() -> tuple[str, ...]:
    """Every registered optimizer's recipes, as names of this module registered with NeMo-Run."""
    published = []
    for spec in specs():
        for fn in optimizer_recipes(spec):
            globals()[fn.__name__] = optimizer_recipe(fn)
            published.append(fn.__name__)
    return tuple(published)


OPTIMIZER_RECIPES: tuple[str, ...] = _publish()
"""``<name>_with_cosine_annealing`` / ``<name>_with_wsd`` of every optimizer registered when this module loaded
(``muon_with_cosine_annealing``, ``adamw_with_wsd``, ...)."""


__all__ = ["EmergingOptimizerModule", "MegatronCoreOptimizer", "OPTIMIZER_RECIPES", "apply_param_group_multipliers",
           "optimizer_config", "optimizer_recipes", *OPTIMIZER_RECIPES]
