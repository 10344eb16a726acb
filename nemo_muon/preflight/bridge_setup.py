"""Ours through Megatron-Bridge's own setup, as the job builds it (Bridge 0.3-0.6: NGC 26.02-26.08).

The real job on these stacks is Bridge's ``pretrain`` on the recipe's `ConfigContainer`
(`nemo_muon.megatron.bridge.container.pretrain`): the model provider's ``provide_distributed_model`` (Bridge's
pre-wrap hooks, Megatron-Core's DDP wrap; on Bridge 0.5 / 0.6 with ``collectives='reduce_scatter'`` our cost layout
installed on the provider as the job installs it) and Bridge's ``setup_optimizer`` on ``container.optimizer`` (on
>= 0.4 our `EngineOptimizerConfig`, whose ``provide`` builds the engine; on 0.3 Bridge's own config, with the hook
the job installs, `nemo_muon.megatron.bridge_03.hook`). Preflight runs that on the tiny model: the job's
optimizer config (`bridge_optimizer_config`, what the container holds) and the DDP fields the job sets on the
container (`bridge_field_overrides`' ``ddp``: the distributed optimizer, the overlapped param gather of a layout, the
NaN check), on the harness's DDP settings for the rest (`wiring.ddp_config_kwargs`: bf16 reductions, no overlapped
gradient reduction, as the reference path), a provider that hands Bridge the tiny `GPTModel`, and a constant learning
rate (the recipe's peak, so that the steps compare with the reference path's; the warm-up and decay are the
scheduler's, not the optimizer path's). Not the container's base (the model's full-size DDP buckets and the like):
building it reads the model's Hugging Face config.

`bridge_setup_applies` says where: Megatron-Bridge installed (a generation nemo-muon enters). Without Bridge
(Megatron-Core alone) ours is built by `nemo_muon.megatron.shared.build`.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

VALIDATE_SYNC = "_validate_and_sync_distributed_optimizer_settings"
"""Bridge's private function ``ConfigContainer.validate()`` runs on the optimizer and DDP fields (0.3-0.6)."""

SETUPS = ("bridge", "megatron-core")
"""How ours is built: Bridge's own model and optimizer setup, or nemo-muon's builder on Megatron-Core."""


def bridge_setup_applies() -> bool:
    """Megatron-Bridge is installed and the job enters our engine through its setup: ``provide`` (Bridge >= 0.4) or
    the hook the job installs (Bridge 0.3)."""
    from nemo_muon.megatron.generations import installed_bridge_generation

    try:
        importlib.metadata.version("megatron-bridge")
    except importlib.metadata.PackageNotFoundError:
        return False
    generation = installed_bridge_generation()
    return generation.engine_optimizer_config is not None or generation.install_engine is not None


def _tiny_provider(model: Any) -> Any:
    """A Bridge model provider whose model is ``model`` (built already, on its device)."""
    from megatron.bridge.models.model_provider import ModelProviderMixin

    class TinyProvider(ModelProviderMixin):
        def provide(self, pre_process: Any = None, post_process: Any = None, vp_stage: Any = None) -> Any:
            return model

        def finalize(self) -> None:
            """Nothing to finalize: the model is built."""

    return TinyProvider()


def _constant_scheduler(weight_decay: float, steps: int) -> Any:
    """Bridge's scheduler config at a constant learning rate and weight decay over ``steps`` steps."""
    from megatron.bridge.training.config import SchedulerConfig

    scheduler = SchedulerConfig(lr_decay_style="constant", start_weight_decay=weight_decay,
                                end_weight_decay=weight_decay, weight_decay_incr_style="constant")
    scheduler.lr_warmup_steps, scheduler.lr_decay_steps, scheduler.wd_incr_steps = 0, steps, steps
    return scheduler


def build_through_bridge(recipe: Any, model: Any, pg_collection: Any, steps: int) -> tuple[Any, Any]:
    """(DDP-wrapped ``model``, the optimizer) as Bridge's setup builds them for ``recipe``: the module doc. On the
    cost layout the DDP model carries the plan its layout encodes as ``cost_layout_plan``."""
    import types

    from megatron.bridge.training import config as bridge_config
    from megatron.bridge.training.config import DistributedDataParallelConfig
    from megatron.bridge.training.optim import setup_optimizer

    from nemo_muon.megatron.bridge.container import (
        bridge_field_overrides,
        bridge_optimizer_config,
        bridge_optimizer_spec,
        routes_cost_layout,
    )
    from nemo_muon.megatron.generations import entry, installed_bridge_generation
    from nemo_muon.megatron.shared.optimizer_config import ENGINE_NEMO_MUON
    from nemo_muon.megatron.shared.stack import optimizer_engine
    from nemo_muon.preflight.wiring import ddp_config_kwargs

    sync = getattr(bridge_config, VALIDATE_SYNC, None)  # Bridge-private: present on 0.3-0.6 (tests run all four)
    if sync is None:
        raise RuntimeError(f"megatron-bridge {importlib.metadata.version('megatron-bridge')} has no "
                           f"megatron.bridge.training.config.{VALIDATE_SYNC} (what ConfigContainer.validate() runs "
                           "on the optimizer and DDP fields on Bridge 0.3-0.6): preflight's Bridge setup supports "
                           "Bridge 0.3-0.6")
    opt = recipe.optimizer
    cost_layout = routes_cost_layout(opt)
    job_ddp = bridge_field_overrides(recipe, cost_layout=cost_layout)["ddp"]  # the job's ConfigContainer.ddp fields
    ddp_config = DistributedDataParallelConfig(**{**ddp_config_kwargs(opt), **job_ddp})
    optim_config = bridge_optimizer_config(opt, bridge_optimizer_spec(recipe))  # the job's ConfigContainer.optimizer
    sync(types.SimpleNamespace(ddp=ddp_config, optimizer=optim_config))  # what ConfigContainer.validate() runs
    optim_config.finalize()
    generation = installed_bridge_generation()
    if optimizer_engine(opt) == ENGINE_NEMO_MUON and generation.install_engine is not None:
        entry(generation.install_engine)(opt)  # Bridge 0.3: as the job installs it; its setup_optimizer builds ours
    provider = _tiny_provider(model)
    planner = None
    if cost_layout:  # Bridge 0.5 / 0.6: as the job installs it on its provider
        planner = entry(generation.cost_layout)(provider, opt)
    (ddp_model,) = provider.provide_distributed_model(ddp_config=ddp_config, pg_collection=pg_collection,
                                                      use_cpu_initialization=model.config.use_cpu_initialization,
                                                      data_parallel_random_init=False)
    if planner is not None:
        ddp_model.cost_layout_plan = planner.plans[-1]  # the plan the layout encodes (the owners check reads it)
    optimizer, _ = setup_optimizer(optim_config, _constant_scheduler(opt.weight_decay, steps), [ddp_model],
                                   use_gloo_process_groups=False)
    return ddp_model, optimizer
