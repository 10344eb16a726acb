"""nemo-muon: Muon and SOAP for NeMo / Megatron-Core / Megatron-Bridge pretraining.

Importing the package is cheap and torch-free; the optimizers and training code load on first use, so the CLI,
the planner and the recipes work on a login node or in a container check without torch.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (loaded lazily); every registered optimizer's class and config class is public
# too, found through its registry entry (`_registered`)
_LAZY = {
    "Muon": "nemo_muon.optim.muon",
    "SOAP": "nemo_muon.optim.soap",
    "newton_schulz": "nemo_muon.optim.ns_iteration",
    "build_optimizer": "nemo_muon.optim.factory",
    "WholeTensorOptimizer": "nemo_muon.layerwise.optimizer",
    "pretrain": "nemo_muon.train.pretrain",
    "MuonConfig": "nemo_muon.config.optimizer",
    "SoapConfig": "nemo_muon.config.optimizer",
    "AdamWConfig": "nemo_muon.config.optimizer",
    "TrainingRecipe": "nemo_muon.config.recipe",
}

# subpackages reachable as attributes without importing them first (``nemo_muon.megatron.nemo2.muon_with_wsd``)
_SUBPACKAGES: frozenset[str] = frozenset({"accounting", "config", "layerwise", "megatron", "models", "optim", "registry",
                                          "reporting", "train", "recipes", "launchers"})

RENAMED = {"LayerWiseDistributedOptimizer": "WholeTensorOptimizer"}
"""Old public name -> new one. The old names still resolve, with a FutureWarning, until 0.3: ``LayerWiseDistributedOptimizer``
sat beside Megatron-Core's class of that name (which our megatron backend also builds)."""

__all__ = ["__version__", *sorted(_LAZY)]


def renamed(module: str, name: str) -> str:
    """The current name of ``name`` in ``module``, warning once per call site that the old one is deprecated."""
    new = RENAMED[name]
    warnings.warn(f"{module}.{name} was renamed {module}.{new} (Megatron-Core has its own {name}); the old name goes "
                  f"away in nemo-muon 0.3", FutureWarning, stacklevel=3)
    return new


def _registered(name: str) -> Any:
    """The optimizer class (``nemo_muon.NorMuon``) or config class (``nemo_muon.NorMuonConfig``) of a registry entry
    of this package called ``name``; None when none is."""
    from nemo_muon.registry import resolve, specs

    for spec in specs():
        module, _, attribute = spec.implementation.partition(":")
        if attribute == name and module.startswith(f"{__name__}."):
            return resolve(spec.implementation)
        if spec.config_class.__name__ == name and spec.config_class.__module__.startswith(f"{__name__}."):
            return spec.config_class
    return None


def __getattr__(name: str) -> Any:
    if name in RENAMED:
        name = renamed(__name__, name)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    found = None if name.startswith("_") else _registered(name)
    if found is not None:
        return found
    raise AttributeError(f"module 'nemo_muon' has no attribute {name!r}")
