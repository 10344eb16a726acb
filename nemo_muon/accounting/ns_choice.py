"""Choices of nemo_muon's Newton–Schulz by cost: the local algorithm, and the TP mode (``tp_mode="auto"``).

Torch-free. FLOPs (multiply-adds count 2) come from ``nemo_muon.accounting.ns_count.ns_flop_terms`` for one matrix
(m, n) with m <= n (the side being whitened): standard steps·(4m²n + 2m³), gram 4m²n + 2m³·(4·steps - 3).
The algorithm used locally is ``gram`` when n >= GRAM_MIN_ASPECT * m (measured on CPU by bench/ns.py), else
``standard`` (see ``choose_algorithm`` for bf16 on GPU).

TP mode choice for one matrix sharded over p ranks along ``partition_dim`` (time = FLOPs/flop_rate +
bytes/bandwidth + collectives*latency, per rank):
- duplicated: all-gather of the other (p-1)/p of the matrix, then the full NS on every rank.
- distributed: only possible when the shard is along the contracted (long) side; NS FLOPs of the m²n terms split p
  ways, the m³ terms duplicated, all-reduces of m×m Gram matrices (1 for gram, one per step for standard, plus one
  scalar for the norm).
``auto`` picks the cheaper of the two (never blockwise, which changes the result).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_muon.registry.cost import ns_flop_terms

SYRK_CAPABILITIES: tuple[tuple[int, int], ...] = ((8, 0), (9, 0), (10, 0), (10, 3))
"""GPU architectures emerging-optimizers validates its Triton SYRK kernel (``tsyrk_ex``) on (A100, H100/H200,
B200/GB200, B300/GB300): ``nemo_muon.optim.ns_kernels`` uses it there only, ``nemo-muon doctor`` reports it."""
GRAM_MIN_ASPECT = 2.0
"""Use Gram NS when the long side is at least this many times the short side."""
GRAM_BF16_DIVERGES: tuple[str, ...] = ("cans",)
"""Coefficient sets whose bf16 Gram iteration diverges: after 5 steps on Gaussian 64×256, 128×512 and 256×256
matrices cans' largest singular value is 9.4, 14 and 27 (restarting every 1, 2, 3 or 5 steps does not help: forming
Z = aI + bR + cR² in bf16 loses too much where its steps are steep), against 1.27-1.5 for bf16 standard NS (the band
of emerging-optimizers' bf16) and 1.12 in fp32. Every other set keeps its band (tests/test_coefficient_sets.py).
bf16 NS of these sets is the standard form: ``auto`` picks it, an explicit ``gram`` is refused."""


def _is_bf16_work(dtype: Any) -> bool:
    return dtype is not None and "float32" not in str(dtype)


def choose_algorithm(m: int, n: int, device: Any = "cpu", dtype: Any = None, coefficients: str = "quintic") -> str:
    """``gram`` or ``standard`` for an m×n matrix on ``device`` with NS compute dtype ``dtype`` and coefficient set
    ``coefficients``.

    Gram when the long side is >= GRAM_MIN_ASPECT x the short side, except in bf16 on a GPU (there the m×m iteration
    runs in bf16 with restarts, a looser band as on CPU, while SYRK-based standard NS is the tuned path:
    bench/gpu/ns_syrk.py measures both) and in bf16 for a set of ``GRAM_BF16_DIVERGES``."""
    short, long = min(m, n), max(m, n)
    on_gpu = str(getattr(device, "type", device)) != "cpu"
    if (on_gpu and _is_bf16_work(dtype)) or gram_diverges(coefficients, dtype):
        return "standard"
    return "gram" if long >= GRAM_MIN_ASPECT * short else "standard"


def gram_diverges(coefficients: str, dtype: Any) -> bool:
    """Whether Gram NS of the set ``coefficients`` in compute dtype ``dtype`` is refused (``GRAM_BF16_DIVERGES``)."""
    return _is_bf16_work(dtype) and coefficients in GRAM_BF16_DIVERGES


@dataclass(frozen=True, kw_only=True)
class TPCostModel:
    """Machine numbers for the auto TP-mode choice. Defaults: one H100/H200-class GPU with NVLink (bf16 dense
    ~4e14 FLOP/s effective for NS-sized GEMMs, ~1e11 B/s per-rank collective bandwidth, ~2e-5 s per collective)."""

    flops_per_s: float = 4e14
    bytes_per_s: float = 1e11
    latency_s: float = 2e-5
    bytes_per_element: int = 4


DEFAULT_TP_COST = TPCostModel()


def tp_mode_costs(
    full_shape: tuple[int, int], partition_dim: int, world: int, steps: int, cost: TPCostModel = DEFAULT_TP_COST
) -> dict[str, float]:
    """Estimated seconds of each feasible TP mode for one matrix; ``partition_dim`` is -2 (rows) or -1 (cols)."""
    rows, cols = full_shape
    m, n = min(rows, cols), max(rows, cols)
    bpe = cost.bytes_per_element
    frac = (world - 1) / world
    algo = choose_algorithm(m, n)
    big, small = ns_flop_terms(m, n, steps, algorithm=algo)  # the m²n terms split over the ranks, the m³ terms not
    dup = float(big + small) / cost.flops_per_s + rows * cols * bpe * frac / cost.bytes_per_s
    dup += cost.latency_s
    costs = {"duplicated": dup}
    contracted_dim = -1 if rows <= cols else -2
    if partition_dim == contracted_dim:
        reduces = 2 if algo == "gram" else steps + 1  # the norm, then one Gram matrix (gram) or one per step
        comm_bytes = 2 * frac * m * m * bpe * (reduces - 1)
        costs["distributed"] = (
            (big / world + small) / cost.flops_per_s + comm_bytes / cost.bytes_per_s + reduces * cost.latency_s
        )
    return costs


def choose_tp_mode(
    full_shape: tuple[int, int], partition_dim: int, world: int, steps: int, cost: TPCostModel = DEFAULT_TP_COST
) -> str:
    """The cheaper of duplicated / distributed for one matrix under ``cost`` (ties go to duplicated)."""
    costs = tp_mode_costs(full_shape, partition_dim, world, steps, cost)
    return min(costs, key=lambda k: (costs[k], k != "duplicated"))
