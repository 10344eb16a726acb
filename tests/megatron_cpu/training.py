"""Tiny Kimi-K2-family and Qwen3-MoE models trained through Megatron-Core's real stack on CPU gloo ranks.

What runs is Megatron's: `GPTModel` (local spec: no Transformer Engine) built from the architecture fields of the
full recipes (`nemo_muon.models.megatron_fields`, checked against Bridge's providers; the model, its DDP wiring, batches
and state readers are preflight's own: `nemo_muon.preflight`), `Float16Module`,
`DistributedDataParallel`, the optimizer our mapping builds (`nemo_muon.megatron.shared.build`: distributed Adam, or the
layer-wise Muon), `forward_backward_no_pipelining` with `finalize_model_grads`, and `dist_checkpointing` save / load.
What is ours: the four shims (`shims.py`), MLA's core attention (`nemo_muon.preflight.mla_attention`: the local spec
has none that takes separate key/value head sizes), the local-spec kernel choices (`nemo_muon.preflight.tiny_model`:
no fused kernels without TE/Apex, the allgather dispatcher, no grouped GEMM), and a deterministic synthetic batch per (step, DP rank).
Every scenario (`train_tiny`, the lockstep and single-process comparisons, TP, EP, the non-finite and resume
scenarios, `text_training.train_on_text`) runs inside the one harness context, `megatron_parallel` (shims, Megatron's
parallel state, its teardown), and gets its model and optimizer from `replica`; each runs on every rank under
`nemo_muon.train.spawn.spawn_ranks`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from nemo_muon.megatron.shared.build import mpu_process_groups
from nemo_muon.preflight.batches import MICRO_BATCH, SEED
from nemo_muon.preflight.batches import forward_backward as _forward_backward
from nemo_muon.preflight.state import bits as _bits
from nemo_muon.preflight.state import checkpoint_state as _checkpoint_state
from nemo_muon.preflight.state import integrity_check, resume_from, settle
from nemo_muon.preflight.state import masters as _masters
from nemo_muon.preflight.state import matrix_masters as _matrix_masters
from nemo_muon.preflight.state import state_tensors as _state_tensors
from nemo_muon.preflight.tiny_model import SEQ
from nemo_muon.preflight.tiny_model import build_tiny_model as _model
from nemo_muon.preflight.wiring import has_layouts as _has_layouts
from nemo_muon.preflight.wiring import wrap_in_ddp

LR = 1e-2
"""The harness's learning rate (`optimizer_config`)."""
_pg_collection = mpu_process_groups


def _ddp(model, config, opt, layer_wise: bool, grad_reduce_in_fp32: bool = False, layout: str = "megatron"):
    """`wrap_in_ddp` over Megatron's initialized process groups."""
    return wrap_in_ddp(model, config, opt, layer_wise, _pg_collection(), grad_reduce_in_fp32, layout)


def _seeded_model(spec_name: str, optimizer_name: str, engine: str = "nemo_muon", grad_reduce_in_fp32: bool = False,
                  nonfinite: str = "raise", tp: int = 1, dense: bool = False, ep: int = 1,
                  split_target: float | None = None, opt: Any = None, seq: int = SEQ, layout: str = "megatron",
                  pp: int = 1, collectives: str | None = None):
    """(model, its config, model spec, optimizer config, DDP-wrapped model with params broadcast) from the fixed
    seed: every replica and every run starts from the same weights. ``grad_reduce_in_fp32``: DDP's fp32 gradient
    buffer (the product's default is bf16 reductions). ``split_target``: Muon's ``ns_split_target``. ``opt``: an
    optimizer config to use instead of the harness's (`optimizer_config`); ``seq``: the longest sequence;
    ``layout``: one of `LAYOUTS`; ``collectives``: the optimizer's ``collectives`` on Megatron-Core 0.16 / 0.17 (None:
    the config's). On >= 0.18 DDP's wiring decides and the config says what was built: 'reduce_scatter' on a
    layer-wise layout (Megatron's or ours), 'all_reduce' on the legacy path."""
    import torch
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(SEED, inference_rng_tracker=True)
    torch.manual_seed(SEED)
    model, config, spec = _model(spec_name, tp, dense, ep, seq, pp)
    opt = optimizer_config(optimizer_name, engine, nonfinite) if opt is None else opt
    if split_target is not None:
        opt = dataclasses.replace(opt, ns_split_target=split_target)
    if collectives is not None:
        opt = dataclasses.replace(opt, collectives=collectives)
    ddp_model = _ddp(model, config, opt, optimizer_name != "adamw", grad_reduce_in_fp32, layout)
    if hasattr(opt, "collectives") and getattr(opt, "engine", None) == "nemo_muon" and _has_layouts():
        wired = "reduce_scatter" if ddp_model.ddp_config.use_distributed_optimizer else "all_reduce"
        opt = dataclasses.replace(opt, collectives=wired)
    ddp_model.broadcast_params()
    return model, config, spec, opt, ddp_model


@contextlib.contextmanager
def megatron_parallel(without_shims: tuple[str, ...] = (), **sizes: int) -> Iterator[Any]:
    """The one context of every scenario: the CPU shims (`shims.install`, all but ``without_shims``), Megatron's
    model-parallel state for ``sizes`` (``initialize_model_parallel``'s keywords: TP, EP, ...), torn down afterwards
    whatever the scenario raised. Yields Megatron's ``parallel_state``."""
    from tests.megatron_cpu import shims

    shims.install(without=without_shims)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(**sizes)
    try:
        yield parallel_state
    finally:
        parallel_state.destroy_model_parallel()


