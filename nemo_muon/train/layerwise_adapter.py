"""Every optimizer of a recipe through `nemo_muon.layerwise.LayerWiseDistributedOptimizer`, as a `TrainingOptimizer`.

Each DP rank owns whole tensors (LPT over update cost), gradients are reduce-scattered to owners, owners update,
and the updated tensors are all-gathered, overlapped with the next forward (``overlap_param_gather``).
Checkpoints go through `nemo_muon.layerwise.checkpoint` with ``engine`` (sharded by name, loadable at any DP size).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.layerwise.optimizer import LayerWiseDistributedOptimizer
from nemo_muon.train.optimizers import StepResult


class LayerwiseTrainingOptimizer:
    """Adapter: clip the global grad norm and step the layer-wise engine."""

    def __init__(self, engine: LayerWiseDistributedOptimizer, *, grad_clip: float) -> None:
        self.engine = engine
        self.grad_clip = grad_clip

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.engine.param_groups

    def zero_grad(self) -> None:
        self.engine.zero_grad(set_to_none=True)

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        if self.grad_clip > 0:
            norm = self.engine.clip_grad_norm_(self.grad_clip)
        else:
            norm = self.engine.global_grad_norm()
        self.engine.step()
        return StepResult(grad_norm=norm, skipped=self.engine.last_step_skipped,
                          optimizer_time_s=time.perf_counter() - t0)

    def wait_params(self) -> None:
        self.engine.finish_param_gather()


def build_layerwise(recipe: TrainingRecipe, model: torch.nn.Module, *, group: Any) -> LayerwiseTrainingOptimizer:
    """The recipe's optimizer (Muon, SOAP or AdamW) run layer-wise over ``group`` (None = one rank)."""
    engine = LayerWiseDistributedOptimizer(model, recipe.optimizer, dp_group=group, overlap_param_gather=True)
    return LayerwiseTrainingOptimizer(engine, grad_clip=recipe.trainer.grad_clip)
