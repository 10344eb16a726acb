"""Pre-launch plan of a recipe: layout, model FLOPs, Newton–Schulz work per rank, optimizer state and gathers.

Torch-free. What it models (docs/flops.md has the rules and the arithmetic):

- Layout from ``validate_layout``; PP rank p holds the decoder layers of its virtual stages, the embedding on
  rank 0 and the final norm + head on the last rank.
- The ranks of one pipeline stage are tp·cp·dp; rank r has TP rank r mod tp and DP·CP index r div tp, and for
  experts ETP rank r mod etp, EP rank (r div etp) mod ep, expert-DP index r div (etp·ep) (Megatron's order).
- Layer-wise ownership (``recipe.layerwise``): each routed expert's matrices go to one of the edp replicas of its EP
  rank (LPT over edp bins), then the stage's other hidden matrices go by LPT (``nemo_muon.layerwise.plan.lpt_assign``)
  over the dp·cp ranks, starting from the expert load each rank already has. Without layer-wise ownership every
  replica orthogonalizes all of its matrices. Costs are the NS FLOPs one TP rank executes for the recipe's TP mode.
- Routed experts of one model have identical shapes, so every EP rank carries the same expert work; the plan
  computes EP rank 0's experts and uses them for every EP rank.
- Optimizer state = fp32 master weights + optimizer moments per rank (bf16 weights and gradients are the same for
  every optimizer and left out): AdamW 12 B/param sharded over dp·cp (experts over edp) like Megatron's
  distributed optimizer; Muon 8 B (master + momentum) per element of the matrices a rank owns, AdamW's 12 B for the
  rest; SOAP 4 B x (master + 2 moments + 2 Kronecker factors + 2 eigenbases) for owned matrices.
- Param gather = bf16 bytes one rank receives per step to refresh the parameters it does not update itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nemo_muon.accounting.gpu_peaks import gpu_peak, known_gpus, peak_precision_of, throughput
from nemo_muon.accounting.layout import Layout, validate_layout
from nemo_muon.accounting.model_flops import model_flops_per_token
from nemo_muon.accounting.ns_flops import matrix_ns_flops, ns_flops_per_tp_rank, tp_partition_dim
from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.matrices import ParamInfo, is_moe_layer, layer_params, non_layer_params, param_counts
from nemo_muon.models.specs import ModelSpec

COUNTING_RULE = (
    "model: Megatron num_floating_point_operations (6 FLOPs per weight per token, top-k routed experts, causal "
    "attention at s/2, logits, no recompute); NS: every hidden matrix once per step on its short side m<=n, "
    "{steps} steps x (4m^2n+2m^3) GEMM or (3m^2n+m^3) SYRK [{method}], per expert, gate/up {gate_up}, QKV {qkv}; "
    "per-rank figures include TP-mode repeats ({tp_mode}); see docs/flops.md"
)


@dataclass(frozen=True)
class _Item:
    cost: float
    """NS FLOPs one TP rank executes."""
    numel: int
    """Elements one TP rank holds."""
    hidden: bool
    soap_elems: int = 0
    """SOAP state elements (moments + factors + eigenbases) of the TP rank's shard."""


@dataclass
class _Rank:
    ns: float = 0.0
    numel: int = 0
    owned_hidden: int = 0
    owned_soap: int = 0
    adam_share: float = 0.0
    """Elements of AdamW-updated params this rank updates (element-sharded)."""


def _item(p: ParamInfo, tp: int, etp: int, tp_mode: str, steps: int, syrk: bool) -> _Item:
    width = etp if p.kind == "expert" else tp
    pdim = tp_partition_dim(p) if len(p.shape) == 2 else None
    shard = list(p.shape)
    if pdim is not None and width > 1:
        shard[pdim] //= width
    numel = 1
    for d in shard:
        numel *= d
    if not p.is_hidden_matrix:
        return _Item(0.0, numel, False)
    m, n = shard
    cost = ns_flops_per_tp_rank(p.shape, width, tp_mode, pdim, steps, syrk=syrk)
    return _Item(cost, numel, True, 3 * m * n + 2 * (m * m + n * n))


