"""Split a fused weight (or its update) into the matrices it is made of, and put the parts back together."""

from __future__ import annotations

import dataclasses

import torch

from nemo_muon.optim.routing import QKVLayout, Route


def split_parts(x: torch.Tensor, route: Route, name: str) -> list[torch.Tensor]:
    """The parts of ``x`` (..., rows, cols) as separate matrices (every leading dim kept: a stack of fused weights
    gives stacks of parts); ``[x]`` when the route has no layout. A ``transposed`` route (stored (in, out)) splits
    along the columns, each part kept in the stored orientation. Views, except a QKV part of several query groups
    (one copy)."""
    if route.transposed and route.layout is not None:
        return [part.mT for part in split_parts(x.mT, dataclasses.replace(route, transposed=False), name)]
    sizes = route.split_sizes(name, x.shape[-2])
    if sizes is None:
        return [x]
    if isinstance(route.layout, QKVLayout):
        lead, cols = x.shape[:-2], x.shape[-1]
        grouped = x.reshape(*lead, x.shape[-2] // sum(sizes), sum(sizes), cols)
        return [p.reshape(*lead, -1, cols) for p in grouped.split(sizes, dim=-2)]
    return list(x.split(sizes, dim=-2))


def merge_parts(parts: list[torch.Tensor], route: Route, like: torch.Tensor) -> torch.Tensor:
    """Inverse of ``split_parts``: a tensor shaped like ``like``."""
    if len(parts) == 1 and route.layout is None:
        return parts[0]
    if route.transposed:
        return merge_parts([part.mT for part in parts], dataclasses.replace(route, transposed=False), like.mT).mT
    if isinstance(route.layout, QKVLayout):
        lead, cols = like.shape[:-2], like.shape[-1]
        groups = like.shape[-2] // sum(route.layout.group_shapes())
        return torch.cat([p.reshape(*lead, groups, -1, cols) for p in parts], dim=-2).reshape(like.shape)
    return torch.cat(parts, dim=-2)
