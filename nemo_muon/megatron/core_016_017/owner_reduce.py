"""Megatron-Core 0.16 / 0.17: the layer-wise optimizer's gradients reduced to their owners instead of all-reduced.

Without a parameter layout (0.18's ``full_param_layout``), Megatron's DDP all-reduces every gradient bucket for the
layer-wise optimizer (``_ParamAndGradBucketGroup.start_grad_sync``), although each matrix's reduced gradient is read
by one data-parallel rank, its owner (``LayerWiseDistributedOptimizer.dp_cp_params_list`` / ``expt_dp_params_list``).
`switch_to_owner_reduce` switches a DDP bucket group to reducing its gradients to their owners: per bucket the
gradients are packed in owner order (one copy of the bucket), each owner's segment is reduced to it
(``torch.distributed.reduce``, the collective NCCL's uneven reduce-scatter is made of; a ring sends every segment
but a rank's own, as a reduce-scatter does) and unpacked into the owner's gradient buffer.

Gradients that more than one rank reads after the reduction are all-reduced as before (`BucketRoute.shared`): a
matrix split over a block (0.16 keeps a whole copy on every member), and the gradients Megatron's
``finalize_model_grads`` all-reduces once more across another group (tensor-parallel-replicated and
sequence-parallel weights, and the embedding / output weights a tied or MTP model shares across pipeline stages:
`READ_ACROSS_GROUPS`). The other ranges of
a rank's buffer stay unreduced: the layer-wise optimizer reads the gradients of the parameters it owns only (its
update, gradient norm and zero count). The parameter side: `nemo_muon.megatron.core_016_017.owner_gather`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from nemo_muon.megatron.shared.class_switch import same_identity, switch_class

Range = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class BucketRoute:
    """Where one bucket's gradients go: ``owned[k]`` the (start, end) ranges of ``bucket.grad_data`` only group
    rank ``k`` reads, ``shared`` the ranges several ranks read (all-reduced); ranges merged where contiguous."""

    owned: tuple[tuple[Range, ...], ...]
    shared: tuple[Range, ...]

    def __post_init__(self) -> None:
        spans = sorted(r for ranges in (*self.owned, self.shared) for r in ranges)
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end:
                raise ValueError(f"bucket ranges overlap: one ends at {end}, the next starts at {start}")

    def segment_sizes(self) -> list[int]:
        """Elements per segment of the packed buffer: each group rank's, then the shared ones."""
        return [sum(e - s for s, e in ranges) for ranges in (*self.owned, self.shared)]


def _merged(ranges: list[Range]) -> tuple[Range, ...]:
    out: list[Range] = []
    for start, end in sorted(ranges):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return tuple(out)


def route_bucket(param_ranges: Mapping[Any, Range], holders: Callable[[Any], tuple[int, ...]], size: int) -> BucketRoute:
    """The route of a bucket whose parameters cover ``param_ranges`` (param -> (start, end) in its gradient buffer);
    ``holders(param)``: the group ranks that read its reduced gradient (one: its owner)."""
    owned: list[list[Range]] = [[] for _ in range(size)]
    shared: list[Range] = []
    for param, span in param_ranges.items():
        ranks = holders(param)
        if not ranks or any(not 0 <= r < size for r in ranks):
            raise ValueError(f"a parameter of shape {tuple(param.shape)} has holders {ranks}; expected ranks of a "
                             f"group of {size}")
        (owned[ranks[0]] if len(ranks) == 1 else shared).append(span)
    return BucketRoute(tuple(_merged(r) for r in owned), _merged(shared))


class PendingReduce:
    """The reductions of one bucket group in flight; `wait` finishes them and unpacks each bucket's owned and
    shared segments into its gradient buffer."""

    def __init__(self, parts: list[tuple[Any, Any, list[Any], list[tuple[int, int, int]]]]) -> None:
        self.parts = parts  # (flat gradient buffer, packed buffer, works, (start, end, offset in packed) to unpack)

    def wait(self) -> None:
        for flat, packed, works, unpack in self.parts:
            for work in works:
                if work is not None:
                    work.wait()
            for start, end, offset in unpack:
                flat[start:end].copy_(packed[offset:offset + end - start])
        self.parts = []


