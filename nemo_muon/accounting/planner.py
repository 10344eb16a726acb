"""Pre-launch plan of a recipe: layout, model FLOPs, Newton–Schulz work per rank, optimizer state and gathers.

Torch-free. What it models (docs/flops.md has the rules and the arithmetic):

- Layout from ``validate_layout``; PP rank p holds the decoder layers of its virtual stages, the embedding on
  rank 0 and the final norm + head on the last rank.
- The ranks of one pipeline stage are tp·cp·dp; rank r has TP rank r mod tp and DP·CP index r div tp, and for
  experts ETP rank r mod etp, EP rank (r div etp) mod ep, expert-DP index r div (etp·ep) (Megatron's order).
- NS load per GPU and the layer-wise ownership come from ``nemo_muon.accounting.model_ownership.stage_plan`` (the one
  place they are computed; ``model_plan`` / ``compare_methods`` use it too): whole stored tensors are the ownership
  unit, a fused gate/up or QKV tensor costs the NS of its parts when the optimizer splits it and of the fused
  matrix when not (the megatron recipes: ``split_gate_up=False``); routed experts stay on their EP rank (LPT over
  its edp replicas), the stage's other tensors go by LPT over the dp·cp ranks starting from their expert load.
  Without layer-wise ownership every replica orthogonalizes all of its matrices. Costs are the NS FLOPs one TP
  rank executes for the recipe's TP mode. With Muon's ``ns_split_target`` the plan is the split one
  the whole-tensor optimizer executes (``stage_plan(balance_target=...)``: the whole-tensor optimizer, or our ownership inside
  Megatron-Core 0.16's layer-wise optimizer, which also all-gathers the update within the block:
  ``CostModel.split_gather_update``); ``ns_split`` reports that plan's figures (split matrices, extra bytes per
  rank, the pipeline layout's bound on the global max/mean) and, for a recipe without a target, what a split at
  the default target would give, marked ``executed: false``.
- Optimizer state = fp32 master weights + optimizer state per rank (bf16 weights and gradients are the same for
  every optimizer and left out), for every optimizer of the registry (``nemo_muon.registry``): an element-wise one
  (AdamW) 12 B/param sharded over dp·cp (experts over edp) like Megatron's distributed optimizer; a matrix one
  4 B x (master + ``spec.matrix.state_elements``) per owned matrix (Muon: + momentum; SOAP: + moments, Kronecker
  factors and eigenbases; per fused part when its update runs per part), AdamW's 12 B for the rest.
- Param gather = bf16 bytes one rank receives per step to refresh the parameters it does not update itself.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_muon._validation import check_choice
from nemo_muon.accounting.gpu_peaks import gpu_peak, known_gpus, peak_precision_of, throughput
from nemo_muon.accounting.hardware import hardware, known_hardware
from nemo_muon.accounting.layout import Layout, validate_layout
from nemo_muon.accounting.model_flops import model_flops_per_token
from nemo_muon.accounting.model_ownership import StagePlan, StageTensor, stage_plan
from nemo_muon.accounting.ns_count import matrix_ns_flops
from nemo_muon.accounting.ns_split import DEFAULT_BALANCE_TARGET
from nemo_muon.accounting.ownership_plan import max_over_mean
from nemo_muon.accounting.rank_matrices import recipe_cost_model
from nemo_muon.accounting.step_time import IMPLEMENTATIONS, MatrixWork, RankWork, StageComm, StepInputs, predict
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.matrices import is_moe_layer, layer_params, param_counts
from nemo_muon.models.specs import ModelSpec
from nemo_muon.registry import spec_for, spec_named, specs
from nemo_muon.registry.cost import FP32_BYTES

ADAMW_STATE_ELEMENTS = 3
"""An element-wise (Adam-family) optimizer's fp32 elements per parameter: master, first and second moment."""

COUNTING_RULE = (
    "model: Megatron num_floating_point_operations (6 FLOPs per weight per token, top-k routed experts, causal "
    "attention at s/2, logits, no recompute); NS: every hidden matrix once per step on its short side m<=n, "
    "{steps} steps x (4m^2n+2m^3) GEMM or (3m^2n+m^3) SYRK [{method}], per expert, gate/up {gate_up}, QKV {qkv}; "
    "per-rank figures include TP-mode repeats ({tp_mode}); see docs/flops.md"
)


@dataclass
class _Rank:
    ns: float = 0.0
    numel: int = 0
    owned_hidden: int = 0
    owned_state: dict[str, int] = field(default_factory=dict)
    """Matrix optimizer name -> state elements (besides masters) of the matrices this rank owns."""
    adam_share: float = 0.0
    """Elements of AdamW-updated params this rank updates (element-sharded)."""
    work: dict[tuple[tuple[tuple[int, ...], ...], float], int] = field(default_factory=dict)
    """(NS parts, NS FLOPs) -> how many such matrices this rank orthogonalizes (the step-time model's input)."""
    split_bytes: float = 0.0
    """Bytes it sends per step for split matrices within its blocks (``OwnershipPlan.split_bytes``)."""
    split_block: int = 1
    """Ranks in its largest block (1: no split)."""


