"""Build the Megatron-Core DDP config and optimizer of a recipe's optimizer on the installed Megatron-Core.

The one place the megatron backend builds the optimizer of our configs, inside Bridge (``provide()``, the Bridge 0.3
hook: `build_engine`) and outside it (the NeMo 2 module, the CPU training tests, the GPU check in ``bench/gpu/``:
`build_megatron_optimizer`): the config goes through the tested mapping (`to_megatron_optimizer_config`), the stack
rules refuse what the installed versions cannot build (evaluated once per process and stack:
`check_installed_stack`), and engine 'nemo_muon' is built by the installed Megatron-Core generation's
``build_engine`` (`nemo_muon.megatron.generations`).
"""

from __future__ import annotations

from typing import Any

from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.megatron.generations import entry, installed_core_generation
from nemo_muon.megatron.shared.optimizer_config import (
    BUILDER_NEMO_MUON,
    MegatronOptimizerSpec,
    to_megatron_optimizer_config,
)
from nemo_muon.megatron.shared.stack import check_installed_stack, optimizer_engine


def mpu_process_groups() -> Any:
    """The `ProcessGroupCollection` of Megatron's initialized ``parallel_state`` with ``dp_cp`` and ``expt_dp`` set.

    For callers whose framework owns Megatron's process groups (NeMo 2's strategy initializes ``parallel_state``):
    the groups are read here, once, and passed explicitly to the optimizer builder.
    """
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("Megatron's parallel_state is not initialized; the layer-wise optimizer needs its "
                           "data-parallel and expert-data-parallel groups (initialize_model_parallel first)")
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    pgs.dp_cp = parallel_state.get_data_parallel_group(with_context_parallel=True)
    pgs.expt_dp = parallel_state.get_expert_data_parallel_group()
    return pgs


def build_engine(opt: BaseOptimizerConfig, config: Any, model_chunks: list[Any], pg_collection: Any, *,
                 config_overrides: Any = None) -> Any:
    """Engine 'nemo_muon' (our Muon / SOAP / ... inside Megatron's layer-wise optimizer) on the installed
    Megatron-Core, by its generation's ``build_engine`` (`nemo_muon.megatron.generations`). ``config``: a Megatron
    `OptimizerConfig` our mapping wrote from ``opt``; ``config_overrides``: Megatron's per-parameter overrides
    (Bridge's weight-decay rules). How gradients and parameters travel is ``opt.collectives``. The entry of Bridge's
    optimizer setup (``provide()``, the Bridge 0.3 hook): the installed stack is checked here."""
    check_installed_stack(opt.name, optimizer_engine(opt))
    return _engine(opt, config, model_chunks, pg_collection, config_overrides=config_overrides)


def _engine(opt: BaseOptimizerConfig, config: Any, model_chunks: list[Any], pg_collection: Any, *,
            config_overrides: Any = None) -> Any:
    """`build_engine` once the stack was checked."""
    if pg_collection is None:
        raise ValueError("pg_collection must be a ProcessGroupCollection (dp_cp, expt_dp set) for the layer-wise "
                         "optimizer; got None")
    return entry(installed_core_generation().build_engine)(opt, config, model_chunks, pg_collection,
                                                           config_overrides=config_overrides)


def build_from_megatron_config(opt: BaseOptimizerConfig, config: Any, spec: MegatronOptimizerSpec,
                               model_chunks: list[Any], *, pg_collection: Any = None) -> Any:
    """The Megatron optimizer of ``config`` (an `OptimizerConfig` from `to_megatron_optimizer_config`, possibly
    adjusted by a framework, e.g. NeMo's precision plugin) for DDP-wrapped ``model_chunks``.

    ``pg_collection`` (a `ProcessGroupCollection` with ``dp_cp`` and ``expt_dp`` set) is required by the layer-wise
    optimizer of Megatron-Core >= 0.18 and passed explicitly; no process group is looked up here. The installed stack
    is checked here, once.
    """
    check_installed_stack(opt.name, optimizer_engine(opt))
    if spec.builder == BUILDER_NEMO_MUON:
        return _engine(opt, config, model_chunks, pg_collection)
    if spec.builder == "get_megatron_muon_optimizer":  # Megatron-Core 0.16 / 0.17's own Muon
        from megatron.core.optimizer.muon import get_megatron_muon_optimizer

        return get_megatron_muon_optimizer(config, model_chunks, layer_wise_distributed_optimizer=spec.layer_wise)
    from megatron.core.optimizer import get_megatron_optimizer

    if spec.layer_wise:
        if pg_collection is None:
            raise ValueError("pg_collection must be a ProcessGroupCollection (dp_cp, expt_dp set) for the layer-wise "
                             "optimizer; got None")
        return get_megatron_optimizer(config, model_chunks, pg_collection=pg_collection, use_gloo_process_groups=False)
    return get_megatron_optimizer(config, model_chunks)


def build_megatron_optimizer(
    opt: BaseOptimizerConfig,
    model_chunks: list[Any],
    *,
    grad_clip: float = 1.0,
    bf16: bool = True,
    layerwise: bool = True,
    pg_collection: Any = None,
    min_lr: float | None = None,
) -> tuple[Any, Any]:
    """(Megatron optimizer, its `OptimizerConfig`) for DDP-wrapped ``model_chunks`` (see `build_from_megatron_config`).
    ``min_lr``: the floor Megatron's `OptimizerParamScheduler` decays to (None: no scheduler drives it)."""
    config, spec = to_megatron_optimizer_config(opt, grad_clip=grad_clip, bf16=bf16, layerwise=layerwise,
                                                min_lr=min_lr)
    return build_from_megatron_config(opt, config, spec, model_chunks, pg_collection=pg_collection), config
