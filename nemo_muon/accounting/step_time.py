"""Step-time model: what a step of Muon and of AdamW costs on given hardware, before launch (torch-free).

Inputs are the plan's counts (``accounting.planner``: model FLOPs, the matrices each rank orthogonalizes, the
elements it updates, the bytes it gathers), the operators each Muon implementation issues (counted on its real step,
``Implementation``) and the hardware constants of ``accounting.hardware``: vendor figures with their sources, and two
assumptions, the operator floor (an input: ``kernel_floor_us``) and the ring-hop latency. The model's achieved
TFLOP/s/GPU is the user's (an AdamW baseline's measurement) or an assumed ``DEFAULT_MODEL_MFU`` of the dense BF16
peak. docs/step_time.md lists every constant with its source or "assumed" and the predictions' sensitivity to the
floor.

Parts of one step, per path (docs/step_time.md has the rules and the published checks):

- ``compute_s``: model FLOPs per GPU / achieved model FLOP/s. Megatron counts 2 FLOPs per weight per token forward
  and 4 backward, so the backward is 2/3 of it and the forward 1/3: the windows a collective can hide in.
- ``grad_reduction_s``: the data-parallel gradient reduction over the DP·CP group of the stage (and the expert-DP
  group for routed experts): a ring reduce-scatter sends (g-1)/g of the buffer, an all-reduce twice that. Hidden in
  the backward when ``overlap_grad_reduce`` (Megatron's buckets), up to the window.
- ``param_gather_s``: the bf16 parameters a rank receives to refresh what it did not update. Megatron's distributed
  optimizer (AdamW) and the reduce-scatter layout hide it in the next forward; Megatron's legacy layer-wise path
  gathers after the step (Bridge keeps ``overlap_param_gather=False`` for it), exposed.
- ``optimizer_s``: the busiest rank's update: Adam's element-wise pass over the elements it owns (30 B each, HBM
  bound) plus every operator of the matrix update the implementation issues (``Implementation.launches``: Newton–
  Schulz in the algorithm it runs on that shape, ``ns_operators``, the operators around each run, the element-wise
  ones sharing the matrix optimizer's ``matrix.element_bytes`` per element, Muon's 22 B), each priced as
  max(FLOPs / peak, bytes / HBM, the kernel floor), issued once per matrix (Megatron's and Emerging-Optimizers'
  loop, ours with ``batch_ns=False``) or once per same-shape stack (ours as shipped); with split ownership, plus the
  bytes the rank sends within its blocks for the split matrices (their Gram all-reduces and the update's exchange)
  at the block's bandwidth.
- ``step_s`` = compute + the exposed parts + optimizer; ``throughput_ratio`` = AdamW's step time / the path's.

A collective's bandwidth is NVLink when its ranks share one NVLink domain, the scale-out NIC otherwise
(``Hardware.link_bytes_per_s``); ranks are numbered in Megatron's order (tp fastest, then cp, dp, pp).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_muon._validation import check_choice, check_range, fail
from nemo_muon.accounting.hardware import Hardware
from nemo_muon.accounting.layout import Layout
from nemo_muon.accounting.ns_choice import choose_algorithm
from nemo_muon.config.optimizer import COEFFICIENT_SETS
from nemo_muon.registry.cost import FP32_BYTES
from nemo_muon.registry.muon import MUON_MATRIX

DEFAULT_MODEL_MFU = 0.40
"""Assumed: achieved model FLOP/s as a fraction of the dense BF16 peak when the user gives no baseline
(``--model-tflops``), printed as such; pass the AdamW baseline's measured model TFLOP/s/GPU instead."""
BACKWARD_SHARE = 2.0 / 3.0
"""Derived: Megatron's FLOP count, 4 of every 6 FLOPs per weight per token are the backward."""
ADAMW_BYTES_PER_ELEMENT = 30
"""Derived: Adam's update reads fp32 master, grad and two moments (16 B), writes master and moments (12 B) and the
bf16 param (2 B). Megatron's Adam: the baseline's distributed optimizer and every matrix optimizer's element-wise
part."""
MUON_BYTES_PER_ELEMENT = MUON_MATRIX.element_bytes
"""Muon's element-wise work per matrix element (its registry entry's ``matrix.element_bytes``): the default of
`StepInputs.matrix_bytes_per_element`."""
NS_PRECISIONS = ("bf16", "fp32")