class _Templates:
    """Per-TP-rank items of one dense and one MoE layer (every layer of a kind has the same shapes)."""

    def __init__(self, spec: ModelSpec, layout: Layout, kw: dict[str, Any], split: dict[str, bool]) -> None:
        self.spec, self.layout, self.kw, self.split = spec, layout, kw, split
        self._cache: dict[bool, tuple[list[_Item], list[_Item]]] = {}

    def layer(self, index: int) -> tuple[list[_Item], list[_Item]]:
        """(non-expert items, items of EP rank 0's local experts) of decoder layer ``index``."""
        moe = is_moe_layer(self.spec, index)
        if moe not in self._cache:
            local = self.spec.num_experts // self.layout.ep if moe else 0
            dense, experts = [], []
            for p in layer_params(self.spec, index, **self.split):
                if p.kind == "expert":
                    if p.expert < local:
                        experts.append(_item(p, self.layout.tp, self.layout.etp, **self.kw))
                else:
                    dense.append(_item(p, self.layout.tp, self.layout.etp, **self.kw))
            self._cache[moe] = (dense, experts)
        return self._cache[moe]


def _stage_items(spec: ModelSpec, layout: Layout, pp_rank: int, tpl: _Templates) -> tuple[list[_Item], list[_Item]]:
    dense: list[_Item] = []
    experts: list[_Item] = []
    for i in layout.pp_rank_layers(pp_rank):
        d, e = tpl.layer(i)
        dense += d
        experts += e
    first, last = non_layer_params(spec)
    extra = (first if pp_rank == 0 else []) + (last if pp_rank == layout.pp - 1 else [])
    dense += [_item(p, layout.tp, layout.etp, **tpl.kw) for p in extra]
    return dense, experts


def _lpt_loads(items: list[_Item], bins: int, initial: list[float]) -> tuple[list[float], list[int], list[int]]:
    """(added NS load, owned hidden numel, owned SOAP elements) per bin after LPT on the items' NS costs."""
    from nemo_muon.layerwise.plan import lpt_assign

    hidden = [it for it in items if it.hidden]
    owners = lpt_assign([it.cost for it in hidden], bins, initial_loads=initial)
    loads, numel, soap = [0.0] * bins, [0] * bins, [0] * bins
    for it, b in zip(hidden, owners, strict=True):
        loads[b] += it.cost
        numel[b] += it.numel
        soap[b] += it.soap_elems
    return loads, numel, soap


