"""The exchange of a split matrix whose block's first member alone holds it (Megatron-Core >= 0.18's reduce-scatter
layout: the owner holds the reduced gradient, the master and the momentum).

The first member cuts each NS input into ``ways`` equal slices along its partition dim and sends slice ``r`` to member
``r`` (`scatter_slices`: one scatter for all matrices of the block); every member orthogonalizes its slices with the
block (distributed Newton–Schulz); the first member gets the slices back and rebuilds each whole update
(`gather_slices`: one gather). Bytes per step, per split matrix of m·n fp32 elements and ``ways`` members: the first
member sends (ways-1)/ways·m·n and each other member 1/ways·m·n, where a block whose members all hold the matrix
all-gathers the update instead ((ways-1)/ways·m·n from every member).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _slice_shape(shape: torch.Size | Sequence[int], dim: int, ways: int) -> tuple[int, ...]:
    out = list(shape)
    if out[dim] % ways:
        raise ValueError(f"a split slice needs dim {dim} of shape {tuple(shape)} divisible by ways={ways}")
    out[dim] //= ways
    return tuple(out)


def scatter_slices(wholes: Sequence[torch.Tensor] | None, shapes: Sequence[Sequence[int]], dims: Sequence[int],
                   group: dist.ProcessGroup, *, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """This member's slice of every whole matrix (``shapes``, cut along ``dims`` into the group's size of equal
    slices, in group rank order). The group's first rank passes ``wholes`` (the matrices, shaped ``shapes``); the
    others pass None and receive."""
    ways, index = dist.get_world_size(group), dist.get_rank(group)
    slice_shapes = [_slice_shape(s, d, ways) for s, d in zip(shapes, dims, strict=True)]
    sizes = [int(torch.Size(s).numel()) for s in slice_shapes]
    received = torch.empty(sum(sizes), dtype=dtype, device=device)
    chunks = None
    if index == 0:
        if wholes is None or len(wholes) != len(shapes):
            raise ValueError("the block's first member must pass every whole matrix to scatter")
        per_member = [[w.to(dtype).chunk(ways, dim=d)[r].reshape(-1) for w, d in zip(wholes, dims, strict=True)]
                      for r in range(ways)]
        chunks = [torch.cat(parts) if parts else received.new_empty(0) for parts in per_member]
    dist.scatter(received, chunks, group=group, group_src=0)
    return [piece.view(s) for piece, s in zip(received.split(sizes), slice_shapes, strict=True)]


def gather_slices(slices: Sequence[torch.Tensor], dims: Sequence[int],
                  group: dist.ProcessGroup) -> list[torch.Tensor] | None:
    """Every member's ``slices`` to the group's first rank, which gets the whole matrices (concatenated along
    ``dims``, group rank order); the other members get None."""
    ways, index = dist.get_world_size(group), dist.get_rank(group)
    flat = torch.cat([s.reshape(-1) for s in slices]) if slices else torch.empty(0)
    parts = [torch.empty_like(flat) for _ in range(ways)] if index == 0 else None
    dist.gather(flat, parts, group=group, group_dst=0)
    if parts is None:
        return None
    sizes = [s.numel() for s in slices]
    per_member = [p.split(sizes) for p in parts]
    return [torch.cat([per_member[r][i].view_as(slices[i]) for r in range(ways)], dim=dims[i])
            for i in range(len(slices))]
