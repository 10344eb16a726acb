"""The training loop's view of an optimizer: reduce gradients over data parallelism, clip, step.

`build_training_optimizer` runs every optimizer of a recipe (Muon, SOAP and the AdamW baseline) through
`nemo_muon.layerwise.LayerWiseDistributedOptimizer`: each DP rank owns whole tensors, gradients are
reduce-scattered to their owners, owners update, updated tensors are all-gathered (overlapped with the next
forward). At DP 1 the same engine runs without communication, so there is one optimizer state format and one
checkpoint path (`nemo_muon.layerwise.checkpoint`) at every DP size.

The wrapper exposes a small interface: `param_groups`, `zero_grad()`, `step() -> StepResult`, `wait_params()`
(finish any pending parameter gather before the model is read outside a forward pass) and `engine` (for
checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from nemo_muon.config.recipe import TrainingRecipe


@dataclass
class StepResult:
    """What one optimizer step reports."""

    grad_norm: float
    """Global gradient norm before clipping (over all parameters, all ranks)."""
    skipped: bool
    """True when a non-finite gradient made the step a no-op."""
    optimizer_time_s: float
    """Wall time of reduce + clip + update (+ any non-overlapped parameter gather)."""


class TrainingOptimizer(Protocol):
    param_groups: list[dict[str, Any]]
    engine: Any

    def zero_grad(self) -> None: ...
    def step(self) -> StepResult: ...
    def wait_params(self) -> None: ...


def optimizer_kind(recipe: TrainingRecipe, dp: int) -> str:
    """How `build_training_optimizer` runs this recipe's optimizer: always 'layerwise' (at DP 1 without
    communication), so checkpoints have one format at every DP size and for every optimizer."""
    return "layerwise"


def build_training_optimizer(recipe: TrainingRecipe, model: torch.nn.Module, *, group: Any) -> TrainingOptimizer:
    """The recipe's optimizer, wired for data parallelism over ``group`` (None = one process)."""
    from nemo_muon.train.layerwise_adapter import build_layerwise

    return build_layerwise(recipe, model, group=group)