def _stage_ranks(layout: Layout, dense: list[_Item], experts: list[_Item], layerwise: bool) -> list[_Rank]:
    tp, etp, ep = layout.tp, layout.etp, layout.ep
    dpcp, edp = layout.dp * layout.cp, layout.edp
    nranks = tp * dpcp
    if layerwise:
        e_load, e_numel, e_soap = _lpt_loads(experts, edp, [0.0] * edp)
    else:
        full = [sum(it.cost for it in experts if it.hidden), sum(it.numel for it in experts if it.hidden),
                sum(it.soap_elems for it in experts)]
        e_load, e_numel, e_soap = ([full[0]] * edp, [full[1]] * edp, [full[2]] * edp)
    expert_adam = sum(it.numel for it in experts if not it.hidden)
    edp_of = [r // (etp * ep) for r in range(nranks)]
    if layerwise:
        initial = [e_load[edp_of[b * tp]] for b in range(dpcp)]
        d_load, d_numel, d_soap = _lpt_loads(dense, dpcp, initial)
    else:
        hidden = [it for it in dense if it.hidden]
        d_load = [sum(it.cost for it in hidden)] * dpcp
        d_numel = [sum(it.numel for it in hidden)] * dpcp
        d_soap = [sum(it.soap_elems for it in hidden)] * dpcp
    dense_numel = sum(it.numel for it in dense)
    expert_numel = sum(it.numel for it in experts)
    dense_adam = sum(it.numel for it in dense if not it.hidden)
    ranks = []
    for r in range(nranks):
        b, e = r // tp, edp_of[r]
        ranks.append(_Rank(ns=d_load[b] + e_load[e], numel=dense_numel + expert_numel,
                           owned_hidden=d_numel[b] + e_numel[e], owned_soap=d_soap[b] + e_soap[e],
                           adam_share=dense_adam / dpcp + expert_adam / edp))
    return ranks


def _optimizer_bytes(rank: _Rank, dense_numel: int, expert_numel: int, layout: Layout) -> dict[str, float]:
    dpcp = layout.dp * layout.cp
    return {
        "adamw": 12.0 * (dense_numel / dpcp + expert_numel / layout.edp),
        "muon": 8.0 * rank.owned_hidden + 12.0 * rank.adam_share,
        "soap": 4.0 * (rank.owned_hidden + rank.owned_soap) + 12.0 * rank.adam_share,
    }


def plan_recipe(recipe: TrainingRecipe, world_size: int | None = None, *, gpu: str | None = None,
                syrk: bool = False, step_time_s: float | None = None,
                stage_layers: Sequence[int] | str | None = None) -> dict[str, Any]:
    """The plan of ``recipe`` on ``world_size`` GPUs (default: the recipe's) as a JSON-ready dict.

    ``step_time_s`` (a measured step time) adds TFLOP/s/GPU and MFU, model-only and model + NS. ``stage_layers``
    is an explicit pipeline layout (see ``validate_layout``). Raises ``LayoutError`` (ValueError) naming the
    constraint when the layout is invalid.
    """
    layout = validate_layout(recipe, world_size, stage_layers)
    spec, opt, tr = recipe.model, recipe.optimizer, recipe.trainer
    gpu = recipe.system.gpu if gpu is None else gpu
    is_muon = isinstance(opt, MuonConfig)
    steps = opt.ns_steps if is_muon else 5
    tp_mode = opt.tp_mode if is_muon else "duplicated"
    split = {"split_gate_up": opt.split_gate_up, "split_qkv": opt.split_qkv} if is_muon else \
        {"split_gate_up": True, "split_qkv": True}
    tpl = _Templates(spec, layout, {"tp_mode": tp_mode, "steps": steps, "syrk": syrk}, split)
    ranks: list[_Rank] = []
    stage_imbalance: list[float] = []
    stage_max: list[float] = []
    stage_min: list[float] = []
    opt_bytes: dict[str, float] = {"adamw": 0.0, "muon": 0.0, "soap": 0.0}
    opt_name = "muon" if is_muon else ("soap" if isinstance(opt, SoapConfig) else "adamw")
    recipe_opt_bytes = 0.0
    gather_max = gather_total = 0.0
    for p in range(layout.pp):
        dense, experts = _stage_items(spec, layout, p, tpl)
        layerwise = _stage_ranks(layout, dense, experts, True)
        stage = layerwise if recipe.layerwise else _stage_ranks(layout, dense, experts, False)
        dense_numel = sum(it.numel for it in dense)
        expert_numel = sum(it.numel for it in experts)
        for rk, lw in zip(stage, layerwise, strict=True):
            # the comparison across optimizers uses layer-wise ownership for Muon/SOAP, Megatron's DistOpt for AdamW
            for k, v in _optimizer_bytes(lw, dense_numel, expert_numel, layout).items():
                opt_bytes[k] = max(opt_bytes[k], v)
            own = _optimizer_bytes(rk, dense_numel, expert_numel, layout)[opt_name]
            recipe_opt_bytes = max(recipe_opt_bytes, own)
            if isinstance(opt, AdamWConfig):  # Megatron's distributed optimizer: gather all but the own shard
                recv = dense_numel * (1 - 1 / (layout.dp * layout.cp)) + expert_numel * (1 - 1 / layout.edp)
            elif recipe.layerwise:  # everything but the owned matrices and the own AdamW shard
                recv = rk.numel - rk.owned_hidden - rk.adam_share
            else:  # every replica updates all of its parameters itself
                recv = 0.0
            gather_max = max(gather_max, 2.0 * recv)
            gather_total += 2.0 * recv
        loads = [rk.ns if is_muon else 0.0 for rk in stage]
        mean = sum(loads) / len(loads)
        stage_imbalance.append(max(loads) / mean if mean > 0 else 1.0)
        stage_max.append(max(loads))
        stage_min.append(min(loads))
        ranks += stage
    useful = _useful_ns_flops(spec, split, steps, syrk) if is_muon else 0.0
    loads = [rk.ns for rk in ranks] if is_muon else [0.0] * len(ranks)
    rank_max = max(loads)
    rank_mean = sum(loads) / len(loads)
    flops = model_flops_per_token(spec, tr.seq_length, tp=layout.tp)
    tokens = tr.global_batch_size * tr.seq_length
    peak_bf16 = gpu_peak(gpu).bf16 * 1e12 if gpu in known_gpus() else None
    all_params = param_counts(spec)
    out = {
        "recipe": recipe.name,
        "model": spec.name,
        "world_size": layout.world_size,
        "gpu": gpu,
        "optimizer": opt_name,
        "layerwise": recipe.layerwise,
        "parallelism": layout.parallelism(),
        "layers_per_pp_rank": list(layout.layers_per_pp_rank),
        "uneven_pipeline": layout.uneven,
        "num_microbatches": layout.num_microbatches,
        "model_params": all_params[0],
        "model_active_params": all_params[1],
        "params_per_rank_max": max(rk.numel for rk in ranks),
        "model_flops_per_token": flops.total,
        "model_flops_per_step": flops.total * tokens,
        "tokens_per_step": tokens,
        "ns_flops_per_step": useful,
        "ns_flops_executed_per_step": sum(loads),
        "ns_flops_per_rank_max": rank_max,
        "ns_flops_per_rank_mean": rank_mean,
        "ns_imbalance": rank_max / rank_mean if rank_mean > 0 else 1.0,
        "ns_imbalance_within_stage_max": max(stage_imbalance),
        "ns_flops_per_pp_rank_max": stage_max,
        "ns_flops_per_pp_rank_min": stage_min,
        "ns_to_model_flops": useful / (flops.total * tokens),
        "ns_time_per_step_s_at_peak": rank_max / peak_bf16 if peak_bf16 else None,
        "optimizer_state_bytes_per_rank": recipe_opt_bytes,
        "optimizer_state_bytes_per_rank_by_optimizer": opt_bytes,
        "param_gather_bytes_per_step": gather_max,
        "param_gather_bytes_per_step_all_ranks": gather_total,
        "syrk": syrk,
        "tp_mode": tp_mode,
        "counting_rule": COUNTING_RULE.format(
            steps=steps, method="SYRK" if syrk else "GEMM", tp_mode=tp_mode,
            gate_up="split" if split["split_gate_up"] else "fused", qkv="split" if split["split_qkv"] else "fused"),
    }
    if step_time_s is not None:
        out.update(_measured(out, step_time_s, gpu, recipe.precision.kind))
    return out


def _measured(plan: dict[str, Any], step_time_s: float, gpu: str, precision: str) -> dict[str, Any]:
    peak_prec = peak_precision_of(precision)
    known = gpu in known_gpus() and peak_prec is not None
    t = throughput(plan["model_flops_per_step"], plan["ns_flops_per_step"], step_time_s, plan["world_size"],
                   gpu if known else None, peak_prec or "bf16")
    return {
        "step_time_s": step_time_s,
        "model_tflops_per_gpu": t.model_tflops,
        "ns_tflops_per_gpu": t.ns_tflops,
        "model_plus_ns_tflops_per_gpu": t.total_tflops,
        "mfu_model": t.mfu_model,
        "mfu_model_plus_ns": t.mfu_total,
        "mfu_peak": f"{gpu} dense {peak_prec}" if known else None,
    }


def _useful_ns_flops(spec: ModelSpec, split: dict[str, bool], steps: int, syrk: bool) -> float:
    """Every hidden matrix once (layers of a kind share shapes, so one layer of each kind is summed)."""
    per_kind: dict[bool, float] = {}
    total = 0.0
    for i in range(spec.num_layers):
        moe = is_moe_layer(spec, i)
        if moe not in per_kind:
            per_kind[moe] = sum(matrix_ns_flops(p.shape, steps, syrk=syrk)
                                for p in layer_params(spec, i, **split) if p.is_hidden_matrix)
        total += per_kind[moe]
    return total