@dataclasses.dataclass
class Replica:
    """One scenario's model and optimizer: the seeded model, its config and spec, our optimizer config, the DDP-wrapped
    model wired into Megatron's schedule, and the Megatron optimizer our mapping built (None when the scenario builds
    its own, e.g. through Bridge or NeMo)."""

    model: Any
    config: Any
    spec: Any
    opt: Any
    ddp_model: Any
    pgs: Any = None
    optimizer: Any = None
    optimizer_config: Any = None

    @property
    def names(self) -> dict[int, str]:
        """id(param) -> the model's parameter name."""
        return {id(p): n for n, p in self.ddp_model.module.named_parameters()}


def replica(spec_name: str, optimizer_name: str = "muon", *, build: bool = True, build_kwargs: dict | None = None,
            **model_kwargs: Any) -> Replica:
    """A `Replica` inside `megatron_parallel`: `_seeded_model` (``model_kwargs``), `finalize_model_grads` and DDP's
    ``no_sync`` set on the model config as Megatron's schedule wants them, and with ``build`` the optimizer
    `build_megatron_optimizer` makes (``build_kwargs``; the layer-wise one gets the process groups explicitly)."""
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    from nemo_muon.megatron.shared.build import build_megatron_optimizer
    from nemo_muon.registry import spec_for

    model, config, spec, opt, ddp_model = _seeded_model(spec_name, optimizer_name, **model_kwargs)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp_model.no_sync
    run = Replica(model, config, spec, opt, ddp_model, pgs=_pg_collection())
    if build:
        layer_wise = spec_for(opt).matrix is not None
        run.optimizer, run.optimizer_config = build_megatron_optimizer(
            opt, [ddp_model], pg_collection=run.pgs if layer_wise else None, **(build_kwargs or {}))
    return run


GLOBAL_MICRO_BATCHES = 2
"""Micro-batches per optimizer step across all data-parallel ranks: each DP rank runs ``GLOBAL_MICRO_BATCHES // DP``
of them (batch ids ``dp_rank * that + i``), so DP=1 and DP=2 train on the same global batch."""


def optimizer_config(name: str, engine: str = "nemo_muon", nonfinite: str = "raise"):
    """The harness's config of the registered optimizer ``name`` ('adamw', 'muon', 'soap', 'normuon', ...): lr `LR`,
    no weight decay, its registry entry's megatron ``recipe_defaults``, and the engine and policy of a matrix one."""
    from nemo_muon.registry import spec_named

    spec = spec_named(name)
    if spec.matrix is None:
        return spec.config_class(lr=LR, weight_decay=0.0)
    return spec.config_class(lr=LR, weight_decay=0.0, **{**spec.megatron.recipe_defaults, "engine": engine,
                                                          "nonfinite": nonfinite})


def _optimizer_classes(optimizer) -> list[str]:
    """Class names of a Megatron optimizer, its chained optimizers (recursively) and the torch optimizers inside."""
    names = [type(optimizer).__name__]
    if hasattr(optimizer, "chained_optimizers"):
        for sub in optimizer.chained_optimizers:
            names += _optimizer_classes(sub)
    elif getattr(optimizer, "optimizer", None) is not None:
        names.append(type(optimizer.optimizer).__name__)
    return names


@contextlib.contextmanager
def _counting_collectives():
    """Count the bytes this rank contributes to torch.distributed collectives over groups of more than one rank
    while the block runs (a collective over a one-rank group moves nothing). Includes DDP's param all-gather, which
    Megatron calls through a function captured at import (``param_and_grad_buffer.dist_all_gather_func``)."""
    import torch.distributed as dist
    from megatron.core.distributed import param_and_grad_buffer as buffers

    sent = {"bytes": 0}
    # name -> (position of the tensor this rank contributes, position of the group argument)
    where = {"all_gather": (1, 2), "all_gather_into_tensor": (1, 2), "_all_gather_base": (1, 2),
             "reduce_scatter_tensor": (1, 3), "all_reduce": (0, 2), "broadcast": (0, 2)}

    def counting(name, original):
        tensor_at, group_at = where[name]

        def wrapper(*args, **kwargs):
            group = args[group_at] if len(args) > group_at else kwargs.get("group")
            tensor = args[tensor_at] if len(args) > tensor_at else next(
                v for k, v in kwargs.items() if k in ("tensor", "input_tensor", "input"))
            if dist.get_world_size(group) > 1:
                sent["bytes"] += tensor.numel() * tensor.element_size()
            return original(*args, **kwargs)
        return wrapper

    patched = [(dist, n) for n in where if hasattr(dist, n)] + [(buffers, "dist_all_gather_func")]
    originals = [(mod, n, getattr(mod, n)) for mod, n in patched]
    for mod, n, original in originals:
        kind = original.__name__ if n == "dist_all_gather_func" else n
        setattr(mod, n, counting(kind if kind in where else "all_gather_into_tensor", original))
    try:
        yield sent
    finally:
        for mod, n, original in originals:
            setattr(mod, n, original)


