"""The Newton–Schulz iteration itself, written as resumable programs so that many matrices can share collectives.

A *program* is a generator over one (possibly batched, possibly sharded) matrix X of shape (..., m, n) whose
contracted dimension n is the one that may be sharded. Every quantity that needs a sum over n (the squared norm, a
Gram matrix X·Xᵀ) is *yielded*; the driver sends back the same tensor (local) or its all-reduce over the tensor-
parallel group (distributed mode), possibly fused with other programs' tensors into one collective per bucket.
The program's return value is this rank's block of the orthogonalized matrix, in the compute dtype.

Two algorithms, identical in exact arithmetic:
- ``standard``: X <- a X + (b A + c A²) X with A = X·Xᵀ, every step (2 m²n + m³ multiply-adds per step). On a GPU
  in bf16, A = X·Xᵀ and b·A + c·A·A use emerging-optimizers' Triton SYRK kernel where it is validated (``syrk_kernel``),
  computing one triangle: 1.5 m²n + 0.5 m³ per step.
- ``gram``: iterate on the small m×m Gram matrix R = X·Xᵀ only: Z = aI + bR + cR², Q <- Z·Q, R <- Z·R·Z, and form
  Q·X once at the end (2 m²n + ~4 m³ per run of steps). It wins when n is a few times m (most LLM matrices), and
  needs one reduction in total instead of one per step. In bf16 precision the whole program is bf16, on every
  device: R drifts from (Q X)(Q X)ᵀ as rounding compounds, so the program "restarts" (X <- Q·X, R <- X·Xᵀ afresh)
  every ``BF16_RESTART_AFTER`` steps. (An fp32 m×m iteration was 2x slower than the peers' bf16 NS on a CPU whose
  bf16 GEMM is 4.5x its fp32 one: bench/results/ns.md.) Bands measured in tests/test_newton_schulz.py and
  docs/optimizers.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence

import torch

from nemo_muon.accounting.ns_choice import SYRK_CAPABILITIES

Program = Generator[torch.Tensor, torch.Tensor, torch.Tensor]
BF16_RESTART_AFTER = 2
"""In bf16 Gram NS, rebuild X and its Gram matrix after this many steps (then every this many)."""


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float, alpha: float) -> torch.Tensor:
    """beta * bias + alpha * a @ b for 2-D or batched 3-D operands."""
    if a.ndim == 2:
        return torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha)


def _polynomial(r: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    """Z = a I + b R + c R² for a (batched) square matrix R."""
    z = _addmm(r, r, r, beta=b, alpha=c)
    z.diagonal(dim1=-2, dim2=-1).add_(a)
    return z


def ns_program(
    x: torch.Tensor,
    coefficients: Sequence[tuple[float, float, float]],
    *,
    algorithm: str,
    compute_dtype: torch.dtype,
    eps: float = 1e-7,
    syrk: Callable[..., torch.Tensor] | None | str = "auto",
) -> Program:
    """Orthogonalize ``x`` (..., m, n), fp32, with the rows as the side being whitened; see the module docstring.

    ``syrk``: "auto" (``syrk_kernel`` decides), None (plain matmuls) or a callable with ``tsyrk_ex``'s signature."""
    sq = yield (x * x).sum(dim=(-2, -1), keepdim=True)
    x = (x / sq.sqrt().clamp_min(eps)).to(compute_dtype)
    if algorithm == "standard":
        syrk = syrk_kernel(x) if syrk == "auto" else syrk
        for a, b, c in coefficients:
            gram = yield (x @ x.mT if syrk is None else syrk(x))
            if syrk is None:
                update = _addmm(gram, gram, gram, beta=b, alpha=c)
            else:  # A·A is symmetric too: A is passed as its own transpose
                update = syrk(gram, gram, alpha=c, beta=b)
            x = _addmm(x, update, x, beta=a, alpha=1.0)
        return x
    restart_after = len(coefficients) if compute_dtype == torch.float32 else BF16_RESTART_AFTER
    r = yield x @ x.mT  # the reducers keep the dtype (they bucket by dtype)
    q: torch.Tensor | None = None
    since_restart = 0
    for k, (a, b, c) in enumerate(coefficients):
        last = k == len(coefficients) - 1
        if since_restart == restart_after and not last:
            x = q @ x
            r = yield x @ x.mT
            q, since_restart = None, 0
        z = _polynomial(r, a, b, c)
        q = z if q is None else z @ q
        if not last:
            r = z @ (r @ z)
        since_restart += 1
    return q @ x


