"""Ownership of the whole-tensor optimizer: which rank owns which tensor (or slice), and what it holds for it.

`build_ownership` runs once, at construction, identically on every rank. Per category of parameters (every
trainable parameter over ``dp_group``; with an ``expert_dp_group`` the dense ones over ``dp_group`` and the expert
ones over ``expert_dp_group``) it checks that the replicas agree, computes the plan (`plan_items.whole_tensor_plan`),
turns it into bucket entries (whole tensors, and one slice per member of each split matrix: ``pieces``), builds
the buckets and records what this rank owns. Then it creates the masters: an fp32 copy of each owned low-precision
tensor (``master_weights``; otherwise the parameter itself) and one tensor per owned slice of a split matrix. An
optimizer factory is built once here, over all parameters, so the plans cost what its optimizer routes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon.accounting.ownership_plan import OwnershipPlan
from nemo_muon.layerwise.buckets import Bucket, Entry, build_buckets, resolve_collectives
from nemo_muon.layerwise.pieces import Piece, make_piece
from nemo_muon.layerwise.plan_items import is_factory, matrix_route, whole_tensor_plan
from nemo_muon.layerwise.split_groups import block_groups

NamedParams = Sequence[tuple[str, torch.nn.Parameter]]
LOW_PRECISION = (torch.bfloat16, torch.float16)


def group_rank_world(group: dist.ProcessGroup | None, field: str) -> tuple[int, int]:
    """This rank's rank in ``group`` and its size (0, 1 for None); raises naming ``field`` if not a member."""
    if group is None:
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{field} must contain this rank (global rank {dist.get_rank()}); it does not")
    return rank, dist.get_world_size(group)


@dataclass(frozen=True)
class SplitMember:
    """This rank's part in a split matrix: every member's slice (member order), the block's group, its own key."""

    pieces: list[Piece]
    group: dist.ProcessGroup
    key: str
    """The bucket / master key of this rank's slice (``piece_key``)."""
    index: int


def piece_key(name: str, index: int, ways: int) -> str:
    """The bucket / master key of slice ``index`` of a matrix split ``ways`` ways."""
    return f"{name}[split {index}/{ways}]"


@dataclass
class Ownership:
    """What `build_ownership` computed for this rank (the whole-tensor optimizer exposes each field as its attribute)."""

    plans: list[OwnershipPlan]
    """One plan per non-empty category (dp_group's first)."""
    buckets: list[Bucket]
    owned: dict[str, tuple[Bucket, int]]
    """Bucket and index of every key this rank owns: whole parameters by name, slices by ``piece_key``."""
    splits: dict[str, SplitMember]
    """Split matrices this rank is a member of, by parameter name."""
    owned_names: list[str]
    """Whole parameters this rank owns (model order); its slices of split matrices are in ``split_keys``."""
    split_keys: list[str]
    masters: dict[str, torch.nn.Parameter]
    """The tensor the inner optimizer updates, by owned name or slice key."""
    collectives: str
    """The collectives the buckets use (of the last category; ``resolve_collectives``)."""


def build_ownership(named: NamedParams, optimizer: Any, *, dp_group: dist.ProcessGroup | None,
                    expert_dp_group: dist.ProcessGroup | None, is_expert: Callable[[str], bool], plan_method: str,
                    collectives: str, bucket_bytes: int, master_weights: bool,
                    check_replicas: bool) -> Ownership:
    """Plans, buckets, owned keys, split memberships and masters of ``named`` (module doc)."""
    categories: list[tuple[NamedParams, dist.ProcessGroup | None, str]] = [(named, dp_group, "dp_group")]
    if expert_dp_group is not None:
        categories = [([(n, p) for n, p in named if not is_expert(n)], dp_group, "dp_group"),
                      ([(n, p) for n, p in named if is_expert(n)], expert_dp_group, "expert_dp_group")]
    built = optimizer(list(named)) if is_factory(optimizer) else None  # asked for its routing (plan_items)
    plans: list[OwnershipPlan] = []
    buckets: list[Bucket] = []
    owned: dict[str, tuple[Bucket, int]] = {}
    splits: dict[str, SplitMember] = {}
    resolved = collectives
    for cat, group, field in categories:
        if not cat:
            continue
        rank, world = group_rank_world(group, field)
        if check_replicas:
            check_replicas_agree(cat, group, field)
        plan = whole_tensor_plan(cat, world, optimizer, plan_method, split=field == "dp_group" and world > 1,
                           built=built)
        plans.append(plan)
        resolved = resolve_collectives(collectives, group)
        entries, owners = _entries(list(reversed(cat)), plan, optimizer, group, rank, splits)
        for b in build_buckets(entries, owners, bucket_bytes, world, rank, group, resolved):
            buckets.append(b)
            for i in b.owned():
                owned[b.names[i]] = (b, i)
    names = [n for n, _ in named]
    owned_names = [n for n in names if n in owned]
    split_keys = [splits[n].key for n in names if n in splits]
    masters = _masters(dict(named), owned, owned_names, split_keys, master_weights)
    return Ownership(plans, buckets, owned, splits, owned_names, split_keys, masters, resolved)


