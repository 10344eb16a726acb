"""Split ownership (issue 15): a matrix too large for whole-tensor LPT is orthogonalized by a block of DP ranks.

A model with one matrix three times as costly as the others: at DP=4 whole-tensor LPT leaves NS load max/mean
1.33; with ``ns_split_target=1.2`` the whole-tensor optimizer splits that matrix over ranks (0, 1) (the plan says so, and the run
does it), and the updates equal whole-tensor ownership and the single-process optimizer within the fp32 spread of
DP=4 (test_layerwise_optimizer's ``reorder_spread``). Checkpoints hold whole tensors, so a run split at DP=4
resumes at DP=2 (where LPT alone reaches the target: no split) and one at DP=2 resumes split at DP=4, each
continuing the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nemo_muon.accounting.ns_split import split_options
from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.layerwise.checkpoint import load_checkpoint, save_checkpoint, step_dir
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer
from nemo_muon.layerwise.pieces import make_piece
from nemo_muon.optim import build_optimizer
from nemo_muon.optim.routing import GateUpLayout, QKVLayout, Route
from tests.distributed import run_distributed
from tests.test_layerwise_optimizer import max_rel_diff, portable, tensors

VOCAB, DIM, WIDE, SMALL, BATCH, SEQ, STEPS = 32, 16, 64, 6, 8, 6, 3
TARGET = 1.2


class OneBigMatrixLM(nn.Module):
    """Six DIM x DIM matrices and one (WIDE, DIM) matrix costing three times one of them (plus AdamW tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.small = nn.ModuleList(nn.Linear(DIM, DIM, bias=False) for _ in range(SMALL))
        self.wide = nn.Linear(DIM, WIDE, bias=False)
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(tokens)
        for layer in self.small:
            h = h + torch.tanh(layer(h))
        h = h + torch.tanh(self.wide(h)).unflatten(-1, (WIDE // DIM, DIM)).mean(-2)
        return self.lm_head(self.norm(h))


def _model() -> OneBigMatrixLM:
    torch.manual_seed(0)
    return OneBigMatrixLM()


def _batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x.chunk(world)[rank], y.chunk(world)[rank]


def _train(model: nn.Module, opt: Any, start: int, stop: int, rank: int, world: int, micro: int = 1) -> None:
    for s in range(start, stop):
        opt.zero_grad()
        for m in range(micro):
            x, y = _batch(s, rank * micro + m, world * micro)
            (F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)) / micro).backward()
        opt.step()


def _cfg(target: float | None) -> MuonConfig:
    return MuonConfig(lr=2e-2, weight_decay=0.1, ns_split_target=target)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _reference(micro: int) -> dict[str, torch.Tensor]:
    model = _model()
    _train(model, build_optimizer(_cfg(None), list(model.named_parameters())), 0, STEPS, 0, 1, micro)
    return _params(model)


def _run_body(rank: int, world: int, group: Any, target: float | None) -> dict[str, Any]:
    model = _model()
    opt = WholeTensorOptimizer(model, _cfg(target), dp_group=group, bucket_size_mb=0.002,
                                        overlap_param_gather=True)
    _train(model, opt, 0, STEPS, rank, world)
    opt.finish_param_gather()
    plan = opt.plans[0]
    return portable({"params": _params(model), "imbalance": plan.imbalance, "flops": plan.flops,
                     "splits": {n: list(sp.ranks) for n, sp in plan.splits.items()},
                     "split_keys": opt.split_keys, "state_names": opt.state_names,
                     "comm": opt.comm_bytes_per_step()})


def test_split_matches_whole_tensor_and_single_process_at_dp4() -> None:
    whole = tensors(run_distributed(_run_body, world_size=4, args=(None,), timeout_s=150))
    split = tensors(run_distributed(_run_body, world_size=4, args=(TARGET,), timeout_s=150))
    assert whole[0]["splits"] == {} and whole[0]["imbalance"] > 1.3  # LPT alone cannot place the wide matrix
    assert split[0]["splits"] == {"wide.weight": [0, 1]}  # split over 2 ranks, as planned
    assert split[0]["imbalance"] <= TARGET < whole[0]["imbalance"]
    assert [r["split_keys"] for r in split] == [["wide.weight[split 0/2]"], ["wide.weight[split 1/2]"], [], []]
    assert "wide.weight" in split[0]["state_names"] and "wide.weight" not in split[2]["state_names"]
    refs = [_reference(m) for m in (1, 2, 4)]  # the single-process optimizer's own spread under reordering
    spread = max(max_rel_diff(a, b) for a in refs for b in refs)
    tol = max(1e-6, 2 * spread)
    for r in split:
        assert all(torch.equal(r["params"][n], split[0]["params"][n]) for n in r["params"])  # replicas identical
        assert max_rel_diff(r["params"], refs[2]) <= tol
        assert max_rel_diff(r["params"], whole[0]["params"]) <= tol
    assert not torch.equal(split[0]["params"]["wide.weight"], whole[0]["params"]["wide.weight"])  # really split


def _save_body(rank: int, world: int, group: Any, root: str, stop: int) -> dict[str, list[int]]:
    model = _model()
    opt = WholeTensorOptimizer(model, _cfg(TARGET), dp_group=group, bucket_size_mb=0.002)
    _train(model, opt, 0, stop, rank, world)
    save_checkpoint(root, stop, model, opt, {"step": stop}, group)
    return {n: list(sp.ranks) for n, sp in opt.plans[0].splits.items()}


def _resume_body(rank: int, world: int, group: Any, root: str, start: int) -> dict[str, Any]:
    model = _model()
    opt = WholeTensorOptimizer(model, _cfg(TARGET), dp_group=group, bucket_size_mb=0.002)
    load_checkpoint(step_dir(root, start), model, opt, group)
    _train(model, opt, start, STEPS, rank, world)
    opt.finish_param_gather()
    return portable({"params": _params(model), "splits": {n: list(sp.ranks) for n, sp in opt.plans[0].splits.items()}})


@pytest.mark.parametrize(("saved_at", "resumed_at"), [(4, 2), (2, 4)])
def test_split_checkpoint_resumes_at_another_dp_size(tmp_path: Path, saved_at: int, resumed_at: int) -> None:
    root = str(tmp_path / "ckpt")
    saved = run_distributed(_save_body, world_size=saved_at, args=(root, 2), timeout_s=150)
    resumed = tensors(run_distributed(_resume_body, world_size=resumed_at, args=(root, 2), timeout_s=150))
    # split at DP=4, whole at DP=2 (LPT reaches the target there): the checkpoint crosses both ways
    assert (saved[0], resumed[0]["splits"]) == (({"wide.weight": [0, 1]}, {}) if saved_at == 4 else
                                                ({}, {"wide.weight": [0, 1]}))
    refs = [_reference(m) for m in (1, 2, 4)]
    tol = max(1e-6, 2 * max(max_rel_diff(a, b) for a in refs for b in refs))
    for r in resumed:
        assert max_rel_diff(r["params"], refs[2]) <= tol


def test_pieces_follow_megatron_tensor_parallel_shards() -> None:
    """A fused gate/up slice is [gate slice; up slice]; a fused QKV slice is whole query groups; columns are a block;
    the slices of all members put back together give the tensor."""
    t = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4)
    gate_up = [make_piece("mlp.linear_fc1.weight", (8, 4), Route("matrix", GateUpLayout()), 0, j, 2) for j in (0, 1)]
    assert gate_up[0].ranges == ((0, 2), (4, 6)) and gate_up[1].ranges == ((2, 4), (6, 8))
    qkv = QKVLayout(num_attention_heads=2, num_query_groups=2, head_dim=1)  # per group q, k, v: 1 + 1 + 1 rows
    pieces = [make_piece("attn.linear_qkv.weight", (6, 4), Route("matrix", qkv), 0, j, 2) for j in (0, 1)]
    assert pieces[1].ranges == ((3, 6),)
    cols = [make_piece("w", (8, 4), Route("matrix"), 1, j, 4) for j in range(4)]
    rebuilt = torch.zeros_like(t)
    for p in gate_up:
        p.write(rebuilt, p.read(t))
    assert torch.equal(rebuilt, t)
    assert torch.equal(torch.cat([p.read(t) for p in cols], dim=1), t)
    with pytest.raises(ValueError, match="ways"):
        make_piece("attn.linear_qkv.weight", (6, 4), Route("matrix", qkv), 0, 0, 4)  # 2 groups over 4 ranks


