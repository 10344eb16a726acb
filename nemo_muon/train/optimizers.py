"""The training loop's view of an optimizer: reduce gradients over data parallelism, clip, step.

`build_training_optimizer` runs every optimizer of a recipe (Muon, SOAP and the AdamW baseline) through
`nemo_muon.layerwise.WholeTensorOptimizer`: each DP rank owns whole tensors and updates them; with the
engine's ``collectives="auto"``, on gloo gradients are all-reduced and each owner broadcasts its updated tensors, on
NCCL gradients are reduce-scattered to their owners and updated tensors all-gathered (overlapped with the next
forward either way). At DP 1 the same whole-tensor optimizer runs without communication, so there is one optimizer state format and one
checkpoint path (`nemo_muon.layerwise.checkpoint`, with ``whole_tensor``) at every DP size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer


@dataclass
class StepResult:
    """What one optimizer step reports."""

    grad_norm: float
    """Global gradient norm before clipping (over all parameters, all ranks)."""
    skipped: bool
    """True when a non-finite gradient made the step a no-op."""
    optimizer_time_s: float
    """Wall time of reduce + clip + update (+ any non-overlapped parameter gather)."""


class TrainingOptimizer:
    """Clip the global grad norm and step the whole-tensor optimizer; `wait_params()` finishes a pending gather."""

    def __init__(self, whole_tensor: WholeTensorOptimizer, *, grad_clip: float) -> None:
        self.whole_tensor = whole_tensor
        self.grad_clip = grad_clip

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.whole_tensor.param_groups

    def zero_grad(self) -> None:
        self.whole_tensor.zero_grad(set_to_none=True)

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        if self.grad_clip > 0:
            norm = self.whole_tensor.clip_grad_norm_(self.grad_clip)
        else:
            norm = self.whole_tensor.global_grad_norm()
        self.whole_tensor.step()
        return StepResult(grad_norm=norm, skipped=self.whole_tensor.last_step_skipped,
                          optimizer_time_s=time.perf_counter() - t0)

    def wait_params(self) -> None:
        """Finish any pending parameter gather (before the model is read outside a forward pass)."""
        self.whole_tensor.finish_param_gather()


def build_training_optimizer(recipe: TrainingRecipe, model: torch.nn.Module, *, group: Any) -> TrainingOptimizer:
    """The recipe's optimizer (Muon, SOAP or AdamW), layer-wise over ``group`` (None = one process)."""
    whole_tensor = WholeTensorOptimizer(model, recipe.optimizer, dp_group=group, overlap_param_gather=True)
    return TrainingOptimizer(whole_tensor, grad_clip=recipe.trainer.grad_clip)
