"""Build the optimizer a config describes: ``build_optimizer(cfg, named_params, **runtime)``.

- ``MuonConfig`` -> ``nemo_muon.Muon``; ``SoapConfig`` -> ``nemo_muon.SOAP``: the config's fields are the keyword
  arguments; ``runtime`` adds what is not a config value (``tp_group``, ``master_weights``, ``fused_layouts``,
  ``matrix_rule``, and for Muon ``tp_mode`` may be overridden).
- ``AdamWConfig`` -> ``torch.optim.AdamW`` (decoupled weight decay). Weight decay applies to every param, 1-D ones
  included, exactly as in the AdamW part of Muon/SOAP (one rule everywhere); to exempt norms and biases pass param
  groups with ``weight_decay=0.0`` as ``named_params``. AdamW takes no TP/routing runtime arguments.
- SOAP preconditions a fused weight as one matrix, so it takes no ``fused_layouts``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig

_MATRIX_RUNTIME = ("tp_group", "master_weights", "matrix_rule")


def build_optimizer(cfg: MuonConfig | SoapConfig | AdamWConfig, named_params: Iterable[Any],
                    **runtime: Any) -> torch.optim.Optimizer:
    """The optimizer for ``cfg`` over ``named_params`` (``model.named_parameters()``, tensors or param groups)."""
    cfg.validate()
    kwargs = cfg.optimizer_kwargs()
    if isinstance(cfg, MuonConfig):
        from nemo_muon.optim.muon import Muon

        allowed = (*_MATRIX_RUNTIME, "tp_mode", "fused_layouts")
        _check_runtime("muon", runtime, allowed)
        return Muon(named_params, **{**kwargs, **runtime})
    if isinstance(cfg, SoapConfig):
        from nemo_muon.optim.soap import SOAP

        _check_runtime("soap", runtime, _MATRIX_RUNTIME)
        return SOAP(named_params, **{**kwargs, **runtime})
    if isinstance(cfg, AdamWConfig):
        _check_runtime("adamw", runtime, ())
        return torch.optim.AdamW(named_params, **kwargs)
    raise ValueError(f"cfg must be one of (MuonConfig, SoapConfig, AdamWConfig); got {type(cfg).__name__}")


def _check_runtime(name: str, runtime: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(runtime) - set(allowed))
    if unknown:
        raise ValueError(f"build_optimizer runtime arguments for {name} must be among {allowed}; got {unknown}")
