"""NeMo 2.7 (Lightning) optimizer modules: Muon / SOAP where a NeMo 2 recipe passes AdamW.

    from nemo_muon.megatron.nemo2 import Muon
    recipe.optim = Muon(lr=1e-4, weight_decay=0.01)          # was: distributed_fused_adam_with_cosine_annealing(...)

`Muon(...)` / `SOAP(...)` return a subclass of NeMo's `MegatronOptimizerModule` whose `optimizers()` builds the
Megatron-Core optimizer our mapping selects (`nemo_muon.megatron.optimizer_config`): on megatron-core 0.16 (NGC
26.02) `get_megatron_muon_optimizer(..., layer_wise_distributed_optimizer=...)`, on 0.18+ `get_megatron_optimizer`
with ``optimizer="muon"|"soap"`` and the layer-wise flag. Muon/SOAP need the strategy's DDP config with
``use_distributed_optimizer=False`` (Megatron-Core refuses otherwise). NeMo is imported only when a module is built,
so this file imports anywhere.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from nemo_muon.config.optimizer import DEFAULT_WEIGHT_DECAY, MuonConfig, OptimizerConfig, SoapConfig
from nemo_muon.megatron.optimizer_config import (
    MEGATRON_MUON_DEFAULTS,
    MegatronOptimizerSpec,
    to_megatron_optimizer_config,
)


def muon_optimizer_config(lr: float, weight_decay: float = DEFAULT_WEIGHT_DECAY, *, grad_clip: float = 1.0,
                          min_lr: float | None = None, layerwise: bool = True,
                          **muon_kwargs: Any) -> tuple[Any, MegatronOptimizerSpec]:
    """The Megatron-Core OptimizerConfig of a Muon run (fields of `MuonConfig` as keyword arguments)."""
    cfg = MuonConfig(lr=lr, weight_decay=weight_decay, **{**MEGATRON_MUON_DEFAULTS, **muon_kwargs})
    return to_megatron_optimizer_config(cfg, grad_clip=grad_clip, min_lr=min_lr, layerwise=layerwise)


@cache
def _module_class() -> type:
    try:
        from nemo.lightning.pytorch.optim.megatron import MegatronOptimizerModule
    except ImportError as e:
        raise ImportError("nemo_muon.megatron.nemo2 needs NeMo 2.7 (nemo_toolkit 2.7.x with the LLM collection, "
                          "e.g. the NGC nemo:26.02 container)") from e

    class EmergingOptimizerModule(MegatronOptimizerModule):
        """MegatronOptimizerModule for Muon / SOAP (layer-wise distributed over data-parallel ranks)."""

        def __init__(self, config: Any, spec: MegatronOptimizerSpec, **kwargs: Any) -> None:
            super().__init__(config, **kwargs)
            self.spec = spec

        def optimizers(self, model: Any) -> list[Any]:
            if self.spec.builder != "get_megatron_muon_optimizer":
                return super().optimizers(model)  # 0.18+: get_megatron_optimizer honours optimizer='muon'|'soap'
            if self.lr_mult != 1.0 or self.no_weight_decay_cond or self.scale_lr_cond:
                raise ValueError("lr_mult / no_weight_decay_cond / scale_lr_cond are not supported by "
                                 "megatron-core 0.16's get_megatron_muon_optimizer; got "
                                 f"lr_mult={self.lr_mult}, no_weight_decay_cond={self.no_weight_decay_cond}, "
                                 f"scale_lr_cond={self.scale_lr_cond}")
            from megatron.core.optimizer.muon import get_megatron_muon_optimizer
            from nemo.core.optim import McoreDistributedOptimizer
            from nemo.utils import AppState

            # get_megatron_muon_optimizer rewrites config.optimizer; keep ours intact
            mcore_opt = get_megatron_muon_optimizer(
                copy.copy(self.config), [m.module for m in model],
                use_gloo_process_groups=AppState().use_gloo_process_groups,
                layer_wise_distributed_optimizer=self.spec.layer_wise,
            )
            return [McoreDistributedOptimizer(mcore_opt)]

    return EmergingOptimizerModule


def optimizer_module(opt: OptimizerConfig, *, lr_scheduler: Any = None, grad_clip: float = 1.0,
                     min_lr: float | None = None, layerwise: bool = True, **module_kwargs: Any) -> Any:
    """A NeMo 2 optimizer module for any of our optimizer configs (AdamW too)."""
    config, spec = to_megatron_optimizer_config(opt, grad_clip=grad_clip, min_lr=min_lr, layerwise=layerwise)
    return _module_class()(config, spec, lr_scheduler=lr_scheduler, **module_kwargs)


def Muon(lr: float, weight_decay: float = DEFAULT_WEIGHT_DECAY, *, lr_scheduler: Any = None, grad_clip: float = 1.0,  # noqa: N802
         layerwise: bool = True, **muon_kwargs: Any) -> Any:
    """NeMo 2 optimizer module for layer-wise distributed Muon (momentum 0.95, Nesterov, TP mode duplicated)."""
    cfg = MuonConfig(lr=lr, weight_decay=weight_decay, **{**MEGATRON_MUON_DEFAULTS, **muon_kwargs})
    return optimizer_module(cfg, lr_scheduler=lr_scheduler, grad_clip=grad_clip, layerwise=layerwise)


def SOAP(lr: float, weight_decay: float = DEFAULT_WEIGHT_DECAY, *, lr_scheduler: Any = None, grad_clip: float = 1.0,  # noqa: N802
         layerwise: bool = True, **soap_kwargs: Any) -> Any:
    """NeMo 2 optimizer module for layer-wise SOAP (megatron-core >= 0.18)."""
    cfg = SoapConfig(lr=lr, weight_decay=weight_decay, **{"nonfinite": "raise", **soap_kwargs})
    return optimizer_module(cfg, lr_scheduler=lr_scheduler, grad_clip=grad_clip, layerwise=layerwise)


def __getattr__(name: str) -> Any:
    if name in ("EmergingOptimizerModule", "MuonOptimizerModule"):
        return _module_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MEGATRON_MUON_DEFAULTS", "Muon", "SOAP", "muon_optimizer_config", "optimizer_module"]
