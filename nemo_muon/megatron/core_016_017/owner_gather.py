"""Megatron-Core 0.16 / 0.17: the layer-wise optimizer's updated parameters all-gathered in the next forward.

Megatron's ``LayerWiseDistributedOptimizer.step`` all-gathers every owner's updated parameters at the end of the
step (``allgather_params``: one uneven all-gather per domain), before the next forward can start. After
`gather_in_forward` the step instead starts one uneven all-gather per DDP bucket, asynchronously and in the order
the forward uses the buckets, and every module waits in a forward pre-hook for the gathers of the buckets that hold
its parameters: the gathers run under the next forward's compute, as Megatron's distributed optimizer does with
``overlap_param_gather``. The bytes are those of Megatron's gather (each owner's parameters, once).

As with ``overlap_param_gather``, a parameter is current once the forward reaches its module. Whatever reads or
writes the model's state outside a forward finishes the gathers in flight first: the ``state_dict``,
``sharded_state_dict``, ``state_dict_for_save_checkpoint`` and ``load_state_dict`` of the DDP wrapper and of every
module it wraps (a checkpoint unwraps to the innermost), DDP's
``start_param_sync`` (Megatron's forced parameter sync), and the next optimizer step; code that reads the
parameters otherwise calls `ParamGathers.finish` (the wrapper's ``param_gathers``).
"""

from __future__ import annotations

from typing import Any

from nemo_muon.megatron.core_016_017.owner_reduce import owner_domains, owner_index
from nemo_muon.megatron.shared.class_switch import same_identity, switch_class


class BucketGather:
    """The uneven all-gather of one bucket's parameters over ``group``: ``owned[k]`` the parameters group rank ``k``
    updates (in the bucket's order, alike on every rank)."""

    def __init__(self, owned: list[list[Any]], group: Any, rank: int) -> None:
        self.owned, self.group, self.rank = owned, group, rank
        self._work: Any = None
        self._received: list[Any] = []

    def start(self) -> None:
        """Issue the all-gather (asynchronous) of the owners' current values."""
        import torch
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors

        mine = self.owned[self.rank]
        like = next(p for params in self.owned for p in params)
        source = (_flatten_dense_tensors([p.detach() for p in mine]) if mine
                  else torch.empty(0, dtype=like.dtype, device=like.device))
        self._received = [torch.empty(sum(p.numel() for p in params), dtype=like.dtype, device=like.device)
                          for params in self.owned]
        self._work = dist.all_gather(self._received, source, group=self.group, async_op=True)

    def pending(self) -> bool:
        """Whether a gather is issued and not yet waited for."""
        return self._work is not None

    def finish(self) -> None:
        """Wait for the gather in flight (if any) and copy the other owners' values into their parameters."""
        if self._work is None:
            return
        from torch._utils import _unflatten_dense_tensors

        self._work.wait()
        self._work = None
        for k, (flat, params) in enumerate(zip(self._received, self.owned, strict=True)):
            if k == self.rank or not params:
                continue
            for value, p in zip(_unflatten_dense_tensors(flat, params), params, strict=True):
                p.data.copy_(value)
        self._received = []


class ParamGathers:
    """Every bucket's `BucketGather` of one layer-wise optimizer, in forward order, and the forward pre-hooks that
    wait for them."""

    def __init__(self, gathers: list[BucketGather], hooks: list[Any]) -> None:
        self.gathers, self.hooks = gathers, hooks

    def start(self) -> None:
        """Finish what is still in flight, then start every bucket's gather (the optimizer step's end)."""
        self.finish()
        for gather in self.gathers:
            gather.start()

    def finish(self) -> None:
        """Wait for every gather in flight and write the gathered values (the parameters are then current)."""
        for gather in self.gathers:
            gather.finish()

    def in_flight(self) -> int:
        """How many bucket gathers are issued and not yet waited for."""
        return sum(g.pending() for g in self.gathers)

    def remove(self) -> None:
        """Finish and detach the forward pre-hooks (another optimizer is built over the same model)."""
        self.finish()
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def _bucket_gathers(chunk: Any, owner_lists: list[list[Any]], group: Any, attribute: str) -> list[BucketGather]:
    import torch.distributed as dist

    owner = owner_index(owner_lists)
    rank = dist.get_rank(group)
    gathers = []
    for bucket_group in reversed(getattr(chunk, attribute)):  # DDP fills buckets from the model's end
        for bucket in reversed(bucket_group.buckets):
            owned: list[list[Any]] = [[] for _ in owner_lists]
            for p in bucket.params_list:
                if id(p) not in owner:
                    raise RuntimeError(f"a parameter of shape {tuple(p.shape)} in a DDP bucket has no owner in the "
                                       "layer-wise optimizer")
                owned[owner[id(p)]].append(p)
            gathers.append(BucketGather(owned, group, rank))
    return gathers


