"""One matrix's Newton–Schulz split over a few data-parallel ranks: the options, their cost and their bytes.

Torch-free. Whole-tensor ownership cannot place a matrix whose NS costs more than a rank's fair share; splitting it
``k`` ways lets ``k`` DP ranks (an aligned block of the DP group: ranks ``b·k .. b·k + k - 1``) orthogonalize it
together, as tensor parallelism's ``distributed`` mode does (``nemo_muon.optim.ns_iteration``): each member holds
one slice along ``dim`` of every part of the matrix (Megatron's TP shard convention, so a fused gate/up slice is
[gate slice; up slice] and a fused QKV slice is whole query groups), runs X·Xᵀ and B·X on its slice, and the Gram
matrices are summed over the block.

Per member and step (``SplitOption``):

- ``cost``: ``ns_count.ns_flops_per_tp_rank(part, k, "distributed", dim)`` summed over the parts: the m²n terms
  split k ways, the m³ terms repeated on every member; a part sliced along its short side is gathered and
  orthogonalized whole on every member (the full cost: what ``newton_schulz`` falls back to).
- ``extra_bytes``: what the split sends beyond whole-tensor ownership, ring model with fp32 payloads: per part in
  distributed mode ``steps`` all-reduces of the m×m Gram matrix and one of the norm, 2(k-1)/k of each; per part
  gathered, (k-1)/k of the part; with ``gather_update`` (an engine that needs the whole update on every member:
  Megatron's layer-wise optimizer, ``nemo_muon.megatron.core_016_017.cost_balanced``) (k-1)/k of the whole update. The standard
  iteration's count (one Gram all-reduce per step) is used, as for FLOPs; the Gram algorithm nemo_muon picks for
  elongated fp32 matrices on CPU sends one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nemo_muon._validation import check_positive_int
from nemo_muon.accounting.ns_count import ns_flops_per_tp_rank

SPLIT_WAYS: tuple[int, ...] = (2, 4, 8)
"""Subgroup sizes a matrix may be split over (aligned blocks of the DP group)."""
DEFAULT_BALANCE_TARGET = 1.02
"""NS load max/mean within one ownership domain that the planner splits matrices to reach."""
_FP32 = 4


@dataclass(frozen=True)
class SplitOption:
    """Orthogonalize one stored tensor ``ways`` ways along ``dim`` (0 rows, 1 columns): each member's share."""

    ways: int
    dim: int
    cost: float
    """NS FLOPs each member executes per step."""
    extra_bytes: float
    """Bytes each member sends per step for the split, beyond whole-tensor ownership (module doc)."""


def _option(parts: Sequence[tuple[int, int]], ways: int, dim: int, steps: int, syrk: bool,
            gather_update: bool) -> SplitOption:
    cost = 0.0
    sent = 0.0
    frac = (ways - 1) / ways
    for part in parts:
        cost += ns_flops_per_tp_rank(part, ways, "distributed", dim, steps, syrk=syrk)
        m, n = sorted(part)
        if part[dim] == n:  # sliced along the long side: Gram all-reduces
            sent += 2 * frac * (steps * m * m + 1) * _FP32
        else:  # along the short side: gathered, orthogonalized whole
            sent += frac * m * n * _FP32
    if gather_update:
        sent += frac * sum(math.prod(p) for p in parts) * _FP32
    return SplitOption(ways=ways, dim=dim, cost=cost, extra_bytes=sent)


def split_options(parts: Sequence[tuple[int, int]], *, steps: int = 5, syrk: bool = False,
                  max_ways: int = max(SPLIT_WAYS), query_groups: int | None = None,
                  gather_update: bool = False) -> tuple[SplitOption, ...]:
    """The ways one stored tensor made of ``parts`` (the 2-D matrices NS runs on, stacked along rows) can be split.

    For each ``k`` in ``SPLIT_WAYS`` up to ``max_ways``: the dim (rows or columns) where every part divides by
    ``k`` (rows: also ``query_groups`` of a fused QKV) and the split costs least; kept only when it costs each
    member less than the whole NS (a short-side slice gains nothing). Increasing ``ways``, cost decreasing.
    """
    check_positive_int("steps", steps)
    check_positive_int("max_ways", max_ways)
    shapes = [tuple(int(d) for d in p) for p in parts]
    if not shapes or any(len(p) != 2 or min(p) < 1 for p in shapes):
        return ()
    whole = sum(ns_flops_per_tp_rank(p, 1, "duplicated", None, steps, syrk=syrk) for p in shapes)
    out: list[SplitOption] = []
    for k in SPLIT_WAYS:
        if k > max_ways:
            break
        fits = []
        for dim in (0, 1):
            if any(p[dim] % k for p in shapes) or (dim == 0 and query_groups is not None and query_groups % k):
                continue
            fits.append(_option(shapes, k, dim, steps, syrk, gather_update))
        if not fits:
            continue
        best = min(fits, key=lambda o: (o.cost, o.extra_bytes, o.dim))
        if best.cost < (out[-1].cost if out else whole):
            out.append(best)
    return tuple(out)
