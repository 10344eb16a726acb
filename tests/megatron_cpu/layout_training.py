"""The layer-wise optimizer's three DDP wirings on Megatron-Core >= 0.18 (`nemo_muon.preflight.wiring.LAYOUTS`), measured on the tiny
model: bytes each rank sends per step (a wrapper around torch.distributed's collectives, DDP's captured ones
included), the fp32 masters after a few steps, DP replicas, and the update cost each rank owns against the plan."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from tests.megatron_cpu.training import (
    GLOBAL_MICRO_BATCHES,
    _forward_backward,
    _masters,
    _optimizer_classes,
    megatron_parallel,
    replica,
    settle,
)

_COLLECTIVES = {  # name -> (position of the tensor this rank contributes, position of the group, kind)
    "all_reduce": (0, 2, "all_reduce"), "broadcast": (0, 2, "broadcast"),
    "all_gather": (1, 2, "all_gather"), "all_gather_into_tensor": (1, 2, "all_gather_into_tensor"),
    "_all_gather_base": (1, 2, "all_gather_into_tensor"),
    "reduce_scatter_tensor": (1, 3, "reduce_scatter_tensor"), "_reduce_scatter_base": (1, 3, "reduce_scatter_tensor"),
    "scatter": (0, 2, "scatter"), "gather": (0, 2, "gather"), "reduce": (0, 3, "reduce"),
}


def _wire_bytes(kind: str, args: tuple, nbytes: int, n: int, dst: int | None = None) -> float:
    """Bytes one rank sends in a ring implementation of the collective (bandwidth-optimal algorithms); ``dst``: a
    reduce's destination, when it is this rank."""
    if kind == "reduce":  # a pipelined chain: every member but the destination forwards the payload once
        return 0.0 if dst is not None else float(nbytes)
    if kind == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if kind == "reduce_scatter_tensor":  # the input is the whole bucket
        return (n - 1) / n * nbytes
    if kind == "all_gather_into_tensor":  # the input is this rank's shard
        return (n - 1) * nbytes
    if kind == "all_gather":  # uneven pieces: all but one pass through each rank
        return (n - 1) / n * sum(t.numel() * t.element_size() for t in args[0])
    if kind == "scatter":  # the source sends every other member its piece (the others pass None)
        return (n - 1) * nbytes if args[1] is not None else 0.0
    if kind == "gather":  # each member sends its piece to the destination, which sends nothing
        return 0.0 if len(args) > 1 and args[1] is not None else float(nbytes)
    return float(nbytes)  # broadcast: a pipelined ring forwards the payload once


@contextlib.contextmanager
def counting_collectives() -> Iterator[dict[str, list[float]]]:
    """Per collective kind over groups of more than one rank: [calls, bytes sent by this rank]."""
    import torch.distributed as dist
    from megatron.core.distributed import param_and_grad_buffer as buffers

    stats: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])

    def counted(name: str, original: Any) -> Any:
        tensor_at, group_at, kind = _COLLECTIVES[name]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            group = args[group_at] if len(args) > group_at else kwargs.get("group")
            n = dist.get_world_size(group)
            if n > 1:
                tensor = args[tensor_at] if len(args) > tensor_at else next(
                    v for k, v in kwargs.items() if k in ("tensor", "input_tensor", "input"))
                dst = (args[1] if len(args) > 1 else kwargs.get("dst")) if kind == "reduce" else None
                stats[kind][0] += 1
                stats[kind][1] += _wire_bytes(kind, args, tensor.numel() * tensor.element_size(), n,
                                              dst if dst == dist.get_rank() else None)
            return original(*args, **kwargs)
        return wrapper

    patched = [(dist, name, getattr(dist, name)) for name in _COLLECTIVES if hasattr(dist, name)]
    patched += [(buffers, "dist_all_gather_func", buffers.dist_all_gather_func),  # captured by DDP at import
                (buffers, "dist_reduce_scatter_func", buffers.dist_reduce_scatter_func)]
    names = {"dist_all_gather_func": "all_gather_into_tensor", "dist_reduce_scatter_func": "reduce_scatter_tensor"}
    for module, attr, original in patched:
        setattr(module, attr, counted(names.get(attr, attr), original))
    try:
        yield stats
    finally:
        for module, attr, original in patched:
            setattr(module, attr, original)


