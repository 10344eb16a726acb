"""The training state a checkpoint carries besides weights and optimizer state, and the checks made on resume.

`training_state` is the ``extra`` of every torch-backend checkpoint: plain data only (numbers, strings, lists,
dicts and one tensor, the RNG state), so `nemo_muon.layerwise.checkpoint` reads it with ``weights_only=True``.
`restore_training_state` refuses (`RunRefused`, naming the field, both values and the fix) a checkpoint of another
optimizer, data order or learning-rate schedule, and any change of an optimizer hyper-parameter unless
``checkpoint.allow_optimizer_change`` opts in; the changes it let through are returned for the metrics.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.train.data import TokenData
from nemo_muon.train.refusals import RunRefused

TRAINING_STATE_FORMAT = "nemo_muon.train.state/2"
"""/2 adds ``optimizer_settings``; /1 checkpoints resume only with checkpoint.allow_optimizer_change=true."""
_FORMAT_1 = "nemo_muon.train.state/1"
_OPT_IN = "checkpoint.allow_optimizer_change=true"


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues, and which optimizer settings it changed (with the user's opt-in)."""

    step: int
    """The first step to run (the checkpoint's step)."""
    source: str
    """The checkpoint folder."""
    elapsed_s: float
    """The run's metrics time at the checkpoint."""
    optimizer_changes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``{"optimizer.lr": {"checkpoint": 0.02, "now": 0.01}, ...}``; empty when nothing changed."""


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def optimizer_settings(recipe: TrainingRecipe) -> dict[str, Any]:
    """Every optimizer hyper-parameter of the recipe by override key (``optimizer.<field>``, tuples as lists),
    and ``trainer.grad_clip`` (part of the optimizer step)."""
    opt = recipe.optimizer
    out = {f"optimizer.{f.name}": _plain(getattr(opt, f.name)) for f in dataclasses.fields(opt) if f.init}
    out["trainer.grad_clip"] = recipe.trainer.grad_clip
    return out


def schedule_settings(recipe: TrainingRecipe) -> dict[str, Any]:
    """Everything the learning rate of a step depends on besides the step (the schedule is a function of it)."""
    s = recipe.scheduler
    return {"kind": s.kind, "warmup_steps": s.warmup_steps, "min_lr_ratio": s.min_lr_ratio,
            "wsd_decay_fraction": s.wsd_decay_fraction, "max_steps": recipe.trainer.max_steps}


def training_state(recipe: TrainingRecipe, step: int, world: int, data: TokenData,
                   elapsed_s: float) -> dict[str, Any]:
    """The ``extra`` of a checkpoint after ``step`` steps: what resuming needs besides weights and optimizer state.

    The data position is the next step (batches are a function of seed and step), the scheduler is a function of
    the step (its settings are recorded and checked on resume), the optimizer settings are recorded and checked,
    the RNG is this process's torch CPU generator, ``elapsed_s`` the run's metrics time so far.
    """
    t = recipe.trainer
    return {
        "format": TRAINING_STATE_FORMAT, "step": step, "recipe": recipe.name, "optimizer": recipe.optimizer.name,
        "world_size": world,
        "data": {"fingerprint": data.info["fingerprint"], "next_step": step, "seed": t.seed,
                 "global_batch_size": t.global_batch_size, "seq_length": t.seq_length},
        "scheduler": schedule_settings(recipe),
        "optimizer_settings": optimizer_settings(recipe),
        "rng": {"torch_cpu": torch.get_rng_state()}, "elapsed_s": float(elapsed_s),
    }


def optimizer_changes(saved: dict[str, Any], recipe: TrainingRecipe) -> dict[str, dict[str, Any]]:
    """The settings whose value in ``recipe`` differs from ``saved`` (a checkpoint's ``optimizer_settings``)."""
    now = optimizer_settings(recipe)
    return {k: {"checkpoint": saved.get(k), "now": now.get(k)} for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)}


def _check_optimizer(extra: dict[str, Any], recipe: TrainingRecipe, path: Path) -> dict[str, dict[str, Any]]:
    allowed = recipe.checkpoint.allow_optimizer_change
    if extra.get("format") == _FORMAT_1:
        if not allowed:
            raise RunRefused(f"checkpoint {str(path)!r} (training state {_FORMAT_1!r}) does not record the optimizer "
                             "hyper-parameters, so an unchanged resume cannot be checked; set "
                             f"{_OPT_IN} to resume it with this recipe's values")
        return {k: {"checkpoint": "unrecorded", "now": v} for k, v in optimizer_settings(recipe).items()}
    changes = optimizer_changes(extra["optimizer_settings"], recipe)
    if changes and not allowed:
        listed = "; ".join(f"{k} must equal the checkpoint's {v['checkpoint']!r} to resume, got {v['now']!r}"
                           for k, v in changes.items())
        raise RunRefused(f"{listed} (checkpoint {str(path)!r}). Resume with the checkpoint's values, or set "
                         f"{_OPT_IN} to continue with the new ones (recorded in metrics.jsonl)")
    return changes


def restore_training_state(extra: dict[str, Any], recipe: TrainingRecipe, data: TokenData,
                           path: Path) -> ResumePoint:
    """Check a loaded checkpoint's training state against this run, restore the RNG; where to resume."""
    if extra.get("format") not in (TRAINING_STATE_FORMAT, _FORMAT_1):
        raise RunRefused(f"checkpoint {str(path)!r} must hold training state {TRAINING_STATE_FORMAT!r} in its extra "
                         f"(saved by the training loop); got format {extra.get('format')!r}")
    if extra["optimizer"] != recipe.optimizer.name:
        raise RunRefused(f"optimizer.name must match the checkpoint's optimizer {extra['optimizer']!r} to resume; "
                         f"got {recipe.optimizer.name!r}")
    saved = extra["data"]
    if saved["fingerprint"] != data.info["fingerprint"]:
        raise RunRefused(f"checkpoint data fingerprint must match this run's data "
                         f"{data.info['fingerprint']!r}; got {saved['fingerprint']!r}")
    t = recipe.trainer
    for name, value in (("seed", t.seed), ("global_batch_size", t.global_batch_size), ("seq_length", t.seq_length)):
        if saved[name] != value:
            raise RunRefused(f"trainer.{name} must equal the checkpoint's {saved[name]} to continue its data order; "
                             f"got {value}")
    for name, value in schedule_settings(recipe).items():
        section = "trainer" if name == "max_steps" else "scheduler"
        if extra["scheduler"].get(name) != value:
            raise RunRefused(f"{section}.{name} must equal the checkpoint's {extra['scheduler'].get(name)!r} to "
                             f"continue its learning-rate schedule; got {value!r}")
    changes = _check_optimizer(extra, recipe, path)
    torch.set_rng_state(extra["rng"]["torch_cpu"])
    return ResumePoint(step=int(saved["next_step"]), source=str(path), elapsed_s=float(extra.get("elapsed_s", 0.0)),
                       optimizer_changes=changes)