STACK_BYTES = 2 * 2**30
"""`nemo_muon.optim.ns_stacks.STACK_BYTES` (the optimizer's default), restated here because this module is torch-free
(``tests/test_step_time.py`` checks they agree)."""


@dataclass(frozen=True)
class Implementation:
    """How a Muon implementation issues its operators: the counts are those of its real optimizer step, counted by
    a torch dispatch mode (`nemo_muon.optim.op_count`; ``tests/test_step_time.py`` re-counts them, bench/launches.py
    counts whole ranks), on the path a GPU runs (bf16 NS: the standard iteration)."""

    name: str
    storage_bytes: int | None
    """Bytes per element NS reads and writes (Emerging-Optimizers' NS takes fp32 and multiplies at the "medium"
    precision, i.e. bf16 tensor cores); None: those of the NS precision (nemo-muon's)."""
    ops_per_part: int
    """Operators around each Newton–Schulz run of a part, besides the iteration (normalization, scale)."""
    part_bytes: float
    """Bytes per element of the part those operators read and write together (fp32: a read or a write is 4)."""
    ops_per_matrix: int
    """Element-wise operators per matrix (per stack when ``batched``): momentum, look-ahead, weight decay, update."""
    picks_algorithm: bool
    """Chooses Gram NS where ``accounting.ns_choice.choose_algorithm`` does (nemo-muon); otherwise always the
    standard iteration: per step X·Xᵀ, b·A + c·A·A, a·X + B·X."""
    casts: int = 0
    """Operators per NS run that cast its input to bf16 and the result back, in bf16 precision (6 B per element
    each)."""
    tall: int = 0
    """Operators per NS run of a tall part (more rows than columns: worked on transposed, copied back; 8 B per
    element each)."""
    ops_per_step: int = 0
    """Operators per step whatever the matrices (the non-finite check, the multi-tensor update)."""
    batched: bool = False
    """Same-shape matrices stacked (`nemo_muon.optim.ns_stacks`): every count above is per stack, not per matrix."""
    stack_bytes: float = STACK_BYTES
    """Most fp32 bytes of input per stack (``batched``)."""

    def units(self, w: MatrixWork) -> int:
        """How many times the per-matrix counts apply to ``w``: once per matrix, or once per stack."""
        if not self.batched:
            return w.count
        return max(1, math.ceil(w.count * FP32_BYTES * _elements(w) / self.stack_bytes))

    def launches(self, work: Sequence[MatrixWork], steps: int, precision: str, device: str = "cuda",
                 coefficients: str = "quintic") -> int:
        """Operators one step of this implementation issues on ``work`` (what ``ns_seconds`` prices)."""
        dtype = "bfloat16" if precision == "bf16" else "float32"
        total = self.ops_per_step
        for w in work:
            per_unit = self.ops_per_matrix
            for rows, cols in _parts(w):
                m, n = sorted((rows, cols))
                algorithm = choose_algorithm(m, n, device, dtype, coefficients) if self.picks_algorithm else "standard"
                per_unit += len(ns_operators(m, n, steps, algorithm, 4)) + self._around(rows, cols, precision)
            total += self.units(w) * per_unit
        return total

    def _around(self, rows: int, cols: int, precision: str) -> int:
        return self.ops_per_part + (self.casts if precision == "bf16" else 0) + (self.tall if rows > cols else 0)

    def _around_bytes(self, rows: int, cols: int, precision: str) -> float:
        """Bytes per element of a part that the operators of `_around` move."""
        return self.part_bytes + (6.0 * self.casts if precision == "bf16" else 0.0) + (8.0 * self.tall if rows > cols
                                                                                     else 0.0)