SYRK_ALIGNMENT = 8
"""``tsyrk_ex`` reads and writes through TMA tensor descriptors, whose strides must be 16-byte aligned: both dimensions
of the bf16 input (and so of the Gram matrix) must be multiples of 8 elements."""
_syrk_notes: set[str] = set()


def syrk_refusal(shape: Sequence[int], *, capability: tuple[int, int] | None, has_triton_340: bool) -> str | None:
    """Why the SYRK kernel cannot run a bf16 CUDA matrix of ``shape`` on a GPU of ``capability`` (None: it can).

    Pure (no GPU needed): checked in this order: 2-D, both dimensions multiples of ``SYRK_ALIGNMENT``, a validated
    architecture, triton >= 3.4."""
    if len(shape) != 2:
        return "batched (3-D) input"
    if any(d % SYRK_ALIGNMENT for d in shape):
        return f"shape {tuple(shape)} not a multiple of {SYRK_ALIGNMENT} in both dimensions"
    if capability not in SYRK_CAPABILITIES:
        return f"GPU capability {capability} not in {SYRK_CAPABILITIES}"
    if not has_triton_340:
        return "triton < 3.4"
    return None


def syrk_kernel(x: torch.Tensor) -> Callable[..., torch.Tensor] | None:
    """emerging-optimizers' Triton ``tsyrk_ex`` (alpha·A·Aᵀ + beta·C, half the FLOPs of a GEMM) when it applies to ``x``:
    a 2-D bf16 CUDA tensor with both dimensions multiples of 8, on a validated architecture with triton >= 3.4
    (``syrk_refusal``). Otherwise None (plain matmul); on a CUDA bf16 input that cannot use it, the reason is logged
    once."""
    if x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return None
    capability = torch.cuda.get_device_capability(x.device)
    kernels = None
    if capability in SYRK_CAPABILITIES:
        from emerging_optimizers import triton_kernels as kernels
    reason = syrk_refusal(tuple(x.shape), capability=capability,
                          has_triton_340=bool(getattr(kernels, "HAS_TRITON_340", False)))
    if reason is None:
        return kernels.tsyrk_ex
    key = "unaligned" if "multiple" in reason else reason  # one note for all unaligned shapes
    if key not in _syrk_notes:
        _syrk_notes.add(key)
        logging.getLogger(__name__).info("newton_schulz: SYRK kernel not used (%s); plain GEMMs instead", reason)
    return None


Reducer = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def run_programs(programs: Sequence[Program], reducers: Sequence[Reducer | None]) -> list[torch.Tensor]:
    """Advance all programs in lock step; each round, hand every yielded tensor to its program's reducer.

    Programs sharing one reducer object have their tensors reduced together (the reducer fuses them into buckets);
    ``None`` means local (the tensor is sent back unchanged). Returns each program's result, in order.
    """
    results: list[torch.Tensor | None] = [None] * len(programs)
    pending: dict[int, torch.Tensor] = {}
    for i, prog in enumerate(programs):
        pending[i] = next(prog)
    while pending:
        replies: dict[int, torch.Tensor] = {}
        by_reducer: dict[int, list[int]] = {}
        for i in pending:
            red = reducers[i]
            if red is None:
                replies[i] = pending[i]
            else:
                by_reducer.setdefault(id(red), []).append(i)
        for idx in by_reducer.values():
            reduced = reducers[idx[0]]([pending[i] for i in idx])
            replies.update(zip(idx, reduced, strict=True))
        for i in list(pending):
            try:
                pending[i] = programs[i].send(replies[i])
            except StopIteration as stop:
                results[i] = stop.value
                del pending[i]
    return results  # type: ignore[return-value]
