"""The update-cost items both Megatron-Core generations plan ownership with: one matrix's cost under our optimizer (its
registry entry's cost model, the one the torch backend and ``nemo-muon plan`` use), which matrices may be split, and
the expert work each data-parallel rank already has when the dense matrices are planned.

Megatron-Core 0.16 / 0.17 plan inside the layer-wise optimizer (`nemo_muon.megatron.core_016_017.cost_balanced`),
>= 0.18 in DDP's parameter layout (`nemo_muon.megatron.core_018_plus.cost_layout`, `split_plan`): the same items.
"""

from __future__ import annotations

from typing import Any

from nemo_muon.accounting.ns_split import split_options
from nemo_muon.accounting.ownership_plan import PlanItem
from nemo_muon.optim.fused import split_parts
from nemo_muon.optim.routed import RoutedOptimizer
from nemo_muon.registry import spec_named


def matrix_item(optimizer: RoutedOptimizer, p: Any, key: str, splittable: bool) -> PlanItem:
    """The plan item of one matrix: the update cost of what our optimizer runs (its fused parts, or the whole matrix,
    as its registry entry says), and the split options where the entry allows a split."""
    shape = tuple(p.shape)
    nbytes = p.numel() * p.element_size()
    matrix = spec_named(optimizer.registry_name).matrix
    parts = [(t.shape[-2], shape[-1]) for t in split_parts(p.detach()[..., :1], optimizer.route_of(p), key)]
    hp = optimizer.defaults
    cost = matrix.update_cost(shape, parts, hp)
    options = split_options(parts, steps=hp["ns_steps"], gather_update=True) if splittable and matrix.splittable else ()
    return PlanItem(key, shape, cost, nbytes, split_options=options)


def is_routed_expert(name: str) -> bool:
    """True for a routed expert's weight (``mlp.experts.``; shared experts are ``mlp.shared_experts.``): never split
    (at EP = 1 Megatron keeps them in the dense domain, `allreduce` True; ``nemo-muon plan`` keeps them whole)."""
    return ".mlp.experts." in f".{name}"


def expert_work(expert_flops: list[float], pgs: Any, size: int, rank: int) -> list[float] | None:
    """The expert matrices' update cost each dp_cp rank already has (None without experts).

    Every EP rank holds experts of the same shapes, so its expert plan over its expert-DP replicas is the same
    (``expert_flops``, computed on this rank): dp_cp rank b is EP rank b mod ep's replica b div ep (Megatron's rank
    order, ep = dp_cp / expt_dp with ETP = TP). This rank checks that order on itself and raises if it differs.
    """
    from megatron.core.utils import get_pg_rank, get_pg_size

    if not any(expert_flops):
        return None
    replicas = get_pg_size(pgs.expt_dp)
    if size % replicas:
        raise RuntimeError(f"expert-DP size {replicas} must divide the dp_cp size {size} (ETP = TP) to plan "
                           "ownership by update cost")
    ep = size // replicas
    if get_pg_rank(pgs.expt_dp) != rank // ep:
        raise RuntimeError(f"dp_cp rank {rank} is expert-DP rank {get_pg_rank(pgs.expt_dp)}, not {rank // ep} "
                           f"(rank div {ep}): the rank order the ownership plan assumes does not hold")
    return [expert_flops[b // ep] for b in range(size)]