def lockstep_engines(rank: int, world_size: int, group: Any, spec_name: str, steps: int) -> dict[str, Any]:
    """Megatron-Core's own layer-wise Muon and ours (engine 'nemo_muon'), configured the same way, on two replicas of
    one tiny model fed the same batches, compared after every step from equal states.

    Per step: both replicas run forward/backward and their optimizer step; the fp32 master weights and momentum
    buffers of every matrix this rank owns are compared (max |difference| relative to max |value|); then our
    replica is reset to Megatron's (bf16 weights, masters, momentum), so each step compares one update, not a
    drifting trajectory. Returns the per-step figures, the loss curves and the classes built.
    """
    import torch

    with megatron_parallel() as parallel_state:
        replicas = {}
        for engine in ("megatron", "nemo_muon"):
            run = replica(spec_name, "muon", engine=engine)
            spec = run.spec
            replicas[engine] = (run.ddp_model, run.optimizer, _matrix_masters(run.optimizer, run.names))
        (theirs_model, theirs_opt, theirs_masters), (ours_model, ours_opt, ours_masters) = replicas.values()
        if set(theirs_masters) != set(ours_masters) or not ours_masters:
            raise AssertionError(f"the two engines own different matrices on rank {rank}: "
                                 f"{sorted(set(theirs_masters) ^ set(ours_masters))}")
        dp_rank = parallel_state.get_data_parallel_rank()
        per_step, losses = [], {"megatron": [], "nemo_muon": []}
        step_s, comm_bytes = {"megatron": [], "nemo_muon": []}, {"megatron": [], "nemo_muon": []}
        for step in range(steps):
            for engine, (ddp_model, optimizer, _) in replicas.items():
                loss = _forward_backward(ddp_model, optimizer, step, dp_rank, spec.vocab_size)
                with _counting_collectives() as sent:
                    start = time.perf_counter()
                    ok, _, _ = optimizer.step()
                    step_s[engine].append(time.perf_counter() - start)
                comm_bytes[engine].append(sent["bytes"])
                if not ok:
                    raise RuntimeError(f"{engine}: optimizer step {step} was skipped")
                losses[engine].append(float(loss))
            master_diff = momentum_diff = scale = 0.0
            with torch.no_grad():
                for name, (ref, ref_opt) in theirs_masters.items():
                    mine, my_opt = ours_masters[name]
                    scale = max(scale, float(ref.abs().max()))
                    master_diff = max(master_diff, float((mine - ref).abs().max()))
                    ref_buf, my_buf = ref_opt.state[ref]["momentum_buffer"], my_opt.state[mine]["momentum_buffer"]
                    momentum_diff = max(momentum_diff, float((my_buf - ref_buf).abs().max()))
                    mine.copy_(ref)
                    my_buf.copy_(ref_buf)
                settle(ours_model)
                settle(theirs_model)
                for mine, ref in zip(ours_model.module.parameters(), theirs_model.module.parameters(), strict=True):
                    mine.copy_(ref)
            per_step.append({"master_max_abs_diff": master_diff, "master_max_abs": scale,
                             "momentum_max_abs_diff": momentum_diff})
        from nemo_muon.accounting.ns_count import matrix_ns_flops

        return {"per_step": per_step, "losses": losses, "matrices_on_rank": len(ours_masters),
                "step_s": step_s, "collective_bytes": comm_bytes,
                "ns_flops_on_rank": sum(matrix_ns_flops(tuple(m.shape)) for m, _ in ours_masters.values()),
                "optimizers": {e: _optimizer_classes(o) for e, (_, o, _) in replicas.items()}}


def matrix_optimizer_against_single_process(rank: int, world_size: int, group: Any, spec_name: str,
                                            optimizer_name: str, steps: int, fields: dict[str, Any] | None = None,
                                            reference_kwargs: dict[str, Any] | None = None,
                                            ep: int = 1) -> dict[str, Any]:
    """Our matrix optimizer ``optimizer_name`` inside Megatron's layer-wise optimizer (engine nemo_muon) beside a
    single-process copy of it (the same class and keyword arguments, `engine_kwargs`, TP = 1) over fp32 copies of the
    matrices this DP rank owns, fed the same DP-reduced gradients each step (Megatron's ``main_grad``, what its
    wrapper hands our optimizer). ``fields``: the optimizer config's, set over the harness's. Returns per step the
    largest |difference| between Megatron's fp32 masters and the reference's parameters, and the largest |value|; and
    the hyperparameters the optimizer Megatron built holds. ``reference_kwargs``: set over the reference's keyword
    arguments (``{"batch_ns": False}``: Muon one matrix at a time against Megatron's default, stacked); ``ep``: expert
    parallelism (expert-DP = world / ep); ``stacked``: the most matrices of one shape this rank owns."""
    import torch

    from nemo_muon.megatron.shared.engine import engine_class_of, engine_kwargs, ours_in
    from nemo_muon.registry import spec_for

    with megatron_parallel(**({"expert_model_parallel_size": ep} if ep > 1 else {})) as parallel_state:
        opt = dataclasses.replace(optimizer_config(optimizer_name), **fields) if fields else None
        run = replica(spec_name, optimizer_name, opt=opt, **({"ep": ep} if ep > 1 else {}))
        spec, opt, ddp_model, optimizer, megatron_config = (run.spec, run.opt, run.ddp_model, run.optimizer,
                                                            run.optimizer_config)
        pgs, config_clip = run.pgs, megatron_config.clip_grad
        params = dict(ddp_model.module.named_parameters())
        masters = _matrix_masters(optimizer, {id(p): n for n, p in params.items()})
        owned = sorted(masters)
        copies = [masters[n][0].detach().clone() for n in owned]
        kwargs = {**engine_kwargs(opt, megatron_config, [ddp_model], pgs), "tp_group": None,
                  "param_names": {id(c): n for n, c in zip(owned, copies, strict=True)}, **(reference_kwargs or {})}
        reference = engine_class_of(spec_for(opt))([{"params": copies}], **kwargs)
        dp_rank = parallel_state.get_data_parallel_rank()
        per_step = []
        for step in range(steps):
            _forward_backward(ddp_model, optimizer, step, dp_rank, spec.vocab_size)
            for name, copy in zip(owned, copies, strict=True):
                copy.grad = params[name].main_grad.detach().float().clone()
            ok, grad_norm, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"optimizer step {step} was skipped")
            clip = config_clip / (grad_norm + 1.0e-6)  # Megatron's clip by the global norm, before its step
            if clip < 1.0:
                for copy in copies:
                    copy.grad.mul_(clip)
            reference.step()
            with torch.no_grad():
                diff = max(float((masters[n][0] - c).abs().max()) for n, c in zip(owned, copies, strict=True))
                scale = max(float(c.abs().max()) for c in copies)
            per_step.append({"max_abs_diff": diff, "max_abs": scale})
        built = next(raw for _, raw in ours_in(optimizer))
        shapes = collections.Counter(tuple(c.shape) for c in copies)
        return {"per_step": per_step, "owned": owned, "optimizers": _optimizer_classes(optimizer),
                "hyperparameters": {k: v for k, v in built.defaults.items() if isinstance(v, (str, int, float))},
                "batch_ns": getattr(built, "batch_ns", None), "stacked": max(shapes.values(), default=0)}


