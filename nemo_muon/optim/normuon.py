"""NorMuon's update: `nemo_muon.Muon` whose orthogonalized parts are normalized by a row-wise second moment.

The formula and its reference are in `nemo_muon.registry.normuon` (config, registry entry). Each fused part (Q, K, V;
gate, up) and each expert of a 3-D stack is its own matrix with its own second moment, stored in the parameter's
state as ``moment2_<part>`` (`nemo_muon.optim.muon_variant`). Tensor parallelism is refused: the mean runs along a
side a TP shard may cut.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nemo_muon.optim.muon_variant import MuonVariant
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


class NorMuon(MuonVariant):
    """Muon with NorMuon's normalization (``beta2``, ``eps``); every other argument is `Muon`'s."""

    label = "NorMuon"
    registry_name = "normuon"
    config_class = NorMuonConfig

    def __init__(self, params: Iterable[Any] | torch.nn.Module, lr: float, weight_decay: float = NorMuonConfig.weight_decay, *,
                 beta2: float = NorMuonConfig.beta2, eps: float = NorMuonConfig.eps, **muon_kwargs: Any) -> None:
        self._take_variant_fields(lr, weight_decay, {"beta2": beta2, "eps": eps}, muon_kwargs.get("tp_group"))
        super().__init__(params, lr, weight_decay, **muon_kwargs)

    def part_state(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """Each part's second moment (`moment2_shape`)."""
        return {"moment2": moment2_shape(shape)}

    def _post_orthogonalize(self, it: MatrixItem, part: int, y: torch.Tensor) -> torch.Tensor:
        """Row-wise second moment along the longer side, then the norm of the orthogonalized part restored."""
        beta2, eps = it.group["beta2"], it.group["eps"]
        mean_square = y.square().mean(dim=long_side(y.shape), keepdim=True)
        moment2 = self.part_tensor(it, "moment2", part, mean_square)
        moment2.lerp_(mean_square, 1 - beta2)
        normalized = y * moment2.clamp_min(eps).rsqrt()
        reference = torch.linalg.vector_norm(y, dim=(-2, -1), keepdim=True)
        current = torch.linalg.vector_norm(normalized, dim=(-2, -1), keepdim=True)
        return normalized * (reference / current.clamp_min(eps))
