"""Process groups and state of split ownership: the blocks of DP ranks that orthogonalize one matrix together.

A plan's splits use aligned blocks of its DP group (ranks ``b·k .. b·k + k - 1`` for ``k`` ways). `block_groups`
creates, for each ``k`` the plan uses (ascending), the block holding this rank: one group per ``k`` on every rank,
created by the block's members only (``use_local_synchronization``), so ranks outside the DP group take no part and
every rank's group counter advances equally. `gather_whole` reassembles a split tensor's state from its members'
slices (every member calls it; the whole is returned on all), so checkpoints hold whole tensors and load at any DP
size, with or without splits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from nemo_muon.accounting.ownership_plan import OwnershipPlan
from nemo_muon.layerwise.pieces import Piece


def block_groups(plan: OwnershipPlan, dp_group: dist.ProcessGroup,
                 rank: int) -> dict[tuple[int, ...], dist.ProcessGroup]:
    """The block groups this rank (``rank`` in ``dp_group``) belongs to, by their DP-group ranks (module doc)."""
    return block_groups_of_ways({sp.option.ways for sp in plan.splits.values()}, dp_group, rank)


def block_groups_of_ways(ways: Iterable[int], dp_group: dist.ProcessGroup,
                         rank: int) -> dict[tuple[int, ...], dist.ProcessGroup]:
    """For each block size in ``ways`` (every rank of ``dp_group`` must pass the same), the aligned block holding
    this rank (``rank`` in ``dp_group``), by its DP-group ranks."""
    out: dict[tuple[int, ...], dist.ProcessGroup] = {}
    for k in sorted(set(ways)):
        ranks = tuple(range(rank // k * k, rank // k * k + k))
        members = [dist.get_global_rank(dp_group, r) for r in ranks]
        out[ranks] = dist.new_group(members, use_local_synchronization=True)
    return out


def every_block_group(dp_group: dist.ProcessGroup, rank: int) -> dict[tuple[int, ...], dist.ProcessGroup]:
    """`block_groups_of_ways` for every block size a plan over ``dp_group`` could use (``SPLIT_WAYS`` dividing its
    size): the same groups on every rank whatever each pipeline stage's plan splits, so group counters stay alike."""
    from nemo_muon.accounting.ns_split import SPLIT_WAYS

    size = dist.get_world_size(dp_group)
    return block_groups_of_ways([k for k in SPLIT_WAYS if size % k == 0], dp_group, rank)


def gather_whole(piece_value: torch.Tensor, pieces: Sequence[Piece], like: torch.Tensor,
                 group: dist.ProcessGroup) -> torch.Tensor:
    """The whole tensor (shaped and typed like ``like``) from every member's slice (``pieces`` in member order)."""
    parts = [torch.empty_like(piece_value) for _ in pieces]
    dist.all_gather(parts, piece_value.contiguous(), group=group)
    whole = torch.empty(like.shape, dtype=piece_value.dtype, device=piece_value.device)
    for piece, part in zip(pieces, parts, strict=True):
        piece.write(whole, part)
    return whole
