"""nemo_muon.layerwise: the whole-tensor optimizer (each data-parallel rank owns whole tensors: the layer-wise layout).

The ownership it runs is computed by the torch-free ``nemo_muon.accounting`` package (``ownership_plan``:
LPT and the round-robin / ping-pong baselines; ``model_ownership``: plans of a whole ModelSpec under PP/DP/EP).

- ``optimizer``: ``WholeTensorOptimizer``, which coordinates its parts: ``plan_items`` (the plan),
  ``ownership`` (what each rank owns and its masters), ``buckets`` (communication), ``grad_reduction``,
  ``owned_update`` (the inner optimizers' step, shared back) and ``state_format``.
- ``checkpoint``: DP-size-independent, atomic, verified checkpoints.

Importing this package is cheap; the torch modules load on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "WholeTensorOptimizer": "nemo_muon.layerwise.optimizer",
    "save_checkpoint": "nemo_muon.layerwise.checkpoint",
    "load_checkpoint": "nemo_muon.layerwise.checkpoint",
    "latest_checkpoint": "nemo_muon.layerwise.checkpoint",
    "CheckpointError": "nemo_muon.layerwise.checkpoint",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nemo_muon.layerwise' has no attribute {name!r}")