IMPLEMENTATIONS: dict[str, Implementation] = {
    # Megatron-Core's TensorParallelMuon (Emerging-Optimizers' Muon step per parameter, Nesterov on): per part the
    # norm (reads 4 B), clamp_min, div (8), two casts (12) and the two muls of the scale (16); per matrix the decay
    # add_, lerp_, lerp and the update's add_
    "megatron": Implementation("megatron", storage_bytes=4, ops_per_part=7, part_bytes=40.0, ops_per_matrix=4,
                               picks_algorithm=False),
    # nemo-muon's Muon, batch_ns=False: per part the normalization (mul 8 B, sum 4, sqrt, clamp_min, div 8) and the
    # scale (8); per matrix lerp_ and lerp; per step the non-finite check (4) and the multi-tensor decay and update
    "nemo_muon_per_matrix": Implementation("nemo_muon_per_matrix", storage_bytes=None, ops_per_part=6,
                                           part_bytes=28.0, ops_per_matrix=2, picks_algorithm=True, casts=2, tall=1,
                                           ops_per_step=6),
    # nemo-muon's Muon as shipped (batch_ns=True): per stack the normalization (5: 20 B); per batch of stacks the
    # multi-tensor copy, look-ahead, decay and update (4, priced per stack; the scale rides on the update's alpha);
    # per step the non-finite check (4) and the multi-tensor momentum (1)
    "nemo_muon": Implementation("nemo_muon", storage_bytes=None, ops_per_part=5, part_bytes=20.0, ops_per_matrix=4,
                                picks_algorithm=True, casts=2, tall=1, ops_per_step=5, batched=True),
}


def _parts(w: MatrixWork) -> list[tuple[int, int]]:
    return [(s[-2], s[-1]) for s in w.shapes if len(s) >= 2]


def _elements(w: MatrixWork) -> int:
    return sum(rows * cols for rows, cols in _parts(w))


def ns_operators(m: int, n: int, steps: int, algorithm: str, element_bytes: int) -> list[tuple[float, float]]:
    """(FLOPs, bytes) of each operator of one NS run on an m x n matrix (m <= n) with ``algorithm``.

    standard: 3 per step (the FLOP count of ``registry.cost.ns_flop_terms``). gram: X·Xᵀ and Q·X once, per step the
    polynomial and the diagonal shift, and the m x m products (Z·Q from the second step, Z·R·Z until the last):
    2 + steps + (4·steps - 3) operators, 4m²n + 2m³(4·steps - 3) FLOPs as ``ns_flop_terms`` counts them."""
    e = element_bytes
    wide = (2.0 * m * m * n, e * (m * n + m * m))
    square = (2.0 * m ** 3, e * 3.0 * m * m)
    if algorithm == "standard":
        return steps * [wide, square, (2.0 * m * m * n, e * (m * m + 3.0 * m * n))]
    if algorithm != "gram":
        raise fail("algorithm", algorithm, "'standard' or 'gram'")
    return [wide, (2.0 * m * m * n, e * (m * m + 2.0 * m * n))] + steps * [(0.0, e * 2.0 * m)] \
        + (4 * steps - 3) * [square]


@dataclass(frozen=True)
class MatrixWork:
    """One matrix (or a stack of ``count`` identical ones) a rank orthogonalizes."""

    shapes: tuple[tuple[int, ...], ...]
    """The parts NS runs on, as this TP rank holds them."""
    flops: float
    """NS FLOPs this rank executes for one of them (the plan's cost, TP-mode repeats included)."""
    count: int = 1


@dataclass(frozen=True)
class RankWork:
    """What one GPU updates in a step (from the plan)."""

    matrices: tuple[MatrixWork, ...]
    matrix_elements: float
    """Elements of the matrices it updates with Muon."""
    adam_elements: float
    """Elements it updates with Adam (its share of the element-wise parameters)."""
    gather_bytes: float
    """bf16 bytes it receives per step to refresh the parameters others update (layer-wise ownership)."""
    split_bytes: float = 0.0
    """Bytes it sends per step for the matrices split over its blocks of DP ranks (split ownership: the Gram
    all-reduces and the update's exchange, ``OwnershipPlan.split_bytes``), in the optimizer step."""
    split_block: int = 1
    """Ranks in its largest such block (1: no split)."""


@dataclass(frozen=True)
class StageComm:
    """One pipeline stage's gradient and parameter volumes."""

    dense_elements: float
    """Parameters of the stage outside the routed experts (reduced over DP·CP)."""
    expert_elements: float
    """Routed-expert parameters of one EP rank (reduced over expert-DP)."""


