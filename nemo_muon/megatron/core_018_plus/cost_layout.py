"""DDP's parameter layout on Megatron-Core >= 0.18 with the layer-wise matrices owned by update cost.

From 0.18 Megatron-Core's `LayerWiseDistributedOptimizer` takes ownership from the parameter layout DDP was built
with (``DistributedDataParallel(full_param_layout=...)``): each bucket of a layer-wise buffer is cut into one equal
shard per data-parallel rank, a matrix lives whole in one shard, and the shard's rank owns it
(``_shard_params_from_layout``). DDP then reduce-scatters the gradient buckets to their owners and all-gathers the
updated parameters (about 2/3 of the bytes of the legacy path's all-reduce + uneven all-gather). Megatron's own layout
packs each bucket by numel; `plan_cost_layout` packs it by the update cost of our matrix optimizer instead (the
registry entry's ``matrix.update_cost`` with fused parts, the cost `nemo_muon.megatron.core_016_017.cost_balanced` plans with on
0.16), so the Newton–Schulz work, not the memory, is what each rank holds evenly:

- LPT on cost, largest first, each bucket's matrices placed on the least loaded rank; loads carry over from bucket
  to bucket and from the expert buffers (planned first, over ``expt_dp``) to the dense ones (over ``dp_cp``),
  as ``nemo-muon plan`` models it; ties (equal loads, common: equal matrices) go to the rank holding the fewest
  elements of the bucket, and moves within `BYTE_SLACK` of LPT's maximum load then shrink the largest shard, so
  the shards, padded to the largest, stay small;
- buckets are contiguous ranges in backward order (DDP's overlap of the reduction with backward is kept), one
  bucket when ``bucket_size`` is None;
- the other buffers (embeddings, norms, biases: Megatron's Adam in its distributed optimizer) keep Megatron's own
  `DistributedOptimizer` layout.

Split ownership (Muon's ``ns_split_target``): `tag_with_costs` plans the whole stage (every model chunk of this
pipeline rank) as ``nemo-muon plan`` does and tags each matrix with its planned owner
(`nemo_muon.megatron.core_018_plus.split_plan`); every chunk's layout then puts each matrix in its planned owner's shard (a split
one whole in its block's first rank's shard: that rank alone holds its gradient, master and momentum), so the layout
is the plan, and the byte tie rule does not apply. `nemo_muon.megatron.core_018_plus.split_shares` gives the block's members their
shares of the NS.

`wrap_with_cost_layout` is the megatron.training-style wiring (tag the parameters, compute the layout, build DDP).
Bridge 0.5 / 0.6 wrap DDP themselves (``megatron.training.models.dist_utils._ddp_wrap``); `nemo_muon.megatron.
bridge_layout` routes their wrap to `tag_with_costs` and `plan_cost_layout`. Process groups are passed explicitly. `check_layout_api` refuses an older Megatron-Core,
naming what it lacks.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

COST_ATTRIBUTE = "nemo_muon_update_cost"
"""The attribute a layer-wise matrix carries its update cost in (set by `tag_with_costs`)."""


def layout_api_problems() -> list[str]:
    """What the installed Megatron-Core lacks for a layer-wise parameter layout (empty: it has everything)."""
    problems = []
    try:
        from megatron.core.distributed import DistributedDataParallel
        from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
        from megatron.core.optimizer.param_layout import BufferKey
    except ImportError as exc:
        return [f"an import failed ({exc}): megatron.core.optimizer.param_layout / layer_wise_optimizer"]
    if "full_param_layout" not in inspect.signature(DistributedDataParallel.__init__).parameters:
        problems.append("DistributedDataParallel(full_param_layout=...)")
    if "is_managed_by_layer_wise_optimizer" not in {f.name for f in dataclasses.fields(BufferKey)}:
        problems.append("BufferKey.is_managed_by_layer_wise_optimizer")
    for name in ("_shard_params_from_layout", "_shard_divisor"):
        if not hasattr(LayerWiseDistributedOptimizer, name):
            problems.append(f"LayerWiseDistributedOptimizer.{name}")
    return problems


def check_layout_api() -> None:
    """Raise unless the installed Megatron-Core (>= 0.18) builds DDP from a layer-wise parameter layout."""
    problems = layout_api_problems()
    if problems:
        import importlib.metadata

        raise RuntimeError(f"the cost-balanced parameter layout needs Megatron-Core >= 0.18; installed megatron-core "
                           f"{importlib.metadata.version('megatron-core')} lacks: {', '.join(problems)}")


def is_layer_wise_matrix(param: Any) -> bool:
    """Whether Megatron's layer-wise optimizer gives ``param`` to the matrix optimizer (its routing rule)."""
    from megatron.core.optimizer.layer_wise_optimizer import is_managed_by_layer_wise_optimizer

    return bool(is_managed_by_layer_wise_optimizer(param))


