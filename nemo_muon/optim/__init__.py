"""nemo_muon.optim: Newton–Schulz (with TP modes), parameter routing, Muon, SOAP and the optimizer factory.

Imports torch (this is not one of the light modules). ``newton_schulz`` is the function, defined in
``nemo_muon.optim.ns_iteration``; the cost models it consults (algorithm, TP mode) are torch-free in
``nemo_muon.accounting.ns_choice``.
"""

from __future__ import annotations

from nemo_muon.optim.factory import build_optimizer
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.ns_iteration import newton_schulz, newton_schulz_many
from nemo_muon.optim.routing import GateUpLayout, QKVLayout, default_matrix_rule
from nemo_muon.optim.soap import SOAP

__all__ = ["SOAP", "GateUpLayout", "Muon", "QKVLayout", "build_optimizer", "default_matrix_rule", "newton_schulz",
           "newton_schulz_many"]
