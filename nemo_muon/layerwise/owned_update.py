"""The update of what one rank owns: its inner optimizers, their learning rates, the result written back and shared.

`OwnedUpdate` builds the inner optimizers once: one (the config's, or the factory's) over the owned whole tensors'
masters, and for Muon's split matrices one Muon per block this rank is in, over its slices, in
``tp_mode="distributed"`` over the block's group. The whole-tensor optimizer's ``param_groups[0]['lr']`` is absolute; each inner
group applies it times its own ratio to the reference rate (the config's ``lr``; for a factory the largest initial
group lr of all ranks' inner optimizers). `apply` steps them and writes every owned master into its parameter and
bucket buffer (a slice into its part of the parameter); `share` starts the buckets' gathers.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon._validation import fail
from nemo_muon.layerwise.ownership import NamedParams, Ownership
from nemo_muon.layerwise.plan_items import is_factory
from nemo_muon.registry import spec_for, specs


class OwnedUpdate:
    """Runs the inner optimizers on this rank's masters and shares the result (module doc)."""

    def __init__(self, optimizer: Any, own: Ownership, names: list[str], *, dp_group: dist.ProcessGroup | None,
                 comm_device: torch.device) -> None:
        self.own = own
        self.inner = build_inner(optimizer, [(n, own.masters[n]) for n in own.owned_names])
        """The inner optimizer over the owned whole tensors' masters (None when this rank owns none)."""
        self.split_inners, self.split_inner_of = _build_split_inners(optimizer, own, names)
        self.base_lrs = [g["lr"] for g in self.inner.param_groups] if self.inner is not None else []
        """The inner groups' rates at construction (their ratios to ``reference_lr`` are kept)."""
        self.reference_lr = _agreed_reference_lr(optimizer, self.base_lrs, dp_group, comm_device)

    @torch.no_grad()
    def apply(self, lr: float) -> None:
        """Step the inner optimizers at the absolute rate ``lr``; write the masters into params and buckets."""
        if self.inner is not None:
            for g, base in zip(self.inner.param_groups, self.base_lrs, strict=True):
                g["lr"] = lr * (base / self.reference_lr)  # exactly lr for a group at the reference rate
            if hasattr(self.inner, "report_nonfinite"):  # nemo_muon optimizers: the whole-tensor optimizer checked globally
                self.inner.step(skip_nonfinite_check=True)
            else:
                self.inner.step()
        for inner in self.split_inners:  # a config's Muon: every group at the config's lr, the reference rate
            for g in inner.param_groups:
                g["lr"] = lr
            inner.step(skip_nonfinite_check=True)
        for name in self.own.owned_names:
            b, i = self.own.owned[name]
            master, p = self.own.masters[name], b.params[i]
            if master is not p:
                p.copy_(master)
            b.view_of(i).copy_(p)
        for key in self.own.split_keys:
            b, i = self.own.owned[key]
            b.pieces[i].write(b.params[i], self.own.masters[key])
            b.read_into_flat(i, b.params[i])

    def share(self) -> None:
        """Start sharing the updated tensors (buckets are in backward order: the first layers' go first)."""
        for b in reversed(self.own.buckets):
            b.start_gather()


def build_inner(optimizer: Any, named: NamedParams) -> torch.optim.Optimizer | None:
    """The config's optimizer (`nemo_muon.optim.build_optimizer`) or the factory's over ``named``; None if empty."""
    if not named:
        return None
    if is_factory(optimizer):
        return optimizer(named)
    from nemo_muon.optim import build_optimizer

    return build_optimizer(optimizer, named)


def _build_split_inners(optimizer: Any, own: Ownership,
                        names: list[str]) -> tuple[list[torch.optim.Optimizer], dict[str, torch.optim.Optimizer]]:
    """One Muon per block this rank is in, over its slices: ``tp_mode="distributed"`` over the block's group; and
    the inner optimizer of each of this rank's slice keys."""
    from nemo_muon.optim import build_optimizer

    by_group: dict[Any, list[tuple[str, torch.nn.Parameter]]] = {}
    for n in names:
        if n in own.splits:
            by_group.setdefault(own.splits[n].group, []).append((n, own.masters[own.splits[n].key]))
    if by_group and not getattr(spec_for(optimizer).matrix, "splittable", False):
        splitting = [s.label for s in specs() if s.matrix is not None and s.matrix.splittable]
        raise fail("optimizer", type(optimizer).__name__, f"one whose registry entry splits matrices "
                   f"(ns_split_target): {splitting}")
    inners = [build_optimizer(optimizer, named, tp_group=g, tp_mode="distributed") for g, named in by_group.items()]
    inner_of = {own.splits[n].key: inner for inner, (_, named) in zip(inners, by_group.items(), strict=True)
                for n, _ in named}
    return inners, inner_of


def _agreed_reference_lr(optimizer: Any, base_lrs: list[float], dp_group: dist.ProcessGroup | None,
                         comm_device: torch.device) -> float:
    """The rate ``param_groups[0]['lr']`` starts at and the inner rates are ratios to: a config's ``lr``; for a
    factory the largest initial group lr of the inner optimizers of all ranks (one all-reduce: a rank that owns
    nothing has no inner optimizer to read)."""
    if not is_factory(optimizer):
        return float(optimizer.lr)
    local = torch.tensor(max(base_lrs, default=-math.inf), dtype=torch.float64, device=comm_device)
    if dp_group is not None:
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=dp_group)
    agreed = float(local)
    if not math.isfinite(agreed) or agreed <= 0:
        raise fail("optimizer", optimizer, "a factory whose optimizer has a positive, finite lr on some rank")
    return agreed
