"""NorMuon's update: `nemo_muon.Muon` whose orthogonalized parts are normalized by a row-wise second moment.

The formula and its reference are in `nemo_muon.registry.normuon` (config, registry entry). Each fused part (Q, K, V;
gate, up) and each expert of a 3-D stack is its own matrix with its own second moment, stored in the parameter's
state as ``moment2_<part>``. Tensor parallelism is refused: the mean runs along a side a TP shard may cut.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon.optim.fused import split_parts
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.routed import MatrixItem
from nemo_muon.registry.normuon import NorMuonConfig


def long_side(shape: tuple[int, ...]) -> int:
    """The axis the second moment averages over: the longer side of a part (rows when square)."""
    return -1 if shape[-2] >= shape[-1] else -2


def moment2_shape(part_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The second moment of a part of this shape: one value per row of its longer side."""
    shape = list(part_shape)
    shape[long_side(part_shape)] = 1
    return tuple(shape)


class NorMuon(Muon):
    """Muon with NorMuon's normalization (``beta2``, ``eps``); every other argument is `Muon`'s."""

    label = "NorMuon"
    registry_name = "normuon"

    def __init__(self, params: Iterable[Any] | torch.nn.Module, lr: float, weight_decay: float = NorMuonConfig.weight_decay, *,
                 beta2: float = NorMuonConfig.beta2, eps: float = NorMuonConfig.eps, **muon_kwargs: Any) -> None:
        NorMuonConfig(lr=lr, weight_decay=weight_decay, beta2=beta2, eps=eps)  # raises naming the field
        tp_group = muon_kwargs.get("tp_group")
        if tp_group is not None and dist.get_world_size(tp_group) > 1:
            raise ValueError("NorMuon's tp_group must be None or of size 1 (the row-wise second moment needs whole "
                             f"matrices); got a group of {dist.get_world_size(tp_group)} ranks: use Muon under "
                             "tensor parallelism")
        self._moment2_defaults = {"beta2": beta2, "eps": eps}
        super().__init__(params, lr, weight_decay, **muon_kwargs)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As `Muon`'s; a group without ``beta2`` / ``eps`` takes the defaults (a group may set its own)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for key, value in self._moment2_defaults.items():
            group.setdefault(key, value)
        NorMuonConfig(lr=group["lr"], weight_decay=group["weight_decay"], beta2=group["beta2"], eps=group["eps"])

    def placeholder_state(self, p: torch.Tensor) -> None:
        """The state a checkpoint load copies into: `Muon`'s, and every part's second moment (`moment2_shape`)."""
        super().placeholder_state(p)
        parts = split_parts(torch.empty(p.shape, device="meta"), self.route_of(p), self._names[p])
        for part, shape in enumerate(moment2_shape(tuple(x.shape)) for x in parts):
            self.state[p].setdefault(f"moment2_{part}", torch.zeros(shape, device=p.device))

    def _post_orthogonalize(self, it: MatrixItem, part: int, y: torch.Tensor) -> torch.Tensor:
        """Row-wise second moment along the longer side, then the norm of the orthogonalized part restored."""
        beta2, eps = it.group["beta2"], it.group["eps"]
        mean_square = y.square().mean(dim=long_side(y.shape), keepdim=True)
        moment2 = it.state.get(f"moment2_{part}")
        if moment2 is None:
            moment2 = it.state[f"moment2_{part}"] = torch.zeros_like(mean_square)
        moment2.lerp_(mean_square, 1 - beta2)
        normalized = y * moment2.clamp_min(eps).rsqrt()
        reference = torch.linalg.vector_norm(y, dim=(-2, -1), keepdim=True)
        current = torch.linalg.vector_norm(normalized, dim=(-2, -1), keepdim=True)
        return normalized * (reference / current.clamp_min(eps))
