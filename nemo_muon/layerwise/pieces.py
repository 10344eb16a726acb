"""Slices of a matrix whose Newton–Schulz several data-parallel ranks run together (split ownership).

A matrix split ``ways`` ways along ``dim`` gives member ``index`` of its block one slice in Megatron's tensor-parallel
shard convention, so that `nemo_muon.Muon` in ``tp_mode="distributed"`` over the block orthogonalizes it exactly as
one rank would the whole (``nemo_muon.accounting.ns_split``):

- along columns (dim 1): columns ``index·n/ways ..`` of the whole tensor;
- along rows (dim 0): rows ``index·m/ways ..`` of each fused part ([gate slice; up slice] for a gated MLP's fc1);
  a fused QKV's parts are interleaved per query group, so its slice is a contiguous block of whole query groups.

`Piece.read` cuts the slice out of a tensor shaped like the parameter (a new tensor), `Piece.write` puts one back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_muon._validation import fail
from nemo_muon.optim.routing import QKVLayout, Route


@dataclass(frozen=True)
class Piece:
    """Member ``index`` of ``ways``'s slice of parameter ``name`` along ``dim``: the ``ranges`` it takes there."""

    name: str
    index: int
    ways: int
    dim: int
    ranges: tuple[tuple[int, int], ...]
    shape: tuple[int, int]

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """This slice of ``t`` (shaped like the parameter) as a new contiguous tensor."""
        return torch.cat([t.narrow(self.dim, a, b - a) for a, b in self.ranges], dim=self.dim)

    def write(self, t: torch.Tensor, value: torch.Tensor) -> None:
        """Copy ``value`` (shaped like this slice) into its place in ``t``."""
        off = 0
        for a, b in self.ranges:
            t.narrow(self.dim, a, b - a).copy_(value.narrow(self.dim, off, b - a))
            off += b - a


def make_piece(name: str, shape: tuple[int, ...], route: Route, dim: int, index: int, ways: int) -> Piece:
    """Member ``index``'s slice of a 2-D parameter split ``ways`` ways along ``dim`` (module doc)."""
    if len(shape) != 2:
        raise fail(f"split of {name!r}: shape", tuple(shape), "a 2-D matrix (3-D expert stacks are never split)")
    rows, cols = shape
    size = shape[dim]
    if dim == 1 or route.layout is None or isinstance(route.layout, QKVLayout):
        unit = sum(route.layout.group_shapes()) if dim == 0 and isinstance(route.layout, QKVLayout) else 1
        if size % (unit * ways):
            raise fail(f"split of {name!r}: ways", ways, f"a divisor of {size // unit} (blocks of {unit} along dim "
                                                          f"{dim})")
        step = size // ways
        ranges: tuple[tuple[int, int], ...] = ((index * step, (index + 1) * step),)
    else:
        parts = route.split_sizes(name, rows) or [rows]
        if any(s % ways for s in parts):
            raise fail(f"split of {name!r}: ways", ways, f"a divisor of every fused part's rows {parts}")
        out, off = [], 0
        for s in parts:
            out.append((off + index * s // ways, off + (index + 1) * s // ways))
            off += s
        ranges = tuple(out)
    taken = sum(b - a for a, b in ranges)
    return Piece(name=name, index=index, ways=ways, dim=dim, ranges=ranges,
                 shape=(taken, cols) if dim == 0 else (rows, taken))