def test_split_options_cost_and_bytes() -> None:
    """Along the long side the m²n terms split and the m³ terms repeat; a short-side-only split gains nothing."""
    (two, four, eight) = split_options([(64, 16)], steps=5)
    assert (two.ways, two.dim) == (2, 0)
    assert two.cost == 5 * 4 * 16 * 16 * 64 / 2 + 5 * 2 * 16**3
    assert two.extra_bytes == 2 * 0.5 * (5 * 16 * 16 + 1) * 4  # the Gram all-reduces, ring model, fp32
    assert two.cost > four.cost > eight.cost
    assert split_options([(16, 16)], steps=5)[0].cost < 5 * (4 + 2) * 16**3  # square: either side is the long side
    assert split_options([(3, 5)]) == ()  # nothing divides


def test_recipes_split_where_the_optimizer_executes_it() -> None:
    """The torch backend takes ``optimizer.ns_split_target`` (and ``nemo-muon plan`` prints the split it executes);
    Kimi K2's split recipe opts in (the default recipe stays on Megatron's wiring, whole tensors); the megatron backend
    refuses it, naming the field, with Megatron's own Muon, without ``collectives='reduce_scatter'`` on
    Megatron-Core >= 0.18, or on a Bridge whose DDP wrap nemo-muon does not lay out."""
    from nemo_muon.recipes.execute import build_recipe

    from nemo_muon.accounting.planner import plan_recipe
    from nemo_muon.megatron.shared.recipe_rules import check_wiring

    tiny = build_recipe("tiny_kimi_k2_muon", ["optimizer.ns_split_target=1.02"])
    split = plan_recipe(tiny, 4)["ns_split"]
    assert split["executed"] is True and split["target"] == 1.02
    assert plan_recipe(build_recipe("tiny_kimi_k2_muon"), 4)["ns_split"]["executed"] is False
    default = build_recipe("kimi_k2_muon")
    assert default.optimizer.ns_split_target is None and default.optimizer.collectives == "all_reduce"
    shipped = build_recipe("kimi_k2_muon_split")
    assert shipped.optimizer.ns_split_target == 1.02 and shipped.optimizer.collectives == "reduce_scatter"
    plan = plan_recipe(shipped)
    assert plan["ns_split"]["executed"] is True and plan["ns_imbalance_within_stage_max"] <= 1.02
    assert plan["ns_split"]["extra_bytes_per_rank_max"] > 0
    with pytest.raises(ValueError, match=r"ns_split_target must be None unless the run uses optimizer.engine='nemo_muon'"
                                         r".*got 1.02"):
        build_recipe("kimi_k2_muon_split", ["optimizer.engine=megatron", "optimizer.collectives=all_reduce"])
    with pytest.raises(ValueError, match=r"collectives='reduce_scatter' needs, on Megatron-Core 0.20.0, a Megatron-Bridge "
                                         r"whose DDP wrap nemo-muon lays out .*a test stack has Bridge 0.7.0"):
        check_wiring(shipped, "0.20.0", "0.7.0", "a test stack")
    check_wiring(shipped, "0.18.2", "0.5.1", "a test stack")  # routed to the cost layout: taken
    check_wiring(shipped, "0.16.0", "0.3.0", "a test stack")  # 0.16: inside the layer-wise optimizer
    whole_wiring = shipped.replace(optimizer=dataclasses.replace(shipped.optimizer, collectives="all_reduce"))
    check_wiring(whole_wiring, "0.17.1", "0.4.2", "a test stack")
    with pytest.raises(ValueError, match=r"unless the run uses optimizer.collectives='reduce_scatter' on Megatron-Core "
                                         r"0.19.2 .*got 1.02"):
        check_wiring(whole_wiring, "0.19.2", "0.6.2", "a test stack")
    with pytest.raises(ValueError, match=r"muon.ns_split_target must be a number in \[1.0, inf\); got 0.9"):
        build_recipe("tiny_kimi_k2_muon", ["optimizer.ns_split_target=0.9"])
