"""Muon's batched step (``Muon(batch_ns=True)``, the default): no operator is issued per matrix.

The matrices of one step are put in classes (same param group, shape, route and TP partition dim: the same
momentum, Newton–Schulz, scale and update), each class cut into stacks of at most ``stack_bytes`` of fp32 input
(`nemo_muon.optim.ns_stacks`), and the stacks packed into batches of at most that many bytes with the same NS
settings. Then, with ``torch._foreach_*`` operators (one per list of tensors; on a GPU a few fused kernels for a
list) and one operator per stack:

1. momentum: ``m <- m.lerp(g, 1 - momentum)`` for every matrix of the step (in place, one foreach per momentum);
2. per batch: the NS input ``g.lerp(m, momentum)`` (Nesterov; else ``m``) written straight into each stack's
   (S, out, in) tensor, one foreach copy and one foreach lerp; a fused weight (gate/up, QKV) split into its parts
   once per stack;
3. Newton–Schulz of every part of the batch in one ``newton_schulz_many(..., stack=True)`` call (the TP modes and
   their fused collectives as for single matrices; parts of equal shape across stacks stacked again);
4. the parts of a fused stack scaled (their global shapes, `muon_scale`) in one foreach and merged once per stack;
5. ``p <- p·(1 - lr·wd) - (lr·scale)·O`` in two foreach operators per (lr, wd, scale), on views of the stacked
   result (a whole matrix's scale rides on the update's alpha: no operator of its own).

Every matrix's update equals the per-matrix step's within fp32 reordering of the batched GEMMs
(``tests/tolerances.GRAM_TOL``); the element-wise work is the same arithmetic, operator for operator, except the
scale, multiplied into the update's alpha (the last bit of the update may differ). Memory: a
batch's NS inputs and temporaries are alive together (a few times ``stack_bytes``), against one matrix's per-matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon.optim.fused import merge_parts, split_parts
from nemo_muon.optim.ns_iteration import newton_schulz_many
from nemo_muon.optim.ns_stacks import chunked, matrices_in, unstacked
from nemo_muon.optim.routed import MatrixItem

Scale = Callable[[int, int, str], float]


def _momentum_buffers(items: Sequence[MatrixItem]) -> list[torch.Tensor]:
    for it in items:
        if "momentum_buffer" not in it.state:
            it.state["momentum_buffer"] = torch.zeros_like(it.grad)
    return [it.state["momentum_buffer"] for it in items]


def step_momentum(items: Sequence[MatrixItem]) -> None:
    """``m <- m.lerp(g, 1 - momentum)`` for every item, one foreach operator per momentum value."""
    for momentum, idx in _by_index(items, lambda it: it.group["momentum"]).items():
        its = [items[i] for i in idx]
        torch._foreach_lerp_(_momentum_buffers(its), [it.grad for it in its], 1 - momentum)


def stacked_ns_inputs(runs: Sequence[Sequence[MatrixItem]]) -> list[torch.Tensor]:
    """One NS input per run (after `step_momentum`): its members' Nesterov look-ahead ``g.lerp(m, momentum)`` (or
    the buffer ``m``) written straight into one (S, out, in) tensor (a single member's own shape), for all runs
    together: one foreach copy and one foreach lerp per momentum value, and no per-matrix temporary."""
    outs, views, rows = [], [], []
    for run in runs:
        grads = [it.grad for it in run]
        out = torch.empty_like(grads[0]) if len(run) == 1 else torch.empty(
            (sum(matrices_in(g) for g in grads), *grads[0].shape[-2:]), dtype=grads[0].dtype,
            device=grads[0].device)
        outs.append(out)
        views += unstacked(out, grads)
        rows += run
    for (momentum, nesterov), idx in _by_index(rows, lambda it: (it.group["momentum"], it.group["nesterov"])).items():
        bufs = [rows[i].state["momentum_buffer"] for i in idx]
        targets = [views[i] for i in idx]
        torch._foreach_copy_(targets, [rows[i].grad for i in idx] if nesterov else bufs)
        if nesterov:
            torch._foreach_lerp_(targets, bufs, momentum)
    return outs


def _by_index(items: Sequence[MatrixItem], key: Callable[[MatrixItem], Any]) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = {}
    for i, it in enumerate(items):
        out.setdefault(key(it), []).append(i)
    return out


def batched_step(items: list[MatrixItem], *, partition_dim: Callable[[torch.Tensor], int | None],
                 tp_group: dist.ProcessGroup | None, tp_mode: str, scale: Scale, stack_bytes: int,
                 apply: Callable[[list[MatrixItem], list[torch.Tensor], list[float]], None]) -> None:
    """Muon's step for ``items`` (module doc), the orthogonalized updates and their scales handed to
    ``apply(items, updates, scales)`` batch by batch (the optimizer's multi-tensor
    ``p <- p·(1 - lr·wd) - (lr·scale)·update``). ``partition_dim(param)``: the TP partition dim of a shard (None:
    whole)."""
    world = 1 if tp_group is None else dist.get_world_size(tp_group)
    step_momentum(items)
    pdims = [partition_dim(it.param) for it in items]
    keys = [(id(it.group), tuple(it.grad.shape), it.route, None if d is None else d - it.param.ndim)
            for it, d in zip(items, pdims, strict=True)]
    stacks = chunked(keys, [4 * it.grad.numel() for it in items], stack_bytes)
    settings = [tuple(items[s[0]].group[k] for k in ("ns_steps", "coefficients", "ns_precision")) for s in stacks]
    batches = chunked(settings, [sum(4 * items[i].grad.numel() for i in s) for s in stacks], stack_bytes)
    for batch in batches:
        runs = [stacks[b] for b in batch]
        members = [items[i] for run in runs for i in run]
        xs = stacked_ns_inputs([[items[i] for i in run] for run in runs])
        splits, dims, scales = [], [], []
        for run, x in zip(runs, xs, strict=True):
            first, pdim = items[run[0]], keys[run[0]][3]
            splits.append(split_parts(x, first.route, first.name))
            dims += [pdim] * len(splits[-1])
            scales += [_part_scale(p.shape, first, pdim, world, tp_mode, scale) for p in splits[-1]]
        steps, coefficients, precision = settings[batch[0]]
        ys = newton_schulz_many([p for split in splits for p in split], steps, coefficients, tp_group=tp_group,
                                tp_mode=tp_mode, partition_dims=dims, precision=precision, stack=True,
                                stack_bytes=stack_bytes)
        fused = [j for j, split in enumerate(splits) for _ in split if len(split) > 1]
        parts_at = [j for j, split in enumerate(splits) for _ in split]
        if fused:  # parts of one fused weight may differ in scale: scaled before they are merged
            torch._foreach_mul_([y for y, j in zip(ys, parts_at, strict=True) if len(splits[j]) > 1],
                                [c for c, j in zip(scales, parts_at, strict=True) if len(splits[j]) > 1])
        updates: list[torch.Tensor] = []
        update_scales: list[float] = []
        at = 0
        for run, x, split in zip(runs, xs, splits, strict=True):
            first = items[run[0]]
            merged = merge_parts(ys[at:at + len(split)], first.route, x)
            # a whole matrix's scale rides on the update's alpha (one operator less per stack)
            update_scales += [1.0 if len(split) > 1 else scales[at]] * len(run)
            at += len(split)
            updates += unstacked(merged, [items[i].grad for i in run])
        apply(members, updates, update_scales)


def _part_scale(shape: torch.Size, it: MatrixItem, pdim: int | None, world: int, tp_mode: str, scale: Scale) -> float:
    """The scale of one part of ``it`` (its global shape: the shard's times the TP size along the partition dim,
    except in blockwise mode; (in, out) swapped for a ``transposed`` route), times ``extra_scale_factor``."""
    dims = [shape[-2], shape[-1]]
    if pdim is not None and world > 1 and tp_mode != "blockwise":
        dims[pdim] *= world
    out, in_ = dims
    if it.route.transposed:
        out, in_ = in_, out
    return scale(out, in_, it.group["scale_mode"]) * it.group["extra_scale_factor"]
