"""Newton–Schulz coefficient sets: emerging-optimizers' tables and iterator, read from the installed package.

Each NS step k computes X <- a_k X + b_k (X Xᵀ) X + c_k (X Xᵀ)² X on X normalized to Frobenius norm 1 (so its spectral
norm is at most 1). A *set* is a table of (a, b, c) triples (emerging-optimizers' ``_COEFFICIENT_SETS``, imported,
never re-typed) and what happens past its end (``SCHEDULE_END``): ``cycle`` starts the table again, ``repeat_last``
keeps its last triple. The schedule of ``steps`` iterations is emerging-optimizers' own ``get_coefficient_iterator``.
Every set runs exactly ``steps`` iterations of that same three-matmul step, with the same normalization: no set adds a
step, a rescaling or another iteration form (tests/test_coefficient_sets.py counts the FLOPs), so the cost model
(``nemo_muon.registry.cost``) needs only ``ns_steps``.

| set | table | past its end | published source |
|---|---|---|---|
| simple | 1 triple | (cycle: the same triple) | Keller Jordan's Muon |
| quintic | 5 | cycle | modded-nanogpt's per-step quintic schedule (leloykun's derivation) |
| polar_express | 8 | repeat_last | Polar Express, arXiv 2505.16932 (with its 1.01 safety factor) |
| cans | 5 | repeat_last | CANS, arXiv 2506.10935 |
| aol | 4 | cycle | Turbo-Muon's flash-newton-schulz, arXiv 2512.04632 (coefficients only) |
| deepseekv4 | 10 (8 x simple, 2 x (2, -1.5, 0.5)) | repeat_last | the DeepSeek-V4 report |

Read the notes in ``SOURCES``: ``aol``'s coefficients were tuned for Turbo-Muon's AOL-preconditioned input, which
neither emerging-optimizers nor we apply; ``deepseekv4`` at fewer than 9 steps is ``simple``. The singular-value band
each set reaches is measured by tests/test_newton_schulz.py and documented in docs/optimizers.md.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Literal

from emerging_optimizers.orthogonalized_optimizers import muon_utils

from nemo_muon._validation import check_choice, check_positive_int, fail
from nemo_muon.config.optimizer import COEFFICIENT_SETS

ScheduleEnd = Literal["cycle", "repeat_last"]
Coefficients = tuple[float, float, float]

SCHEDULE_END: dict[str, ScheduleEnd] = {
    "simple": "cycle",
    "quintic": "cycle",
    "polar_express": "repeat_last",
    "cans": "repeat_last",
    "aol": "cycle",
    "deepseekv4": "repeat_last",
}
"""What emerging-optimizers' ``newton_schulz`` does past a set's table (0.3.0: ``repeat_last`` for polar_express, cans
and deepseekv4, ``cycle`` for the others; it keeps that choice inside the function, so it is stated here and pinned
by tests/test_coefficient_sets.py, which runs its ``newton_schulz`` past every table's end)."""

SOURCES: dict[str, str] = {
    "simple": "Keller Jordan, 'Muon: An optimizer for hidden layers in neural networks' (2024), "
              "https://kellerjordan.github.io/posts/muon/: one triple for every step.",
    "quintic": "modded-nanogpt's per-step schedule, "
               "https://github.com/KellerJordan/modded-nanogpt/blob/0674386070ceb4dcd207e1aca747ffcea6c15250/"
               "train_gpt_medium.py#L45, derived in https://leloykun.github.io/ponder/muon-opt-coeffs/.",
    "polar_express": "Amsel, Persson, Musco, Gower, 'The Polar Express: Optimal Matrix Sign Methods and Their "
                     "Application to the Muon Algorithm', arXiv 2505.16932, Algorithm 1 (divided by its 1.01 safety "
                     "factor per degree).",
    "cans": "Grishina, Smirnov, Rakhuba, 'Accelerating Newton-Schulz Iteration for Orthogonalization via "
            "Chebyshev-type Polynomials' (CANS), arXiv 2506.10935: Remez polynomials on adaptive intervals, "
            "https://github.com/GrishKate/accelerating_orthogonalization. Its first triple maps a singular value of "
            "0.37 to 1.99: later steps are steep there, so bf16 rounding grows (band in docs/optimizers.md) and the "
            "bf16 Gram iteration diverges (refused, nemo_muon.accounting.ns_choice.GRAM_BF16_DIVERGES).",
    "aol": "Boissin, Massena, Mamalet, Serrurier, 'Turbo-Muon: Accelerating Orthogonality-Based Optimization with "
           "Pre-Conditioning', arXiv 2512.04632, https://github.com/thib-s/flash-newton-schulz "
           "(newton_schulz_triton.py). Tuned for 4 steps after AOL rescaling (arXiv 2208.03160); as in "
           "emerging-optimizers and Megatron-Core, only the coefficients are used (after the Frobenius "
           "normalization every set has), and a 5th step starts the table again.",
    "deepseekv4": "DeepSeek-AI, DeepSeek-V4 technical report, "
                  "https://huggingface.co/deepseek-ai/DeepSeek-V4-Pro/resolve/main/DeepSeek_V4.pdf: 8 steps of "
                  "simple's triple, then 2 of (2, -1.5, 0.5) (p(1) = 1 with zero slope: they settle the singular values at 1). Defined for 10 "
                  "steps; at ns_steps <= 8 it is exactly simple.",
}
"""The published source of each set (docs/optimizers.md repeats them; tests/test_coefficient_sets.py checks it)."""


def _installed_version() -> str:
    try:
        return version("emerging-optimizers")
    except PackageNotFoundError:  # a source checkout on the path
        return "unknown"


def coefficient_table(name: str, *, field: str = "coefficients") -> list[Coefficients]:
    """The (a, b, c) table of the set ``name`` in the installed emerging-optimizers (its length: the steps the set
    defines). Raises naming ``field`` and the version when the installed package lacks the set (cans and deepseekv4
    arrived in emerging-optimizers 0.3.0)."""
    check_choice(field, name, COEFFICIENT_SETS)
    tables = muon_utils._COEFFICIENT_SETS
    if name not in tables:
        raise fail(field, name, f"a set of the installed emerging-optimizers {_installed_version()}: "
                                         f"{tuple(s for s in COEFFICIENT_SETS if s in tables)} (install "
                                         f"emerging-optimizers >= 0.3.0 for all of {COEFFICIENT_SETS})")
    return [tuple(map(float, t)) for t in tables[name]]


def defined_steps(name: str) -> int:
    """How many steps the set ``name`` defines before it cycles or repeats its last triple."""
    return len(coefficient_table(name))


def coefficient_schedule(name: str, steps: int) -> list[Coefficients]:
    """The (a, b, c) triple of each of ``steps`` NS iterations for the coefficient set ``name`` (emerging-optimizers'
    iterator, with the set's ``SCHEDULE_END``)."""
    table = coefficient_table(name)
    check_positive_int("steps", steps)
    return [tuple(map(float, t)) for t in muon_utils.get_coefficient_iterator(steps, table, mode=SCHEDULE_END[name])]
