"""The shared skeleton of Muon and SOAP: parameter routing, the one per-parameter update loop, the AdamW part,
non-finite gradient policy, and optional fp32 master weights for bf16/fp16 parameters.

Subclasses implement ``_matrix_updates(items)``: given the matrix-routed parameters that have gradients (each as a
``MatrixItem``), return one fp32 update per item (the step is then ``p <- p·(1 - lr·wd) - lr·update``), or None for
an item that only built its state this step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from nemo_muon.optim.routing import ADAMW, ROUTE_NAMES, FusedLayout, MatrixRule, Route, resolve_layouts, route_param

_LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass
class MatrixItem:
    """One matrix-routed parameter in this step: the param, its fp32 grad, its state and group, its route."""

    param: torch.Tensor
    grad: torch.Tensor
    state: dict[str, Any]
    group: dict[str, Any]
    route: Route
    name: str


def adamw_direction(grad: torch.Tensor, state: dict[str, Any], betas: tuple[float, float], eps: float) -> torch.Tensor:
    """torch.optim.AdamW's update direction (bias-corrected m / (sqrt(v) + eps)); updates ``state`` in place."""
    if "exp_avg" not in state:
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(grad)
        state["exp_avg_sq"] = torch.zeros_like(grad)
    step = state["step"]
    if step.device.type != "cpu":  # put on a device by some loader: back to the host once, not a sync every step
        step = state["step"] = step.detach().cpu()
    step += 1
    t = step.item()  # a host tensor (as in torch.optim.AdamW): no device sync
    b1, b2 = betas
    state["exp_avg"].lerp_(grad, 1 - b1)
    state["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - b2**t)).add_(eps)
    return state["exp_avg"] / denom / (1 - b1**t)


def place_state_value(key: str, value: Any, device: torch.device) -> Any:
    """A loaded per-parameter state value, copied for a parameter on ``device``: tensors move there keeping their
    dtype, except ``step``, which stays on the host as in torch.optim (reading it for the bias corrections is then
    no device sync per parameter)."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach().clone()
    return value.cpu() if key == "step" else value.to(device)


class RoutedOptimizer(torch.optim.Optimizer):
    """Base class; see the module docstring. Not used directly."""

    label = "optimizer"

    def __init__(
        self,
        params: Iterable[Any],
        defaults: dict[str, Any],
        *,
        nonfinite: str,
        master_weights: bool,
        matrix_rule: MatrixRule | None,
        fused_layouts: Mapping[str, FusedLayout | Mapping | None] | None,
        split_qkv: bool,
        split_gate_up: bool,
        adamw_lr: float | None,
    ) -> None:
        self.nonfinite = nonfinite
        self.master_weights = bool(master_weights)
        self.last_step_skipped = False
        self.skipped_steps = 0
        self._warned_skip = False
        self._routes: dict[torch.Tensor, Route] = {}
        self._names: dict[torch.Tensor, str] = {}
        self._matrix_rule = matrix_rule
        self._layouts = resolve_layouts(fused_layouts)
        self._split_qkv, self._split_gate_up = split_qkv, split_gate_up
        defaults = {**defaults, "adamw_lr": adamw_lr}
        super().__init__(params, defaults)

    # --- routing -------------------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch.optim.Optimizer's, then routes each parameter of the group (see ``nemo_muon.optim.routing``)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._validate_group(group)
        except ValueError as err:
            self.param_groups.pop()
            raise ValueError(f"param_groups[{len(self.param_groups)}]: {err}") from None
        forced = group.get("algorithm")
        if forced is not None and forced not in ROUTE_NAMES:
            raise ValueError(f"param_groups[{len(self.param_groups) - 1}]['algorithm'] must be one of "
                             f"{ROUTE_NAMES}; got {forced!r}")
        lr, adamw_lr = group["lr"], group["adamw_lr"]
        group["adamw_lr_ratio"] = 1.0 if adamw_lr is None else float(adamw_lr) / float(lr)
        names = group.get("param_names") or [None] * len(group["params"])
        for i, (p, name) in enumerate(zip(group["params"], names, strict=True)):
            label = name or f"param_groups[{len(self.param_groups) - 1}].params[{i}]"
            self._names[p] = label
            self._routes[p] = route_param(
                name, tuple(p.shape), matrix_rule=self._matrix_rule, forced=forced, layouts=self._layouts,
                split_qkv=self._split_qkv, split_gate_up=self._split_gate_up,
            )

    def _validate_group(self, group: dict[str, Any]) -> None:
        """Check a group's hyperparameters (groups may override the defaults); subclasses use their config."""

    def name_of(self, p: torch.Tensor) -> str | None:
        """The name a parameter of this optimizer was given (None for an unnamed one)."""
        return self._names.get(p)

    def route_of(self, p: torch.Tensor) -> Route:
        """The route of a parameter of this optimizer (``algorithm`` "matrix" or "adamw", and its fused layout)."""
        return self._routes[p]

    # --- non-finite gradients ------------------------------------------------------------------------------------
    def _grads(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(p, p.grad) for g in self.param_groups for p in g["params"] if p.grad is not None]

    def has_nonfinite_grads(self) -> bool:
        """True if any gradient of this optimizer's params has a NaN/Inf (one device sync)."""
        grads = [g for _, g in self._grads()]
        if not grads:
            return False
        return not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())

    def nonfinite_param_names(self) -> list[str]:
        """Names of the params whose gradient has a NaN/Inf."""
        return [self._names[p] for p, g in self._grads() if not bool(torch.isfinite(g).all())]

    def report_nonfinite(self) -> None:
        """Apply the ``nonfinite`` policy to a step found to have non-finite grads (by this optimizer or a caller
        that checked globally): raise, or record the skip (``last_step_skipped``, ``skipped_steps``, warn once)."""
        names = ", ".join(self.nonfinite_param_names()) or "a param outside this optimizer (caller's global check)"
        if self.nonfinite == "raise":
            raise FloatingPointError(f"{self.label}: non-finite gradient in {names} "
                                     "(nonfinite='raise'; use 'skip' to skip such steps)")
        self.last_step_skipped = True
        self.skipped_steps += 1
        if not self._warned_skip:
            self._warned_skip = True
            warnings.warn(f"{self.label}: non-finite gradient in {names}; the step was skipped for all params "
                          "(counted in skipped_steps; warned once)", stacklevel=3)

    # --- the step ------------------------------------------------------------------------------------------------
    def _matrix_updates(self, items: list[MatrixItem]) -> list[torch.Tensor]:
        raise NotImplementedError

    def takes_part_without_updates(self) -> bool:
        """Whether a step must run the matrix update even when this rank has no matrix gradient (it takes part in
        other ranks' collectives); False here."""
        return False

    def _target(self, p: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """The tensor the update is applied to: the fp32 master copy for low-precision params if enabled."""
        if self.master_weights and p.dtype in _LOW_PRECISION:
            if "master" not in state:
                state["master"] = p.detach().float().clone()
            return state["master"]
        return p

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, *, skip_nonfinite_check: bool = False) -> Any:
        """One optimization step. ``skip_nonfinite_check=True``: the caller has checked all grads (e.g. globally
        across ranks with ``has_nonfinite_grads`` + an all-reduce) and calls ``report_nonfinite`` itself."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_step_skipped = False
        if not skip_nonfinite_check and self.has_nonfinite_grads():
            self.report_nonfinite()
            return loss
        matrix_items: list[MatrixItem] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                grad = p.grad.float()
                route = self._routes[p]
                if route.algorithm == ADAMW:
                    lr = group["lr"] * group["adamw_lr_ratio"]
                    update = adamw_direction(grad, state, group["adamw_betas"], group["adamw_eps"])
                    self._apply(p, state, update, lr, group["weight_decay"])
                else:
                    matrix_items.append(MatrixItem(p, grad, state, group, route, self._names[p]))
        if matrix_items or self.takes_part_without_updates():
            for item, update in zip(matrix_items, self._matrix_updates(matrix_items), strict=True):
                if update is None:  # the subclass only built state this step (SOAP's first step)
                    continue
                self._apply(item.param, item.state, update, item.group["lr"], item.group["weight_decay"])
        return loss

    def _apply(self, p: torch.Tensor, state: dict[str, Any], update: torch.Tensor, lr: float, wd: float) -> None:
        target = self._target(p, state)
        if wd:
            target.mul_(1 - lr * wd)
        target.add_(update.to(target.dtype), alpha=-lr)
        if target is not p:
            p.copy_(target)

    # --- checkpoints ---------------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch.optim.Optimizer's, except that state tensors keep their saved dtype (fp32 momentum and master
        weights of bf16/fp16 params are not cast down to the param dtype); they move to the param's device, except
        ``step`` (``place_state_value``)."""
        saved_state = state_dict["state"]
        super().load_state_dict({**state_dict, "state": {}})
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        by_id = dict(zip(ids, params, strict=True))
        for key, value in saved_state.items():
            p = by_id[key]
            self.state[p] = {k: place_state_value(k, v, p.device) for k, v in value.items()}