def plan_items(model_chunks: Sequence[Any], ours: Any, pg_collection: Any) -> dict[Any, Any]:
    """param -> its `PlanItem` under ``ours`` (the recipe's matrix optimizer config), for every trainable layer-wise
    matrix of ``model_chunks`` (un-wrapped or Float16-wrapped; ``.config`` is the model's config): named as the model
    names it, costed as `nemo_muon.megatron.core_016_017.cost_balanced` plans (the registry entry's ``update_cost`` of the parts
    our optimizer runs, asked of an instance of our engine class built on the matrices with the recipe's config;
    nothing is stepped), with split options where ``ours`` has ``ns_split_target`` and the entry splits (never a
    routed expert)."""
    from nemo_muon.megatron.shared.engine import engine_class_of, engine_kwargs, parameter_names
    from nemo_muon.megatron.shared.ownership import is_routed_expert, matrix_item
    from nemo_muon.registry import spec_for

    matrices = [p for chunk in model_chunks for p in chunk.parameters() if p.requires_grad and is_layer_wise_matrix(p)]
    if not matrices:
        return {}
    rates = types.SimpleNamespace(lr=ours.lr, weight_decay=ours.weight_decay)
    probe = engine_class_of(spec_for(ours))([{"params": matrices}],
                                            **engine_kwargs(ours, rates, list(model_chunks), pg_collection))
    names = parameter_names(model_chunks)
    splits = getattr(ours, "ns_split_target", None) is not None
    out = {}
    for k, p in enumerate(matrices):
        name = names.get(id(p), f"matrix {k}")
        out[p] = matrix_item(probe, p, name, splits and not is_routed_expert(name))
    return out


def tag_with_costs(model_chunks: Sequence[Any], ours: Any, pg_collection: Any) -> int:
    """Tag every trainable parameter for DDP's buffer routing (layer-wise matrix or not, Megatron's rule) and each
    layer-wise matrix with its update cost (`COST_ATTRIBUTE`); where ``ours`` has ``ns_split_target``, plan the stage
    (``model_chunks``: every chunk of this pipeline rank) and tag each matrix with its planned owner
    (`nemo_muon.megatron.core_018_plus.split_plan.tag_stage_plan`). Returns how many matrices were costed."""
    from megatron.core.optimizer.layer_wise_optimizer import tag_params_for_buffer_routing

    from nemo_muon.megatron.core_018_plus.split_plan import clear_stage_plan, tag_stage_plan

    tag_params_for_buffer_routing(list(model_chunks))
    target = getattr(ours, "ns_split_target", None)
    items = plan_items(model_chunks, ours, pg_collection)
    for p, item in items.items():
        setattr(p, COST_ATTRIBUTE, float(item.cost))
    if target is not None and items:
        tag_stage_plan(items, pg_collection, target)
    else:
        clear_stage_plan(items)
    return len(items)


