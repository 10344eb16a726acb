"""Ownership plans of a whole ModelSpec at scale (computed, not run): NS load per GPU under TP, PP, CP, DP and EP.

This module is the one place the per-rank Newton–Schulz load of the layer-wise optimizer is computed:
``stage_plan`` plans one pipeline stage of a validated ``Layout``; ``nemo-muon plan`` (``accounting.planner``)
and ``model_plan`` / ``compare_methods`` (bench, docs) both call it. Torch-free.

Model (Megatron-Core's layout):

- PP rank p holds the decoder layers of its virtual stages (``Layout.pp_rank_layers``), the embedding on rank 0,
  the final norm and the head on the last rank.
- The GPUs of one stage are tp·cp·dp; GPU r has TP rank r mod tp and DP·CP index r div tp, and for routed experts
  ETP rank r mod etp, EP rank (r div etp) mod ep and expert-DP index r div (etp·ep).
- The ownership unit is a stored tensor (the whole-tensor optimizer and Megatron's layer-wise optimizer own whole tensors). A fused
  gate/up or QKV tensor costs the NS of its parts when the optimizer splits it (``split_gate_up`` / ``split_qkv``)
  and of the fused matrix when it does not (Megatron orthogonalizes ``linear_fc1`` fused), but is owned as one.
- Cost = NS FLOPs one TP rank executes for the TP mode (``accounting.ns_count.ns_flops_per_tp_rank``); shapes and
  bytes are the TP rank's shard. Element-wise tensors cost 0 and are placed by bytes.
- ``CostModel.tensors`` names whose stored tensors these are. "megatron": Megatron's (above). "hf": the torch
  backend's HF models (``nemo_muon.models.hf``): every Megatron part (q / k / v, gate / up, the MLA projections) is
  a tensor of its own, and the routed experts of a layer are one 3-D stack per projection (gate and up fused), owned
  whole like any other tensor (the torch backend has no EP); the whole-tensor optimizer (``layerwise.plan_items``) costs
  exactly these tensors.
- With EP > 1, routed experts of EP rank e are spread over its expert-DP replicas by the method (pinned when
  expert-DP = 1); with EP = 1 and ETP = TP they are ordinary tensors of the stage (Megatron's ``allreduce`` stays
  True);
  the stage's other tensors go to the dp·cp ranks by the method, starting from the expert work each rank has.
  When etp = tp (Megatron's default) a DP·CP rank's TP ranks hold the same experts and the experts are pinned in
  the same plan; otherwise the DP plan starts from the busiest TP rank's expert load.

``balance_target`` (``stage_plan``, ``model_plan``; what the layer-wise optimizers execute, ``nemo-muon plan``'s
figures): a free hidden matrix can be split over an aligned block of 2, 4 or 8 DP ranks that run its Newton–Schulz
together (``accounting.ns_split``: distributed NS over the block, its true per-member cost and bytes); LPT splits the
busiest rank's largest matrix until the stage's max/mean reaches the target (``ownership.plan_ownership``). Only
with TP = 1 (under TP a matrix is already a shard; a split would nest in the TP mode) and never for routed experts
(owned within their EP rank's expert-DP group, or, at EP = 1, kept whole as the engines keep them).
``split_gather_update`` counts the extra all-gather of the whole update that Megatron's layer-wise optimizer needs (``nemo_muon.megatron.core_016_017.cost_balanced``); the whole-tensor optimizer shares the slices in its usual buckets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nemo_muon._validation import check_choice, check_positive_int, fail
from nemo_muon.accounting.layout import Layout
from nemo_muon.accounting.ns_count import TP_MODES, ns_flops_per_tp_rank, spec_partition_dim
from nemo_muon.accounting.ns_split import DEFAULT_BALANCE_TARGET, split_options
from nemo_muon.accounting.ownership_plan import METHODS, Method, OwnershipPlan, PlanItem, max_over_mean, plan_ownership
from nemo_muon.models.matrices import ParamInfo, is_moe_layer, layer_params, non_layer_params
from nemo_muon.models.specs import ModelSpec

KIMI_K2_BRIDGE_LAYERS: tuple[int, ...] = (16, 16, 16, 13)
"""Decoder layers per PP rank in Megatron-Bridge's Kimi K2 PP4 VP4 recipe."""


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """How a tensor's NS work is counted: steps, GEMM or SYRK count, which fused tensors are split, TP mode."""

    steps: int = 5
    syrk: bool = False
    split_gate_up: bool = True
    split_qkv: bool = True
    tp_mode: str = "duplicated"
    split_gather_update: bool = False
    """A split matrix's whole update is all-gathered within its block (Megatron's layer-wise optimizer)."""
    tensors: str = "megatron"
    """Whose stored tensors are the ownership units: "megatron" or "hf" (the torch backend's; module doc)."""

    def __post_init__(self) -> None:
        check_positive_int("cost.steps", self.steps)
        check_choice("cost.tp_mode", self.tp_mode, TP_MODES)
        check_choice("cost.tensors", self.tensors, TENSOR_LAYOUTS)


