"""Tolerances shared by the tests that compare two fp32 evaluations of Newton–Schulz, derived from the arithmetic
(docs/testing.md, "Other CPUs"): they must hold on every x86-64 CPU CI may draw, not on the one they were tuned on.

Two evaluations of the same NS polynomial in different operation orders (the Gram form R = X·Xᵀ, Z = aI + bR + cR²
against X·Xᵀ·X; a Gram matrix summed over tensor-parallel or data-parallel shards) differ by fp32 rounding:
u = 2⁻²⁴ ≈ 6e-8 per product over m terms (√m·u on entries <= 1), amplified along the smallest singular values by the
steps' leading coefficients a_k (2.3 to 8.5; their product over 5 steps is ~10³). A square matrix keeps singular values
near 0 in that steep region for every step; a matrix of aspect >= 2 leaves it after one or two steps.
"""

from __future__ import annotations

import math
from typing import Any

GRAM_TOL_SQUARE = 2e-4
"""Per element of the orthogonalized matrix, short side m <= 64, square: √64·u·10³ ≈ 5e-4 worst case; measured
<= 2.0e-5 with AVX-512, AVX2 and SSE4.1 kernels (tests/test_coefficient_sets.py)."""
GRAM_TOL = 5e-5
"""The same at aspect >= 4 (amplification ≲ a₁·a₂ ≈ 35: ~2e-5); measured <= 9.6e-6 on the three kernel sets."""


def update_tolerance(lr: float, long_side: int, short_side: int) -> float:
    """|difference| allowed per element between two fp32 masters after one Muon step from equal states that ran NS in
    different operation orders: the update is lr x sqrt(long side) (spectral scale) x the orthogonalized matrix, whose
    elements differ by at most `GRAM_TOL_SQUARE`, scaled by √(short side / 64) for more terms per product."""
    return lr * math.sqrt(long_side) * GRAM_TOL_SQUARE * math.sqrt(max(short_side, 64) / 64)


FP32_U = 2.0 ** -24
"""The unit roundoff of fp32."""


def adaptive_direction_tolerance(moment2: Any, beta2: float, eps: float, ns_tol: float = GRAM_TOL) -> Any:
    """|difference| allowed per element between two AdaMuon directions Ô_t = O_t ⊘ (√V_t + ε) (V_t = β₂·V_{t-1} +
    (1 - β₂)·O_t²) computed from the same NS inputs by two fp32 NS orders, each O_k off by at most ``ns_tol`` per
    element (`GRAM_TOL` at aspect >= 4). ``moment2``: V_t of either run (a tensor); the bound is per element.

    First order: with s = √V_t, c = β₂·V_{t-1} and a = 1 - β₂, ∂Ô/∂O_t = (s + ε - a·O_t²/s)/(s + ε)² lies in
    [0, 1/(s + ε)]; through the history, |δc| <= 2·τ·Σ_k β₂^(t-k)·|O_k|·a <= 2·τ·√(β₂·c) (Cauchy–Schwarz) and
    |∂Ô/∂c| = |O_t|/(2·s·(s + ε)²) with |O_t|·√c <= s²/√a, so that term is <= τ·√(β₂/a)/(s + ε). Together
    τ·(1 + √(β₂/(1 - β₂)))/(√V_t + ε); twice that covers the second-order remainder while it is small, and no
    difference exceeds 2/√(1 - β₂), since |Ô| <= |O_t|/√(a·O_t²)."""
    first = ns_tol * (1.0 + math.sqrt(beta2 / (1.0 - beta2))) / (moment2.sqrt() + eps)
    return (2.0 * first).clamp(max=2.0 / math.sqrt(1.0 - beta2))