def _layer_wise(optimizer: Any) -> Any:
    for sub in [optimizer, *getattr(optimizer, "chained_optimizers", [])]:
        if type(sub).__name__ == "LayerWiseDistributedOptimizer":
            return sub
        inner = _layer_wise(sub) if sub is not optimizer and hasattr(sub, "chained_optimizers") else None
        if inner is not None:
            return inner
    return None


def train_with_layout(rank: int, world_size: int, group: Any, spec_name: str, layout: str, steps: int,
                      optimizer_name: str = "muon", grad_reduce_in_fp32: bool = False,
                      grad_clip: float = 1.0, split_target: float | None = None, ep: int = 1,
                      collectives: str | None = None, pp: int = 1) -> dict[str, Any]:
    """``steps`` steps of the tiny model with our matrix optimizer under DDP wiring ``layout`` (bf16 gradient
    reduction, the product's default, unless ``grad_reduce_in_fp32``); returns the bytes this rank sent in the last step, the
    fp32 masters it owns, the replicas' largest difference, the update cost each rank owns as Megatron derived it
    from the layout, and (layout 'cost') the plan's loads and padding. ``grad_clip`` 0 turns clipping off: the
    wirings sum the clipping norm in different fp32 orders (the legacy layer-wise optimizer over whole owned
    parameters, the chained one over its distributed optimizer's element slices), one ulp apart. ``split_target``:
    Muon's ``ns_split_target`` (layout 'cost': the plan's splits, by parameter name, are returned); ``ep``: expert
    parallelism (expert-DP = world / ep); ``collectives``: Megatron-Core 0.16 / 0.17's wiring of our engine
    (`nemo_muon.megatron.core_016_017.assembly.COLLECTIVES`; None: the default); ``pp``: pipeline stages (the data-parallel
    size is world / pp)."""
    import torch
    import torch.distributed as dist

    from nemo_muon.megatron.core_018_plus.cost_layout import layout_api_problems
    from tests.megatron_cpu.ownership_probe import owned_costs, update_costs

    sizes = {**({"expert_model_parallel_size": ep} if ep > 1 else {}),
             **({"pipeline_model_parallel_size": pp} if pp > 1 else {})}
    with megatron_parallel(**sizes) as parallel_state:
        run = replica(spec_name, optimizer_name, layout=layout, grad_reduce_in_fp32=grad_reduce_in_fp32,
                      split_target=split_target, ep=ep, collectives=collectives, **({"pp": pp} if pp > 1 else {}),
                      build_kwargs={"grad_clip": grad_clip})
        ddp_model, optimizer = run.ddp_model, run.optimizer
        dp_rank = parallel_state.get_data_parallel_rank()
        micro = GLOBAL_MICRO_BATCHES // parallel_state.get_data_parallel_world_size()
        micro = max(micro, 1)
        sent: list[dict[str, list[float]]] = []
        losses = []
        for step in range(steps):
            with counting_collectives() as stats:
                loss = _forward_backward(ddp_model, optimizer, step, dp_rank, run.spec.vocab_size, micro)
                ok, _, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"step {step} was skipped")
            sent.append({k: list(v) for k, v in stats.items()})
            loss = loss.reshape(1).float()
            dist.all_reduce(loss, group=group)
            losses.append(float(loss) / world_size)
        gathers = getattr(ddp_model, "param_gathers", None)  # 0.16 / 0.17 reduce-scatter: gathered in the next forward
        in_flight = 0 if gathers is None else gathers.in_flight()
        settle(ddp_model)
        flat = torch.cat([p.detach().float().reshape(-1) for p in ddp_model.module.parameters()])
        dp_group = parallel_state.get_data_parallel_group()  # the replicas of this stage (the world without PP)
        replicas = [torch.zeros_like(flat) for _ in range(dist.get_world_size(dp_group))]
        dist.all_gather(replicas, flat, group=dp_group)
        costs = None if layout_api_problems() else update_costs([ddp_model.module], run.opt, run.pgs)  # >= 0.18
        plan = getattr(ddp_model, "cost_layout_plan", None)
        layer_wise = _layer_wise(optimizer)
        return {"losses": losses, "gathers_in_flight_after_step": in_flight, "sent_last_step": sum(v[1] for v in sent[-1].values()),
                "sent_by_kind": sent[-1], "masters": _masters(optimizer, run.names),
                "replica_max_diff": max(float((replicas[0] - r).abs().max()) for r in replicas),
                "weights": flat.numpy().copy(), "optimizers": _optimizer_classes(optimizer),
                "use_distributed_optimizer": bool(ddp_model.ddp_config.use_distributed_optimizer),
                "owned_costs": owned_costs(layer_wise, costs) if layer_wise is not None and costs else None,
                "expert_owned_costs": None if getattr(layer_wise, "expt_dp_params_list", None) is None or not costs else
                [sum(costs.get(p, 0.0) for p in params) for params in layer_wise.expt_dp_params_list],
                "plan_loads": None if plan is None else plan.loads["dense"],
                "padding": None if plan is None else plan.padding,
                "splits": None if plan is None else {run.names[id(p)]: list(s.ranks) for p, s in plan.splits.items()}}


