"""Newton–Schulz coefficient schedules, taken from emerging-optimizers' tables (imported, not copied).

Each NS step k computes X <- a_k X + b_k (X Xᵀ) X + c_k (X Xᵀ)² X. A *set* is a schedule of (a, b, c) triples:
- ``simple``: Keller Jordan's constant (3.4445, -4.7750, 2.0315), repeated every step.
- ``quintic``: the 5-step schedule tuned for a quintic iteration (modded-nanogpt); cycles past 5 steps.
- ``polar_express``: Polar Express (arXiv 2505.16932, with its 1.01 safety factor); repeats its last triple.
The singular-value band each set reaches on random matrices is measured by tests/test_newton_schulz.py and
documented in docs/optimizers.md.
"""

from __future__ import annotations

from emerging_optimizers.orthogonalized_optimizers.muon_utils import _COEFFICIENT_SETS, get_coefficient_iterator

from nemo_muon._validation import check_choice, check_positive_int
from nemo_muon.config.optimizer import COEFFICIENT_SETS

_REPEAT_LAST = ("polar_express",)

Coefficients = tuple[float, float, float]


def coefficient_schedule(name: str, steps: int) -> list[Coefficients]:
    """The (a, b, c) triple of each of ``steps`` NS iterations for the coefficient set ``name``."""
    check_choice("coefficients", name, COEFFICIENT_SETS)
    check_positive_int("steps", steps)
    mode = "repeat_last" if name in _REPEAT_LAST else "cycle"
    return [tuple(map(float, t)) for t in get_coefficient_iterator(steps, _COEFFICIENT_SETS[name], mode=mode)]
