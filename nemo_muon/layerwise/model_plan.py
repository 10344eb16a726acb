"""Ownership plans of a whole ModelSpec at scale (computed, not run): NS load per GPU under PP, DP and EP.

Layout model (Megatron-Core): TP=1; ``pp`` stages each hold ``layers_per_stage[s]`` consecutive decoder layers
(virtual pipeline chunks of a rank are all on that rank, so VP does not change per-rank totals); the embedding is on
the first stage, the final norm and output head on the last. Each stage has ``dp`` data-parallel ranks; DP rank d
is EP rank ``d % ep``. Routed experts live on their EP rank (``expert // (num_experts / ep)``); with expert-DP
``dp / ep`` > 1 an EP rank's experts are spread over its expert-DP ranks by the same method, with expert-DP = 1
they are pinned. Every other tensor (fused gate/up or QKV parts together: they are one stored tensor) is free
and placed by the method. Element-wise tensors (embedding, head, norms) cost 0 NS FLOPs and are placed by bytes.

``split_large=True`` models what the engine does not do (yet): a free matrix whose NS cost exceeds
``split_threshold`` x the stage's mean free load per rank is split into k equal row blocks orthogonalized jointly
by k DP ranks (distributed NS, Gram matrix all-reduced: exact when split along the long side), communication not
counted. This is the only way below the LPT bound set by one whole o_proj or dense-MLP matrix on one rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nemo_muon._validation import check_choice, check_positive_int, check_range, fail
from nemo_muon.layerwise.plan import METHODS, Method, OwnershipPlan, PlanItem, ns_cost, plan_ownership
from nemo_muon.models.specs import ModelSpec

KIMI_K2_BRIDGE_LAYERS: tuple[int, ...] = (16, 16, 16, 13)
"""Decoder layers per PP rank in Megatron-Bridge's Kimi K2 PP4 VP4 recipe."""


def default_layers_per_stage(num_layers: int, pp: int) -> tuple[int, ...]:
    """Even split, the first ``num_layers % pp`` stages one layer more."""
    q, r = divmod(num_layers, pp)
    return tuple(q + 1 if s < r else q for s in range(pp))


@dataclass
class ModelPlan:
    """One ownership plan per pipeline stage, and the imbalance within a stage and across all GPUs."""

    model: str
    method: str
    dp: int
    pp: int
    ep: int
    layers_per_stage: tuple[int, ...]
    stages: list[OwnershipPlan]

    @property
    def within_stage_imbalance(self) -> float:
        """Worst max/mean of NS FLOPs among the DP ranks of one stage."""
        return max(s.imbalance for s in self.stages)

    @property
    def global_imbalance(self) -> float:
        """max/mean of NS FLOPs over all dp*pp GPUs (includes the pipeline layout's imbalance)."""
        flops = [f for s in self.stages for f in s.flops]
        total = sum(flops)
        return max(flops) / (total / len(flops)) if total > 0 else 1.0

    @property
    def max_rank_flops(self) -> float:
        return max(f for s in self.stages for f in s.flops)

    def to_dict(self) -> dict[str, Any]:
        """Summary as JSON-ready data (per-stage max/mean/min NS FLOPs and imbalance; owners left out)."""
        return {
            "model": self.model,
            "method": self.method,
            "gpus": self.dp * self.pp,
            "dp": self.dp,
            "pp": self.pp,
            "ep": self.ep,
            "layers_per_stage": list(self.layers_per_stage),
            "within_stage_imbalance": self.within_stage_imbalance,
            "global_imbalance": self.global_imbalance,
            "max_rank_ns_flops": self.max_rank_flops,
            "stages": [
                {"max_ns_flops": max(s.flops), "mean_ns_flops": sum(s.flops) / len(s.flops),
                 "min_ns_flops": min(s.flops), "imbalance": s.imbalance}
                for s in self.stages
            ],
        }

    def format(self) -> str:
        """One line per stage, then the two imbalance figures."""
        lines = [f"{self.model} on {self.dp * self.pp} GPUs (PP{self.pp} DP{self.dp} EP{self.ep}), {self.method}"]
        for i, s in enumerate(self.stages):
            mean = sum(s.flops) / len(s.flops)
            lines.append(f"  stage {i} ({self.layers_per_stage[i]} layers): max {max(s.flops):.3e} "
                         f"mean {mean:.3e} NS FLOP/step, max/mean {s.imbalance:.4f}")
        lines.append(f"  within-stage max/mean {self.within_stage_imbalance:.4f}, "
                     f"global max/mean {self.global_imbalance:.4f}")
        return "\n".join(lines)