@dataclass(frozen=True)
class PathTime:
    """The parts of one step on one path (module doc)."""

    compute_s: float
    grad_reduction_s: float
    grad_reduction_exposed_s: float
    param_gather_s: float
    param_gather_exposed_s: float
    optimizer_s: float
    ns_busiest_rank_s: float
    overlap: str

    @property
    def step_s(self) -> float:
        return self.compute_s + self.grad_reduction_exposed_s + self.optimizer_s + self.param_gather_exposed_s

    def to_dict(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "compute_s": self.compute_s, "grad_reduction_s": self.grad_reduction_s,
                "grad_reduction_exposed_s": self.grad_reduction_exposed_s, "param_gather_s": self.param_gather_s,
                "param_gather_exposed_s": self.param_gather_exposed_s, "optimizer_s": self.optimizer_s,
                "ns_busiest_rank_s": self.ns_busiest_rank_s, "overlap": self.overlap}


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """Everything the model reads besides the hardware (built by ``accounting.planner``)."""

    layout: Layout
    model_flops_per_gpu: float
    ranks: Sequence[Sequence[RankWork]]
    """Per pipeline stage, per GPU of the stage (Megatron's order)."""
    stages: Sequence[StageComm]
    ns_steps: int
    ns_precision: str = "bf16"
    ns_coefficients: str = "quintic"
    """The NS coefficient set (``MuonConfig.coefficients``): it decides the algorithm of bf16 NS (``ns_seconds``)."""
    grad_bytes: int = 2
    """Bytes per gradient element in the reduction (Bridge's perf runs: bf16, ``grad_reduce_in_fp32=False``)."""
    overlap_grad_reduce: bool = True
    implementation: Implementation = field(default_factory=lambda: IMPLEMENTATIONS["megatron"])
    matrix_bytes_per_element: int = MUON_BYTES_PER_ELEMENT
    """HBM bytes of the matrix optimizer's element-wise passes per matrix element (the recipe's registry entry:
    ``spec.matrix.element_bytes``)."""

    def __post_init__(self) -> None:
        check_range("model_flops_per_gpu", self.model_flops_per_gpu, low=0.0)
        if len(self.ranks) != self.layout.pp or len(self.stages) != self.layout.pp:
            raise fail("step inputs", (len(self.ranks), len(self.stages)), f"one entry per PP stage ({self.layout.pp})")
        if self.ns_precision not in NS_PRECISIONS:
            raise fail("ns_precision", self.ns_precision, f"one of {NS_PRECISIONS}")
        check_choice("ns_coefficients", self.ns_coefficients, COEFFICIENT_SETS)


def _ring(nbytes: float, group: int, bandwidth: float, latency: float, *, all_reduce: bool = False) -> float:
    """A ring reduce-scatter / all-gather (twice that for an all-reduce) of an ``nbytes`` buffer over ``group``."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    one = (group - 1) / group * nbytes / bandwidth + (group - 1) * latency
    return 2.0 * one if all_reduce else one


def _group_bandwidth(hw: Hardware, layout: Layout, stride: int, size: int) -> float:
    """Slowest bandwidth over the stages' groups of ``size`` ranks ``stride`` apart (tp rank 0 of each)."""
    per_stage = layout.tp * layout.cp * layout.dp
    return min(hw.link_bytes_per_s([p * per_stage + stride * i for i in range(size)]) for p in range(layout.pp))


def _peak_for_ns(hw: Hardware, precision: str) -> float:
    # fp32 NS runs on TF32 tensor cores, half the BF16 rate on Hopper and Blackwell datasheets; a CPU has 'fp32'
    if precision in hw.peak_flops:
        return hw.peak(precision)
    return hw.peak("bf16") / 2.0 if precision == "fp32" else hw.peak("bf16")


def _op(hw: Hardware, flops: float, nbytes: float, peak: float) -> float:
    return max(flops / peak, nbytes / hw.hbm_bytes_per_s, hw.kernel_floor_s)


