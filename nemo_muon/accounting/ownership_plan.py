"""Ownership plan of the layer-wise distributed optimizer: which data-parallel rank updates which whole tensor.

Torch-free: the whole-tensor optimizer (``nemo_muon.layerwise``), Megatron's layer-wise optimizer (``nemo_muon.megatron.core_016_017.cost_balanced``),
the stage plans (``model_ownership``) and the planner use it. The items' costs come from the one cost model of a
matrix update, ``nemo_muon.registry.cost`` (``ns_cost``, ``soap_cost``, asked through each optimizer's registry
entry); the assignment rules:

- ``lpt_assign``: longest-processing-time-first: items by cost descending (ties by index), each to the
  least-loaded bin (ties by bin index). Deterministic, so every rank computes the same plan with no communication.
- Baselines: ``round_robin`` (KellerJordan/Muon: sort by shape descending, item k to rank k mod N) and
  ``ping_pong`` (Megatron-Core's legacy layer-wise path: sort by numel descending, ranks 0..N-1 then N-1..0).

Items that Muon/SOAP precondition carry an NS cost; element-wise items (norms, embeddings, the head: AdamW) carry
cost 0 and are balanced by bytes after the matrices. Items can be pinned to a rank (routed experts on their EP rank).

Splitting (``plan_ownership(..., balance_target=...)``, LPT only): while the plan's max/mean exceeds the target, the
most expensive item of the busiest rank that has a further ``split_options`` entry (``accounting.ns_split``; if the
busiest rank has none, the most expensive such item anywhere) is split one step further (2, 4, 8 ranks) and the plan
is redone; the best plan seen is kept. A split item is placed,
in LPT order by its per-member cost, on the aligned block of ``ways`` ranks whose busiest member is least loaded
(ties: the lowest block), so the subgroups the engines create are few and fixed; ``owners`` names the block's first
rank and ``splits`` the whole placement.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_muon._validation import check_choice, check_positive_int, fail
from nemo_muon.accounting.ns_split import SplitOption

Method = Literal["lpt", "round_robin", "ping_pong"]
METHODS: tuple[str, ...] = ("lpt", "round_robin", "ping_pong")


def lpt_assign(costs: Sequence[float], num_bins: int, *, initial_loads: Sequence[float] | None = None) -> list[int]:
    """Assign items to ``num_bins`` bins by LPT; returns the bin of each item (deterministic, ties by index).

    ``initial_loads`` (one per bin) start the bins with work already placed (for example pinned experts).
    """
    check_positive_int("num_bins", num_bins)
    loads = [0.0] * num_bins if initial_loads is None else [float(x) for x in initial_loads]
    if len(loads) != num_bins:
        raise fail("initial_loads", f"{len(loads)} values", f"one value per bin ({num_bins})")
    for i, c in enumerate(costs):
        if not (c >= 0.0) or math.isinf(c):
            raise fail(f"costs[{i}]", c, "a finite number >= 0")
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    heap = [(load, b) for b, load in enumerate(loads)]
    heapq.heapify(heap)
    out = [0] * len(costs)
    for i in order:
        load, b = heapq.heappop(heap)
        out[i] = b
        heapq.heappush(heap, (load + costs[i], b))
    return out


def round_robin_assign(shapes: Sequence[Sequence[int]], num_bins: int) -> list[int]:
    """KellerJordan/Muon's split: sort by shape descending (stable), item k of that order to bin k mod N."""
    check_positive_int("num_bins", num_bins)
    order = sorted(range(len(shapes)), key=lambda i: tuple(-d for d in shapes[i]))
    out = [0] * len(shapes)
    for k, i in enumerate(order):
        out[i] = k % num_bins
    return out


def ping_pong_assign(numels: Sequence[int], num_bins: int) -> list[int]:
    """Megatron-Core's legacy layer-wise split: sort by numel descending (stable), bins 0..N-1, N-1..0, ..."""
    check_positive_int("num_bins", num_bins)
    order = sorted(range(len(numels)), key=lambda i: (-numels[i], i))
    out = [0] * len(numels)
    for k, i in enumerate(order):
        lap, pos = divmod(k, num_bins)
        out[i] = pos if lap % 2 == 0 else num_bins - 1 - pos
    return out


