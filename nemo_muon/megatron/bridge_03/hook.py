"""The one place nemo-muon reaches into Megatron-Bridge's optimizer setup (Bridge 0.3.x, Megatron-Core 0.16).

Bridge 0.3's `megatron.bridge.training.optim.setup_optimizer` builds every Muon through the name
``get_megatron_muon_optimizer`` of its own module (imported from ``megatron.core.optimizer.muon``). `install` rebinds
that name, in Bridge's module only, to `build_for_bridge`, which builds nemo-muon's Muon (or SOAP: Bridge sends
``*soap*`` optimizers to the same name) inside Megatron's layer-wise optimizer (`nemo_muon.megatron.shared.build.build_engine`,
Megatron-Core 0.16's assembly) with the config overrides and process groups Bridge passes. Nothing else of Bridge changes. The hook is pinned: `install` refuses another Bridge minor
version, and a setup_optimizer that no longer calls that name, so a Bridge upgrade fails loudly here instead of
silently running Megatron's own Muon.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from typing import Any

from nemo_muon.megatron.generations import BRIDGE_GENERATIONS

SUPPORTED_BRIDGE: tuple[tuple[int, int], ...] = tuple(g.minor for g in BRIDGE_GENERATIONS
                                                     if g.install_engine == f"{__name__}:install")
"""The Bridge minors whose row (`nemo_muon.megatron.generations`) enters the engine through this hook."""
HOOKED_NAME = "get_megatron_muon_optimizer"


def build_for_bridge(config: Any, model_chunks: list[Any], config_overrides: Any = None,
                     use_gloo_process_groups: bool = True, layer_wise_distributed_optimizer: bool = False,
                     pg_collection: Any = None, *, ours: Any = None) -> Any:
    """Stands in for Megatron-Core 0.16's ``get_megatron_muon_optimizer`` inside Bridge's setup_optimizer (which
    sends Muon and SOAP there); ``ours`` is the recipe's optimizer config, bound by `install`."""
    from nemo_muon.megatron.shared.build import build_engine, mpu_process_groups

    if not layer_wise_distributed_optimizer:
        raise ValueError(f"optimizer.optimizer must be 'dist_muon' or 'dist_soap' (layer-wise) for engine "
                         f"'nemo_muon'; got {config.optimizer!r}")
    if pg_collection is None:  # Bridge passes none unless dist.use_decentralized_pg; Megatron's groups are set up
        pg_collection = mpu_process_groups()
    return build_engine(ours, config, model_chunks, pg_collection, config_overrides=config_overrides)


def check_hook_point(optim_module: Any, bridge_version: str) -> None:
    """Raise unless Bridge is 0.3.x and its setup_optimizer builds Muon through the module name we rebind."""
    from nemo_muon.versions import release_numbers

    if release_numbers(bridge_version)[:2] not in SUPPORTED_BRIDGE:
        raise RuntimeError(f"optimizer.engine='nemo_muon' is wired into Megatron-Bridge "
                           f"{' / '.join('.'.join(map(str, v)) + '.x' for v in SUPPORTED_BRIDGE)}; installed megatron-bridge {bridge_version}. "
                           "Set optimizer.engine=megatron, or use a Bridge this nemo-muon supports")
    source = inspect.getsource(optim_module.setup_optimizer)
    if f"{HOOKED_NAME}(" not in source or not hasattr(optim_module, HOOKED_NAME):
        raise RuntimeError(f"megatron.bridge.training.optim.setup_optimizer no longer calls {HOOKED_NAME} (Bridge "
                           f"{bridge_version}): the nemo_muon engine hook point moved; set optimizer.engine=megatron")


def install(ours: Any) -> None:
    """Make Bridge's setup_optimizer build nemo-muon's Muon / SOAP (``ours``: the recipe's `MuonConfig` /
    `SoapConfig`) for ``dist_muon`` / ``dist_soap`` configs."""
    from megatron.bridge.training import optim

    check_hook_point(optim, importlib.metadata.version("megatron-bridge"))
    optim.get_megatron_muon_optimizer = functools.partial(build_for_bridge, ours=ours)


def installed() -> bool:
    """Whether Bridge's setup_optimizer currently builds nemo-muon's optimizers."""
    from megatron.bridge.training import optim

    hooked = getattr(optim, HOOKED_NAME, None)
    return isinstance(hooked, functools.partial) and hooked.func is build_for_bridge