TENSOR_LAYOUTS: tuple[str, ...] = ("megatron", "hf")
"""The values of ``CostModel.tensors``."""
_LOCAL_EXPERT = re.compile(r"local_experts\.[0-9]+\.", re.ASCII)


@dataclass(frozen=True)
class StageTensor:
    """One stored tensor of a stage as one TP rank sees it."""

    item: PlanItem
    """Name of the stored tensor, TP-shard shape, NS FLOPs one TP rank executes, bytes of the shard."""
    parts: tuple[tuple[int, ...], ...]
    """TP-shard shape of each matrix NS runs on (one, or the split gate/up / QKV parts); () if element-wise."""
    ep_rank: int | None = None
    """EP rank holding this routed expert; None for every other tensor."""

    @property
    def hidden(self) -> bool:
        """True for the matrices Muon orthogonalizes."""
        return bool(self.parts)


@dataclass
class StagePlan:
    """Ownership of one pipeline stage and the NS FLOPs each of its GPUs executes."""

    tensors: list[StageTensor]
    plan: OwnershipPlan
    """Owners among the stage's dp·cp ranks (routed experts included when etp = tp); ``flops`` per DP·CP rank."""
    expert_replica: dict[str, int]
    """Routed expert -> expert-DP replica (of its EP rank) that owns it."""
    gpu_flops: list[float]
    """NS FLOPs per step of each GPU of the stage (tp·cp·dp, Megatron's rank order)."""


def _shard(shape: tuple[int, ...], width: int, pdim: int | None) -> tuple[int, ...]:
    if pdim is None or width == 1:
        return shape
    out = list(shape)
    out[pdim] //= width
    return tuple(out)


def _split_options(name: str, parts: tuple[tuple[int, ...], ...], layout: Layout, cost: CostModel,
                   query_groups: int | None) -> tuple[Any, ...]:
    if layout.tp != 1 or not parts:
        return ()
    fused_qkv = len(parts) == 3 and ".linear_qkv." in name
    return split_options([(p[0], p[1]) for p in parts], steps=cost.steps, syrk=cost.syrk,
                         query_groups=query_groups if fused_qkv else None, gather_update=cost.split_gather_update)


def _tensor_key(p: ParamInfo, tensors: str) -> str:
    """The stored tensor a parameter (part) belongs to under ``CostModel.tensors`` (module doc)."""
    if tensors == "megatron":
        return p.tensor_name
    if p.expert is None:
        return p.name  # HF stores every Megatron part as a tensor of its own
    return _LOCAL_EXPERT.sub("experts.", p.tensor_name)  # one stack of the layer's experts per projection


def _layer_tensors(params: list[ParamInfo], layout: Layout, cost: CostModel,
                   bytes_per_param: int, experts_per_ep: int, query_groups: int | None = None) -> list[StageTensor]:
    merged: dict[str, list[ParamInfo]] = {}
    for p in params:
        merged.setdefault(_tensor_key(p, cost.tensors), []).append(p)
    out: list[StageTensor] = []
    for name, ps in merged.items():
        width = layout.etp if ps[0].kind == "expert" else layout.tp
        pdim = spec_partition_dim(ps[0]) if len(ps[0].shape) == 2 else None
        numel = sum(math.prod(_shard(p.shape, width, pdim)) for p in ps)
        hidden = [p for p in ps if p.is_hidden_matrix]
        flops = sum(ns_flops_per_tp_rank(p.shape, width, cost.tp_mode, pdim, cost.steps, syrk=cost.syrk)
                    for p in hidden)
        stacked = cost.tensors == "hf" and ps[0].expert is not None
        experts = sorted({p.expert for p in ps}) if stacked else []
        one = [p for p in ps if p.expert == ps[0].expert]  # the parts of one tensor (of one expert in a stack)
        shape = _shard((sum(p.shape[0] for p in one), *ps[0].shape[1:]), width, pdim)  # split parts stack on rows
        if stacked:
            shape = (len(experts), *shape)
        parts = tuple(_shard(p.shape, width, pdim) for p in hidden)
        # Megatron owns routed experts within their EP rank's expert-DP group; at EP = 1 (ETP = TP) they are
        # ordinary dense parameters (``allreduce`` stays True) placed with the rest. Routed experts are never split.
        routed = ps[0].expert is not None
        grouped = layout.ep > 1 or layout.etp != layout.tp
        ep_rank = ps[0].expert // experts_per_ep if routed and not stacked and grouped else None
        options = () if routed else _split_options(name, parts, layout, cost, query_groups)
        out.append(StageTensor(PlanItem(name, shape, flops, numel * bytes_per_param, split_options=options), parts,
                               ep_rank))
    return out


