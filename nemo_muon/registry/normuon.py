"""NorMuon (Li et al., arXiv 2510.05491): Muon whose orthogonalized update is normalized per row by a second
moment, then rescaled to the orthogonalized update's Frobenius norm. Its config and its registry entry; the update
is `nemo_muon.optim.normuon.NorMuon`.

Per matrix (after Muon's momentum and Newton–Schulz, O = NS(u)): with the mean taken along the longer side,
v <- v.lerp(mean(O², long side), 1 - beta2);  Ô = O · rsqrt(max(v, eps));  Ô <- Ô · ‖O‖_F / max(‖Ô‖_F, eps);
then Muon's scale. The same as emerging-optimizers' ``AdaptiveMuon(moment2_method="normuon")``, which is the test's
reference; ours adds what Muon has there: the AdamW part, fused-weight splitting, 3-D expert stacks (per expert),
the layer-wise optimizers and split ownership.
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
class NorMuonConfig(MuonConfig):
    """Muon's fields, and the row-wise second moment of the orthogonalized update."""

    beta2: float = 0.95
    """EMA rate of the second moment (emerging-optimizers' ``beta2``)."""
    eps: float = 1e-8
    """Floor of the second moment and of the norm ratio."""

    name: str = dataclasses.field(default="normuon", init=False)

    def validate(self) -> None:
        super().validate()
        check_range("normuon.beta2", self.beta2, low=0.0, high=1.0, high_inclusive=False)
        check_range("normuon.eps", self.eps, low=0.0, low_inclusive=False)


def normuon_state_elements(shape: Shape) -> int:
    """The momentum, and one second-moment value per row of the longer side."""
    *batch, m, n = shape
    return math.prod(shape) + math.prod(batch) * max(m, n)


SPEC = dataclasses.replace(
    MUON_SPEC,  # Muon's routing, NS cost, runtime arguments, Megatron names, field mapping and recipe defaults
    name="normuon",
    label="NorMuon",
    config_class=NorMuonConfig,
    implementation="nemo_muon.optim.normuon:NorMuon",
    # the whole-tensor optimizer's split runs NS on slices; the row moment needs the whole matrix
    matrix=dataclasses.replace(MUON_SPEC.matrix, state_elements=normuon_state_elements, splittable=False),
    # no Megatron-Core implementation
    megatron=dataclasses.replace(MUON_SPEC.megatron, engines=("nemo_muon",), registered_name="nemo_muon.normuon"),
)
