"""Megatron-Core >= 0.18: our matrix optimizers as entries of Megatron's emerging-optimizer registry.

Megatron-Core >= 0.18 keeps a registry of emerging optimizers (``megatron/core/optimizer/emerging_optimizers.py``:
name -> optimizer class, state init, config -> kwargs). `register_with_megatron` adds each of ours under its registry
entry's ``megatron.registered_name`` (``nemo_muon``, ``nemo_soap``, ``nemo_normuon``);
``OptimizerConfig(optimizer=<that name>, use_layer_wise_distributed_optimizer=True)`` then goes through Megatron's own
`get_megatron_optimizer` like its Muon does. The recipe's validated config rides on the copy of Megatron's config our
builder hands `get_megatron_optimizer` (attribute `OURS_ATTRIBUTE`), where the entry's ``config_to_kwargs`` reads it.

Megatron-Core has no public function to add an entry: the table is the module's private ``_EMERGING_OPTIMIZERS``
(0.18, 0.19), which `register_with_megatron` writes through `setdefault` and `registry_problems` pins (a Megatron-Core
that moves it fails naming the version, tests/megatron_cpu/test_megatron_training.py).
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.megatron.core_018_plus.split_shares import attach_split_shares
from nemo_muon.megatron.shared.engine import (
    engine_class_of,
    engine_kwargs,
    finish_wrapping,
    init_placeholder_state,
    nonfinite_policy,
)
from nemo_muon.megatron.shared.nonfinite import apply_nonfinite_policy
from nemo_muon.registry import check_split_target, spec_for, specs

OURS_ATTRIBUTE = "nemo_muon_config"
"""The attribute of (our copy of) Megatron's `OptimizerConfig` that carries the recipe's validated config to our
registry entries' ``config_to_kwargs``."""


def _kwargs_from_attached(config: Any, model_chunks: list[Any], pg_collection: Any) -> dict[str, Any]:
    """Megatron's ``config_to_kwargs`` of our registry entries: the config our builder attached (`OURS_ATTRIBUTE`)."""
    ours = getattr(config, OURS_ATTRIBUTE, None)
    if ours is None:
        raise ValueError(f"OptimizerConfig(optimizer={config.optimizer!r}) is nemo-muon's; build it through "
                         "nemo_muon.megatron.shared.build.build_engine (or Bridge's OptimizerConfig.provide() of "
                         "nemo_muon.megatron.bridge_04_plus.provider), which carries the recipe's optimizer config")
    return engine_kwargs(ours, config, model_chunks, pg_collection)


def register_with_megatron() -> None:
    """Add every registry entry with engine 'nemo_muon' to Megatron-Core's emerging-optimizer registry (>= 0.18)
    under its ``megatron.registered_name``; idempotent."""
    from megatron.core.optimizer import emerging_optimizers as eo

    registry = getattr(eo, "_EMERGING_OPTIMIZERS", None)
    entry_cls = getattr(eo, "EmergingOptimizerEntry", None)
    if registry is None or entry_cls is None:
        raise RuntimeError("megatron.core.optimizer.emerging_optimizers has no _EMERGING_OPTIMIZERS / "
                           "EmergingOptimizerEntry: the registration hook moved (written for Megatron-Core 0.19)")
    for spec in specs():
        if "nemo_muon" in spec.megatron.engines and spec.megatron.registered_name:
            registry.setdefault(spec.megatron.registered_name, entry_cls(
                optimizer_cls=engine_class_of(spec), init_state_fn=init_placeholder_state,
                config_to_kwargs=_kwargs_from_attached))


def build_layer_wise(config: Any, model_chunks: list[Any], pg_collection: Any, *, ours: BaseOptimizerConfig,
                         config_overrides: Any = None) -> Any:
    """Megatron-Core >= 0.18: Megatron's own builder with ``optimizer=<our registry entry's registered_name>``
    (registered here), ``ours`` attached to the copy of Megatron's config it is given (`OURS_ATTRIBUTE`).
    ``config_overrides``: Megatron's per-parameter overrides (Bridge's weight-decay rules), passed to Megatron's
    builder. ``ours.ns_split_target``'s block shares are attached by the caller (`nemo_muon.megatron.shared.build.
    build_engine`, `nemo_muon.megatron.core_018_plus.split_shares`)."""
    from megatron.core.optimizer import get_megatron_optimizer

    check_split_target(ours)
    register_with_megatron()
    config = copy.copy(config)
    config.optimizer = spec_for(ours).megatron.registered_name
    setattr(config, OURS_ATTRIBUTE, ours)
    optimizer = get_megatron_optimizer(config, model_chunks, config_overrides=config_overrides,
                                       pg_collection=pg_collection, use_gloo_process_groups=False)
    if not finish_wrapping(optimizer):
        raise RuntimeError(f"Megatron-Core built none of our optimizers for optimizer={config.optimizer!r}")
    return apply_nonfinite_policy(optimizer, nonfinite_policy(ours))


def build_engine(opt: BaseOptimizerConfig, config: Any, model_chunks: list[Any], pg_collection: Any, *,
                 config_overrides: Any = None, collectives: str | None = None) -> Any:
    """This generation's engine 'nemo_muon' (`nemo_muon.megatron.generations`): `build_layer_wise`; with
    ``ns_split_target`` DDP must be on the cost layout planned with it, whose split matrices get their block shares
    here. ``collectives`` is DDP's layout's to decide here: only None is accepted."""
    if collectives is not None:
        raise ValueError(f"collectives is decided by DDP's parameter layout on Megatron-Core >= 0.18 (the cost layout "
                         f"reduce-scatters): leave it None there; got collectives={collectives!r}")
    optimizer = build_layer_wise(config, model_chunks, pg_collection, ours=opt, config_overrides=config_overrides)
    target = getattr(opt, "ns_split_target", None)
    if target is not None:  # the matrices DDP's cost layout split over blocks of dp_cp ranks
        attach_split_shares(optimizer, model_chunks, pg_collection, target)
    return optimizer