def _entries(named: NamedParams, plan: OwnershipPlan, optimizer: Any, group: dist.ProcessGroup | None, rank: int,
             splits: dict[str, SplitMember]) -> tuple[list[Entry], dict[str, int]]:
    """Bucket entries in ``named``'s order: whole parameters, and one slice per member of each split matrix
    (this rank's memberships are added to ``splits``)."""
    entries: list[Entry] = []
    owners: dict[str, int] = {}
    groups = block_groups(plan, group, rank) if plan.splits and group is not None else {}
    for n, p in named:
        sp = plan.splits.get(n)
        if sp is None:
            entries.append((n, p, None))
            owners[n] = plan.owners[n]
            continue
        route = matrix_route(n, tuple(p.shape), optimizer)
        pieces = [make_piece(n, tuple(p.shape), route, sp.option.dim, j, sp.option.ways)
                  for j in range(sp.option.ways)]
        for j, (r, piece) in enumerate(zip(sp.ranks, pieces, strict=True)):
            key = piece_key(n, j, sp.option.ways)
            entries.append((key, p, piece))
            owners[key] = r
        if rank in sp.ranks:
            j = sp.ranks.index(rank)
            splits[n] = SplitMember(pieces, groups[sp.ranks], piece_key(n, j, sp.option.ways), j)
    return entries, owners


def _masters(params: dict[str, torch.nn.Parameter], owned: dict[str, tuple[Bucket, int]], owned_names: list[str],
             split_keys: list[str], master_weights: bool) -> dict[str, torch.nn.Parameter]:
    """The tensors the inner optimizers update: an fp32 copy of a low-precision parameter (``master_weights``),
    else the parameter; a slice of a split matrix is a tensor of its own (fp32 likewise), a TP shard for Muon."""
    masters: dict[str, torch.nn.Parameter] = {}
    for n in owned_names:
        p = params[n]
        use_master = master_weights and p.dtype in LOW_PRECISION
        masters[n] = torch.nn.Parameter(p.detach().float().clone()) if use_master else p
    for key in split_keys:
        b, i = owned[key]
        p = b.params[i]
        dtype = torch.float32 if master_weights and p.dtype in LOW_PRECISION else p.dtype
        master = torch.nn.Parameter(b.pieces[i].read(p.detach()).to(dtype))
        master.tensor_model_parallel = True
        master.partition_dim = b.pieces[i].dim
        masters[key] = master
    return masters


def check_replicas_agree(named: NamedParams, group: dist.ProcessGroup | None, field: str) -> None:
    """Raise on every rank if any parameter differs across ``group`` (fingerprints compared by all-reduce)."""
    if group is None or dist.get_world_size(group) == 1:
        return
    fps = []
    device = named[0][1].device  # NCCL all-reduces device tensors only
    for _, p in named:
        x = p.detach().reshape(-1).double()
        w = torch.arange(x.numel(), dtype=torch.float64, device=x.device).remainder_(7).add_(1)
        fps.append(torch.stack([x.sum(), (x * x).sum(), (x * w).sum()]).to(device))
    fp = torch.stack(fps)
    both = torch.cat([fp, -fp])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    hi, lo = both[: len(fps)], -both[len(fps):]
    differ = [named[i][0] for i in range(len(fps)) if not torch.equal(hi[i], lo[i])]
    if differ:
        raise ValueError(f"parameters differ across the ranks of {field} at construction (initialize them "
                         f"identically, e.g. same seed or a broadcast): {differ[:10]}")
