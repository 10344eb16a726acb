"""Newton–Schulz FLOPs of Muon's optimizer step: per matrix, per parameter list, per tensor-parallel mode.

Counting rule (published, tested; docs/flops.md):

- One NS iteration on X (m x n) is computed on the short side (transpose so m <= n): A = X·Xᵀ (2m²n FLOPs as a
  GEMM, m²n as a SYRK that computes one triangle), B = b·A + c·A·A (2m³, or m³ as a SYRK), X ← a·X + B·X (2m²n).
  ``steps`` iterations cost steps·(4m²n + 2m³) with GEMMs (5 steps: 20m²n + 10m³) and steps·(3m²n + m³) with SYRK
  (5 steps: 15m²n + 5m³). Element-wise work (the a·X, b·A additions, the normalisation) is not counted.
- Each routed expert is its own matrix (per-expert NS). A fused gate/up or QKV weight is counted as its parts
  when split (``matrix_params(split_gate_up=True, split_qkv=True)``) and as one matrix when fused.
- Only the hidden matrices Muon orthogonalizes count (``ParamInfo.is_hidden_matrix``: attention, dense MLP,
  routed and shared experts, router); embeddings, the head and norms go to AdamW.
- The count is the standard quintic iteration's. nemo_muon's Gram NS (``algorithm="gram"``: X·Xᵀ and Q·X once,
  4m²n + 2m³·(4·steps − 3), chosen on elongated matrices by ``nemo_muon.accounting.ns_choice``) and fused kernels
  execute less; the rule stays the standard count so numbers compare.
- "Useful" NS FLOPs count every matrix once (what a single device would do); "executed" FLOPs add the work a
  tensor-parallel mode repeats: ``duplicated`` runs the full NS on every TP rank (TP x the work), ``distributed``
  runs X·Xᵀ and B·X on the shard and repeats A·A on every rank, ``blockwise`` orthogonalizes each shard alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nemo_muon._validation import check_choice, check_positive_int, fail
from nemo_muon.config.optimizer import TP_MODES
from nemo_muon.models.matrices import ParamInfo
from nemo_muon.registry.cost import ns_flop_terms

_COLUMN_PARALLEL = ("linear_fc1", "linear_qkv", "linear_q_up_proj", "linear_kv_up_proj", "linear_q_proj",
                    "word_embeddings", "output_layer")
_ROW_PARALLEL = ("linear_proj", "linear_fc2")


def _short_long(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) != 2 or any(not isinstance(d, int) or d < 1 for d in shape):
        raise fail("shape", tuple(shape), "a 2-D shape of positive integers (m, n)")
    m, n = sorted(shape)
    return m, n


def matrix_ns_flops(shape: Sequence[int], steps: int = 5, *, syrk: bool = False, algorithm: str = "standard") -> float:
    """NS FLOPs of one (m, n) matrix on its short side: steps·(4m²n + 2m³), or steps·(3m²n + m³) with SYRK
    (``ns_flop_terms``; ``algorithm="gram"`` counts nemo_muon's Gram NS instead)."""
    check_positive_int("steps", steps)
    m, n = _short_long(shape)
    return float(sum(ns_flop_terms(m, n, steps, syrk=syrk, algorithm=algorithm)))


def spec_partition_dim(info: ParamInfo) -> int | None:
    """Dimension Megatron shards over tensor parallelism (0 = column-parallel output rows and the vocab-parallel
    embedding / head, 1 = row-parallel input columns), or None for weights every TP rank holds whole (MLA
    down-projections, the router, norms)."""
    if len(info.shape) != 2:
        return None
    module = info.tensor_name.rsplit(".", 2)[-2]
    if module in _COLUMN_PARALLEL:
        return 0
    if module in _ROW_PARALLEL:
        return 1
    return None


def ns_flops_per_tp_rank(shape: Sequence[int], tp: int, tp_mode: str, partition_dim: int | None,
                         steps: int = 5, *, syrk: bool = False) -> float:
    """NS FLOPs one TP rank executes for a matrix sharded ``tp`` ways along ``partition_dim``.

    duplicated (and unsharded weights): the full NS on every rank. blockwise: NS of the shard alone.
    distributed: the Gram matrix of the shard (all-reduced) and B·X on the shard, A·A repeated on every rank;
    it needs the shard along the long (contracted) side, so a short-side shard counts as duplicated (what
    ``nemo_muon.newton_schulz`` falls back to). ``auto`` is counted as distributed where possible (the optimizer's
    own choice also weighs the communication, see ``nemo_muon.accounting.ns_choice``).
    """
    check_positive_int("tp", tp)
    check_choice("tp_mode", tp_mode, TP_MODES)
    full = matrix_ns_flops(shape, steps, syrk=syrk)
    if tp == 1 or partition_dim is None or tp_mode == "duplicated":
        return full
    check_choice("partition_dim", partition_dim, (0, 1))
    if shape[partition_dim] % tp:
        raise fail(f"shape[{partition_dim}]", shape[partition_dim], f"divisible by tp={tp}")
    if tp_mode == "blockwise":
        shard = list(shape)
        shard[partition_dim] //= tp
        return matrix_ns_flops(shard, steps, syrk=syrk)
    m, n = _short_long(shape)
    if shape[partition_dim] != n:  # the shard is along the short side: distributed falls back to duplicated
        return full
    long_terms, square_terms = ns_flop_terms(m, n, steps, syrk=syrk)  # X·Xᵀ and B·X split tp ways, A·A repeated
    return float(long_terms // tp + square_terms)


@dataclass(frozen=True)
class NSFlops:
    """NS FLOPs of one optimizer step over a parameter list."""

    useful: float
    """Every hidden matrix counted once (the work a single device does; the 'model+NS' TFLOP/s numerator)."""
    executed: float
    """Summed over the TP ranks that run it (duplicated TP repeats the work TP times)."""
    num_matrices: int
    by_kind: dict[str, float] = field(default_factory=dict)
    """Useful FLOPs per ParamInfo.kind."""


def ns_flops(params: Iterable[ParamInfo], *, steps: int = 5, syrk: bool = False, tp: int = 1, etp: int = 1,
             tp_mode: str = "duplicated") -> NSFlops:
    """NS FLOPs of one optimizer step for ``params`` (non-hidden-matrix entries are skipped).

    Routed experts are sharded over ``etp`` (expert tensor parallel), every other matrix over ``tp``.
    """
    check_choice("tp_mode", tp_mode, TP_MODES)
    useful = executed = 0.0
    count = 0
    by_kind: dict[str, float] = {}
    for p in params:
        if not p.is_hidden_matrix:
            continue
        f = matrix_ns_flops(p.shape, steps, syrk=syrk)
        width = etp if p.kind == "expert" else tp
        pdim = spec_partition_dim(p)
        per_rank = ns_flops_per_tp_rank(p.shape, width, tp_mode, pdim, steps, syrk=syrk)
        useful += f
        executed += per_rank * width
        count += 1
        by_kind[p.kind] = by_kind.get(p.kind, 0.0) + f
    return NSFlops(useful=useful, executed=executed, num_matrices=count, by_kind=by_kind)
