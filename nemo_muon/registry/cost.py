"""The one cost model of a matrix update: FLOPs per step and state bytes of one matrix, torch-free.

Every consumer asks these functions through an optimizer's `OptimizerSpec` (``spec.matrix``): the planner
(``nemo_muon.accounting``), the whole-tensor optimizer's ownership (``nemo_muon.layerwise.plan_items``), the ownership inside
Megatron-Core (``nemo_muon.megatron.core_016_017.cost_balanced``) and the split (``nemo_muon.accounting.ns_split``).

- Newton–Schulz (``ns_flop_terms``, the counting rule of docs/flops.md): one iteration on X (m x n, m <= n after
  transposing) is A = X·Xᵀ (2m²n, or m²n as a SYRK), B = b·A + c·A·A (2m³, or m³), X <- a·X + B·X (2m²n); ``steps``
  iterations cost steps·(4m²n + 2m³) with GEMMs. ``ns_cost`` applies it to a matrix or a 3-D stack (E x one matrix).
- SOAP (``soap_cost``): factor updates G·Gᵀ and Gᵀ·G (2m²n + 2mn²), rotations into and out of the eigenbasis
  (4m²n + 4mn²), and every ``precondition_frequency`` steps one power iteration + QR per factor (~ (2 + 4/3)(m³+n³)).
- State bytes are fp32, per owned matrix, master weights included (``FP32_BYTES`` each element).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nemo_muon._validation import check_choice, check_positive_int, fail

FP32_BYTES = 4
"""Bytes of one fp32 element: master weights and every optimizer state tensor are fp32."""
NS_ALGORITHMS: tuple[str, ...] = ("standard", "gram")


def _dims(shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise fail("shape", tuple(shape), "a sequence of non-negative integers")
    return dims


def ns_flop_terms(m: int, n: int, steps: int, *, syrk: bool = False, algorithm: str = "standard") -> tuple[int, int]:
    """NS FLOPs of an (m, n) matrix whitened on its m side, as (terms in m²n, terms in m³): the one place the
    Newton–Schulz FLOP formula is written (the counting rule, the TP-mode split and the ownership cost add these).

    standard: steps x (X·Xᵀ 2m²n + B·X 2m²n, A·A 2m³); with ``syrk`` X·Xᵀ and A·A compute one triangle (m²n, m³).
    gram: X·Xᵀ and Q·X once (4m²n), per step the polynomial (2m³), Z·Q (2m³, not on the first step) and Z·R·Z
    (4m³, not on the last): 2m³·(4·steps − 3).
    """
    check_choice("algorithm", algorithm, NS_ALGORITHMS)
    if algorithm == "gram":
        return 4 * m * m * n, 2 * m**3 * (4 * steps - 3)
    if syrk:
        return steps * 3 * m * m * n, steps * m**3
    return steps * 4 * m * m * n, steps * 2 * m**3


def ns_cost(shape: Sequence[int], steps: int = 5, *, syrk: bool = False) -> float:
    """Newton–Schulz FLOPs of one matrix (or of every matrix of a 3-D+ stack); 0 for 0-D/1-D shapes.

    20m²n + 10m³ for 5 steps on an (m, n) matrix with m <= n (GEMMs); 15m²n + 5m³ with ``syrk``.
    """
    check_positive_int("steps", steps)
    dims = _dims(shape)
    if len(dims) < 2:
        return 0.0
    batch = math.prod(dims[:-2])
    m, n = sorted(dims[-2:])
    return float(batch * sum(ns_flop_terms(m, n, steps, syrk=syrk)))


def soap_cost(shape: Sequence[int], precondition_frequency: int = 1) -> float:
    """SOAP FLOPs per step of one (m, n) matrix (module doc). 0 for 0-D/1-D shapes; a 3-D stack costs its batch
    size times one matrix."""
    check_positive_int("precondition_frequency", precondition_frequency)
    dims = _dims(shape)
    if len(dims) < 2:
        return 0.0
    batch = math.prod(dims[:-2])
    m, n = dims[-2:]
    per_step = 6 * m * n * (m + n) + (10.0 / 3.0) * (m**3 + n**3) / precondition_frequency
    return float(batch * per_step)


def soap_state_elements(shape: Sequence[int]) -> int:
    """SOAP's fp32 state elements of one (m, n) matrix besides its master: the two moments and the rotated gradient
    of the step (3mn), the Kronecker factors and their eigenbases (2m² + 2n²); a 3-D stack: per matrix."""
    dims = _dims(shape)
    batch = math.prod(dims[:-2])
    m, n = dims[-2:]
    return batch * (3 * m * n + 2 * (m * m + n * n))
