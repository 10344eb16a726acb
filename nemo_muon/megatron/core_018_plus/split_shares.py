"""Split ownership on Megatron-Core >= 0.18: our Muon's block shares of the matrices the cost layout split.

`nemo_muon.megatron.core_018_plus.split_plan` plans the stage's layer-wise matrices with ``ns_split_target`` (as ``nemo-muon plan``
does) and `nemo_muon.megatron.core_018_plus.cost_layout` puts a split matrix whole in its block's first rank's shard: that rank owns
it in Megatron's layer-wise optimizer (its reduced gradient, fp32 master and momentum). `attach_split_shares`
gives every member of the block its share (`SplitShare` with ``first_holds``): the first member's on the master it
steps, the others' on the model parameter their optimizer routes but does not step. At each step the first member
scatters the NS input's slices, the block orthogonalizes them together and the first member gathers the update
(`nemo_muon.optim.split_exchange`); everything else (param all-gather, checkpoints, gradient norm) stays Megatron's,
since only the owner holds the matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _masters(wrapper: Any) -> dict[Any, Any]:
    """Model parameter -> the fp32 master copy the wrapper steps in its place (bf16 training; empty in fp32)."""
    return {old: new for olds, news in zip(getattr(wrapper, "float16_groups", []),
                                           getattr(wrapper, "fp32_from_float16_groups", []), strict=True)
            for old, new in zip(olds, news, strict=True)}


def attach_split_shares(optimizer: Any, model_chunks: Sequence[Any], pg_collection: Any, target: float) -> int:
    """Give our Muon inside ``optimizer`` (built by Megatron's builder over DDP's layout) the block share of each
    matrix the layout split, on this rank's blocks of ``pg_collection.dp_cp``; returns how many this rank takes
    part in. Raises, naming ``ns_split_target``, unless the model was tagged and laid out with ``target``."""
    from megatron.core.utils import get_pg_rank, get_pg_size

    from nemo_muon.layerwise.split_groups import every_block_group
    from nemo_muon.megatron.core_018_plus.cost_layout import is_layer_wise_matrix
    from nemo_muon.megatron.core_018_plus.split_plan import planned_owner
    from nemo_muon.megatron.shared.engine import ours_in
    from nemo_muon.optim.muon import Muon, SplitShare

    matrices = [p for chunk in model_chunks for p in chunk.parameters() if p.requires_grad and is_layer_wise_matrix(p)]
    plans = [planned_owner(p) for p in matrices]
    requests = {None if o is None else o.stage.target for o in plans}
    if matrices and requests != {target}:
        raise ValueError(f"optimizer.ns_split_target={target!r} needs DDP built on the cost layout planned with it "
                         "(nemo_muon.megatron.core_018_plus.cost_layout.wrap_with_cost_layout, or Megatron-Bridge 0.5 / 0.6 "
                         f"through nemo_muon.megatron.bridge_05_06.layout); the model's layer-wise matrices ask for "
                         f"{sorted(map(str, requests))}")
    pg = pg_collection.dp_cp
    if get_pg_size(pg) == 1:
        return 0
    rank = get_pg_rank(pg)
    splits = [(p, o.split) for p, o in zip(matrices, plans, strict=True) if o.split is not None]
    blocks = every_block_group(pg, rank)  # alike on every rank (pipeline stages split differently)
    muons = [(raw, _masters(wrapper)) for wrapper, raw in ours_in(optimizer, Muon)]
    taken = 0
    for p, split in splits:
        if rank not in split.ranks:
            continue
        index = split.ranks.index(rank)
        share = SplitShare(blocks[split.ranks], index, split.ways, split.dim, first_holds=True)
        for raw, masters in muons:
            key = masters.get(p, p)
            if raw.name_of(key) is not None:
                raw.share_split(key, share)
                taken += 1
                break
        else:
            raise RuntimeError(f"split matrix of shape {tuple(p.shape)} (dp_cp ranks {split.ranks}) is routed by no "
                               "Muon of ours in the optimizer Megatron built")
    return taken