def muon_tensor_parallel_against_single_process(rank: int, world_size: int, group: Any, spec_name: str,
                                                tp_mode: str, steps: int) -> dict[str, Any]:
    """Our Muon (engine nemo_muon) inside Megatron's layer-wise optimizer at TP=2 (DP=1; the dense variant of the
    tiny model) in TP mode ``tp_mode``, beside a single-process (TP=1) `MegatronMuon` over the full matrices: each
    step the reference gets the TP shards of every reduced, clipped gradient gathered along Megatron's partition dim,
    and the rank's fp32 master shards are compared with the reference's matching slices. (Gathered column-parallel
    shards of a gated fc1 are [gate_0; up_0; gate_1; up_1], a row permutation of TP=1's [gate; up]; Muon commutes
    with row permutations, QKV shards hold whole query groups in order.) Returns per step the largest |difference|
    and the largest |value|."""
    import torch
    import torch.distributed as dist

    from nemo_muon.megatron.shared.engine import engine_class, engine_kwargs, fused_layouts
    from nemo_muon.optim.muon import Muon, tensor_partition_dim

    with megatron_parallel(tensor_model_parallel_size=world_size):
        opt = dataclasses.replace(optimizer_config("muon"), tp_mode=tp_mode, nonfinite="raise")
        run = replica(spec_name, opt=opt, tp=world_size, dense=True)
        config, spec, ddp_model, optimizer, pgs = run.config, run.spec, run.ddp_model, run.optimizer, run.pgs
        opt_config = run.optimizer_config
        tp_group, tp_rank = pgs.tp, dist.get_rank(pgs.tp)
        params = dict(ddp_model.module.named_parameters())
        masters = _matrix_masters(optimizer, {id(p): n for n, p in params.items()})
        owned = sorted(masters)
        dims = {n: tensor_partition_dim(params[n]) for n in owned}

        def full(name: str, shard) -> Any:
            if dims[name] is None:
                return shard.detach().float().clone()
            parts = [torch.zeros_like(shard, dtype=torch.float32) for _ in range(world_size)]
            dist.all_gather(parts, shard.detach().float().contiguous(), group=tp_group)
            return torch.cat(parts, dim=dims[name])

        def my_slice(name: str, whole) -> Any:
            dim = dims[name]
            return whole if dim is None else whole.chunk(world_size, dim=dim)[tp_rank]

        copies = [full(n, masters[n][0]) for n in owned]
        kwargs = engine_kwargs(opt, opt_config, [ddp_model], pgs)
        kwargs.update(tp_group=None, fused_layouts=fused_layouts(config, 1),
                      param_names={id(c): n for n, c in zip(owned, copies, strict=True)})
        reference = engine_class(Muon)([{"params": copies}], **kwargs)
        per_step = []
        for step in range(steps):
            _forward_backward(ddp_model, optimizer, step, 0, spec.vocab_size, GLOBAL_MICRO_BATCHES)
            for name, copy in zip(owned, copies, strict=True):
                copy.grad = full(name, params[name].main_grad)
            ok, grad_norm, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"optimizer step {step} was skipped")
            clip = opt_config.clip_grad / (grad_norm + 1.0e-6)
            if clip < 1.0:
                for copy in copies:
                    copy.grad.mul_(clip)
            reference.step()
            with torch.no_grad():
                diff = max(float((masters[n][0] - my_slice(n, c)).abs().max()) for n, c in zip(owned, copies,
                                                                                               strict=True))
                scale = max(float(c.abs().max()) for c in copies)
            per_step.append({"max_abs_diff": diff, "max_abs": scale})
        return {"per_step": per_step, "owned": owned, "sharded": sorted(n for n in owned if dims[n] is not None),
                "tp_mode": masters[owned[0]][1].tp_mode if hasattr(masters[owned[0]][1], "tp_mode") else None}