@dataclass(frozen=True)
class PlanItem:
    """One unit of ownership: a whole tensor (or one expert of a stack), its cost and its size."""

    name: str
    shape: tuple[int, ...]
    cost: float
    """Preconditioner FLOPs per step (NS or SOAP); 0 for element-wise (AdamW) items."""
    nbytes: int
    """Bytes of the parameter (the gather volume; optimizer state scales with it)."""
    pinned_rank: int | None = None
    """Rank that must own this item (routed experts on their EP rank); None = free."""
    split_options: tuple[SplitOption, ...] = ()
    """How its NS can be split over DP ranks (``ns_split.split_options``); () = whole-tensor only."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SplitPlacement:
    """A split item's members (an aligned block of the DP group; the first is ``OwnershipPlan.owners``) and how."""

    ranks: tuple[int, ...]
    option: SplitOption


@dataclass
class OwnershipPlan:
    """Owner rank of every item, with per-rank preconditioner FLOPs and bytes."""

    num_ranks: int
    method: str
    owners: dict[str, int]
    flops: list[float]
    nbytes: list[int]
    items: list[PlanItem] = field(repr=False, default_factory=list)
    splits: dict[str, SplitPlacement] = field(default_factory=dict)
    """Items whose NS is split over several ranks, by name (empty without a balance target)."""

    @property
    def split_bytes(self) -> list[float]:
        """Bytes each rank sends per step for the splits, beyond whole-tensor ownership (``SplitOption``)."""
        out = [0.0] * self.num_ranks
        for sp in self.splits.values():
            for r in sp.ranks:
                out[r] += sp.option.extra_bytes
        return out

    @property
    def imbalance(self) -> float:
        """max/mean of per-rank preconditioner FLOPs (1.0 when there is no such work)."""
        return max_over_mean(self.flops)

    @property
    def bytes_imbalance(self) -> float:
        """max/mean of per-rank owned bytes."""
        return max_over_mean([float(b) for b in self.nbytes])

    def items_of(self, rank: int) -> list[str]:
        """Names owned by ``rank``, in item order."""
        return [it.name for it in self.items if self.owners[it.name] == rank]

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data."""
        return {
            "num_ranks": self.num_ranks,
            "method": self.method,
            "imbalance": self.imbalance,
            "bytes_imbalance": self.bytes_imbalance,
            "flops_per_rank": list(self.flops),
            "bytes_per_rank": list(self.nbytes),
            "owners": dict(self.owners),
            "splits": {n: {"ranks": list(sp.ranks), "dim": sp.option.dim, "cost": sp.option.cost,
                           "extra_bytes": sp.option.extra_bytes} for n, sp in self.splits.items()},
            "split_bytes_per_rank": self.split_bytes,
        }

    def format(self) -> str:
        """A small table: per-rank FLOPs, bytes and item count, then the imbalance."""
        counts = [0] * self.num_ranks
        for r in self.owners.values():
            counts[r] += 1
        lines = [f"ownership plan ({self.method}, {self.num_ranks} ranks)", "rank  precond GFLOP  MiB  items"]
        for r in range(self.num_ranks):
            lines.append(f"{r:4d}  {self.flops[r] / 1e9:13.3f}  {self.nbytes[r] / 2**20:.2f}  {counts[r]:5d}")
        lines.append(f"imbalance max/mean: flops {self.imbalance:.4f}, bytes {self.bytes_imbalance:.4f}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def max_over_mean(values: Sequence[float]) -> float:
    """max/mean of per-rank loads, 1.0 when there is no load (the imbalance figure of every plan)."""
    total = sum(values)
    if total <= 0:
        return 1.0
    return max(values) / (total / len(values))


def plan_ownership(items: Sequence[PlanItem], num_ranks: int, method: Method = "lpt", *,
                   initial_flops: Sequence[float] | None = None,
                   balance_target: float | None = None) -> OwnershipPlan:
    """Assign every item to a rank: pinned items first, then costed items by ``method``, then cost-0 items by
    LPT on bytes (so owned bytes stay balanced). Deterministic in the item order.

    ``initial_flops`` (one per rank) is work the ranks already have outside ``items`` (for example experts owned
    in another process group); LPT starts from it and the plan's ``flops`` include it. ``balance_target`` (LPT
    only, >= 1) splits items with ``split_options`` until max/mean reaches it or nothing more helps (module doc).
    """
    check_positive_int("num_ranks", num_ranks)
    check_choice("method", method, METHODS)
    if initial_flops is not None and len(initial_flops) != num_ranks:
        raise fail("initial_flops", f"{len(initial_flops)} values", f"one value per rank ({num_ranks})")
    if balance_target is not None:
        if method != "lpt":
            raise fail("method", method, "'lpt' when balance_target is set (only LPT splits matrices)")
        if not (isinstance(balance_target, (int, float)) and 1.0 <= balance_target < math.inf):
            raise fail("balance_target", balance_target, "a finite number >= 1.0 (NS load max/mean), or None")
    names = [it.name for it in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise fail("items", f"duplicate names {dup[:5]}", "unique item names")
    for it in items:
        if it.pinned_rank is not None and not (isinstance(it.pinned_rank, int) and 0 <= it.pinned_rank < num_ranks):
            raise fail(f"items[{it.name!r}].pinned_rank", it.pinned_rank, f"an int in [0, {num_ranks})")
    best = _assign(items, num_ranks, method, initial_flops, {})
    if balance_target is None:
        return best
    options = {it.name: [o for o in it.split_options if o.ways <= num_ranks and num_ranks % o.ways == 0]
               for it in items if it.pinned_rank is None and it.cost > 0}
    cost_of = {it.name: (it.cost, -i) for i, it in enumerate(items)}
    level: dict[str, int] = {}
    plan = best
    for _ in range(sum(len(o) for o in options.values())):
        if plan.imbalance <= balance_target:
            break
        busiest = max(range(num_ranks), key=lambda r: (plan.flops[r], -r))
        open_ = [n for n, opts in options.items() if level.get(n, 0) < len(opts)]
        held = [n for n in open_ if busiest in (plan.splits[n].ranks if n in plan.splits else (plan.owners[n],))]
        held = held or open_  # nothing left to split on the busiest rank: free LPT room with the largest elsewhere
        if not held:
            break
        pick = max(held, key=lambda n: (plan.splits[n].option.cost, cost_of[n][1]) if n in plan.splits else cost_of[n])
        level[pick] = level.get(pick, 0) + 1
        plan = _assign(items, num_ranks, method, initial_flops,
                       {n: options[n][lv - 1] for n, lv in level.items()})
        if plan.imbalance < best.imbalance:
            best = plan
    return best


def _assign(items: Sequence[PlanItem], num_ranks: int, method: str, initial_flops: Sequence[float] | None,
            split: dict[str, SplitOption]) -> OwnershipPlan:
    """One assignment (``plan_ownership``); ``split`` maps item names to the option they are split with."""
    flops = [0.0] * num_ranks if initial_flops is None else [float(f) for f in initial_flops]
    nbytes = [0] * num_ranks
    owners: dict[str, int] = {}
    splits: dict[str, SplitPlacement] = {}

    def place(it: PlanItem, r: int) -> None:
        owners[it.name] = r
        flops[r] += it.cost
        nbytes[r] += it.nbytes

    for it in items:
        if it.pinned_rank is not None:
            place(it, it.pinned_rank)
    costed = [it for it in items if it.pinned_rank is None and it.cost > 0]
    if split:  # LPT by per-member cost; a split item takes the least-loaded aligned block
        each = [split[it.name].cost if it.name in split else it.cost for it in costed]
        for i in sorted(range(len(costed)), key=lambda i: (-each[i], i)):
            it = costed[i]
            if it.name not in split:
                place(it, min(range(num_ranks), key=lambda r: (flops[r], r)))
                continue
            opt = split[it.name]
            k = opt.ways
            b = min(range(num_ranks // k), key=lambda b: (max(flops[b * k:(b + 1) * k]), b))
            ranks = tuple(range(b * k, (b + 1) * k))
            for r in ranks:
                flops[r] += opt.cost
                nbytes[r] += it.nbytes // k
            owners[it.name] = ranks[0]
            splits[it.name] = SplitPlacement(ranks=ranks, option=opt)
    else:
        if method == "lpt":
            bins = lpt_assign([it.cost for it in costed], num_ranks, initial_loads=flops)
        elif method == "round_robin":
            bins = round_robin_assign([it.shape for it in costed], num_ranks)
        else:
            bins = ping_pong_assign([it.numel for it in costed], num_ranks)
        for it, r in zip(costed, bins, strict=True):
            place(it, r)
    rest = [it for it in items if it.pinned_rank is None and it.cost <= 0]
    for it, r in zip(rest, lpt_assign([float(it.nbytes) for it in rest], num_ranks, initial_loads=nbytes),
                     strict=True):
        place(it, r)
    return OwnershipPlan(num_ranks=num_ranks, method=method, owners=owners, flops=flops, nbytes=nbytes,
                         items=list(items), splits=splits)
