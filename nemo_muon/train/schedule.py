"""Learning-rate multiplier of a step from `SchedulerConfig`: linear warmup, then cosine / WSD / constant."""

from __future__ import annotations

import math

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
