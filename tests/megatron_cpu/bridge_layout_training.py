"""Megatron-Bridge's own model setup (a model provider's ``provide_distributed_model``: pre-wrap hooks, Megatron-Core's
``dist_utils._ddp_wrap``) and optimizer setup (``setup_optimizer``) on the tiny model, with the product's cost-layout
wiring (`nemo_muon.megatron.bridge_05_06.layout`) or without it (Megatron's legacy layer-wise path), trained a few steps:
bytes each rank sends per step, DP replicas, the owners Megatron derived from the layout against the plan."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any

from tests.megatron_cpu.layout_training import _layer_wise, counting_collectives
from tests.megatron_cpu.training import (
    GLOBAL_MICRO_BATCHES,
    SEED,
    SEQ,
    _forward_backward,
    _masters,
    _model,
    _optimizer_classes,
    megatron_parallel,
    optimizer_config,
)


@dataclass
class BridgeSetup:
    """What Bridge's own model and optimizer setup built for the tiny model (inside `megatron_parallel`)."""

    ddp_model: Any
    optimizer: Any
    scheduler: Any
    """Bridge's `OptimizerParamScheduler` (``setup_optimizer``'s)."""
    spec: Any
    model_config: Any
    optim_config: Any
    scheduler_config: Any
    ddp_config: Any
    planner: Any
    """The cost-layout planner (`bridge_layout.install`), None on Megatron's legacy layer-wise path."""


def bridge_setup(spec_name: str, steps: int, cost_layout: bool, optimizer_name: str = "muon",
                 split_target: float | None = None, grad_clip: float = 1.0) -> BridgeSetup:
    """Inside `megatron_parallel`: the tiny model through a Bridge model provider's ``provide_distributed_model``
    (with the product's cost-layout wiring when ``cost_layout``) and Bridge's ``setup_optimizer`` on the product's
    optimizer config (with Muon's ``ns_split_target`` = ``split_target``, clipping at ``grad_clip``, 0 = off), with a
    constant-lr scheduler over ``steps`` steps."""
    import torch
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from nemo_muon.megatron.bridge.container import bridge_optimizer_config
    from nemo_muon.megatron.bridge_05_06 import layout as bridge_layout
    from nemo_muon.megatron.shared.build import mpu_process_groups
    from nemo_muon.megatron.shared.optimizer_config import ddp_flags, to_megatron_optimizer_config
    from nemo_muon.preflight.wiring import ddp_config_kwargs
    from tests.megatron_cpu.te_stub import bridge_imports_without_te

    bridge_imports_without_te()
    from megatron.bridge.models.model_provider import ModelProviderMixin
    from megatron.bridge.training.config import DistributedDataParallelConfig, SchedulerConfig
    from megatron.bridge.training.config import _validate_and_sync_distributed_optimizer_settings as sync
    from megatron.bridge.training.optim import setup_optimizer

    model_parallel_cuda_manual_seed(SEED, inference_rng_tracker=True)
    torch.manual_seed(SEED)
    model, config, spec = _model(spec_name)
    opt = optimizer_config(optimizer_name)
    if cost_layout:  # the recipe's opt-in to the cost layout (Bridge 0.5 / 0.6 route it: routes_cost_layout)
        opt = dataclasses.replace(opt, collectives="reduce_scatter")
    if split_target is not None:
        opt = dataclasses.replace(opt, ns_split_target=split_target)

    class TinyProvider(ModelProviderMixin):
        def provide(self, pre_process=None, post_process=None, vp_stage=None):  # noqa: ANN001, ANN202
            return model

        def finalize(self) -> None: ...

    provider = TinyProvider()
    flags = ddp_flags(opt, cost_layout=cost_layout)
    ddp_config = DistributedDataParallelConfig(**{**ddp_config_kwargs(opt), **flags,
                                                  "overlap_param_gather": flags["use_distributed_optimizer"]})
    planner = bridge_layout.install(provider, opt) if cost_layout else None
    _, mapping = to_megatron_optimizer_config(opt, min_lr=0.0, grad_clip=grad_clip)
    optim_config = bridge_optimizer_config(opt, mapping)
    sync(types.SimpleNamespace(ddp=ddp_config, optimizer=optim_config))  # what ConfigContainer.validate() runs
    optim_config.finalize()
    pgs = mpu_process_groups()
    (ddp_model,) = provider.provide_distributed_model(ddp_config=ddp_config, pg_collection=pgs,
                                                      use_cpu_initialization=True, data_parallel_random_init=True)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp_model.no_sync
    scheduler_config = SchedulerConfig(lr_decay_style="constant", start_weight_decay=0.0, end_weight_decay=0.0,
                                       weight_decay_incr_style="constant")
    scheduler_config.lr_warmup_steps, scheduler_config.lr_decay_steps = 0, steps
    scheduler_config.wd_incr_steps = steps
    optimizer, scheduler = setup_optimizer(optim_config, scheduler_config, [ddp_model], use_gloo_process_groups=False)
    return BridgeSetup(ddp_model, optimizer, scheduler, spec, config, optim_config, scheduler_config, ddp_config,
                       planner)


