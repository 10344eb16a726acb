"""What the CPU harness reads of the ownership Megatron executes: each matrix's update cost under our optimizer (the
cost layout's `plan_items`, the registry's cost model) and the cost each data-parallel rank owns as Megatron's
layer-wise optimizer derived it (test-side views of `nemo_muon.megatron`; nothing here ships)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nemo_muon.megatron.core_018_plus.cost_layout import COST_ATTRIBUTE, plan_items
from nemo_muon.megatron.core_018_plus.split_plan import split_of
from nemo_muon.registry import spec_named


def matrix_cost(optimizer: Any, shape: tuple[int, ...]) -> float:
    """Per-step update FLOPs of one whole matrix under our optimizer: its registry entry's cost model
    (``spec.matrix.update_flops``) at the optimizer's defaults."""
    return spec_named(optimizer.registry_name).matrix.update_flops(shape, optimizer.defaults)


def update_costs(model_chunks: Sequence[Any], ours: Any, pg_collection: Any) -> dict[Any, float]:
    """param -> its per-step update cost under ``ours``, for every trainable layer-wise matrix of ``model_chunks``
    (`plan_items`' costs)."""
    return {p: item.cost for p, item in plan_items(model_chunks, ours, pg_collection).items()}


def owned_costs(layer_wise_optimizer: Any, costs: Mapping[Any, float] | None = None) -> list[float]:
    """The update cost each dp_cp rank runs as Megatron's layer-wise optimizer derived ownership from the layout
    (``dp_cp_params_list``, plus ``expt_dp_params_list`` where expert-DP is dp_cp: EP = 1), a split matrix
    (`nemo_muon.megatron.core_018_plus.split_plan.split_of`) counted as its member cost on each rank of its block; ``costs``:
    param -> cost (default: the params' `COST_ATTRIBUTE`; anything else costs 0)."""
    def cost(p: Any) -> float:
        return float(costs.get(p, 0.0) if costs is not None else getattr(p, COST_ATTRIBUTE, 0.0))

    dense = getattr(layer_wise_optimizer, "dp_cp_params_list", None) or []
    lists = [list(params) for params in dense]
    expert = getattr(layer_wise_optimizer, "expt_dp_params_list", None) or []
    if len(expert) == len(lists):
        lists = [mine + list(theirs) for mine, theirs in zip(lists, expert, strict=True)]
    loads = [0.0] * len(lists)
    for rank, params in enumerate(lists):
        for p in params:
            split = split_of(p)
            if split is None:
                loads[rank] += cost(p)
            else:
                for member in split.ranks:
                    loads[member] += split.member_cost
    return loads
