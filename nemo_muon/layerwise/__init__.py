"""nemo_muon.layerwise: the layer-wise distributed optimizer (whole tensors per data-parallel rank).

- ``plan`` (torch-free): NS/SOAP cost model, LPT ownership and the round-robin / ping-pong baselines.
- ``model_plan`` (torch-free): ownership plans of a whole ModelSpec under PP/DP/EP (computed, not run).
- ``optimizer``: ``LayerWiseDistributedOptimizer``; ``buckets``: its communication buckets.
- ``checkpoint``: DP-size-independent, atomic, verified checkpoints.

Importing this package is cheap; the torch modules load on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LayerWiseDistributedOptimizer": "nemo_muon.layerwise.optimizer",
    "save_checkpoint": "nemo_muon.layerwise.checkpoint",
    "load_checkpoint": "nemo_muon.layerwise.checkpoint",
    "latest_checkpoint": "nemo_muon.layerwise.checkpoint",
    "CheckpointError": "nemo_muon.layerwise.checkpoint",
    "ns_cost": "nemo_muon.layerwise.plan",
    "soap_cost": "nemo_muon.layerwise.plan",
    "lpt_assign": "nemo_muon.layerwise.plan",
    "plan_ownership": "nemo_muon.layerwise.plan",
    "OwnershipPlan": "nemo_muon.layerwise.plan",
    "PlanItem": "nemo_muon.layerwise.plan",
    "model_plan": "nemo_muon.layerwise.model_plan",
    "compare_methods": "nemo_muon.layerwise.model_plan",
    "stage_plan": "nemo_muon.layerwise.model_plan",
    "CostModel": "nemo_muon.layerwise.model_plan",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nemo_muon.layerwise' has no attribute {name!r}")