def expert_parallel_training(rank: int, world_size: int, group: Any, spec_name: str, ep: int,
                             steps: int) -> dict[str, Any]:
    """``steps`` steps of engine nemo_muon on tiny ``spec_name`` with expert parallelism ``ep`` (expert-DP =
    world / ep). Returns this rank's EP and expert-DP ranks, the matrices it owns, and whether after training the
    expert weights agree within each expert-DP group (and differ across EP ranks, which hold other experts) and the
    dense weights agree across all ranks."""
    import torch
    import torch.distributed as dist

    with megatron_parallel(expert_model_parallel_size=ep) as parallel_state:
        run = replica(spec_name, "muon", ep=ep)
        spec, ddp_model, optimizer, pgs = run.spec, run.ddp_model, run.optimizer, run.pgs
        dp_rank, dp = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
        for step in range(steps):
            _forward_backward(ddp_model, optimizer, step, dp_rank, spec.vocab_size, max(1, GLOBAL_MICRO_BATCHES // dp))
            ok, _, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"optimizer step {step} was skipped")
        settle(ddp_model)
        named = list(ddp_model.module.named_parameters())
        owned = sorted(_matrix_masters(optimizer, {id(p): n for n, p in named}))

        def gathered(tensors):
            flat = torch.cat([t.detach().float().reshape(-1) for t in tensors])
            everyone = [torch.zeros_like(flat) for _ in range(world_size)]
            dist.all_gather(everyone, flat, group=group)
            return everyone

        ep_rank = parallel_state.get_expert_model_parallel_rank()
        expt_dp_rank = dist.get_rank(pgs.expt_dp)
        ranks = [None] * world_size
        dist.all_gather_object(ranks, (ep_rank, expt_dp_rank), group=group)
        experts = gathered([p for n, p in named if ".experts." in n])
        dense = gathered([p for n, p in named if ".experts." not in n])
        same_ep = [r for r in range(world_size) if ranks[r][0] == ep_rank]
        other_ep = [r for r in range(world_size) if ranks[r][0] != ep_rank]
        return {"ep_rank": ep_rank, "expt_dp_rank": expt_dp_rank, "expt_dp_size": dist.get_world_size(pgs.expt_dp),
                "owned": owned, "experts": sorted(n for n, p in named if ".experts." in n and p.dim() == 2),
                "experts_agree_in_expert_dp_group": all(torch.equal(experts[rank], experts[r]) for r in same_ep),
                "experts_differ_across_ep": all(not torch.equal(experts[rank], experts[r]) for r in other_ep),
                "dense_agree": all(torch.equal(dense[0], d) for d in dense)}


def ownership_loads(rank: int, world_size: int, group: Any, spec_name: str, optimizer_name: str) -> dict[str, Any]:
    """Megatron-Core 0.16: build engine nemo_muon's layer-wise optimizer twice on the tiny model, with ownership by
    update cost (ours, the default) and by Megatron's numel ping-pong, and return per ownership the update cost of
    the matrices this rank owns, the names it owns, and every matrix's cost (for the plan the test recomputes)."""
    from nemo_muon.megatron.core_016_017.assembly import build_layer_wise
    from nemo_muon.megatron.shared.optimizer_config import to_megatron_optimizer_config
    from tests.megatron_cpu.ownership_probe import matrix_cost

    with megatron_parallel():
        out: dict[str, Any] = {}
        for ownership in ("ns_cost", "megatron"):
            run = replica(spec_name, optimizer_name, build=False)
            opt, ddp_model = run.opt, run.ddp_model
            megatron_config, _ = to_megatron_optimizer_config(opt)
            optimizer = build_layer_wise(megatron_config, [ddp_model], run.pgs, ours=opt, ownership=ownership)
            params = dict(ddp_model.module.named_parameters())
            masters = _matrix_masters(optimizer, {id(p): n for n, p in params.items()})
            inner = next(iter(masters.values()))[1]
            costs = {n: matrix_cost(inner, tuple(p.shape)) for n, p in params.items()
                     if p.dim() == 2 and "embedding" not in n and "output_layer" not in n}
            out[ownership] = {"owned": sorted(masters), "load": sum(costs[n] for n in masters), "costs": costs,
                              "class": type(optimizer).__name__}
        return out


def nonfinite_gradient_on_one_rank(rank: int, world_size: int, group: Any, spec_name: str, optimizer_name: str,
                                   policy: str, where: str = "reduced") -> dict[str, Any]:
    """Three steps of engine 'nemo_muon' with ``optimizer.nonfinite=policy``; at the second, the last DP rank alone
    makes a gradient NaN: ``where='reduced'`` puts it into the reduced gradient of a matrix it owns (a fault after
    the reduction), ``'backward'`` multiplies its loss by NaN (a fault in its backward: DDP's buckets carry it into
    the reduction, where DDP's own NaN check looks first). Reports per step whether the update succeeded (or the
    error raised), whether that step left every weight, master and state tensor exactly as before, and whether the
    DP replicas agree at the end."""
    import torch
    import torch.distributed as dist

    with megatron_parallel() as parallel_state:
        run = replica(spec_name, optimizer_name, nonfinite=policy)
        spec, ddp_model, optimizer = run.spec, run.ddp_model, run.optimizer
        params = dict(ddp_model.module.named_parameters())
        names = {id(p): n for n, p in params.items()}
        owned = sorted(_matrix_masters(optimizer, names))
        dp_rank = parallel_state.get_data_parallel_rank()
        faulty = dp_rank == parallel_state.get_data_parallel_world_size() - 1
        steps: list[dict[str, Any]] = []
        for step in range(3):
            fault = step == 1 and faulty
            _forward_backward(ddp_model, optimizer, step, dp_rank, spec.vocab_size,
                              loss_factor=float("nan") if fault and where == "backward" else 1.0)
            if fault and where == "reduced":
                params[owned[0]].main_grad.view(-1)[0] = float("nan")
            before = _state_tensors(ddp_model, optimizer, names)
            try:
                ok, grad_norm, _ = optimizer.step()
            except FloatingPointError as exc:
                steps.append({"ok": None, "error": str(exc)})
                break
            after = _state_tensors(ddp_model, optimizer, names)
            untouched = before.keys() == after.keys() and all(
                torch.equal(_bits(before[k]), _bits(after[k])) for k in before)
            steps.append({"ok": bool(ok), "grad_norm": None if grad_norm is None else float(grad_norm),
                          "untouched": untouched})
        settle(ddp_model)
        flat = torch.cat([p.detach().float().reshape(-1) for p in ddp_model.module.parameters()])
        replicas = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(replicas, flat, group=group)
        return {"steps": steps, "faulty": faulty, "skipped": getattr(optimizer, "skipped_nonfinite_steps", None),
                "replica_max_diff": max(float((replicas[0] - r).abs().max()) for r in replicas),
                "optimizers": _optimizer_classes(optimizer)}


BUILDS: tuple[str, ...] = ("builder", "nemo2", "nemo2_cosine")
"""How `train_tiny` builds the optimizer: `nemo_muon.megatron.shared.build.build_megatron_optimizer`, or NeMo 2's way through
`nemo_muon.megatron.nemo2.EmergingOptimizerModule.optimizers()` (constant lr, or NeMo's warmup + cosine scheduler
stepped after every optimizer step, as Lightning does)."""
NEMO2_WARMUP_STEPS, NEMO2_MIN_LR = 2, 1e-3


class _ModelChunk:
    """What NeMo's `MegatronParallel` (a ModuleList of chunks) yields per chunk once its DDP is set up: an object whose
    ``.module`` is the DDP-wrapped model (all `MegatronOptimizerModule.optimizers` reads of it)."""

    def __init__(self, ddp_model) -> None:
        self.module = ddp_model


def _nemo2_optimizer(opt, ddp_model, build: str, steps: int):
    """(Megatron optimizer, NeMo's optimizer wrapper, lr scheduler or None) built by our NeMo 2 optimizer module."""
    from nemo.lightning.pytorch.optim.lr_scheduler import CosineAnnealingScheduler

    from nemo_muon.megatron.nemo2 import EmergingOptimizerModule

    sched = (CosineAnnealingScheduler(max_steps=steps, warmup_steps=NEMO2_WARMUP_STEPS, constant_steps=0,
                                      min_lr=NEMO2_MIN_LR) if build == "nemo2_cosine" else None)
    module = EmergingOptimizerModule(opt, lr_scheduler=sched)
    (wrapper,) = module.optimizers([_ModelChunk(ddp_model)])
    scheduler = None if sched is None else sched.scheduler(None, wrapper)["lr_scheduler"]["scheduler"]
    return wrapper.mcore_optimizer, wrapper, scheduler


def train_tiny(rank: int, world_size: int, group: Any, spec_name: str, optimizer_name: str, steps: int,
               without_shims: tuple[str, ...] = (), checkpoint_dir: str | None = None, save_after: int | None = None,
               resume_at: int | None = None, build: str = "builder", grad_reduce_in_fp32: bool = False,
               with_masters: bool = False, split_target: float | None = None, layout: str = "megatron") -> dict[str, Any]:
    """Train ``steps`` steps of the tiny model ``spec_name`` with ``optimizer_name`` ('adamw', 'muon' or 'soap').

    Each step trains on the same global batch at any DP size (`GLOBAL_MICRO_BATCHES`).
    ``save_after``: save a Megatron `dist_checkpointing` checkpoint to ``checkpoint_dir`` after that many steps;
    ``resume_at``: load it first and continue from that step (the batches follow the step number).
    ``build``: one of `BUILDS`. ``grad_reduce_in_fp32``: see `_seeded_model`. ``with_masters``: also return the
    fp32 master weights this rank's optimizer updates (``"masters"``: name -> numpy array). ``split_target``:
    Muon's ``ns_split_target`` (split ownership; ``"split"`` reports the plan's splits: on 0.16 the optimizer's, on
    >= 0.18 the cost layout's, by parameter name). ``layout``: DDP's wiring on >= 0.18 (`LAYOUTS`).
    """
    import torch
    import torch.distributed as dist

    from tests.megatron_cpu import shims

    with megatron_parallel(without_shims) as parallel_state:
        from megatron.core import dist_checkpointing

        run = replica(spec_name, optimizer_name, build=build == "builder", grad_reduce_in_fp32=grad_reduce_in_fp32,
                      split_target=split_target, layout=layout)
        spec, opt, ddp_model, optimizer = run.spec, run.opt, run.ddp_model, run.optimizer
        scheduler, checkpointed = None, None
        if build != "builder":
            optimizer, checkpointed, scheduler = _nemo2_optimizer(opt, ddp_model, build, steps)
        start = 0
        if resume_at is not None:
            resume_from(ddp_model, optimizer, checkpoint_dir)
            start = resume_at
        dp_rank = parallel_state.get_data_parallel_rank()
        micro_batches = max(1, GLOBAL_MICRO_BATCHES // parallel_state.get_data_parallel_world_size())  # DP=4: one each
        losses: list[float] = []
        lrs: list[float] = []
        grad_norms: list[float] = []
        for step in range(start, start + steps):
            step_loss = _forward_backward(ddp_model, optimizer, step, dp_rank, spec.vocab_size, micro_batches)
            lrs.append(optimizer.param_groups[0]["lr"])
            ok, grad_norm, _ = optimizer.step()
            grad_norms.append(float(grad_norm) if grad_norm is not None else float("nan"))
            if scheduler is not None:
                scheduler.step()
            loss = step_loss.reshape(1)
            dist.all_reduce(loss, group=group)
            losses.append(float(loss) / world_size)
            if not ok:
                raise RuntimeError(f"optimizer step {step} was skipped")
            if save_after is not None and step + 1 == save_after:
                dist_checkpointing.save(_checkpoint_state(ddp_model, checkpointed or optimizer, loading=False),
                                        checkpoint_dir, **integrity_check())
        settle(ddp_model)
        flat = torch.cat([p.detach().float().reshape(-1) for p in ddp_model.module.parameters()])
        replicas = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(replicas, flat, group=group)
        names = {id(p): n for n, p in ddp_model.module.named_parameters()}
        ownership = _ownership_plan(optimizer)
        split_plan = None if ownership is None or not ownership.splits else ownership
        layout_plan = getattr(ddp_model, "cost_layout_plan", None)  # >= 0.18, layout 'cost'
        if layout_plan is not None and layout_plan.splits:
            split = {names[id(p)]: list(sp.ranks) for p, sp in layout_plan.splits.items()}
        else:
            split = None if split_plan is None else {n: list(sp.ranks) for n, sp in split_plan.splits.items()}
        return {
            "losses": losses,
            "lrs": lrs,
            "grad_norms": grad_norms,
            "split": split,
            "ownership_flops": None if ownership is None else list(ownership.flops),
            "replica_max_diff": max(float((replicas[0] - r).abs().max()) for r in replicas),
            "num_params": int(flat.numel()),
            "optimizers": _optimizer_classes(optimizer),
            "shim_hits": {n: sorted(f) for n, f in shims.hits_by_file().items()},
            **({"masters": _masters(optimizer, names)} if with_masters else {}),
        }


def train_through_bridge_setup_optimizer(rank: int, world_size: int, group: Any, spec_name: str,
                                         steps: int, optimizer_name: str = "muon",
                                         engine: str = "nemo_muon", collectives: str | None = None) -> dict[str, Any]:
    """Megatron-Bridge's own ``setup_optimizer`` (what Bridge's ``setup()`` calls) on the optimizer config the product
    gives Bridge (`nemo_muon.megatron.bridge.container.bridge_optimizer_config`; on Bridge 0.3 with the engine hook installed,
    as `pretrain` does), on the tiny model: the optimizer and scheduler Bridge builds, stepped like Bridge's
    train_step does. ``collectives``: the optimizer's (None: the config's default)."""
    import torch
    import torch.distributed as dist

    from nemo_muon.megatron.bridge.container import bridge_optimizer_config
    from nemo_muon.megatron.bridge_03 import hook as bridge_hook
    from nemo_muon.megatron.generations import installed_bridge_generation
    from nemo_muon.megatron.shared.optimizer_config import to_megatron_optimizer_config
    from tests.megatron_cpu.te_stub import bridge_imports_without_te

    with megatron_parallel() as parallel_state:
        bridge_imports_without_te()
        from megatron.bridge.training.config import SchedulerConfig
        from megatron.bridge.training.optim import setup_optimizer

        run = replica(spec_name, optimizer_name, build=False, engine=engine, collectives=collectives)
        spec, opt, ddp_model = run.spec, run.opt, run.ddp_model
        _, mapping = to_megatron_optimizer_config(opt, min_lr=0.0)
        if engine == "nemo_muon" and installed_bridge_generation().engine_entry == "hook":
            bridge_hook.install(opt)
        scheduler_config = SchedulerConfig(lr_decay_style="constant", start_weight_decay=0.0, end_weight_decay=0.0,
                                           weight_decay_incr_style="constant")
        scheduler_config.lr_warmup_steps, scheduler_config.lr_decay_steps = 0, steps
        scheduler_config.wd_incr_steps = steps
        optimizer_config = bridge_optimizer_config(opt, mapping)
        optimizer_config.finalize()  # what ConfigContainer.validate() does before setup()
        optimizer, scheduler = setup_optimizer(optimizer_config, scheduler_config, [ddp_model],
                                               use_gloo_process_groups=False)
        dp_rank = parallel_state.get_data_parallel_rank()
        losses = []
        for step in range(steps):
            step_loss = _forward_backward(ddp_model, optimizer, step, dp_rank, spec.vocab_size)
            ok, _, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"optimizer step {step} was skipped")
            scheduler.step(increment=MICRO_BATCH * world_size)
            loss = step_loss.reshape(1)
            dist.all_reduce(loss, group=group)
            losses.append(float(loss) / world_size)
        gathers = getattr(ddp_model, "param_gathers", None)  # 0.16 / 0.17: parameters gathered in the next forward
        in_flight = 0 if gathers is None else gathers.in_flight()
        settle(ddp_model)
        flat = torch.cat([p.detach().float().reshape(-1) for p in ddp_model.module.parameters()])
        replicas = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(replicas, flat, group=group)
        return {"losses": losses, "gathers_in_flight_after_step": in_flight,
                "grads_to_owners": [hasattr(g, "owner_routes") for g in ddp_model.bucket_groups],
                "optimizers": _optimizer_classes(optimizer), "hook_installed": bridge_hook.installed(),
                "config_class": type(optimizer_config).__name__, "provides": hasattr(optimizer_config, "provide"),
                "replica_max_diff": max(float((replicas[0] - r).abs().max()) for r in replicas)}


def _ownership_plan(optimizer):
    """The dense matrices' plan of our ownership inside Megatron-Core 0.16's layer-wise optimizer (None elsewhere)."""
    for sub in [optimizer, *getattr(optimizer, "chained_optimizers", [])]:
        plan = getattr(sub, "dense_plan", None)
        if plan is not None:
            return plan
    return None


def attempt_resumes(rank: int, world_size: int, group: Any, attempts: list[tuple[str, str, str]]) -> list[dict]:
    """For each (model spec, optimizer name, checkpoint dir): build the model and optimizer from the fixed seed, try
    Megatron's `dist_checkpointing.load` + the model's and optimizer's load_state_dict, and report the error raised
    (type and message) and whether the model weights, fp32 masters and optimizer state are exactly as before."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    outcomes = []
    for spec_name, optimizer_name, checkpoint_dir in attempts:
        with megatron_parallel():

            run = replica(spec_name, optimizer_name)
            ddp_model, optimizer, names = run.ddp_model, run.optimizer, run.names

            # the load's sharded state dict creates the optimizer's placeholder state: compare from there
            state_for_load = _checkpoint_state(ddp_model, optimizer, loading=True)
            before, error = _state_tensors(ddp_model, optimizer, names), None
            try:
                resume_from(ddp_model, optimizer, checkpoint_dir, state_for_load)
            except (Exception, CheckpointException) as exc:  # what Megatron raises is the subject of the test
                error = f"{type(exc).__name__}: {exc}"
            after = _state_tensors(ddp_model, optimizer, names)
            changed = sorted(k for k in before.keys() | after.keys()
                             if k not in before or k not in after or not torch.equal(_bits(before[k]), _bits(after[k])))
            unchanged = not changed
            outcomes.append({"error": error, "unchanged": unchanged, "changed": changed[:5]})
    return outcomes


def resumed_weights_against_owners(rank: int, world_size: int, group: Any, spec_name: str, optimizer_name: str,
                                   checkpoint_dir: str) -> dict[str, Any]:
    """Resume ``checkpoint_dir`` as `train_tiny` does and, before any forward, compare every matrix on every rank
    with its owner's fp32 master cast to the parameter's dtype (what the owner's last step gathered to all ranks;
    Megatron-LM #6920 skipped that gather after a load, leaving stale weights on the other ranks)."""
    import torch
    import torch.distributed as dist

    with megatron_parallel():

        run = replica(spec_name, optimizer_name)
        ddp_model, optimizer, names = run.ddp_model, run.optimizer, run.names
        params = dict(ddp_model.module.named_parameters())
        fresh = {n: p.detach().clone() for n, p in params.items()}
        resume_from(ddp_model, optimizer, checkpoint_dir)
        owned = {n: master.detach().to(params[n].dtype) for n, (master, _) in _matrix_masters(optimizer, names).items()}
        everyone: list[dict] = [{} for _ in range(world_size)]
        dist.all_gather_object(everyone, owned, group=group)
        expected = {n: t for ranks in everyone for n, t in ranks.items()}
        mismatched = sorted(n for n, t in expected.items() if not torch.equal(_bits(params[n]), _bits(t)))
        return {"checked": len(expected), "mismatched": mismatched, "owned_here": len(owned),
                "changed_by_load": sum(not torch.equal(fresh[n], params[n]) for n in expected)}


def layer_wise_file_writes(rank: int, world_size: int, group: Any, save_root: str) -> dict[str, bool]:
    """Call the layer-wise optimizer's torch-format save where Megatron-Bridge 0.3 / 0.4 put it (the save root) and
    where Megatron-LM's torch format puts it (inside ``iter_0000003``); report which files exist afterwards."""
    import os

    with megatron_parallel():
        run = replica("tiny_kimi_k2", "muon")
        layer_wise = run.optimizer
        while not hasattr(layer_wise, "save_state_dict_to_file"):
            layer_wise = next(s for s in layer_wise.chained_optimizers if hasattr(s, "chained_optimizers"))
        at_root = os.path.join(save_root, f"layer_wise_optimizer_{rank}.pt")
        in_folder = os.path.join(save_root, "iter_0000003", f"layer_wise_optimizer_{rank}.pt")
        os.makedirs(os.path.dirname(in_folder), exist_ok=True)
        layer_wise.save_state_dict_to_file(at_root)
        layer_wise.save_state_dict_to_file(in_folder)
        layer_wise.load_state_dict_from_file(in_folder)
        return {"at_root": os.path.exists(at_root), "in_folder": os.path.exists(in_folder),
                "class": type(layer_wise).__name__}
