"""AdaMuon's update (arXiv 2507.11005): `nemo_muon.Muon` whose orthogonalized parts are divided by the root of their
element-wise second moment, then rescaled to the norm of a semi-orthogonal matrix.

The formula, its paper and its reference are in `nemo_muon.registry.adamuon` (config, registry entry). Each fused
part (Q, K, V; gate, up) and each expert of a 3-D stack is its own matrix with its own second moment
``moment2_<part>`` (`nemo_muon.optim.muon_variant`). Tensor parallelism is refused: the rescaling reads the whole
matrix's norm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from nemo_muon.optim.muon_variant import MuonVariant
from nemo_muon.optim.routed import MatrixItem
from nemo_muon.registry.adamuon import AdaMuonConfig


def adaptive_direction(o: torch.Tensor, moment2: torch.Tensor, beta2: float, eps: float) -> torch.Tensor:
    """Ô = O ⊘ (√V + ε) after V <- β₂·V + (1 - β₂)·O ⊙ O (``moment2`` updated in place)."""
    moment2.lerp_(o.square(), 1 - beta2)
    return o / (moment2.sqrt() + eps)


def rms_aligned(direction: torch.Tensor, eps: float) -> torch.Tensor:
    """``direction`` (a matrix, or a stack of them) rescaled to the Frobenius norm √min(m, n) of a semi-orthogonal
    matrix of its shape, each matrix of a stack alone."""
    m, n = direction.shape[-2:]
    norm = torch.linalg.vector_norm(direction, dim=(-2, -1), keepdim=True)
    return direction * (math.sqrt(min(m, n)) / norm.clamp_min(eps))


class AdaMuon(MuonVariant):
    """Muon with AdaMuon's sign, second moment and rescaling (``beta2``, ``eps``, ``sign_stabilized``,
    ``rms_aligned``); every other argument is `Muon`'s."""

    label = "AdaMuon"
    registry_name = "adamuon"
    config_class = AdaMuonConfig

    def __init__(self, params: Iterable[Any] | torch.nn.Module, lr: float,
                 weight_decay: float = AdaMuonConfig.weight_decay, *, beta2: float = AdaMuonConfig.beta2,
                 eps: float = AdaMuonConfig.eps, sign_stabilized: bool = AdaMuonConfig.sign_stabilized,
                 rms_aligned: bool = AdaMuonConfig.rms_aligned, **muon_kwargs: Any) -> None:
        fields = {"beta2": beta2, "eps": eps, "sign_stabilized": sign_stabilized, "rms_aligned": rms_aligned}
        self._take_variant_fields(lr, weight_decay, fields, muon_kwargs.get("tp_group"))
        super().__init__(params, lr, weight_decay, **muon_kwargs)

    def part_state(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """Each part's second moment, shaped like the part."""
        return {"moment2": shape}

    def _ns_input(self, it: MatrixItem) -> list[torch.Tensor]:
        """Muon's NS input (momentum, Nesterov look-ahead, fused parts), or its sign (``sign_stabilized``)."""
        parts = super()._ns_input(it)
        return [p.sign() for p in parts] if it.group["sign_stabilized"] else parts

    def _post_orthogonalize(self, it: MatrixItem, part: int, y: torch.Tensor) -> torch.Tensor:
        """Ô = O ⊘ (√V + ε), rescaled (``rms_aligned``) before Muon's scale."""
        eps = it.group["eps"]
        direction = adaptive_direction(y, self.part_tensor(it, "moment2", part, y), it.group["beta2"], eps)
        return rms_aligned(direction, eps) if it.group["rms_aligned"] else direction