def _waiting_hook(gathers: list[BucketGather]) -> Any:
    def hook(module: Any, args: Any) -> None:
        for gather in gathers:
            gather.finish()

    return hook


_STATE_ACCESS = ("state_dict", "sharded_state_dict", "state_dict_for_save_checkpoint", "load_state_dict",
                 "start_param_sync")
"""Methods of the DDP wrapper and of the modules it wraps that read or write the parameters outside a forward."""


def _wrapped(chunk: Any) -> list[Any]:
    """The DDP wrapper and every module it wraps down to the model (Bridge's bf16 runs put a ``Float16Module``
    between them; checkpointing unwraps to the innermost one)."""
    import torch

    out = [chunk]
    while isinstance(getattr(out[-1], "module", None), torch.nn.Module):
        out.append(out[-1].module)
    return out


def _finishing_class(base: type) -> type:
    """``base`` (the DDP wrapper's or the wrapped model's class) finishing the parameter gathers in flight before
    any of its `_STATE_ACCESS` methods runs."""

    def finishing(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.param_gathers.finish()
            return getattr(super(subclass, self), name)(*args, **kwargs)

        method.__name__ = name
        return method

    subclass = type(base.__name__, (base,), {name: finishing(name) for name in _STATE_ACCESS if hasattr(base, name)})
    return same_identity(subclass, base)


def _gathering_optimizer_class(base: type) -> type:
    """``base`` (Megatron's layer-wise optimizer class) starting its parameter gathers at the end of the step."""

    class GatheredInForward(base):  # type: ignore[misc, valid-type]
        param_gathers: ParamGathers

        def allgather_params(self) -> None:
            self.param_gathers.start()

    return same_identity(GatheredInForward, base)


_MODEL_CLASSES: dict[type, type] = {}
_OPTIMIZER_CLASSES: dict[type, type] = {}


def gather_in_forward(layer_wise: Any, model_chunks: list[Any], pg_collection: Any) -> ParamGathers | None:
    """Switch the built Megatron-Core 0.16 / 0.17 ``layer_wise`` optimizer to gathering the updated parameters
    per bucket of the DDP ``model_chunks``, each waited for by the modules using it (module doc). None at
    data-parallel size 1 (nothing to gather)."""
    domains = owner_domains(layer_wise, pg_collection)
    if not domains:
        return None
    gathers: list[BucketGather] = []
    for chunk in model_chunks:
        for attribute, owner_lists, group in domains:
            gathers.extend(_bucket_gathers(chunk, owner_lists, group, attribute))
    of_param = {id(p): g for g in gathers for params in g.owned for p in params}
    hooks = []
    for chunk in model_chunks:
        previous = getattr(chunk, "param_gathers", None)
        if previous is not None:
            previous.remove()
        for module in chunk.module.modules():
            needed = list({id(of_param[id(p)]): of_param[id(p)] for p in module.parameters(recurse=False)
                           if id(p) in of_param}.values())
            if needed:
                hooks.append(module.register_forward_pre_hook(_waiting_hook(needed)))
    param_gathers = ParamGathers(gathers, hooks)
    for chunk in model_chunks:
        for model in _wrapped(chunk):
            switch_class(model, _finishing_class, _MODEL_CLASSES)
            model.param_gathers = param_gathers
    switch_class(layer_wise, _gathering_optimizer_class, _OPTIMIZER_CLASSES)
    layer_wise.param_gathers = param_gathers
    return param_gathers
