"""Muon / SOAP through `nemo_muon.layerwise.LayerWiseDistributedOptimizer`, as a `TrainingOptimizer`.

Each DP rank owns whole tensors (LPT over Newton–Schulz cost), gradients are reduce-scattered to owners, owners
update, and the updated tensors are all-gathered, overlapped with the next forward (``overlap_param_gather``).
Checkpoints hold the merged, name-keyed state of all ranks, so they load at any DP size (including 1, where the
same engine runs with no communication).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.layerwise.optimizer import LayerWiseDistributedOptimizer
from nemo_muon.train.optimizers import StepResult


def merge_shards(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """One DP-independent state dict from the per-rank shards of `LayerWiseDistributedOptimizer.state_dict()`."""
    merged = dict(shards[0], state={}, masters={}, owned=[])
    for s in shards:
        merged["state"].update(s["state"])
        merged["masters"].update(s["masters"])
        merged["owned"] += s["owned"]
    missing = sorted(set(merged["names"]) - set(merged["owned"]))
    if missing:
        raise ValueError(f"layer-wise optimizer shards must cover every parameter; unowned: {missing[:5]}")
    return merged


class LayerwiseTrainingOptimizer:
    """Adapter: clip the global grad norm, step, and gather/merge state for checkpoints."""

    def __init__(self, engine: LayerWiseDistributedOptimizer, *, group: Any, grad_clip: float) -> None:
        self.engine = engine
        self.group = group
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

    def state_dict(self) -> dict[str, Any]:
        """The merged state of all ranks (a collective; every rank gets the full dict)."""
        shard = self.engine.state_dict()
        if self.group is None:
            return merge_shards([shard])
        shards: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(shards, shard, group=self.group)
        return merge_shards(shards)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)

    def wait_params(self) -> None:
        self.engine.finish_param_gather()


def build_layerwise(recipe: TrainingRecipe, model: torch.nn.Module, *, group: Any) -> LayerwiseTrainingOptimizer:
    """The recipe's Muon / SOAP run layer-wise over ``group`` (None = one rank, no communication)."""
    engine = LayerWiseDistributedOptimizer(model, recipe.optimizer, dp_group=group, overlap_param_gather=True)
    return LayerwiseTrainingOptimizer(engine, group=group, grad_clip=recipe.trainer.grad_clip)
