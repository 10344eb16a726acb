"""Split Newton–Schulz where the block's first member alone holds the matrix (`SplitShare.first_holds`: Megatron-Core
>= 0.18's reduce-scatter layout, where the owner has the reduced gradient and the momentum): the owner scatters the NS
input's slices, every member orthogonalizes its slice with the block, the owner gathers the update. Checked on gloo
against one process's Muon on the same gradients: blocks of 2 and 4 ranks sharing ranks, a row and a column split, a
fused QKV matrix split per part, a matrix no one helps with, and a rank that holds no matrix at all."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from nemo_muon.optim.muon import Muon, SplitShare
from tests.distributed import run_distributed

LR, STEPS = 0.02, 3
SHAPES = {"layers.0.self_attention.linear_qkv.weight": (96, 32), "layers.0.mlp.linear_fc2.weight": (32, 48),
          "layers.1.self_attention.linear_proj.weight": (32, 32), "layers.1.mlp.linear_fc2.weight": (16, 16)}
QKV = {"num_attention_heads": 4, "num_query_groups": 4, "head_dim": 8}
# name -> (holder, split: (block ranks, dim) or None), at DP=4 and DP=2
PLACEMENT = {
    4: {"layers.0.self_attention.linear_qkv.weight": (0, ((0, 1, 2, 3), 0)),
        "layers.0.mlp.linear_fc2.weight": (2, ((2, 3), 1)),
        "layers.1.self_attention.linear_proj.weight": (0, ((0, 1), 0)),
        "layers.1.mlp.linear_fc2.weight": (1, None)},
    2: {"layers.0.self_attention.linear_qkv.weight": (0, ((0, 1), 0)),
        "layers.0.mlp.linear_fc2.weight": (0, ((0, 1), 1)),
        "layers.1.self_attention.linear_proj.weight": (0, None),
        "layers.1.mlp.linear_fc2.weight": (0, ((0, 1), 1))},
}


def _params() -> dict[str, torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.nn.Parameter(torch.randn(s, generator=g) * 0.1) for n, s in SHAPES.items()}


def _grads(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def _muon(params: dict[str, torch.nn.Parameter]) -> Muon:
    from nemo_muon.optim.routing import QKVLayout

    return Muon(list(params.items()), lr=LR, weight_decay=0.1, split_qkv=True,
                fused_layouts={"linear_qkv": QKVLayout(**QKV)})


def _split_rank(rank: int, world_size: int, group: Any) -> dict[str, Any]:
    from nemo_muon.layerwise.split_groups import block_groups_of_ways

    placement = PLACEMENT[world_size]
    params = _params()
    muon = _muon(params)
    held = {n for n, (holder, _) in placement.items() if holder == rank}
    for g in muon.param_groups:  # Megatron's narrowing: the groups keep the params this rank owns
        g["params"] = [p for p in g["params"] if muon.name_of(p) in held]
    ways = sorted({len(s[0]) for _, s in placement.values() if s is not None})
    blocks = block_groups_of_ways(ways, group, rank)
    for name, (_, split) in placement.items():
        if split is not None and rank in split[0]:
            ranks, dim = split
            muon.share_split(params[name], SplitShare(blocks[ranks], ranks.index(rank), len(ranks), dim,
                                                      first_holds=True))
    helps = muon.takes_part_without_updates()
    for step in range(STEPS):
        grads = _grads(step)
        for name in held:
            params[name].grad = grads[name]
        muon.step()
    return {"held": {n: params[n].detach().numpy().copy() for n in held}, "helps": helps,
            "untouched": all(torch.equal(params[n], _params()[n]) for n in SHAPES if n not in held)}


def _reference() -> dict[str, torch.Tensor]:
    params = _params()
    muon = _muon(params)
    for step in range(STEPS):
        for name, grad in _grads(step).items():
            params[name].grad = grad
        muon.step()
    return {n: p.detach().clone() for n, p in params.items()}


@pytest.mark.parametrize("world_size", [2, 4])
def test_first_member_holds_the_matrix_and_the_block_orthogonalizes_it_as_one_process_does(world_size):
    ranks = run_distributed(_split_rank, world_size=world_size, timeout_s=120)
    expected = _reference()
    got = {n: torch.from_numpy(t) for r in ranks for n, t in r["held"].items()}
    assert set(got) == set(SHAPES)  # every matrix updated by its holder, once
    start = _params()
    for name, tensor in got.items():
        moved = (expected[name] - start[name]).abs().max()
        assert moved > 0.01 * LR
        # the distributed NS sums its Gram matrices in another order: fp32 rounding of the update only
        assert (tensor - expected[name]).abs().max() <= 1e-4 * moved, name
    assert all(r["untouched"] for r in ranks)  # helpers hold no copy to update
    helpers = [r["helps"] for r in ranks]
    assert helpers == ([False, True] if world_size == 2 else [False, True, True, True])
    if world_size == 4:
        assert ranks[3]["held"] == {}  # rank 3 holds no matrix and still steps with its blocks


def _refusals(rank: int, world_size: int, group: Any) -> list[str]:
    params = _params()
    muon = _muon(params)
    errors = []
    try:
        muon.share_split(params["layers.0.mlp.linear_fc2.weight"], SplitShare(group, rank, 3, 0, first_holds=True))
    except ValueError as err:
        errors.append(str(err))
    muon.share_split(params["layers.1.self_attention.linear_proj.weight"], SplitShare(group, rank, 2, 0,
                                                                                       first_holds=True))
    params["layers.0.mlp.linear_fc2.weight"].grad = torch.ones(SHAPES["layers.0.mlp.linear_fc2.weight"])
    try:  # the holder has no gradient for its split matrix: it refuses before any collective
        muon.step() if rank == 0 else None
    except RuntimeError as err:
        errors.append(str(err))
    dist.barrier(group)
    return errors


def test_a_share_that_does_not_divide_or_a_held_split_matrix_without_gradient_is_refused_by_name():
    errors = run_distributed(_refusals, world_size=2, timeout_s=60)[0]
    assert "dim 0 of 'layers.0.mlp.linear_fc2.weight' (32, 48) must divide into ways=3" in errors[0]
    assert "'layers.1.self_attention.linear_proj.weight' has no gradient this step" in errors[1]