def train_through_bridge_model_setup(rank: int, world_size: int, group: Any, spec_name: str, steps: int,
                                     cost_layout: bool, optimizer_name: str = "muon",
                                     split_target: float | None = None, grad_clip: float = 1.0) -> dict[str, Any]:
    """``steps`` steps through `bridge_setup`; returns the losses, the bytes this rank sent in the last step, the fp32
    masters this rank's optimizers hold (by parameter name), the replicas' largest difference and, on the cost
    layout, whether Megatron's derived owners are the plan's."""
    import torch
    import torch.distributed as dist

    from nemo_muon.megatron.bridge_05_06 import layout as bridge_layout
    from nemo_muon.megatron.shared.engine import ours_in
    from nemo_muon.optim.muon import Muon

    with megatron_parallel() as parallel_state:
        setup = bridge_setup(spec_name, steps, cost_layout, optimizer_name, split_target, grad_clip)
        ddp_model, optimizer, spec, planner = setup.ddp_model, setup.optimizer, setup.spec, setup.planner
        ddp_config = setup.ddp_config
        dp_rank = parallel_state.get_data_parallel_rank()
        micro = max(GLOBAL_MICRO_BATCHES // parallel_state.get_data_parallel_world_size(), 1)
        losses, sent = [], []
        for step in range(steps):
            with counting_collectives() as stats:  # the gather of step k-1's update runs in step k's forward
                loss = _forward_backward(ddp_model, optimizer, step, dp_rank, spec.vocab_size, micro)
                ok, _, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"step {step} was skipped")
            sent.append(sum(v[1] for v in stats.values()))
            loss = loss.reshape(1).float()
            dist.all_reduce(loss, group=group)
            losses.append(float(loss) / world_size)
        if ddp_config.overlap_param_gather:
            ddp_model.start_param_sync(force_sync=True)  # the last update's gather (the next forward's)
        flat = torch.cat([p.detach().float().reshape(-1) for p in ddp_model.module.parameters()])
        replicas = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(replicas, flat, group=group)
        owners_match = None
        if planner is not None:
            layer_wise = _layer_wise(optimizer)
            derived = {id(p): r for r, params in enumerate(layer_wise.dp_cp_params_list) for p in params}
            owners_match = bool(planner.plans) and all(derived.get(id(p)) == r
                                                       for plan in planner.plans for p, r in plan.owners.items())
        names = {id(p): n for n, p in ddp_model.module.named_parameters()}
        return {"losses": losses, "sent_last_step": sent[-1], "optimizers": _optimizer_classes(optimizer),
                "masters": _masters(optimizer, names),
                "use_distributed_optimizer": bool(ddp_model.ddp_config.use_distributed_optimizer),
                "overlap_param_gather": bool(ddp_model.ddp_config.overlap_param_gather),
                "full_param_layout": getattr(ddp_model, "full_param_layout", None) is not None,
                "owners_match": owners_match, "planned": None if planner is None else len(planner.plans),
                "hook_installed": bridge_layout.installed(), "seq": SEQ,
                "planned_splits": None if planner is None else sum(len(plan.splits) for plan in planner.plans),
                "split_shares": sum(len(raw._splits) for _, raw in ours_in(optimizer, Muon)),
                "replica_max_diff": max(float((replicas[0] - r).abs().max()) for r in replicas)}


def ddp_wrap_tiny(rank: int, world_size: int, group: Any, without: tuple[str, ...] = ()) -> dict[str, Any]:
    """Megatron-Core's ``dist_utils._ddp_wrap`` (what Bridge's model setup calls) around the tiny model with the
    shims but ``without``; returns each shim's call sites."""
    from megatron.core.distributed import DistributedDataParallelConfig

    from nemo_muon.megatron.shared.build import mpu_process_groups
    from tests.megatron_cpu import shims

    with megatron_parallel(without):
        from megatron.training.models.dist_utils import _ddp_wrap

        model, _, _ = _model("tiny_qwen3_moe")
        ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
        (wrapped,) = _ddp_wrap([model], False, ddp_config, False, pg_collection=mpu_process_groups())
        return {"wrapped": type(wrapped).__name__,
                "shim_hits": {n: sorted(f) for n, f in shims.hits_by_file().items()}}