def start_reduce(grad_data: Any, route: BucketRoute, group: Any, rank: int, op: Any, async_op: bool,
                 destinations: list[int] | None = None) -> tuple[Any, Any, list[Any], list[tuple[int, int, int]]]:
    """Pack ``grad_data`` in owner order and issue each owner's reduce and the shared all-reduce on ``group``
    (``rank``: the owner this rank is; ``destinations``: each owner's global rank, default the group's ranks in
    order); returns this bucket's part of a `PendingReduce`."""
    import torch
    import torch.distributed as dist

    flat = grad_data.view(-1)
    segments = (*route.owned, route.shared)
    packed = torch.cat([flat[s:e] for ranges in segments for s, e in ranges] or [flat[:0]])
    works, unpack, offset = [], [], 0
    for k, (ranges, n) in enumerate(zip(segments, route.segment_sizes(), strict=True)):
        shared = k == len(route.owned)
        if n:
            piece = packed[offset:offset + n]
            dst = None if shared else (destinations[k] if destinations else dist.get_global_rank(group, k))
            works.append(dist.all_reduce(piece, op=op, group=group, async_op=async_op) if shared else
                         dist.reduce(piece, dst=dst, op=op, group=group, async_op=async_op))
        if shared or k == rank:
            at = offset
            for s, e in ranges:
                unpack.append((s, e, at))
                at += e - s
        offset += n
    return flat, packed, works, unpack


def _owner_reduce_class(base: type) -> type:
    """``base`` (Megatron's ``_ParamAndGradBucketGroup``) reducing each bucket's gradients to their owners."""

    class OwnerReducedBucketGroup(base):  # type: ignore[misc, valid-type]
        owner_routes: list[BucketRoute]
        owner_group: Any
        owner_rank: int
        owner_destinations: list[int]

        def start_grad_sync(self, force_all_reduce: bool | None = False) -> None:
            if force_all_reduce:
                return super().start_grad_sync(force_all_reduce=force_all_reduce)
            if self.is_first_batch and self.grad_reduce_handle is not None:
                return None  # already dispatched in this first batch (Megatron's rule)
            if self.grad_reduce_handle is not None:
                raise RuntimeError("a gradient reduction of this bucket group is already in flight")
            if any(getattr(b, "params_with_extra_main_grads", None) for b in self.buckets):
                raise RuntimeError("gradients reduced to their owners do not support main grads kept outside DDP's "
                                   "buffer (params_with_extra_main_grads)")
            import torch

            config = self.ddp_config
            if config.check_for_nan_in_grad or getattr(config, "check_for_large_grads", False):
                self.check_grads(check_for_nan_or_inf=config.check_for_nan_in_grad,
                                 check_for_large=getattr(config, "check_for_large_grads", False))
            for bucket in self.buckets:  # the factor already says whether the collective sums or averages
                if bucket.gradient_scaling_factor != 1.0:
                    bucket.grad_data *= bucket.gradient_scaling_factor
            op = torch.distributed.ReduceOp.AVG if config.average_in_collective else torch.distributed.ReduceOp.SUM
            async_op = config.overlap_grad_reduce and config.num_distributed_optimizer_instances == 1
            pending = PendingReduce([start_reduce(b.grad_data, route, self.owner_group, self.owner_rank, op, async_op,
                                                  self.owner_destinations)
                                     for b, route in zip(self.buckets, self.owner_routes, strict=True)])
            if async_op:
                self.grad_reduce_handle = pending
            else:
                pending.wait()
                self.grad_reduce_handle = None
            return None

    return same_identity(OwnerReducedBucketGroup, base)


_CLASSES: dict[type, type] = {}