def train_virtual_pipeline(rank: int, world_size: int, group: Any, collectives: str, steps: int) -> dict[str, Any]:
    """Megatron-Core 0.16 / 0.17: ``steps`` steps of the tiny Kimi K2 model on PP=2 x DP=2 with two virtual-pipeline
    chunks per rank (one layer each, Megatron's interleaved schedule, one DDP wrapper per chunk, one layer-wise
    optimizer over both) with our engine's ``collectives``; returns the losses, this rank's fp32 masters (keyed
    ``<chunk>.<name>``), the names our Muon knows its matrices by, the gathers left in flight after the last step
    and the bytes sent in it."""
    import torch
    import torch.distributed as dist
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from nemo_muon.megatron.shared.build import build_megatron_optimizer
    from nemo_muon.optim.routed import RoutedOptimizer
    from tests.megatron_cpu.training import (
        SEED,
        _ddp,
        _model,
        _pg_collection,
        optimizer_config,
    )

    chunks_per_rank, micro_batches = 2, 2
    with megatron_parallel(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=chunks_per_rank) as ps:
        model_parallel_cuda_manual_seed(SEED, inference_rng_tracker=True)
        torch.manual_seed(SEED)
        opt = dataclasses.replace(optimizer_config("muon"), collectives=collectives)
        chunks, configs = [], []
        for vp_stage in range(chunks_per_rank):
            model, config, spec = _model("tiny_kimi_k2", pp=2, vp_stage=vp_stage, vp=chunks_per_rank)
            chunk = _ddp(model, config, opt, True)
            chunk.broadcast_params()
            chunks.append(chunk)
            configs.append(config)
        for config in configs:  # the schedule reads the first chunk's; every chunk's says the same
            config.finalize_model_grads_func = finalize_model_grads
            config.no_sync_func = [c.no_sync for c in chunks]
        optimizer, _ = build_megatron_optimizer(opt, chunks, pg_collection=_pg_collection())
        dp_rank = ps.get_data_parallel_rank()
        losses, sent = [], {}
        for step in range(steps):
            with counting_collectives() as stats:
                loss = _forward_backward(chunks, optimizer, step, dp_rank, spec.vocab_size, micro_batches)
                ok, _, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"step {step} was skipped")
            sent = {k: list(v) for k, v in stats.items()}
            loss = loss.reshape(1).float()
            dist.all_reduce(loss, group=group)
            losses.append(float(loss))
        in_flight = sum(c.param_gathers.in_flight() for c in chunks if hasattr(c, "param_gathers"))
        for chunk in chunks:
            settle(chunk)
        names = {id(p): f"{k}.{n}" for k, c in enumerate(chunks) for n, p in c.module.named_parameters()}
        ours = next(sub.optimizer for sub in optimizer.chained_optimizers
                    if isinstance(getattr(sub, "optimizer", None), RoutedOptimizer))
        return {"losses": losses, "masters": _masters(optimizer, names), "gathers_in_flight_after_step": in_flight,
                "muon_names": sorted(ours.name_of(p) or "" for g in ours.param_groups for p in g["params"]),
                "sent_last_step": sum(v[1] for v in sent.values()), "sent_by_kind": sent,
                "ownership": _optimizer_classes(optimizer)}