def ns_seconds(work: Sequence[MatrixWork], hw: Hardware, impl: Implementation, steps: int, precision: str,
               coefficients: str = "quintic", element_bytes: float = MUON_BYTES_PER_ELEMENT) -> float:
    """Time one rank spends in its matrix update: every operator ``impl.launches`` counts, each priced at
    max(FLOPs / peak, bytes / HBM, the floor) (module doc). Newton–Schulz's operators move their operands
    (``ns_operators``); the operators around a run share ``Implementation.part_bytes`` per element of the part (plus
    the casts' and a tall part's copy), the element-wise ones the update's ``element_bytes`` per matrix element. Every coefficient set runs ``steps`` iterations of the same
    step; ``coefficients`` matters only for the algorithm choice (a set of ``ns_choice.GRAM_BF16_DIVERGES`` runs bf16
    NS in the standard form)."""
    peak = _peak_for_ns(hw, precision)
    e = impl.storage_bytes or (2 if precision == "bf16" else 4)
    dtype = "bfloat16" if precision == "bf16" else "float32"
    total = impl.ops_per_step * hw.kernel_floor_s
    for w in work:
        units = impl.units(w)
        stack = w.count / units  # matrices per operator
        parts = _parts(w)
        standard = sum(steps * (4 * m * m * n + 2 * m ** 3) for m, n in (sorted(p) for p in parts))
        scale = w.flops / standard if standard > 0 else 1.0  # TP-mode repeats of the plan's (standard) cost
        t = 0.0
        for rows, cols in parts:
            m, n = sorted((rows, cols))
            algorithm = choose_algorithm(m, n, hw.kind, dtype, coefficients) if impl.picks_algorithm else "standard"
            t += sum(_op(hw, stack * scale * f, stack * scale * b, peak)
                     for f, b in ns_operators(m, n, steps, algorithm, e))
            ops = impl._around(rows, cols, precision)
            t += ops * _op(hw, 0.0, stack * impl._around_bytes(rows, cols, precision) * rows * cols / ops, peak)
        if impl.ops_per_matrix:
            t += impl.ops_per_matrix * _op(hw, 0.0, stack * element_bytes * _elements(w) / impl.ops_per_matrix, peak)
        total += units * t
    return total


def path_times(inputs: StepInputs, hw: Hardware, model_flops_per_s: float) -> dict[str, PathTime]:
    """The three paths (AdamW's distributed optimizer, Muon's all-reduce layout, Muon's reduce-scatter layout)."""
    check_range("model_flops_per_s", model_flops_per_s, low=0.0, low_inclusive=False)
    lay = inputs.layout
    compute = inputs.model_flops_per_gpu / model_flops_per_s
    backward, forward = BACKWARD_SHARE * compute, (1.0 - BACKWARD_SHARE) * compute
    dpcp = lay.dp * lay.cp
    dp_bw = _group_bandwidth(hw, lay, lay.tp, dpcp)
    edp_bw = _group_bandwidth(hw, lay, lay.etp * lay.ep, lay.edp)
    lat = hw.collective_latency_s
    g = inputs.grad_bytes

    def reduce(stage: StageComm, all_reduce: bool) -> float:
        return (_ring(g * stage.dense_elements, dpcp, dp_bw, lat, all_reduce=all_reduce)
                + _ring(g * stage.expert_elements, lay.edp, edp_bw, lat, all_reduce=all_reduce))

    def gather_sharded(stage: StageComm) -> float:
        return (_ring(2 * stage.dense_elements, dpcp, dp_bw, lat)
                + _ring(2 * stage.expert_elements, lay.edp, edp_bw, lat))

    def hidden(t: float, window: float, overlapped: bool) -> float:
        return max(0.0, t - window) if overlapped else t

    rs = max(reduce(s, False) for s in inputs.stages)
    ar = max(reduce(s, True) for s in inputs.stages)
    ag = max(gather_sharded(s) for s in inputs.stages)
    adam_opt = max(ADAMW_BYTES_PER_ELEMENT * (s.dense_elements / dpcp + s.expert_elements / lay.edp)
                   for s in inputs.stages) / hw.hbm_bytes_per_s
    by_work: dict[tuple[MatrixWork, ...], float] = {}  # ranks holding identical matrices: priced once
    ns = []
    for rk in (rk for stage in inputs.ranks for rk in stage):
        if rk.matrices not in by_work:
            by_work[rk.matrices] = ns_seconds(rk.matrices, hw, inputs.implementation, inputs.ns_steps,
                                              inputs.ns_precision, inputs.ns_coefficients,
                                              inputs.matrix_bytes_per_element)
        ns.append(by_work[rk.matrices])
    def split_exchange(rk: RankWork) -> float:  # within its blocks: consecutive DP ranks, tp apart
        return rk.split_bytes / _group_bandwidth(hw, lay, lay.tp, rk.split_block) if rk.split_block > 1 else 0.0

    muon_opt = max(n + ADAMW_BYTES_PER_ELEMENT * rk.adam_elements / hw.hbm_bytes_per_s + split_exchange(rk)
                   for n, rk in zip(ns, (rk for st in inputs.ranks for rk in st), strict=True))
    uneven = max(rk.gather_bytes for stage in inputs.ranks for rk in stage) / dp_bw
    og = inputs.overlap_grad_reduce
    grad_note = "grad reduction in the backward" if og else "grad reduction after the backward"
    return {
        "adamw": PathTime(compute, rs, hidden(rs, backward, og), ag, hidden(ag, forward, True), adam_opt, 0.0,
                          f"distributed optimizer: {grad_note} (reduce-scatter), param all-gather in the forward"),
        "muon_all_reduce": PathTime(compute, ar, hidden(ar, backward, og), uneven, uneven, muon_opt, max(ns),
                                    f"layer-wise, Megatron's legacy path: {grad_note} (all-reduce), Newton–Schulz "
                                    "on the busiest rank, then the uneven param gather, exposed"),
        "muon_reduce_scatter": PathTime(compute, rs, hidden(rs, backward, og), uneven, hidden(uneven, forward, True),
                                        muon_opt, max(ns),
                                        f"layer-wise, reduce-scatter layout: {grad_note} (reduce-scatter to "
                                        "owners), Newton–Schulz on the busiest rank, param gather in the forward"),
    }