def _params_of_layer(spec: ModelSpec, i: int, cost: CostModel) -> list[ParamInfo]:
    """Layer ``i``'s parameters with the parts NS runs on. Megatron's tensors fuse gate/up and QKV (split per the
    optimizer's flags); HF's are separate tensors (always split), except the experts' fused gate/up stack."""
    ps = layer_params(spec, i, split_gate_up=cost.split_gate_up, split_qkv=cost.split_qkv)
    if cost.tensors == "megatron":
        return ps
    separate = layer_params(spec, i, split_gate_up=True, split_qkv=True)
    return [p for p in separate if p.expert is None] + [p for p in ps if p.expert is not None]


def stage_tensors(spec: ModelSpec, layout: Layout, pp_rank: int, cost: CostModel = CostModel(),
                  bytes_per_param: int = 2) -> list[StageTensor]:
    """The stored tensors PP rank ``pp_rank`` holds (decoder layers in order, then embedding / final norm / head)."""
    per_ep = spec.num_experts // layout.ep if spec.num_experts else 1
    templates: dict[bool, tuple[int, list[StageTensor]]] = {}
    out: list[StageTensor] = []
    for i in layout.pp_rank_layers(pp_rank):
        moe = is_moe_layer(spec, i)
        if moe not in templates:  # every layer of a kind has the same tensors: build once, rename per layer
            ps = _params_of_layer(spec, i, cost)
            templates[moe] = (i, _layer_tensors(ps, layout, cost, bytes_per_param, per_ep, spec.num_query_groups))
        j, tpl = templates[moe]
        old, new = f"decoder.layers.{j}.", f"decoder.layers.{i}."
        if i == j:
            out += tpl
            continue
        cut = len(old)
        out += [StageTensor(PlanItem(new + t.item.name[cut:], t.item.shape, t.item.cost, t.item.nbytes,
                                     split_options=t.item.split_options), t.parts, t.ep_rank) for t in tpl]
    first, last = non_layer_params(spec)
    extra = (first if pp_rank == 0 else []) + (last if pp_rank == layout.pp - 1 else [])
    return out + _layer_tensors(extra, layout, cost, bytes_per_param, per_ep, spec.num_query_groups)


