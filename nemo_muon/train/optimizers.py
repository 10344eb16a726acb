"""The training loop's view of an optimizer: reduce gradients over data parallelism, clip, step, checkpoint.

`build_training_optimizer` picks, from the recipe:
- Muon / SOAP with ``recipe.layerwise``: `nemo_muon.layerwise`'s LayerWiseDistributedOptimizer (each rank
  orthogonalizes whole matrices it owns, then parameters are gathered);
- otherwise (AdamW, or layerwise=False): `ReplicatedOptimizer` = gradients all-reduced (averaged) over the DP group,
  the global norm clipped, and the same optimizer stepped on every rank (DDP semantics).

Every wrapper exposes the same small interface: `param_groups`, `zero_grad()`, `step() -> StepResult`,
`state_dict()` / `load_state_dict()` (full, DP-independent state) and `wait_params()` (finish any pending
parameter gather before the model is read outside a forward pass).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from nemo_muon.config.optimizer import AdamWConfig
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

    def zero_grad(self) -> None: ...
    def step(self) -> StepResult: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def wait_params(self) -> None: ...


def base_optimizer(recipe: TrainingRecipe, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The single-replica optimizer of a recipe: `nemo_muon.optim.build_optimizer` on the model's named params."""
    from nemo_muon.optim import build_optimizer

    return build_optimizer(recipe.optimizer, list(model.named_parameters()))


class ReplicatedOptimizer:
    """DDP-style: average gradients over ``group``, clip the global norm, step the same optimizer on every rank.

    ``group=None`` is a single process (no communication). The gradient all-reduce is flattened into one
    buffer per dtype so gloo sends one message per step.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], *,
                 group: Any, grad_clip: float) -> None:
        self.optimizer = optimizer
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.grad_clip = grad_clip
        self.world = dist.get_world_size(group) if group is not None else 1

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)

    def _reduce_grads(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.world == 1:
            return
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        self._reduce_grads()
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in self.params]))
        grad_norm = float(norm)
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            if self.grad_clip > 0 and grad_norm > self.grad_clip:
                scale = self.grad_clip / (grad_norm + 1e-6)
                for p in self.params:
                    p.grad.mul_(scale)
            self.optimizer.step()
        return StepResult(grad_norm=grad_norm, skipped=skipped, optimizer_time_s=time.perf_counter() - t0)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "replicated", "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "replicated":
            raise ValueError(f"optimizer checkpoint kind must be 'replicated' for this run; got {state.get('kind')!r}")
        self.optimizer.load_state_dict(state["optimizer"])

    def wait_params(self) -> None:
        return None


def optimizer_kind(recipe: TrainingRecipe, dp: int) -> str:
    """'layerwise' or 'replicated': how `build_training_optimizer` runs this recipe's optimizer.

    Muon / SOAP with ``recipe.layerwise`` always use the layer-wise engine (at DP 1 it runs without communication),
    so their checkpoints have one format at every DP size; AdamW is the DDP baseline.
    """
    if isinstance(recipe.optimizer, AdamWConfig) or not recipe.layerwise:
        return "replicated"
    return "layerwise"


def build_training_optimizer(recipe: TrainingRecipe, model: torch.nn.Module, *, group: Any) -> TrainingOptimizer:
    """The recipe's optimizer, wired for data parallelism over ``group`` (None = one process)."""
    dp = dist.get_world_size(group) if group is not None else 1
    if optimizer_kind(recipe, dp) == "layerwise":
        from nemo_muon.train.layerwise_adapter import build_layerwise

        return build_layerwise(recipe, model, group=group)
    opt = base_optimizer(recipe, model)
    return ReplicatedOptimizer(opt, list(model.parameters()), group=group, grad_clip=recipe.trainer.grad_clip)