def predict(inputs: StepInputs, hw: Hardware, *, model_tflops: float | None = None,
            kernel_floor_us: float | None = None) -> dict[str, Any]:
    """The step-time block of ``plan --json`` (docs/flops.md lists its keys). ``kernel_floor_us``: the operator
    floor in microseconds (default: the hardware table's, `hardware.KERNEL_FLOOR_S`, an assumption)."""
    if model_tflops is None:
        rate, source = DEFAULT_MODEL_MFU * hw.peak("bf16"), f"assumed: {DEFAULT_MODEL_MFU:.0%} of dense bf16 peak"
    else:
        # achieved model TFLOP/s cannot pass the GPU's fastest dense peak
        check_range(f"model_tflops on {hw.name}", model_tflops, low=0.0, low_inclusive=False,
                    high=max(hw.peak_flops.values()) / 1e12)
        rate, source = model_tflops * 1e12, "given with --model-tflops"
    if kernel_floor_us is None:
        floor_source = f"assumed: {hw.kernel_floor_s * 1e6:g} us (docs/step_time.md, measure it: bench/gpu/step_time_ns.py)"
    else:
        check_range("kernel_floor_us", kernel_floor_us, low=0.0, high=1e6)
        hw = dataclasses.replace(hw, kernel_floor_s=kernel_floor_us * 1e-6)
        floor_source = "given with --kernel-floor-us"
    paths = path_times(inputs, hw, rate)
    adamw = paths["adamw"].step_s
    muon = [k for k in paths if k != "adamw"]
    return {
        "hardware": hw.describe(),
        "model_tflops_per_gpu": rate / 1e12,
        "model_tflops_source": source,
        "kernel_floor_us": hw.kernel_floor_s * 1e6,
        "kernel_floor_source": floor_source,
        "implementation": inputs.implementation.name,
        "launches_per_step_max": max(inputs.implementation.launches(work, inputs.ns_steps, inputs.ns_precision,
                                                                    hw.kind, inputs.ns_coefficients)
                                     for work in {rk.matrices for stage in inputs.ranks for rk in stage}),
        "ns_precision": inputs.ns_precision,
        "grad_bytes": inputs.grad_bytes,
        "paths": {k: v.to_dict() for k, v in paths.items()},
        "throughput_ratio": {k: adamw / paths[k].step_s for k in muon},
        "extra_step_s": {k: paths[k].step_s - adamw for k in muon},
        "extra_step_vs_adamw": {k: paths[k].step_s / adamw - 1.0 for k in muon},
    }
