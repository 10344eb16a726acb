"""AdaMuon (Chongjie Si, Debing Zhang, Wei Shen, "AdaMuon: Adaptive Muon Optimizer", arXiv 2507.11005): Muon whose
orthogonalized update is divided element-wise by the root of its own second moment, then rescaled to AdamW's RMS.
Its config and its registry entry; the update is `nemo_muon.optim.adamuon.AdaMuon`.

The paper's update of an m x n matrix, after Muon's momentum M_t (and Nesterov look-ahead):
    O_t = NS(sign(M_t))                        sign-stabilized orthogonal update (``sign_stabilized``)
    V_t = β₂·V_{t-1} + (1 - β₂)·O_t ⊙ O_t      element-wise second moment of the orthogonalized update, V_0 = 0
    Ô_t = O_t ⊘ (√V_t + ε)
    W_t = W_{t-1}·(1 - η·λ) - η·γ_t·Ô_t,  γ_t = 0.2·√(mn) / ‖Ô_t‖_F   RMS-aligned rescaling (``rms_aligned``)
No bias correction: the rescaling removes V's scale. Here the rescaling is written as Muon's: Ô_t is rescaled to the
Frobenius norm √min(m, n) of a semi-orthogonal matrix of its shape, then multiplied by Muon's scale, so that the
scale mode means what it means for Muon; with ``scale_mode='match_rms_adamw'`` (the default: 0.2·√max(m, n)) that
is the paper's γ_t exactly (the update's RMS is 0.2). Muon's EMA momentum is the paper's sum up to the factor
(1 - μ), which neither sign nor Newton–Schulz sees.

emerging-optimizers' ``AdaptiveMuon(moment2_method="adamuon")`` (and Megatron-Core 0.19's
``TensorParallelAdaptiveMuon`` built on it) runs neither the sign nor the rescaling: Ô_t times Muon's scale. With
``sign_stabilized=False, rms_aligned=False`` this is that update (tests/test_adamuon.py compares both).
Each fused part and each expert of a 3-D stack is its own matrix, with its own V (``moment2_<part>``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nemo_muon._validation import check_range
from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.registry.muon import SPEC as MUON_SPEC
from nemo_muon.registry.spec import Shape


@dataclass(kw_only=True)
class AdaMuonConfig(MuonConfig):
    """Muon's fields, and AdaMuon's second moment, sign and rescaling."""

    beta2: float = 0.95
    """EMA rate of the element-wise second moment V (emerging-optimizers' ``beta2`` default)."""
    eps: float = 1e-8
    """Added to √V in the division (Adam's place for it)."""
    sign_stabilized: bool = True
    """Orthogonalize the sign of the momentum (the paper's sign-stabilized update); False: the momentum itself, as the
    paper's first version and emerging-optimizers do."""
    rms_aligned: bool = True
    """Rescale Ô to the norm of a semi-orthogonal matrix of its shape before Muon's scale (module docstring: the
    paper's γ with match_rms_adamw); False: Ô times Muon's scale, as emerging-optimizers."""

    name: str = dataclasses.field(default="adamuon", init=False)

    def validate(self) -> None:
        super().validate()
        check_range("adamuon.beta2", self.beta2, low=0.0, high=1.0, high_inclusive=False)
        check_range("adamuon.eps", self.eps, low=0.0, low_inclusive=False)


def adamuon_state_elements(shape: Shape) -> int:
    """The momentum, and one second-moment value per element."""
    return 2 * math.prod(shape)


SPEC = dataclasses.replace(
    MUON_SPEC,  # Muon's routing, NS cost, runtime arguments, Megatron names, field mapping, recipe defaults, baseline
    name="adamuon",
    label="AdaMuon",
    config_class=AdaMuonConfig,
    implementation="nemo_muon.optim.adamuon:AdaMuon",
    # the rescaling reads the whole matrix's norm; V adds a read and a write of 4 B per element to Muon's 22 B
    matrix=dataclasses.replace(MUON_SPEC.matrix, state_elements=adamuon_state_elements, splittable=False,
                               element_bytes=MUON_SPEC.matrix.element_bytes + 8),
    # engine 'nemo_muon' only: Megatron-Core's TensorParallelAdaptiveMuon (>= 0.19) has neither sign nor rescaling
    megatron=dataclasses.replace(MUON_SPEC.megatron, engines=("nemo_muon",), registered_name="nemo_muon.adamuon"),
)