def switch_to_owner_reduce(bucket_group: Any, holders: Callable[[Any], tuple[int, ...]], group: Any) -> None:
    """Make DDP ``bucket_group`` reduce each gradient to the ranks ``holders(param)`` names (group ranks of
    ``group``, a process group with the ranks of the bucket group's data-parallel group)."""
    import torch.distributed as dist

    theirs = getattr(bucket_group, "data_parallel_group", None)
    if theirs is None:
        raise RuntimeError("gradients reduced to owners replace DDP's all-reduce; DDP here reduce-scatters "
                           "(use_distributed_optimizer=True)")
    if dist.get_process_group_ranks(theirs) != dist.get_process_group_ranks(group):
        raise RuntimeError(f"the bucket group reduces over ranks {dist.get_process_group_ranks(theirs)}, the owners "
                           f"are ranks of {dist.get_process_group_ranks(group)}")
    size = dist.get_world_size(group)
    routes = []
    for bucket in bucket_group.buckets:
        flat = bucket.grad_data.view(-1)
        for param, (start, _) in bucket.param_to_index.items():
            grad = getattr(param, "main_grad", None)
            if grad is None or grad.data_ptr() != flat[start:].data_ptr():
                raise RuntimeError("a parameter's main_grad is not where its bucket's index puts it")
        routes.append(route_bucket(bucket.param_to_index, holders, size))
    switch_class(bucket_group, _owner_reduce_class, _CLASSES)
    bucket_group.owner_routes, bucket_group.owner_group = routes, group
    bucket_group.owner_rank = dist.get_rank(group)
    bucket_group.owner_destinations = [dist.get_global_rank(group, k) for k in range(size)]  # once, not per step


READ_ACROSS_GROUPS = ("average_gradients_across_tp_domain", "sequence_parallel", "pipeline_parallel",
                      "shared_embedding")
"""Parameter attributes under which ``finalize_model_grads`` all-reduces a gradient again over another group after
DDP's reduction (tensor-parallel-replicated and sequence-parallel weights, conditional embedders across stages, the
word embedding and output layer a tied or MTP model shares across pipeline stages): every data-parallel rank must
then hold it reduced."""


def _read_across_groups(param: Any) -> bool:
    return any(getattr(param, attribute, False) for attribute in READ_ACROSS_GROUPS)


def owner_domains(layer_wise: Any, pg_collection: Any) -> list[tuple[str, list[list[Any]], Any]]:
    """(DDP's bucket-group attribute, the layer-wise optimizer's per-rank owner lists, their process group) of each
    domain that has owners: the dense buckets over dp_cp, the expert buckets over expt_dp (empty at DP size 1)."""
    domains = [("bucket_groups", layer_wise.dp_cp_params_list, pg_collection.dp_cp),
               ("expert_parallel_bucket_groups", layer_wise.expt_dp_params_list, pg_collection.expt_dp)]
    return [d for d in domains if d[1] is not None]


def owner_index(owner_lists: list[list[Any]]) -> dict[int, int]:
    """id(param) -> the group rank whose list holds it."""
    return {id(p): k for k, params in enumerate(owner_lists) for p in params}


def domain_holders(owner_lists: list[list[Any]],
                   split_holders: Mapping[int, tuple[int, ...]]) -> Callable[[Any], tuple[int, ...]]:
    """``holders(param)`` of one domain: its owner's group rank in ``owner_lists`` (the layer-wise optimizer's
    per-rank lists), a split matrix's block (``split_holders``: id -> ranks), or every rank for a gradient
    `READ_ACROSS_GROUPS` names."""
    size = len(owner_lists)
    owner = owner_index(owner_lists)

    def holders(param: Any) -> tuple[int, ...]:
        if _read_across_groups(param):
            return tuple(range(size))
        if id(param) in split_holders:
            return tuple(split_holders[id(param)])
        if id(param) not in owner:
            raise RuntimeError(f"a parameter of shape {tuple(param.shape)} in a gradient bucket has no owner in the "
                               "layer-wise optimizer")
        return (owner[id(param)],)

    return holders


def reduce_to_owners(layer_wise: Any, model_chunks: list[Any], pg_collection: Any) -> int:
    """Switch every bucket group of the DDP ``model_chunks`` to reducing gradients to their owners in the built
    Megatron-Core 0.16 / 0.17 ``layer_wise`` optimizer (dense buckets over ``pg_collection.dp_cp``, expert buckets
    over ``expt_dp``). Returns the number of bucket groups switched (0 at data-parallel size 1)."""
    splits = getattr(layer_wise, "split_holders", {})
    switched = 0
    for attribute, owner_lists, group in owner_domains(layer_wise, pg_collection):
        holders = domain_holders(owner_lists, splits)
        for chunk in model_chunks:
            for bucket_group in getattr(chunk, attribute):
                switch_to_owner_reduce(bucket_group, holders, group)
                switched += 1
    return switched