@dataclasses.dataclass
class CostLayout:
    """A `FullParamLayout` (``layout``) and the plan it encodes: the owning rank of each layer-wise matrix
    (``owners``: param -> rank in its buffer's group), the cost each rank owns per domain (``loads``: "dense" over
    dp_cp, its expert work included, and "expert" over expt_dp), and the layer-wise buffers' elements with and
    without padding (``buffer_numel``, ``param_numel``); with ``ns_split_target`` the split matrices and the plan."""

    layout: Any
    owners: dict[Any, int]
    loads: dict[str, list[float]]
    buffer_numel: int = 0
    param_numel: int = 0
    splits: dict[Any, Any] = dataclasses.field(default_factory=dict)
    """The chunk's matrices split over blocks of dp_cp ranks (param -> `LayoutSplit`; empty without
    ``ns_split_target``)."""
    stage_plan: Any = None
    """With ``ns_split_target``: the stage's `StageSplitPlan` the layout encodes (None otherwise)."""

    @property
    def padding(self) -> float:
        """Padding of the layer-wise buffers, relative to their parameters."""
        return self.buffer_numel / self.param_numel - 1.0 if self.param_numel else 0.0


BYTE_SLACK = 0.005
"""How far (relative) the most loaded rank's update cost may rise above LPT's so that the largest shard of a bucket
(which every shard is padded to) shrinks: tiny Kimi K2 at DP=4, padding 4.9% -> 1.3% for max/mean 1.002 -> 1.005
(Megatron's numel layout: 1.030, 0.7%)."""


def lpt_by_cost(costs: Sequence[float], sizes: Sequence[int], loads: list[float], *,
                byte_slack: float = BYTE_SLACK, max_moves: int = 200) -> list[int]:
    """Owner of each item (one bucket's matrices): largest cost first onto the least loaded rank, ties to the rank
    holding the fewest elements (``sizes``) of these items; then, while the largest rank's elements can shrink by
    moving one of its items to another rank (or swapping it with one there) without any rank's load exceeding
    LPT's maximum by more than ``byte_slack``, the best such move. ``loads`` (one per rank, work already placed)
    are updated in place."""
    ranks = range(len(loads))
    held = [0] * len(loads)
    owners = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda k: (-costs[k], -sizes[k], k)):
        least = min(loads)
        rank = min((r for r in ranks if loads[r] == least), key=lambda r: (held[r], r))
        owners[i], loads[rank], held[rank] = rank, loads[rank] + costs[i], held[rank] + sizes[i]
    cap = max(loads) * (1.0 + byte_slack)
    for _ in range(max_moves):
        big = max(ranks, key=lambda r: (held[r], -r))
        best: tuple[int, int, int | None, int] | None = None  # (new largest, item, swapped item, rank)
        for a in (k for k in range(len(costs)) if owners[k] == big):
            for j in ranks:
                if j == big:
                    continue
                for b in [None, *(k for k in range(len(costs)) if owners[k] == j)]:
                    size_b, cost_b = (0, 0.0) if b is None else (sizes[b], costs[b])
                    if max(loads[big] - costs[a] + cost_b, loads[j] - cost_b + costs[a]) > cap:
                        continue
                    largest = max([held[r] for r in ranks if r not in (big, j)]
                                  + [held[big] - sizes[a] + size_b, held[j] - size_b + sizes[a]])
                    if largest < held[big] and (best is None or largest < best[0]):
                        best = (largest, a, b, j)
        if best is None:
            break
        _, a, b, j = best
        for item, src, dst in ((a, big, j), *(() if b is None else ((b, j, big),))):
            owners[item] = dst
            loads[src], loads[dst] = loads[src] - costs[item], loads[dst] + costs[item]
            held[src], held[dst] = held[src] - sizes[item], held[dst] + sizes[item]
    return owners


def _bucket_ranges(params: Sequence[Any], bucket_size: int | None, dp: int) -> list[list[Any]]:
    """The layer-wise params (forward order) cut into buckets, each a contiguous range in backward order; a bucket
    closes at ``bucket_size`` elements, or later while one matrix alone would leave most shards empty."""
    buckets: list[list[Any]] = [[]]
    numel = largest = 0
    for p in reversed(params):
        buckets[-1].append(p)
        numel += p.numel()
        largest = max(largest, p.numel())
        if bucket_size is not None and numel >= max(bucket_size, dp * largest):
            buckets.append([])
            numel = largest = 0
    return [b for b in buckets if b]


