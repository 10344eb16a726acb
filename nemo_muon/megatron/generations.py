"""The Megatron-Core and Megatron-Bridge generations nemo-muon supports: one row each, naming the folder that serves
it and the entry points the shared code calls (``"module:function"``, imported only when called).

Every version decision of the megatron backend is a lookup here (`core_generation`, `bridge_generation`); nothing
else compares version numbers to pick code. Deleting a generation is deleting its folder and its row; a folder of
one generation never imports another's (tests/test_megatron_generations.py). Torch-free.

========================  ==================  =================================================================
generation                NGC releases        folder / entry
========================  ==================  =================================================================
Megatron-Core 0.16-0.17   26.02, 26.04        ``core_016_017``: our optimizer assembled into the layer-wise
                                              optimizer; gradients to owners, parameters gathered in forward
Megatron-Core >= 0.18     26.06, 26.08        ``core_018_plus``: the emerging-optimizer registry; DDP on the
                                              cost layout
Megatron-Bridge 0.3       26.02               ``bridge_03``: library recipe + perf-script fields; engine hook
Megatron-Bridge 0.4       26.04               ``bridge_04_05``: library recipe + perf-script fields; ``bridge_04_plus``:
                                              engine through ``provide()``
Megatron-Bridge 0.5       26.06               ``bridge_04_05`` + ``bridge_04_plus`` + ``bridge_05_06``: the cost
                                              layout in Bridge's wrap
Megatron-Bridge 0.6       26.08               ``bridge_04_plus`` + ``bridge_05_06`` + ``bridge_06``: perf recipes
========================  ==================  =================================================================
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

from nemo_muon.versions import release_numbers

Minor = tuple[int, int]


@dataclass(frozen=True)
class CoreGeneration:
    """Megatron-Core releases ``first`` .. ``last`` (None: open-ended) and how engine 'nemo_muon' enters them."""

    name: str
    """The folder under ``nemo_muon/megatron/`` that serves it; also the API generation `MegatronOptimizerSpec.api`
    names (the `OptimizerConfig` fields differ by generation)."""
    first: Minor
    last: Minor | None
    releases: str
    build_engine: str
    """``build_engine(opt, config, model_chunks, pg_collection, *, config_overrides=None)``."""
    parameter_layout: bool
    """DDP builds the layer-wise buffers from a parameter layout (``full_param_layout``): the cost layout exists."""
    wrap_with_cost_layout: str | None = None
    """``(model_chunks, config, ddp_config, *, ours, pg_collection, bucket_size) -> (wrapped, plans)``: DDP on the
    cost layout outside Bridge (``nemo-muon preflight``); None where the generation has no parameter layout."""


@dataclass(frozen=True)
class BridgeGeneration:
    """One Megatron-Bridge minor and how a megatron recipe and engine 'nemo_muon' enter it."""

    minor: Minor
    releases: str
    base_container: str
    """``(recipe) -> ConfigContainer``: the container a recipe starts from (ours are set on top)."""
    engine_entry: str
    """How engine 'nemo_muon' enters Bridge's optimizer setup: ``"hook"`` (`install_engine` before ``pretrain``) or
    ``"provide"`` (``ConfigContainer.optimizer`` is ours, `engine_optimizer_config`)."""
    install_engine: str | None = None
    """``(ours) -> None``: rebind Bridge's optimizer builder (``engine_entry == "hook"``)."""
    engine_optimizer_config: str | None = None
    """``(ours, megatron_kwargs) -> ConfigContainer.optimizer`` (``engine_entry == "provide"``)."""
    cost_layout: str | None = None
    """``(model_config, ours) -> planner``: DDP of Bridge's own model setup on the cost layout; None: the legacy
    layer-wise path (all-reduce, uneven all-gather)."""


CORE_016_017 = "core_016_017"
CORE_018_PLUS = "core_018_plus"
CORE_GENERATIONS: tuple[CoreGeneration, ...] = (
    CoreGeneration(CORE_016_017, (0, 16), (0, 17), "NGC 26.02, 26.04",
                   "nemo_muon.megatron.core_016_017.assembly:build_engine", parameter_layout=False),
    CoreGeneration(CORE_018_PLUS, (0, 18), None, "NGC 26.06, 26.08",
                   "nemo_muon.megatron.core_018_plus.registry_entry:build_engine", parameter_layout=True,
                   wrap_with_cost_layout="nemo_muon.megatron.core_018_plus.cost_layout:wrap_with_cost_layout"),
)
_PROVIDE = "nemo_muon.megatron.bridge_04_plus.provider:engine_optimizer_config"
_LAYOUT = "nemo_muon.megatron.bridge_05_06.layout:install"
_LIBRARY_04_05 = "nemo_muon.megatron.bridge_04_05.library_recipe:library_recipe_container"
BRIDGE_GENERATIONS: tuple[BridgeGeneration, ...] = (
    BridgeGeneration((0, 3), "NGC 26.02", "nemo_muon.megatron.bridge_03.library_recipe:library_recipe_container",
                     "hook", install_engine="nemo_muon.megatron.bridge_03.hook:install"),
    BridgeGeneration((0, 4), "NGC 26.04", _LIBRARY_04_05, "provide", engine_optimizer_config=_PROVIDE),
    BridgeGeneration((0, 5), "NGC 26.06", _LIBRARY_04_05, "provide", engine_optimizer_config=_PROVIDE,
                     cost_layout=_LAYOUT),
    BridgeGeneration((0, 6), "NGC 26.08", "nemo_muon.megatron.bridge_06.perf_recipes:perf_recipe_container",
                     "provide", engine_optimizer_config=_PROVIDE, cost_layout=_LAYOUT),
)


def core_generation(version: str) -> CoreGeneration:
    """The row serving Megatron-Core ``version``; a ValueError names the supported range otherwise."""
    minor = release_numbers(version)[:2]
    for row in CORE_GENERATIONS:
        if row.first <= minor and (row.last is None or minor <= row.last):
            return row
    raise ValueError(f"megatron-core must be >= 0.16 (the first with Muon); got {version!r}")


def bridge_generation(version: str) -> BridgeGeneration:
    """The row of Megatron-Bridge ``version``'s minor; a ValueError names the supported minors otherwise."""
    minor = release_numbers(version)[:2]
    for row in BRIDGE_GENERATIONS:
        if row.minor == minor:
            return row
    newest = BRIDGE_GENERATIONS[-1]
    if minor > newest.minor:  # untested: the public extension point and the newest base; no pinned private hook
        return dataclasses.replace(newest, minor=minor, releases="newer than nemo-muon's tests", cost_layout=None)
    shown = ", ".join(".".join(map(str, r.minor)) for r in BRIDGE_GENERATIONS)
    raise ValueError(f"megatron-bridge must be one of {shown} (NGC 26.02 onwards); got {version!r}")


def installed_core_generation() -> CoreGeneration:
    """The row of the installed Megatron-Core."""
    return core_generation(importlib.metadata.version("megatron-core"))


def installed_bridge_generation() -> BridgeGeneration:
    """The row of the installed Megatron-Bridge."""
    return bridge_generation(importlib.metadata.version("megatron-bridge"))


def entry(reference: str) -> Any:
    """The function a row names (``"module:function"``), imported now."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)
