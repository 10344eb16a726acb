"""Same-shape matrices stacked into one batched tensor, and the results taken apart again (views, no copies).

Newton–Schulz of a stack (S, m, n) is S independent iterations in one batched operator each: the result of every
matrix equals its own NS within fp32 reordering (a batched GEMM may sum in another order than a single one; the
bound is ``tests/tolerances.GRAM_TOL`` / ``GRAM_TOL_SQUARE``). What a stack saves is operators: one per stack and
NS operation instead of one per matrix, the launches a GPU spends its time on when the matrices are small
(docs/step_time.md). What it costs is memory: the members' inputs are copied into the stack and the iteration's
temporaries are the stack's, so a stack holds at most ``STACK_BYTES`` of fp32 input (``chunked``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

STACK_BYTES = 2 * 2**30
"""Most fp32 bytes of input one stack holds (2 GiB), and one batch of stacks (`nemo_muon.optim.muon_batched`). NS
of a stack needs about three times its input in temporaries, so a batched step holds a few GiB more than the
per-matrix step, whose largest matrix on the recipes' ranks is Kimi K2's dense fused fc1 (36,864 x 7,168 fp32,
1 GiB); more matrices than fit run as several stacks (more operators, not more memory). A chosen trade: at 2 GiB
Kimi K2's busiest rank on 256 GB300 runs 9 stacks (bench/launches.py), at 1 GiB 16."""


def matrices_in(x: torch.Tensor) -> int:
    """How many matrices a 2-D matrix or 3-D stack holds."""
    return 1 if x.ndim == 2 else x.shape[0]


def chunked(keys: Sequence[Hashable], nbytes: Sequence[int], limit: int = STACK_BYTES) -> list[list[int]]:
    """Indices grouped by equal key, in order of first appearance, each group cut into runs of at most ``limit``
    bytes (a member larger than ``limit`` alone)."""
    groups: dict[Hashable, list[list[int]]] = {}
    sizes: dict[Hashable, int] = {}
    for i, (key, size) in enumerate(zip(keys, nbytes, strict=True)):
        runs = groups.setdefault(key, [[]])
        if runs[-1] and sizes[key] + size > limit:
            runs.append([])
            sizes[key] = 0
        runs[-1].append(i)
        sizes[key] = sizes.get(key, 0) + size
    return [run for runs in groups.values() for run in runs]


def stacked(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The matrices of ``xs`` (2-D, or 3-D stacks, all of one matrix shape) as one tensor: the single member as it is,
    otherwise one (S, m, n) copy."""
    if len(xs) == 1:
        return xs[0]
    return torch.cat([x if x.ndim == 3 else x.unsqueeze(0) for x in xs])


def unstacked(y: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Inverse of `stacked`: one view of ``y`` per member, shaped like it."""
    if len(like) == 1:
        return [y.reshape(like[0].shape)]
    pieces = y.split([matrices_in(x) for x in like])
    return [piece.reshape(x.shape) for piece, x in zip(pieces, like, strict=True)]
