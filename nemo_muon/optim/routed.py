"""The shared skeleton of Muon and SOAP: parameter routing, the one per-parameter update loop, the AdamW part,
non-finite gradient policy, and optional fp32 master weights for bf16/fp16 parameters.

What the optimizers take (``params``): the ``nn.Module`` itself (routing by what each parameter is: module type,
tying, known fused layouts; `nemo_muon.optim.param_roles`), ``model.named_parameters()`` (the name rule of
`nemo_muon.optim.routing`; a 2-D parameter whose name hints at an embedding or head but goes to the matrix update is
reported in one warning), or param-group dicts of those. Refused, in one line naming the parameter: a tensor of 2 or
more dimensions without a name (plain ``model.parameters()``) unless its group's ``"algorithm"`` or ``matrix_rule``
places it; a parameter that is not real floating point (complex, integer: the update would drop its imaginary part);
a keyword the optimizer does not take (`nemo_muon.optim.keywords`). ``opt.routes()`` is the table of every
parameter's route and its reason (`nemo_muon.optim.route_table`).

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

from nemo_muon.optim.keywords import checked_init
from nemo_muon.optim.param_roles import module_roles
from nemo_muon.optim.route_table import RouteRow, RouteTable, update_label
from nemo_muon.optim.routing import (
    ADAMW,
    ROUTE_NAMES,
    FusedLayout,
    MatrixRule,
    ParamRole,
    Route,
    resolve_layouts,
    route_param,
)

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
    splits_fused = False
    """Whether the matrix update runs on the parts of a fused weight (Muon) or on the whole (SOAP); for ``routes()``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass's ``__init__`` refuses unknown keywords in one line (`nemo_muon.optim.keywords`)."""
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = checked_init(cls.__dict__["__init__"], cls, RoutedOptimizer)  # type: ignore[method-assign]

    def __init__(
        self,
        params: Iterable[Any] | torch.nn.Module,
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
        self._roles: dict[torch.Tensor, ParamRole] = {}
        self._unsure: list[str] = []
        self._initialized = False
        if isinstance(params, torch.nn.Module):
            self._roles = module_roles(params)
            params = list(params.named_parameters())
        defaults = {**defaults, "adamw_lr": adamw_lr}
        super().__init__(params, defaults)
        self._initialized = True
        self._report_unsure()

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
        index = len(self.param_groups) - 1
        try:
            routes = self._route_group(group, forced, index)
        except ValueError:
            self.param_groups.pop()
            raise
        for p, (label, route) in routes.items():
            self._names[p], self._routes[p] = label, route
        self._unsure += [label for label, route in routes.values() if route.unsure]
        if self._initialized:
            self._report_unsure()

    def _route_group(self, group: dict[str, Any], forced: str | None,
                     index: int) -> dict[torch.Tensor, tuple[str, Route]]:
        """Each parameter of a new group -> (its name or label, its route); raises for a parameter that is not real
        floating point or, unnamed and 2-D or more, cannot be placed (module docstring)."""
        names = group.get("param_names") or [None] * len(group["params"])
        routes = {}
        for i, (p, name) in enumerate(zip(group["params"], names, strict=True)):
            label = name or f"param_groups[{index}].params[{i}]"
            if not p.is_floating_point():
                raise ValueError(f"{self.label}: parameter {label!r} has dtype {p.dtype}; allowed: real floating-point "
                                 "parameters (float32, bfloat16, float16, float64); keep a complex value as two real "
                                 "parameters (or torch.view_as_real of it)")
            if name is None and p.dim() >= 2 and forced is None and (
                    self._matrix_rule is None or self._matrix_rule(None, tuple(p.shape)) is None):
                raise ValueError(
                    f"{self.label}: parameter {label!r} with shape {tuple(p.shape)} has no name, so whether it is an "
                    f"embedding, the output head or a hidden matrix cannot be told; pass the model itself "
                    f"({self.label}(model, ...)) or model.named_parameters(), or place unnamed tensors with a param "
                    "group's 'algorithm' or matrix_rule")
            routes[p] = (label, route_param(
                name, tuple(p.shape), matrix_rule=self._matrix_rule, forced=forced, layouts=self._layouts,
                split_qkv=self._split_qkv, split_gate_up=self._split_gate_up, role=self._roles.get(p),
            ))
        return routes

    def _report_unsure(self) -> None:
        """One warning naming the parameters the name rule sent to the matrix update although their names hint at an
        embedding or output head (`Route.unsure`); once per parameter."""
        if not self._unsure:
            return
        names, self._unsure = self._unsure, []
        how = "by module type" if self._roles else f"by name only ({self.label}(model, ...) routes by module type)"
        warnings.warn(f"{self.label}: routed {how}; the matrix update goes to {len(names)} parameter(s) whose names "
                      f"hint at an embedding or output head: {', '.join(names)}; if one is, place it with matrix_rule "
                      "or a param group's 'algorithm' (opt.routes() shows every route)", stacklevel=2)

    def _validate_group(self, group: dict[str, Any]) -> None:
        """Check a group's hyperparameters (groups may override the defaults); subclasses use their config."""

    def name_of(self, p: torch.Tensor) -> str | None:
        """The name a parameter of this optimizer was given (None for an unnamed one)."""
        return self._names.get(p)

    def route_of(self, p: torch.Tensor) -> Route:
        """The route of a parameter of this optimizer (``algorithm`` "matrix" or "adamw", and its fused layout)."""
        return self._routes[p]

    def routes(self) -> RouteTable:
        """Every parameter's route, in param-group order: name, shape, update, reason (``print`` it to check)."""
        return RouteTable(
            RouteRow(self._names[p], tuple(p.shape), update_label(self._routes[p], tuple(p.shape), self.label,
                                                                 splits=self.splits_fused), self._routes[p].reason)
            for g in self.param_groups for p in g["params"])

    # --- non-finite gradients ------------------------------------------------------------------------------------
    def _grads(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(p, p.grad) for g in self.param_groups for p in g["params"] if p.grad is not None]

    def has_nonfinite_grads(self) -> bool:
        """True if any gradient of this optimizer's params has a NaN/Inf: the largest |element| of every gradient in
        one multi-tensor operator (it propagates NaN), per device; one device sync."""
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for _, g in self._grads():
            if g.numel():
                by_device.setdefault(g.device, []).append(g)
        return any(not math.isfinite(torch.stack(torch._foreach_norm(grads, math.inf)).max().item())
                   for grads in by_device.values())

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
            self._apply_many([(item.param, item.state, update, item.group["lr"], item.group["weight_decay"])
                              for item, update in zip(matrix_items, self._matrix_updates(matrix_items), strict=True)
                              if update is not None])  # None: applied already, or only state built (SOAP's 1st)
        return loss

    def _apply_many(self, entries: list[tuple[torch.Tensor, dict[str, Any], torch.Tensor, float, float]],
                    scales: list[float] | None = None) -> None:
        """``_apply`` of every (param, state, update, lr, wd) entry, multi-tensor: per (lr, wd, scale, device) one
        foreach for the decay and one for the update ``p <- p·(1 - lr·wd) - (lr·scale)·update`` (``scales``: one per
        entry, default 1), and one to copy fp32 masters into their params; an update of another dtype than its
        target is scaled, cast and applied alone, as ``_apply`` does."""
        same: dict[tuple[float, float, float, torch.device], list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        for (p, state, update, lr, wd), scale in zip(entries, scales or [1.0] * len(entries), strict=True):
            target = self._target(p, state)
            if target.dtype != update.dtype:
                self._apply(p, state, update * scale if scale != 1.0 else update, lr, wd)
                continue
            same.setdefault((lr, wd, scale, target.device), []).append((p, target, update))
        for (lr, wd, scale, _), rows in same.items():
            targets = [t for _, t, _ in rows]
            if wd:
                torch._foreach_mul_(targets, 1 - lr * wd)
            torch._foreach_add_(targets, [u for _, _, u in rows], alpha=-lr * scale)
            copied = [(p, t) for p, t, _ in rows if t is not p]
            if copied:
                torch._foreach_copy_([p for p, _ in copied], [t for _, t in copied])

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
