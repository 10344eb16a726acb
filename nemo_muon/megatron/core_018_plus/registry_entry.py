"""Megatron-Core >= 0.18: our matrix optimizers as entries of Megatron's emerging-optimizer registry.

Megatron-Core >= 0.18 keeps a registry of emerging optimizers (``megatron/core/optimizer/emerging_optimizers.py``:
name -> optimizer class, state init, config -> kwargs). `register_with_megatron` adds each of ours under its registry
entry's ``megatron.registered_name`` (``nemo_muon.muon``, ``nemo_muon.soap``, ...: the package, then the optimizer);
``OptimizerConfig(optimizer=<that name>, use_layer_wise_distributed_optimizer=True)`` then goes through Megatron's own
`get_megatron_optimizer` like its Muon does. The recipe's validated config rides on the copy of Megatron's config our
builder hands `get_megatron_optimizer` (attribute `OURS_ATTRIBUTE`), where the entry's ``config_to_kwargs`` reads it.

Megatron-Core has no public function to add an entry: the table is the module's private ``_EMERGING_OPTIMIZERS``
(0.18, 0.19), which `register_with_megatron` writes through `setdefault`, after `registry_problems` checked the hook
point (a Megatron-Core that moves it fails naming the version: tests/megatron_cpu/test_pinned_hook_points.py).
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


ENTRY_FIELDS = ("optimizer_cls", "init_state_fn", "config_to_kwargs")
"""What our entries give Megatron's ``EmergingOptimizerEntry`` (0.18.2, 0.19.2)."""


def registry_problems(module: Any = None) -> list[str]:
    """What Megatron-Core's emerging-optimizer module (``module``; default: the installed one) lacks for our entries:
    the private table ``_EMERGING_OPTIMIZERS`` (a dict) and ``EmergingOptimizerEntry`` with `ENTRY_FIELDS`. Empty:
    the hook point is where 0.18 / 0.19 have it."""
    import dataclasses

    if module is None:
        try:
            from megatron.core.optimizer import emerging_optimizers as module
        except ImportError as exc:
            return [f"megatron.core.optimizer.emerging_optimizers does not import ({exc})"]
    problems = []
    if not isinstance(getattr(module, "_EMERGING_OPTIMIZERS", None), dict):
        problems.append("_EMERGING_OPTIMIZERS (a dict of name -> entry)")
    entry_cls = getattr(module, "EmergingOptimizerEntry", None)
    fields = {f.name for f in dataclasses.fields(entry_cls)} if dataclasses.is_dataclass(entry_cls) else set()
    if not set(ENTRY_FIELDS) <= fields:
        problems.append(f"EmergingOptimizerEntry with fields {ENTRY_FIELDS}")
    return problems


def register_with_megatron(module: Any = None) -> None:
    """Add every registry entry with engine 'nemo_muon' to Megatron-Core's emerging-optimizer table (``module``:
    default the installed ``megatron.core.optimizer.emerging_optimizers``) under its ``megatron.registered_name``;
    idempotent. Raises naming the installed Megatron-Core when the hook point moved (`registry_problems`)."""
    import importlib.metadata

    if module is None:
        from megatron.core.optimizer import emerging_optimizers as module
    problems = registry_problems(module)
    if problems:
        raise RuntimeError(f"engine 'nemo_muon' registers into Megatron-Core's private emerging-optimizer table "
                           f"(written for 0.18 / 0.19); installed megatron-core "
                           f"{importlib.metadata.version('megatron-core')} lacks: {'; '.join(problems)}")
    for spec in specs():
        if "nemo_muon" in spec.megatron.engines and spec.megatron.registered_name:
            module._EMERGING_OPTIMIZERS.setdefault(spec.megatron.registered_name, module.EmergingOptimizerEntry(
                optimizer_cls=engine_class_of(spec), init_state_fn=init_placeholder_state,
                config_to_kwargs=_kwargs_from_attached))


def check_wiring(opt: BaseOptimizerConfig, model_chunks: list[Any]) -> None:
    """On >= 0.18 DDP decides how gradients travel before the optimizer exists: refuse chunks wired otherwise than
    ``opt.collectives`` says ('reduce_scatter': DDP on a layer-wise parameter layout; 'all_reduce': DDP without the
    distributed optimizer), naming the field, so the config never describes another wiring than the one that runs."""
    uses_layout = {bool(getattr(getattr(c, "ddp_config", None), "use_distributed_optimizer", False))
                   for c in model_chunks}
    wanted = opt.collectives == "reduce_scatter"
    if uses_layout and uses_layout != {wanted}:
        wiring = "a layer-wise parameter layout (reduce-scatter)" if not wanted else "no layout (all-reduce)"
        raise ValueError(f"{opt.name}.collectives={opt.collectives!r} but DDP was built on {wiring}: set "
                         f"optimizer.collectives={'reduce_scatter' if not wanted else 'all_reduce'}, or build DDP "
                         "as it says (nemo_muon.megatron.core_018_plus.cost_layout.wrap_with_cost_layout for "
                         "'reduce_scatter')")


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
                 config_overrides: Any = None) -> Any:
    """This generation's engine 'nemo_muon' (`nemo_muon.megatron.generations`): `build_layer_wise` over DDP chunks
    wired as ``opt.collectives`` says (`check_wiring`); with ``ns_split_target`` DDP must be on the cost layout
    planned with it, whose split matrices get their block shares here."""
    check_wiring(opt, model_chunks)
    optimizer = build_layer_wise(config, model_chunks, pg_collection, ours=opt, config_overrides=config_overrides)
    target = getattr(opt, "ns_split_target", None)
    if target is not None:  # the matrices DDP's cost layout split over blocks of dp_cp ranks
        attach_split_shares(optimizer, model_chunks, pg_collection, target)
    return optimizer
