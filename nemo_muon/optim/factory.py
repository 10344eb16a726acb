"""Build the optimizer a config describes: ``build_optimizer(cfg, named_params, **runtime)``.

The config's entry in `nemo_muon.registry` names the class (``spec.implementation``) and the runtime arguments it
takes besides the config's fields (``spec.runtime_args``: ``tp_group``, ``master_weights``, ``fused_layouts``,
``matrix_rule``, for Muon ``tp_mode``); the config's fields are the keyword arguments. AdamW is
``torch.optim.AdamW`` (decoupled weight decay on every param, 1-D ones included, exactly as in the AdamW part of
Muon/SOAP; to exempt norms and biases pass param groups with ``weight_decay=0.0`` as ``named_params``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nemo_muon.registry import resolve, spec_for


def build_optimizer(cfg: Any, named_params: Iterable[Any], **runtime: Any) -> torch.optim.Optimizer:
    """The optimizer for ``cfg`` over ``named_params``: ``model.named_parameters()`` or param groups; Muon / SOAP also
    take the model itself (routing by what each parameter is, `nemo_muon.optim.param_roles`)."""
    spec = spec_for(cfg)
    cfg.validate()
    unknown = sorted(set(runtime) - set(spec.runtime_args))
    if unknown:
        raise ValueError(f"build_optimizer runtime arguments for {spec.name} must be among {spec.runtime_args}; got "
                         f"{unknown}")
    return resolve(spec.implementation)(named_params, **{**cfg.optimizer_kwargs(), **runtime})
