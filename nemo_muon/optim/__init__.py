"""nemo_muon.optim: Newton–Schulz (with TP modes), parameter routing, Muon, SOAP and the optimizer factory.

Heavy imports (torch, emerging-optimizers) happen on first attribute access, so ``import nemo_muon.optim`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "newton_schulz": "nemo_muon.optim.newton_schulz",
    "newton_schulz_many": "nemo_muon.optim.newton_schulz",
    "Muon": "nemo_muon.optim.muon",
    "SOAP": "nemo_muon.optim.soap",
    "build_optimizer": "nemo_muon.optim.factory",
    "GateUpLayout": "nemo_muon.optim.routing",
    "QKVLayout": "nemo_muon.optim.routing",
    "default_matrix_rule": "nemo_muon.optim.routing",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nemo_muon.optim' has no attribute {name!r}")