def _stage_items(spec: ModelSpec, params: Sequence[Any], layers: range, first: bool, last: bool, ep: int,
                 ns_steps: int, bytes_per_param: int) -> tuple[list[PlanItem], list[tuple[PlanItem, int]]]:
    """Free items and (expert item, EP rank) pairs of one stage; split parts of one tensor merged."""
    merged: dict[str, dict[str, Any]] = {}
    for p in params:
        if p.layer is None:
            if (p.kind == "embedding" and not first) or (p.kind != "embedding" and not last):
                continue
        elif p.layer not in layers:
            continue
        cost = ns_cost(p.shape, ns_steps) if p.is_hidden_matrix else 0.0
        entry = merged.setdefault(p.tensor_name, {"cost": 0.0, "numel": 0, "expert": p.expert, "shape": p.shape})
        entry["cost"] += cost
        entry["numel"] += p.numel
    per_ep = spec.num_experts // ep if spec.num_experts else 1
    free: list[PlanItem] = []
    experts: list[tuple[PlanItem, int]] = []
    for name, e in merged.items():
        item = PlanItem(name, tuple(e["shape"]), e["cost"], e["numel"] * bytes_per_param)
        if e["expert"] is None:
            free.append(item)
        else:
            experts.append((item, e["expert"] // per_ep))
    return free, experts


def _split(items: list[PlanItem], threshold: float) -> list[PlanItem]:
    out: list[PlanItem] = []
    for it in items:
        k = math.ceil(it.cost / threshold) if threshold > 0 and it.cost > threshold else 1
        if k == 1:
            out.append(it)
            continue
        for j in range(k):
            out.append(PlanItem(f"{it.name}[rows {j}/{k}]", it.shape, it.cost / k, it.nbytes // k))
    return out


def model_plan(spec: ModelSpec, *, dp: int, pp: int = 1, ep: int = 1, layers_per_stage: Sequence[int] | None = None,
               method: Method = "lpt", split_large: bool = False, split_threshold: float = 0.5, ns_steps: int = 5,
               bytes_per_param: int = 2) -> ModelPlan:
    """Plan NS ownership for ``spec`` on ``dp * pp`` GPUs (TP=1) with expert parallelism ``ep``.

    ``layers_per_stage`` defaults to an even split; pass ``KIMI_K2_BRIDGE_LAYERS`` for Bridge's Kimi K2 layout.
    """
    check_positive_int("dp", dp)
    check_positive_int("pp", pp)
    check_positive_int("ep", ep)
    check_choice("method", method, METHODS)
    check_range("split_threshold", split_threshold, low=0.0, low_inclusive=False)
    if dp % ep:
        raise fail("ep", ep, f"a divisor of dp ({dp})")
    if spec.num_experts and spec.num_experts % ep:
        raise fail("ep", ep, f"a divisor of num_experts ({spec.num_experts})")
    lps = default_layers_per_stage(spec.num_layers, pp) if layers_per_stage is None else tuple(layers_per_stage)
    if len(lps) != pp or sum(lps) != spec.num_layers or min(lps) < 1:
        raise fail("layers_per_stage", lps, f"{pp} positive layer counts summing to num_layers ({spec.num_layers})")
    from nemo_muon.models.matrices import matrix_params

    params = matrix_params(spec)
    stages: list[OwnershipPlan] = []
    start = 0
    expert_dp = dp // ep
    for s, n in enumerate(lps):
        free, experts = _stage_items(spec, params, range(start, start + n), s == 0, s == pp - 1, ep, ns_steps,
                                     bytes_per_param)
        start += n
        pinned: list[PlanItem] = []
        for e in range(ep):
            mine = [it for it, r in experts if r == e]
            sub = plan_ownership(mine, expert_dp, method)
            pinned += [PlanItem(it.name, it.shape, it.cost, it.nbytes, pinned_rank=e + ep * sub.owners[it.name])
                       for it in mine]
        if split_large:
            mean_free = sum(it.cost for it in free) / dp
            free = _split(free, split_threshold * mean_free)
        stages.append(plan_ownership(pinned + free, dp, method))
    label = f"{method}+split" if split_large else method
    return ModelPlan(model=spec.name, method=label, dp=dp, pp=pp, ep=ep, layers_per_stage=lps, stages=stages)


def compare_methods(spec: ModelSpec, **layout: Any) -> dict[str, ModelPlan]:
    """The same layout planned by LPT, LPT with large matrices split, and the two baselines."""
    out = {m: model_plan(spec, method=m, **layout) for m in ("round_robin", "ping_pong", "lpt")}
    out["lpt+split"] = model_plan(spec, method="lpt", split_large=True, **layout)
    return out