def stage_plan(spec: ModelSpec, layout: Layout, pp_rank: int, *, method: Method = "lpt",
               cost: CostModel = CostModel(), balance_target: float | None = None,
               bytes_per_param: int = 2, tensors: list[StageTensor] | None = None) -> StagePlan:
    """Layer-wise ownership of PP rank ``pp_rank``'s tensors and the NS FLOPs of each of its GPUs (module doc).

    ``balance_target`` splits the largest free matrices over DP ranks to reach it (LPT only; module doc).
    ``tensors`` reuses a ``stage_tensors(spec, layout, pp_rank, cost, bytes_per_param)`` list built before."""
    check_choice("method", method, METHODS)
    if tensors is None:
        tensors = stage_tensors(spec, layout, pp_rank, cost, bytes_per_param)
    tp, etp, ep, edp, dpcp = layout.tp, layout.etp, layout.ep, layout.edp, layout.dp * layout.cp
    expert_replica: dict[str, int] = {}
    expert_load = [[0.0] * edp for _ in range(ep)]
    by_ep: dict[int, list[PlanItem]] = {}
    for t in tensors:
        if t.ep_rank is not None:
            by_ep.setdefault(t.ep_rank, []).append(t.item)
    first: tuple[list[tuple[Any, ...]], list[int], list[float]] | None = None
    for e, items in by_ep.items():
        key = [(it.shape, it.cost, it.nbytes) for it in items]
        if first is None or key != first[0]:  # EP ranks with identical experts get the identical (deterministic) plan
            sub = plan_ownership(items, edp, method)
            first = (key, [sub.owners[it.name] for it in items], sub.flops)
        expert_replica.update(zip((it.name for it in items), first[1], strict=True))
        expert_load[e] = list(first[2])
    gpu_expert = [expert_load[(r // etp) % ep][r // (etp * ep)] for r in range(tp * dpcp)]
    free = [t.item for t in tensors if t.ep_rank is None]
    if tp == etp:  # DP·CP rank b holds EP rank b mod ep's experts of replica b div ep on all of its TP ranks
        pinned = [PlanItem(t.item.name, t.item.shape, t.item.cost, t.item.nbytes,
                           pinned_rank=t.ep_rank + ep * expert_replica[t.item.name])
                  for t in tensors if t.ep_rank is not None]
        plan = plan_ownership(pinned + free, dpcp, method, balance_target=balance_target)
        gpu = [plan.flops[r // tp] for r in range(tp * dpcp)]
    else:
        start = [max(gpu_expert[b * tp:(b + 1) * tp]) for b in range(dpcp)]
        plan = plan_ownership(free, dpcp, method, initial_flops=start, balance_target=balance_target)
        gpu = [plan.flops[r // tp] - start[r // tp] + gpu_expert[r] for r in range(tp * dpcp)]
    return StagePlan(tensors=tensors, plan=plan, expert_replica=expert_replica, gpu_flops=gpu)


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
        return max_over_mean([f for s in self.stages for f in s.flops])

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


def default_layers_per_stage(num_layers: int, pp: int) -> tuple[int, ...]:
    """Even split, the first ``num_layers % pp`` stages one layer more."""
    q, r = divmod(num_layers, pp)
    return tuple(q + 1 if s < r else q for s in range(pp))


def model_plan(spec: ModelSpec, *, dp: int, pp: int = 1, ep: int = 1, layers_per_stage: Sequence[int] | None = None,
               method: Method = "lpt", balance_target: float | None = None, ns_steps: int = 5,
               bytes_per_param: int = 2, split_gate_up: bool = True, split_qkv: bool = True,
               split_gather_update: bool = False) -> ModelPlan:
    """Plan NS ownership for ``spec`` on ``dp * pp`` GPUs (TP=1, CP=1) with expert parallelism ``ep``.

    Stage s holds ``layers_per_stage[s]`` consecutive layers (default: an even split; pass
    ``KIMI_K2_BRIDGE_LAYERS`` for Bridge's Kimi K2 layout). ``split_gate_up`` / ``split_qkv`` say whether NS runs on
    the parts of the fused tensors (our optimizers' default) or on the fused matrix (Megatron's Muon for gate/up).
    For a recipe's own layout (VP, TP, CP) use ``nemo-muon plan`` / ``accounting.plan_recipe``: same computation.
    """
    check_positive_int("dp", dp)
    check_positive_int("pp", pp)
    check_positive_int("ep", ep)
    check_positive_int("ns_steps", ns_steps)
    check_choice("method", method, METHODS)
    if dp % ep:
        raise fail("ep", ep, f"a divisor of dp ({dp})")
    if spec.num_experts and spec.num_experts % ep:
        raise fail("ep", ep, f"a divisor of num_experts ({spec.num_experts})")
    lps = default_layers_per_stage(spec.num_layers, pp) if layers_per_stage is None else tuple(layers_per_stage)
    if len(lps) != pp or sum(lps) != spec.num_layers or min(lps) < 1:
        raise fail("layers_per_stage", lps, f"{pp} positive layer counts summing to num_layers ({spec.num_layers})")
    layout = Layout(world_size=dp * pp, tp=1, pp=pp, vp=1, cp=1, ep=ep, etp=1, dp=dp, edp=dp // ep,
                    num_microbatches=1, stage_layers=lps, uneven=len(set(lps)) > 1)
    cost = CostModel(steps=ns_steps, split_gate_up=split_gate_up, split_qkv=split_qkv,
                     split_gather_update=split_gather_update)
    stages = [stage_plan(spec, layout, s, method=method, cost=cost, balance_target=balance_target,
                         bytes_per_param=bytes_per_param).plan for s in range(pp)]
    label = f"{method}+split" if balance_target is not None else method
    return ModelPlan(model=spec.name, method=label, dp=dp, pp=pp, ep=ep, layers_per_stage=lps, stages=stages)


def compare_methods(spec: ModelSpec, **layout: Any) -> dict[str, ModelPlan]:
    """The same layout planned by LPT, LPT with large matrices split, and the two baselines."""
    out = {m: model_plan(spec, method=m, **layout) for m in ("round_robin", "ping_pong", "lpt")}
    out["lpt+split"] = model_plan(spec, method="lpt", balance_target=DEFAULT_BALANCE_TARGET, **layout)
    return out