def _layer_wise_buffer(params: Sequence[Any], param_indices: Any, dp: int, ddp_config: Any,
                       bucket_size: int | None, loads: list[float], owners: dict[Any, int],
                       planned: Mapping[Any, int] | None = None) -> tuple[Any, int]:
    """One layer-wise buffer's `PerBufferParamLayout` (and its padded numel): per bucket, owners by `lpt_by_cost`
    (or the ``planned`` owner of each matrix: a split plan's, whose loads are already counted), each owner's
    matrices whole in its shard (64-aligned starts), shards padded to the largest."""
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
    from megatron.core.optimizer.param_layout import PerBufferParamLayout, pad_param_start, pad_to_divisor

    divisor = LayerWiseDistributedOptimizer._shard_divisor(dp, ddp_config)
    index_map: dict[Any, tuple[int, int, int]] = {}
    bucket_indices: list[tuple[int, int]] = []
    unpadded: list[int] = []
    start = 0
    for bucket_id, bucket in enumerate(_bucket_ranges(params, bucket_size, dp)):
        for p in bucket:
            if getattr(p, "shared_embedding", False):
                raise ValueError(f"a shared embedding (shape {tuple(p.shape)}) cannot be a layer-wise matrix")
            if not hasattr(p, COST_ATTRIBUTE):
                raise ValueError(f"layer-wise matrix of shape {tuple(p.shape)} has no update cost "
                                 f"({COST_ATTRIBUTE}): tag the model with tag_with_costs before computing the layout")
        bucket_owners = ([planned[p] for p in bucket] if planned is not None else
                         lpt_by_cost([getattr(p, COST_ATTRIBUTE) for p in bucket], [p.numel() for p in bucket], loads))
        shards: list[list[Any]] = [[] for _ in range(dp)]
        for p, rank in zip(bucket, bucket_owners, strict=True):
            shards[rank].append(p)
            owners[p] = rank
        ends = []
        for shard in shards:
            end = 0
            for p in shard:
                end = pad_param_start(end) + p.numel()
            ends.append(end)
        shard_numel = max(pad_to_divisor(max(ends), divisor), divisor)
        for rank, shard in enumerate(shards):
            cursor = start + rank * shard_numel
            for p in shard:
                cursor = pad_param_start(cursor)
                index_map[p] = (cursor, cursor + p.numel(), bucket_id)
                cursor += p.numel()
        bucket_indices.append((start, start + dp * shard_numel))
        unpadded.append(sum(p.numel() for p in bucket))
        start += dp * shard_numel
    kwargs: dict[str, Any] = {"param_index_map": index_map, "bucket_indices": bucket_indices,
                              "per_bucket_numel_unpadded": unpadded,
                              "param_indices": list(param_indices) if param_indices is not None else []}
    if "num_optimizer_shards" in {f.name for f in dataclasses.fields(PerBufferParamLayout)}:  # 0.19; not in 0.18
        kwargs["num_optimizer_shards"] = dp
    return PerBufferParamLayout(**kwargs), start


def _dense_start(expert_loads: list[float], pg_collection: Any) -> list[float]:
    """Each dp_cp rank's expert work (zeros without experts), from the expert plan over expt_dp."""
    from megatron.core.utils import get_pg_rank, get_pg_size

    from nemo_muon.megatron.shared.ownership import expert_work

    size, rank = get_pg_size(pg_collection.dp_cp), get_pg_rank(pg_collection.dp_cp)
    carried = expert_work(expert_loads, pg_collection, size, rank)
    return [0.0] * size if carried is None else list(carried)


