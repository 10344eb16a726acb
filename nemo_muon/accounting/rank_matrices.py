"""The matrices one GPU updates with a recipe's matrix optimizer, from the plan (torch-free).

`busiest_rank` lists, for the GPU with the most Newton–Schulz work of the recipe's layer-wise ownership
(`nemo_muon.accounting.model_ownership.stage_plan`, the plan `nemo-muon plan` prints), every matrix it owns: the
stored tensor as its TP rank holds it (Megatron's fused ``linear_qkv`` and ``linear_fc1`` whole) and the parts
Newton–Schulz runs on (the optimizer's ``split_qkv`` / ``split_gate_up``). ``bench/launches.py`` builds stand-ins
of these matrices to count the operators of one optimizer step (`nemo_muon.optim.op_count`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_muon.accounting.layout import validate_layout
from nemo_muon.accounting.model_ownership import CostModel, StagePlan, stage_plan
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.registry import spec_for


@dataclass(frozen=True)
class RankMatrix:
    """One matrix a GPU updates."""

    name: str
    shape: tuple[int, ...]
    """The stored tensor as this GPU's TP rank holds it."""
    parts: tuple[tuple[int, ...], ...]
    """The matrices Newton–Schulz runs on (the whole, or the fused parts the optimizer splits)."""


@dataclass(frozen=True)
class RankMatrices:
    """The matrices of one GPU (`busiest_rank`)."""

    recipe: str
    world_size: int
    pp_rank: int
    stage_rank: int
    """Its index among the tp·cp·dp GPUs of its pipeline stage (Megatron's order)."""
    ns_flops: float
    """NS FLOPs per step it executes (the plan's: the busiest rank's)."""
    matrices: tuple[RankMatrix, ...]


def recipe_cost_model(recipe: TrainingRecipe, syrk: bool = False) -> tuple[CostModel, bool, float | None]:
    """How the plan counts ``recipe``'s matrices: (cost model, whether the optimizer runs Newton–Schulz, the split
    ownership target it executes or None)."""
    opt = recipe.optimizer
    opt_spec = spec_for(opt)
    runs_ns = opt_spec.matrix is not None and opt_spec.matrix.newton_schulz
    split = opt_spec.matrix.routing(opt) if runs_ns else {"split_gate_up": True, "split_qkv": True}
    megatron = recipe.backend == "megatron"
    cost = CostModel(steps=opt.ns_steps if runs_ns else 5, syrk=syrk,
                     tp_mode=opt.tp_mode if runs_ns else "duplicated", split_gather_update=megatron,
                     tensors="megatron" if megatron else "hf", **split)
    target = opt.ns_split_target if runs_ns and opt_spec.matrix.splittable and recipe.layerwise else None
    return cost, runs_ns, target


def _owned(sp: StagePlan, stage_rank: int, layout: Any) -> list[RankMatrix]:
    tp, etp, ep = layout.tp, layout.etp, layout.ep
    b, e, k = stage_rank // tp, (stage_rank // etp) % ep, stage_rank // (etp * ep)
    out = []
    for t in sp.tensors:
        if not t.hidden:
            continue
        if t.ep_rank is None:
            split = sp.plan.splits.get(t.item.name)
            mine = b in split.ranks if split is not None else sp.plan.owners[t.item.name] == b
        else:
            mine = t.ep_rank == e and sp.expert_replica[t.item.name] == k
        if mine:
            out.append(RankMatrix(t.item.name, tuple(t.item.shape), tuple(t.parts)))
    return out


def busiest_rank(recipe: TrainingRecipe, world_size: int | None = None) -> RankMatrices:
    """The matrices of the GPU with the most NS FLOPs under ``recipe``'s layer-wise plan on ``world_size`` GPUs
    (default: the recipe's); the first such GPU on a tie. A matrix split over DP ranks (``ns_split_target``) is
    listed whole on every member of its block."""
    layout = validate_layout(recipe, world_size)
    cost, _, target = recipe_cost_model(recipe)
    best: tuple[float, int, int, StagePlan] | None = None
    for p in range(layout.pp):
        sp = stage_plan(recipe.model, layout, p, cost=cost, balance_target=target)
        r = max(range(len(sp.gpu_flops)), key=lambda i: sp.gpu_flops[i])
        if best is None or sp.gpu_flops[r] > best[0]:
            best = (sp.gpu_flops[r], p, r, sp)
    flops, p, r, sp = best  # type: ignore[misc]
    return RankMatrices(recipe.name, layout.world_size, p, r, flops, tuple(_owned(sp, r, layout)))
