"""Split ownership on Megatron-Core >= 0.18: the pipeline stage's ownership plan, made when the model is tagged.

With Muon's ``ns_split_target`` DDP's cost layout (`nemo_muon.megatron.core_018_plus.cost_layout`) must lay out exactly the plan
``nemo-muon plan`` computes for the stage: all model chunks of this pipeline rank (its virtual stages) planned
together, the routed experts first by LPT over ``expt_dp``, then the dense matrices by `plan_ownership` with the
target over ``dp_cp``, starting from each rank's expert work (the rule `nemo_muon.megatron.core_016_017.cost_balanced` runs on
0.16 / 0.17). DDP computes the layout one chunk at a time, so `tag_stage_plan` plans the stage when the whole model
is tagged (before the wrap) and leaves on every layer-wise matrix its `PlannedOwner`: the rank whose shard holds it
and, for a split matrix, its `LayoutSplit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

PLAN_ATTRIBUTE = "nemo_muon_planned_owner"
"""The attribute a layer-wise matrix carries its `PlannedOwner` in (set by `tag_stage_plan`)."""


@dataclasses.dataclass(frozen=True)
class LayoutSplit:
    """A matrix whose Newton–Schulz the aligned block ``ranks`` of dp_cp runs (the plan's `SplitPlacement`): the
    layout puts it whole in the shard of ``ranks[0]``, which holds its gradient, master and momentum; each member
    orthogonalizes 1/``ways`` of it along ``dim`` (``member_cost`` each)."""

    ranks: tuple[int, ...]
    ways: int
    dim: int
    member_cost: float


@dataclasses.dataclass(frozen=True)
class StageSplitPlan:
    """The stage's plan: the dense matrices' `OwnershipPlan` over dp_cp (its ``flops`` include each rank's expert
    work) and the expert work of each expt_dp rank, for ``target``."""

    target: float
    dense: Any
    expert_flops: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class PlannedOwner:
    """Where the stage plan puts one layer-wise matrix: ``rank`` in its buffer's group (dp_cp, or expt_dp for a
    routed expert under expert parallelism), its ``split`` (None: whole), and the ``stage`` plan it belongs to."""

    rank: int
    split: LayoutSplit | None
    stage: StageSplitPlan


def is_expert_parallel(param: Any) -> bool:
    """Megatron's rule for the expert buffers (``allreduce`` False: reduced over expt_dp)."""
    return not getattr(param, "allreduce", True)


def tag_stage_plan(items: Mapping[Any, Any], pg_collection: Any, target: float) -> StageSplitPlan:
    """Plan the stage's layer-wise matrices (``items``: param -> `PlanItem`, every chunk of this pipeline rank) with
    ``target`` and set each one's `PlannedOwner` (module doc); returns the plan."""
    from megatron.core.utils import get_pg_rank, get_pg_size

    from nemo_muon.accounting.ownership_plan import plan_ownership
    from nemo_muon.megatron.shared.ownership import expert_work

    dp, edp = get_pg_size(pg_collection.dp_cp), get_pg_size(pg_collection.expt_dp)
    experts = [p for p in items if is_expert_parallel(p)]
    dense = [p for p in items if not is_expert_parallel(p)]
    expert_plan = plan_ownership([items[p] for p in experts], edp, "lpt")
    start = expert_work(list(expert_plan.flops), pg_collection, dp, get_pg_rank(pg_collection.dp_cp))
    dense_plan = plan_ownership([items[p] for p in dense], dp, "lpt", initial_flops=start, balance_target=target)
    stage = StageSplitPlan(float(target), dense_plan, tuple(expert_plan.flops))
    for p in experts:
        setattr(p, PLAN_ATTRIBUTE, PlannedOwner(expert_plan.owners[items[p].name], None, stage))
    for p in dense:
        name = items[p].name
        sp = dense_plan.splits.get(name)
        split = None if sp is None else LayoutSplit(tuple(sp.ranks), sp.option.ways, sp.option.dim, sp.option.cost)
        setattr(p, PLAN_ATTRIBUTE, PlannedOwner(dense_plan.owners[name], split, stage))
    return stage


def clear_stage_plan(params: Any) -> None:
    """Remove a previous `PlannedOwner` (a model tagged again without a target)."""
    for p in params:
        if hasattr(p, PLAN_ATTRIBUTE):
            delattr(p, PLAN_ATTRIBUTE)


def planned_owner(param: Any) -> PlannedOwner | None:
    """``param``'s `PlannedOwner`, or None (no split target)."""
    return getattr(param, PLAN_ATTRIBUTE, None)


def split_of(param: Any) -> LayoutSplit | None:
    """``param``'s `LayoutSplit`, or None (whole, or no split target)."""
    owner = planned_owner(param)
    return None if owner is None else owner.split