def _state_elements(t: StageTensor) -> dict[str, int]:
    """State elements of a hidden tensor under each matrix optimizer: its parts' or the whole tensor's."""
    names = tuple(s.name for s in specs() if s.matrix is not None)  # every registered matrix optimizer
    return _state_elements_of(tuple(t.item.shape), tuple(t.parts), names)


@functools.lru_cache(maxsize=4096)
def _state_elements_of(shape: tuple[int, ...], parts: tuple[tuple[int, ...], ...],
                       names: tuple[str, ...]) -> dict[str, int]:
    """`_state_elements` by shape (a model has few distinct shapes and very many tensors; callers only read it)."""
    out = {}
    for spec in map(spec_named, names):
        m = spec.matrix
        out[spec.name] = sum(m.state_elements(part) for part in parts) if m.per_part else m.state_elements(shape)
    return out


def _add(into: dict[Any, int], more: dict[Any, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _stage_ranks(layout: Layout, sp: StagePlan, layerwise: bool, split_held_whole: bool = False) -> list[_Rank]:
    """Per-GPU NS load, held elements, owned matrix elements and AdamW share of one stage (``sp`` from
    ``nemo_muon.accounting.model_ownership.stage_plan``, the one source of the ownership and of the NS load).
    ``split_held_whole``: every member of a split matrix's block keeps its whole master and momentum (our ownership
    inside Megatron-Core 0.16); otherwise each keeps its slice (the whole-tensor optimizer)."""
    tp, etp, ep, edp = layout.tp, layout.etp, layout.ep, layout.edp
    dpcp = layout.dp * layout.cp
    dense = [t for t in sp.tensors if t.ep_rank is None]
    dense_numel = sum(t.item.numel for t in dense)
    dense_adam = sum(t.item.numel for t in dense if not t.hidden)
    d_numel, d_ns = [0] * dpcp, [0.0] * dpcp
    d_state: list[dict[str, int]] = [{} for _ in range(dpcp)]
    e_numel = [[0] * edp for _ in range(ep)]
    e_state: list[list[dict[str, int]]] = [[{} for _ in range(edp)] for _ in range(ep)]
    e_ns = [[0.0] * edp for _ in range(ep)]
    e_held = [0] * ep
    e_adam = [0] * ep
    d_work: list[dict[Any, int]] = [{} for _ in range(dpcp)]
    e_work: list[list[dict[Any, int]]] = [[{} for _ in range(edp)] for _ in range(ep)]
    for t in sp.tensors:
        if not t.hidden:
            if t.ep_rank is not None:
                e_held[t.ep_rank] += t.item.numel
                e_adam[t.ep_rank] += t.item.numel
            continue
        if t.ep_rank is None:
            split = sp.plan.splits.get(t.item.name) if layerwise else None
            if split is not None:  # each member of the block owns one slice
                for b in split.ranks:
                    d_numel[b] += t.item.numel if split_held_whole else t.item.numel // split.option.ways
                    d_ns[b] += split.option.cost
                    _count(d_work[b], (t.parts, split.option.cost))
                continue
            for b in [sp.plan.owners[t.item.name]] if layerwise else range(dpcp):
                d_numel[b] += t.item.numel
                _add(d_state[b], _state_elements(t))
                d_ns[b] += t.item.cost
                _count(d_work[b], (t.parts, t.item.cost))
            continue
        e_held[t.ep_rank] += t.item.numel
        for k in [sp.expert_replica[t.item.name]] if layerwise else range(edp):
            e_numel[t.ep_rank][k] += t.item.numel
            _add(e_state[t.ep_rank][k], _state_elements(t))
            e_ns[t.ep_rank][k] += t.item.cost
            _count(e_work[t.ep_rank][k], (t.parts, t.item.cost))
    split_bytes = sp.plan.split_bytes if layerwise and sp.plan.splits else [0.0] * dpcp
    block = [max((len(s.ranks) for s in sp.plan.splits.values() if b in s.ranks), default=1) if layerwise else 1
             for b in range(dpcp)]
    ranks = []
    for r in range(tp * dpcp):
        b, e, k = r // tp, (r // etp) % ep, r // (etp * ep)
        ns = sp.gpu_flops[r] if layerwise else d_ns[b] + e_ns[e][k]
        ranks.append(_Rank(ns=ns, numel=dense_numel + e_held[e], owned_hidden=d_numel[b] + e_numel[e][k],
                           owned_state=_merged(d_state[b], e_state[e][k]),
                           adam_share=dense_adam / dpcp + e_adam[e] / edp, work=_merged(d_work[b], e_work[e][k]),
                           split_bytes=float(split_bytes[b]), split_block=block[b]))
    return ranks


def _count(into: dict[Any, int], key: Any) -> None:
    into[key] = into.get(key, 0) + 1


def _merged(a: dict[Any, int], b: dict[Any, int]) -> dict[Any, int]:
    out = dict(a)
    _add(out, b)
    return out


def _optimizer_bytes(rank: _Rank, dense_numel: int, expert_numel: int, layout: Layout) -> dict[str, float]:
    """Optimizer-state bytes of this rank under every registered optimizer (module doc)."""
    dpcp = layout.dp * layout.cp
    adam = float(FP32_BYTES * ADAMW_STATE_ELEMENTS)
    out = {}
    for spec in specs():
        if spec.matrix is None:
            out[spec.name] = adam * (dense_numel / dpcp + expert_numel / layout.edp)
        else:
            owned = rank.owned_hidden + rank.owned_state.get(spec.name, 0)
            out[spec.name] = float(FP32_BYTES * owned) + adam * rank.adam_share
    return out


def plan_recipe(recipe: TrainingRecipe, world_size: int | None = None, *, gpu: str | None = None,
                syrk: bool = False, step_time_s: float | None = None,
                stage_layers: Sequence[int] | str | None = None, model_tflops: float | None = None,
                kernel_floor_us: float | None = None, implementation: str | None = None) -> dict[str, Any]:
    """The plan of ``recipe`` on ``world_size`` GPUs (default: the recipe's) as a JSON-ready dict.

    ``step_time_s`` (a measured step time) adds TFLOP/s/GPU and MFU, model-only and model + NS. ``stage_layers``
    is an explicit pipeline layout (see ``validate_layout``). ``model_tflops`` (the AdamW baseline's achieved model
    TFLOP/s/GPU) anchors the step-time model's compute (``step_time``; default: an assumed MFU);
    ``kernel_floor_us`` is its operator floor (default: the assumed one of ``accounting.hardware``) and
    ``implementation`` the Muon it prices (a key of ``step_time.IMPLEMENTATIONS``; default: the recipe engine's,
    Megatron's own or ours as shipped, batched). Raises ``LayoutError`` (ValueError) naming the
    constraint when the layout is invalid.
    """
    layout = validate_layout(recipe, world_size, stage_layers)
    if implementation is not None:
        check_choice("implementation", implementation, tuple(IMPLEMENTATIONS))
    spec, opt, tr = recipe.model, recipe.optimizer, recipe.trainer
    gpu = recipe.system.gpu if gpu is None else gpu
    opt_spec = spec_for(opt)
    cost, runs_ns, target = recipe_cost_model(recipe, syrk)  # runs_ns: NS-based, its load is planned
    steps, tp_mode = cost.steps, cost.tp_mode
    split = {"split_gate_up": cost.split_gate_up, "split_qkv": cost.split_qkv}
    ranks: list[_Rank] = []
    stage_imbalance: list[float] = []
    stage_max: list[float] = []
    stage_min: list[float] = []
    split_target = target if target is not None else DEFAULT_BALANCE_TARGET
    split_loads: list[list[float]] = []
    split_plans: list[StagePlan] = []
    opt_bytes: dict[str, float] = {spec.name: 0.0 for spec in specs()}
    opt_name = opt_spec.name
    recipe_opt_bytes = 0.0
    gather_max = gather_total = 0.0
    step_ranks: list[list[RankWork]] = []
    step_stages: list[StageComm] = []
    for p in range(layout.pp):
        sp = stage_plan(spec, layout, p, cost=cost, balance_target=target)
        layerwise = _stage_ranks(layout, sp, True, split_held_whole=recipe.backend == "megatron")
        stage = layerwise if recipe.layerwise else _stage_ranks(layout, sp, False)
        dense_numel = sum(t.item.numel for t in sp.tensors if t.ep_rank is None)
        expert_numel = sum(t.item.numel for t in sp.tensors if t.ep_rank == 0)
        if runs_ns and opt_spec.matrix.splittable and recipe.layerwise:
            ssp = sp if target is not None else stage_plan(spec, layout, p, cost=cost, balance_target=split_target,
                                                           tensors=sp.tensors)
            split_plans.append(ssp)
            split_loads.append(ssp.gpu_flops)
        for rk, lw in zip(stage, layerwise, strict=True):
            # the comparison across optimizers uses layer-wise ownership for Muon/SOAP, Megatron's DistOpt for AdamW
            for k, v in _optimizer_bytes(lw, dense_numel, expert_numel, layout).items():
                opt_bytes[k] = max(opt_bytes[k], v)
            own = _optimizer_bytes(rk, dense_numel, expert_numel, layout)[opt_name]
            recipe_opt_bytes = max(recipe_opt_bytes, own)
            if opt_spec.matrix is None:  # Megatron's distributed optimizer: gather all but the own shard
                recv = dense_numel * (1 - 1 / (layout.dp * layout.cp)) + expert_numel * (1 - 1 / layout.edp)
            elif recipe.layerwise:  # everything but the owned matrices and the own AdamW shard
                recv = rk.numel - rk.owned_hidden - rk.adam_share
            else:  # every replica updates all of its parameters itself
                recv = 0.0
            gather_max = max(gather_max, 2.0 * recv)
            gather_total += 2.0 * recv
        step_ranks.append([_rank_work(lw) for lw in layerwise])
        step_stages.append(StageComm(dense_elements=dense_numel, expert_elements=expert_numel))
        loads = [rk.ns if runs_ns else 0.0 for rk in stage]
        stage_imbalance.append(max_over_mean(loads))
        stage_max.append(max(loads))
        stage_min.append(min(loads))
        ranks += stage
    useful = _useful_ns_flops(spec, split, steps, syrk) if runs_ns else 0.0
    loads = [rk.ns for rk in ranks] if runs_ns else [0.0] * len(ranks)
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
        "ns_imbalance": max_over_mean(loads),
        "ns_imbalance_within_stage_max": max(stage_imbalance),
        "ns_split": _split_summary(split_plans, split_loads, split_target, target is not None),
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
    out["step_time"] = None
    for name, value in (("model_tflops", model_tflops), ("kernel_floor_us", kernel_floor_us)):
        if value is not None and gpu.lower() not in known_hardware():  # never ignored silently
            raise ValueError(f"{name} prices the step-time model, which needs a GPU with public constants (one of "
                             f"{tuple(known_hardware())}); got {name}={value} with gpu {gpu!r}")
    if gpu.lower() in known_hardware():
        megatrons_own = recipe.backend == "megatron" and getattr(opt, "engine", None) == "megatron"
        inputs = StepInputs(
            layout=layout, model_flops_per_gpu=flops.total * tokens / layout.world_size, ranks=step_ranks,
            stages=step_stages, ns_steps=steps,
            # Megatron's own Muon multiplies in bf16 ("medium" fp32 matmul precision); ours in its ns_precision
            ns_precision="bf16" if megatrons_own or not runs_ns else opt.ns_precision,
            ns_coefficients=opt.coefficients if runs_ns else "quintic",
            grad_bytes=4 if recipe.precision.kind == "fp32" else 2,
            implementation=IMPLEMENTATIONS[implementation or ("megatron" if megatrons_own else "nemo_muon")],
            **({"matrix_bytes_per_element": opt_spec.matrix.element_bytes} if opt_spec.matrix is not None else {}))
        out["step_time"] = predict(inputs, hardware(gpu), model_tflops=model_tflops, kernel_floor_us=kernel_floor_us)
    return out


def _rank_work(rank: _Rank) -> RankWork:
    """The step-time model's view of one GPU of the layer-wise plan."""
    return RankWork(matrices=tuple(MatrixWork(parts, cost, n) for (parts, cost), n in rank.work.items()),
                    matrix_elements=float(rank.owned_hidden), adam_elements=rank.adam_share,
                    gather_bytes=2.0 * (rank.numel - rank.owned_hidden - rank.adam_share),
                    split_bytes=rank.split_bytes, split_block=rank.split_block)


def _split_summary(plans: list[StagePlan], loads: list[list[float]], target: float,
                   executed: bool) -> dict[str, Any] | None:
    """The split plan's figures (None without layer-wise Muon): see the module doc."""
    if not plans:
        return None
    every = [f for stage in loads for f in stage]
    mean = sum(every) / len(every)
    stage_means = [sum(stage) / len(stage) for stage in loads]
    return {
        "target": target,
        "executed": executed,
        "note": None if executed else (
            "not executed: optimizer.ns_split_target is None (whole-tensor ownership); set it to run this split "
            "(torch backend; megatron backend on Megatron-Core 0.16 with engine nemo_muon and TP=1)"),
        "ns_imbalance_within_stage_max": max(max_over_mean(stage) for stage in loads),
        "ns_imbalance": max(every) / mean if mean > 0 else 1.0,
        "ns_imbalance_layout_bound": max(stage_means) / mean if mean > 0 else 1.0,
        "ns_flops_per_rank_max": max(every),
        "split_matrices": sum(len(sp.plan.splits) for sp in plans),
        "ways": sorted({s.option.ways for sp in plans for s in sp.plan.splits.values()}),
        "extra_bytes_per_rank_max": max(max(sp.plan.split_bytes) for sp in plans),
    }


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