def plan_cost_layout(params: Iterable[Any], bucket_size: int | None, ddp_config: Any,
                     pg_collection: Any) -> CostLayout:
    """The `CostLayout` of one model chunk's trainable ``params`` (tagged by `tag_with_costs`) for DDP with
    ``ddp_config`` over ``pg_collection``'s ``dp_cp`` and ``expt_dp`` groups (module doc)."""
    from megatron.core.distributed.param_and_grad_buffer import group_params_for_buffers
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.param_layout import FullParamLayout
    from megatron.core.utils import get_pg_size

    from nemo_muon.megatron.core_018_plus.split_plan import planned_owner

    check_layout_api()
    dp, edp = get_pg_size(pg_collection.dp_cp), get_pg_size(pg_collection.expt_dp)
    groups = group_params_for_buffers(list(params), ddp_config.grad_reduce_in_fp32)
    layouts: dict[Any, Any] = {}
    owners: dict[Any, int] = {}
    loads = {"expert": [0.0] * edp, "dense": [0.0] * dp}
    buffer_numel = param_numel = 0
    dense_started = False
    planned, stage = _planned(groups)
    for key in sorted(groups, key=lambda k: not k.is_expert_parallel):  # experts first: dense starts from them
        group_params, indices = groups[key]
        size = edp if key.is_expert_parallel else dp
        if not key.is_managed_by_layer_wise_optimizer:
            layouts[key] = DistributedOptimizer._compute_per_buffer_param_layout(group_params, bucket_size, size,
                                                                                 ddp_config, indices)
            continue
        if not key.is_expert_parallel and not dense_started:
            loads["dense"][:] = _dense_start(loads["expert"], pg_collection)
            dense_started = True
        domain = loads["expert" if key.is_expert_parallel else "dense"]
        layouts[key], numel = _layer_wise_buffer(group_params, indices, size, ddp_config, bucket_size, domain, owners,
                                                 planned)
        buffer_numel += numel
        param_numel += sum(p.numel() for p in group_params)
    splits = {}
    if stage is not None:  # the stage plan's loads (every chunk of this pipeline rank), not this chunk's
        loads = {"expert": list(stage.expert_flops), "dense": list(stage.dense.flops)}
        splits = {p: split for p in planned if (split := planned_owner(p).split) is not None}
    return CostLayout(FullParamLayout(layouts=layouts), owners, loads, buffer_numel, param_numel, splits, stage)


def _planned(groups: Mapping[Any, Any]) -> tuple[dict[Any, int] | None, Any]:
    """The planned owner of every layer-wise matrix and the stage plan (`nemo_muon.megatron.core_018_plus.split_plan`), or
    (None, None) when none was planned (no split target: each bucket by `lpt_by_cost`)."""
    from nemo_muon.megatron.core_018_plus.split_plan import planned_owner

    matrices = [p for key, (ps, _) in groups.items() if key.is_managed_by_layer_wise_optimizer for p in ps]
    tags = [planned_owner(p) for p in matrices]
    if all(t is None for t in tags):
        return None, None
    if any(t is None for t in tags) or len({id(t.stage) for t in tags}) != 1:
        raise ValueError("every layer-wise matrix of the chunk must carry the same stage plan "
                         "(nemo_muon_planned_owner): tag the whole model with tag_with_costs and one config")
    return {p: t.rank for p, t in zip(matrices, tags, strict=True)}, tags[0].stage


def wrap_with_cost_layout(model_chunks: Sequence[Any], config: Any, ddp_config: Any, *, ours: Any,
                          pg_collection: Any, bucket_size: int | None = None) -> tuple[list[Any], list[CostLayout]]:
    """Megatron-Core's `DistributedDataParallel` around each chunk with the cost layout (megatron.training's
    layer-wise wiring, `wrap_model_chunks_with_ddp`, with our layout): ``ddp_config.use_distributed_optimizer`` set
    (reduce-scatter of gradients, all-gather of parameters), parameters tagged and costed, one `CostLayout` per
    chunk. Returns (the wrapped chunks, their layouts)."""
    from megatron.core.distributed import DistributedDataParallel

    check_layout_api()
    ddp_config.use_distributed_optimizer = True
    tag_with_costs(model_chunks, ours, pg_collection)
    wrapped, plans = [], []
    for chunk in model_chunks:
        plan = plan_cost_layout([p for p in chunk.parameters() if p.requires_grad], bucket_size, ddp_config,
                                pg_collection)
        wrapped.append(DistributedDataParallel(config, ddp_config, chunk, pg_collection=pg_collection,
                                               full_param_layout=plan.layout))
        plans.append(plan)
    return wrapped, plans


