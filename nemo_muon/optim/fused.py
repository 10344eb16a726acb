"""Split a fused weight (or its update) into the matrices it is made of, and put the parts back together."""

from __future__ import annotations

import dataclasses

import torch

from nemo_muon.optim.routing import QKVLayout, Route


def split_parts(x: torch.Tensor, route: Route, name: str) -> list[torch.Tensor]:
    """The parts of ``x`` (..., rows, cols) as separate matrices; ``[x]`` when the route has no layout. A
    ``transposed`` route (stored (in, out)) splits along the columns, each part kept in the stored orientation."""
    if route.transposed and route.layout is not None:
        return [part.mT for part in split_parts(x.mT, dataclasses.replace(route, transposed=False), name)]
    sizes = route.split_sizes(name, x.shape[-2])
    if sizes is None:
        return [x]
    if isinstance(route.layout, QKVLayout):
        groups = x.shape[-2] // sum(sizes)
        grouped = x.reshape(groups, sum(sizes), x.shape[-1])
        return [p.reshape(-1, x.shape[-1]) for p in grouped.split(sizes, dim=1)]
    return list(x.split(sizes, dim=-2))


def merge_parts(parts: list[torch.Tensor], route: Route, like: torch.Tensor) -> torch.Tensor:
    """Inverse of ``split_parts``: a tensor shaped like ``like``."""
    if len(parts) == 1 and route.layout is None:
        return parts[0]
    if route.transposed:
        return merge_parts([part.mT for part in parts], dataclasses.replace(route, transposed=False), like.mT).mT
    if isinstance(route.layout, QKVLayout):
        cols = like.shape[-1]
        groups = like.shape[-2] // sum(route.layout.group_shapes())
        return torch.cat([p.reshape(groups, -1, cols) for p in parts], dim=1).reshape(like.shape)
    return torch.cat(parts, dim=-2)
