"""Engine 'nemo_muon' in Megatron-Bridge >= 0.4 (NGC 26.04 onwards), through Bridge's own extension point.

Bridge's ``setup_optimizer`` asks the optimizer config first: ``if hasattr(optimizer_config, "provide"):
optimizer_config.provide(model_chunks=, config_overrides=, use_gloo_process_groups=, pg_collection=)`` (Bridge PR
#2132, in every release from 0.4.0). `EngineOptimizerConfig` is Bridge's `OptimizerConfig` (every Megatron field,
as our mapping writes them) plus the recipe's own optimizer config, and its ``provide`` builds nemo-muon's Muon / SOAP
inside Megatron-Core's layer-wise distributed optimizer on whichever Megatron-Core generation is installed
(`nemo_muon.megatron.shared.build.build_engine`). Nothing of Bridge is patched. This module imports Bridge: load it only where
Bridge is installed (`nemo_muon.megatron.bridge.container.engine_optimizer_config` does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from megatron.bridge.training.config import OptimizerConfig as BridgeOptimizerConfig

from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.registry import is_registered, spec_for


@dataclass
class EngineOptimizerConfig(BridgeOptimizerConfig):
    """Bridge's `OptimizerConfig` whose ``provide`` builds engine 'nemo_muon' (``engine_config``: the recipe's
    matrix optimizer config (Muon, SOAP, NorMuon, ...: `nemo_muon.registry`), validated when it was made)."""

    engine_config: BaseOptimizerConfig | None = None

    def provide(self, model_chunks: Any, config_overrides: Any = None, use_gloo_process_groups: bool = False,
                pg_collection: Any = None) -> Any:
        """The optimizer Bridge's setup_optimizer asks for: ours inside Megatron's layer-wise optimizer."""
        from nemo_muon.megatron.shared.build import build_engine, mpu_process_groups

        if not is_registered(self.engine_config) or spec_for(self.engine_config).matrix is None:
            raise ValueError(f"EngineOptimizerConfig.engine_config must be a registered matrix optimizer's config "
                             f"(nemo_muon.registry: Muon, SOAP, NorMuon, ...); got "
                             f"{type(self.engine_config).__name__}")
        chunks = model_chunks if isinstance(model_chunks, list) else [model_chunks]
        _check_ddp_layout(chunks)
        if pg_collection is None:  # Bridge passes none unless dist.use_decentralized_pg; Megatron's groups are set up
            pg_collection = mpu_process_groups()
        return build_engine(self.engine_config, self, chunks, pg_collection, config_overrides=config_overrides)


def _check_ddp_layout(chunks: list[Any]) -> None:
    """Refuse DDP built with ``use_distributed_optimizer`` on untagged parameters (Megatron's numel layout for all of
    them, which the layer-wise optimizer cannot own): Bridge's own wrap without `nemo_muon.megatron.bridge_05_06.layout`."""
    ddp_config = getattr(chunks[0], "ddp_config", None) if chunks else None
    if ddp_config is None or not ddp_config.use_distributed_optimizer:
        return
    if not any(hasattr(p, "is_managed_by_layer_wise_optimizer") for c in chunks for p in c.parameters()):
        raise ValueError("Bridge built DDP with ddp.use_distributed_optimizer=True on parameters no layer-wise layout "
                         "tagged: train through nemo_muon.megatron.bridge.container.pretrain (it installs the cost layout, "
                         "nemo_muon.megatron.bridge_05_06.layout), or set ddp.use_distributed_optimizer=False")


def engine_optimizer_config(ours: BaseOptimizerConfig, megatron_kwargs: dict[str, Any]) -> EngineOptimizerConfig:
    """`EngineOptimizerConfig` with the Megatron fields ``megatron_kwargs`` (our mapping's) and ``ours``."""
    fields = {f.name for f in dataclasses.fields(EngineOptimizerConfig)}
    unknown = sorted(set(megatron_kwargs) - fields)
    if unknown:
        raise ValueError(f"Megatron-Bridge's OptimizerConfig has no field(s) {unknown} (installed Bridge)")
    return EngineOptimizerConfig(**megatron_kwargs, engine_config=ours)
