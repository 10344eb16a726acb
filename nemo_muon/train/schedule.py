"""The learning-rate schedule of `SchedulerConfig` (linear warmup, then cosine / WSD / constant), and the torch LR
scheduler that applies it: the one owner of the rate. It sets absolute rates on the optimizer's param groups;
whatever reads the rate (the metrics) reads it back from those groups."""

from __future__ import annotations

import math

import torch

from nemo_muon.config.recipe import SchedulerConfig


def lr_multiplier(cfg: SchedulerConfig, step: int, max_steps: int) -> float:
    """The factor on the peak learning rate for optimizer step ``step`` (0-based) of ``max_steps``.

    Warmup: (step + 1) / warmup_steps for the first warmup_steps steps. Then
    - cosine: from 1 down to min_lr_ratio at the last step,
    - wsd: 1 until the last wsd_decay_fraction of the steps, then linear down to min_lr_ratio at the last step,
    - constant: 1.
    """
    if not (0 <= step < max_steps):
        raise ValueError(f"step must be in [0, {max_steps}); got {step}")
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    last = max_steps - 1
    if cfg.kind == "cosine":
        span = last - cfg.warmup_steps
        progress = 1.0 if span <= 0 else (step - cfg.warmup_steps) / span
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    decay_steps = max(1, round(cfg.wsd_decay_fraction * max_steps))
    decay_start = max(cfg.warmup_steps, max_steps - decay_steps)
    if step < decay_start:
        return 1.0
    span = last - decay_start
    progress = 1.0 if span <= 0 else (step - decay_start) / span
    return 1.0 - (1.0 - cfg.min_lr_ratio) * progress


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, max_steps: int, *, peak_lr: float,
                       start_step: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """torch's ``LambdaLR`` over ``optimizer`` for ``cfg``: every group's ``initial_lr`` is ``peak_lr`` and its
    ``lr`` is set to ``peak_lr * lr_multiplier(cfg, start_step, max_steps)``, the absolute rate of optimizer step
    ``start_step`` (0-based; a resumed run passes the checkpoint's step). Call ``.step()`` after each optimizer step;
    at and after the end of the schedule the rate stays at the last step's."""
    if not (0 <= start_step <= max_steps):
        raise ValueError(f"start_step must be in [0, {max_steps}]; got {start_step}")
    for group in optimizer.param_groups:
        group["initial_lr"] = peak_lr
    last = max_steps - 1
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(cfg, min(step, last), max_steps), last_epoch=start_step - 1)
