"""Megatron-Core >= 0.18's layer-wise parameter layout with ownership by update cost
(`nemo_muon.megatron.core_018_plus.cost_layout`), on the tiny Kimi K2 model with our Muon, against the legacy wiring (DDP
all-reduce, then the layer-wise optimizer's uneven all-gather) and Megatron's own numel layout: the bytes each rank
sends per step, the fp32 masters after a step, DP replicas, and the update cost each rank owns against the plan.
On Megatron-Core 0.16 / 0.17 the layout API is absent and the module refuses, naming what is missing."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import numpy as np
import pytest

from nemo_muon.megatron.core_018_plus.cost_layout import layout_api_problems
from tests.distributed import run_distributed
from tests.megatron_cpu.layout_training import train_with_layout
from tests.megatron_cpu.test_megatron_training import MASTER_TOLERANCE
from tests.megatron_cpu.test_megatron_training import _all_masters as _masters

MCORE = importlib.metadata.version("megatron-core")
BYTES_RATIO = 0.70
"""Largest bytes sent per rank per step on the reduce-scatter layout, relative to the legacy path's: gradients
reduce-scattered ((n-1)/n of the buffer) and parameters all-gathered, where the legacy path all-reduces the
gradients (2 (n-1)/n) and all-gathers the parameters; with bf16 gradients 2/3, measured 0.6676 (DP=2) and 0.6715
(DP=4, with 1.3% padding) on 0.19.2."""


def test_an_older_megatron_core_is_refused_naming_what_it_lacks():
    from nemo_muon.megatron.core_018_plus.cost_layout import check_layout_api

    problems = layout_api_problems()
    if MCORE.startswith(("0.16.", "0.17.")):
        assert "DistributedDataParallel(full_param_layout=...)" in problems or problems[0].startswith("an import")
        with pytest.raises(RuntimeError, match=rf"needs Megatron-Core >= 0.18; installed megatron-core {MCORE} lacks"):
            check_layout_api()
    else:
        assert problems == []
        check_layout_api()


@pytest.mark.parametrize("world_size, timeout_s", [(2, 200), (4, 300)])
def test_cost_layout_sends_two_thirds_of_the_legacy_bytes_with_the_same_masters(world_size, timeout_s):
    if layout_api_problems():  # Megatron-Core 0.16 / 0.17: refused (above); their layer-wise path is the legacy one
        assert MCORE.startswith(("0.16.", "0.17."))
        return
    fp32 = world_size > 2  # DP=4 sums 4 gradients, in another order per owner: compare in fp32
    args = ("muon", fp32)
    legacy = run_distributed(train_with_layout, world_size=world_size, args=("tiny_kimi_k2", "legacy", 1, *args),
                             timeout_s=timeout_s)
    cost = run_distributed(train_with_layout, world_size=world_size, args=("tiny_kimi_k2", "cost", 1, *args),
                           timeout_s=timeout_s)
    assert not legacy[0]["use_distributed_optimizer"] and cost[0]["use_distributed_optimizer"]
    assert "MegatronMuon" in cost[0]["optimizers"] and "DistributedOptimizer" in cost[0]["optimizers"]
    for ours, theirs in zip(cost, legacy, strict=True):  # every rank sends the same bytes on each path
        assert "reduce_scatter_tensor" in ours["sent_by_kind"] and "all_reduce" in theirs["sent_by_kind"]
        limit = BYTES_RATIO if not fp32 else 0.62  # fp32 gradients: 3/5 (the param gather stays bf16)
        assert ours["sent_last_step"] <= limit * theirs["sent_last_step"], (ours["sent_by_kind"],
                                                                            theirs["sent_by_kind"])
    for run in (legacy, cost):
        assert run[0]["replica_max_diff"] == 0.0
    assert legacy[0]["losses"] == cost[0]["losses"]
    expected, got = _masters(legacy), _masters(cost)
    matrices = sorted(got)
    assert matrices and set(matrices) <= set(expected)  # the cost layout's masters: the matrices (Adam's: DistOpt)
    worst = max(float(np.abs(expected[n] - got[n]).max()) for n in matrices)
    assert worst <= MASTER_TOLERANCE, worst
    if world_size == 2:  # two bf16 gradients sum alike in either collective: bit for bit
        assert worst == 0.0


def test_without_clipping_the_cost_layout_trains_bit_for_bit_as_the_legacy_path():
    """Four steps at DP=2, clipping off: the same losses and the same matrix masters, bit for bit. With clipping the
    paths part after the first step by one fp32 ulp of the clipping norm (the legacy layer-wise optimizer sums it
    over whole owned parameters, the chained one over its distributed optimizer's element slices), which the tiny
    bf16 MoE model amplifies; so a stale parameter, a wrong scale or a different Adam would show here."""
    if layout_api_problems():
        assert MCORE.startswith(("0.16.", "0.17."))
        return
    args = (4, "muon", False, 0.0)
    legacy = run_distributed(train_with_layout, world_size=2, args=("tiny_kimi_k2", "legacy", *args), timeout_s=240)
    cost = run_distributed(train_with_layout, world_size=2, args=("tiny_kimi_k2", "cost", *args), timeout_s=240)
    assert len(cost[0]["losses"]) == 4 and legacy[0]["losses"] == cost[0]["losses"]
    expected, got = _masters(legacy), _masters(cost)
    assert got and max(float(np.abs(expected[n] - got[n]).max()) for n in got) == 0.0
    assert cost[0]["replica_max_diff"] == 0.0


@pytest.mark.parametrize("world_size, timeout_s", [(4, 300)])
def test_each_rank_owns_the_planned_update_cost_better_balanced_than_megatrons_layout(world_size, timeout_s):
    if layout_api_problems():
        assert MCORE.startswith(("0.16.", "0.17."))  # refused above; 0.16 plans by cost in its own optimizer
        return
    cost = run_distributed(train_with_layout, world_size=world_size, args=("tiny_kimi_k2", "cost", 1),
                           timeout_s=timeout_s)
    megatron = run_distributed(train_with_layout, world_size=world_size, args=("tiny_kimi_k2", "megatron", 1),
                               timeout_s=timeout_s)
    loads = cost[0]["owned_costs"]  # what Megatron's layer-wise optimizer derived from the layout DDP holds
    assert all(r["owned_costs"] == loads and r["plan_loads"] == loads for r in cost)  # = the plan, on every rank
    theirs = megatron[0]["owned_costs"]
    assert sum(loads) == pytest.approx(sum(theirs))  # the same matrices, owned differently
    ours_ratio = max(loads) / (sum(loads) / len(loads))
    their_ratio = max(theirs) / (sum(theirs) / len(theirs))
    assert ours_ratio <= their_ratio and ours_ratio <= 1.01, (ours_ratio, their_ratio)
    assert cost[0]["padding"] <= 0.02, cost[0]["padding"]  # the byte tie rule keeps the shards close
    assert cost[0]["replica_max_diff"] == 0.0


def test_split_ownership_on_the_cost_layout_resumes_from_a_checkpoint_bit_for_bit(tmp_path):
    """DP=4, target 1.0 (blocks of 2 and 4): Megatron's ``dist_checkpointing`` save after step 1 and a resume give
    steps 2 and 3 bit for bit, losses and masters: a split matrix's master and momentum live with its block's first
    rank alone, checkpointed as whole-tensor ownership's are, and the block shares are attached again at build."""
    from tests.megatron_cpu.training import train_tiny

    if layout_api_problems():
        assert MCORE.startswith(("0.16.", "0.17."))  # 0.16's split resume: test_megatron_training.py
        return
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tail = ("builder", False, True, 1.0, "cost")  # build, fp32 grads, with masters, split target, layout
    straight = run_distributed(train_tiny, world_size=4, args=("tiny_kimi_k2", "muon", 3, (), str(ckpt), 1, None,
                                                               *tail), timeout_s=400, daemon=False)
    resumed = run_distributed(train_tiny, world_size=4, args=("tiny_kimi_k2", "muon", 2, (), str(ckpt), None, 1,
                                                              *tail), timeout_s=400, daemon=False)
    assert straight[0]["split"] and resumed[0]["split"] == straight[0]["split"]
    assert resumed[0]["losses"] == straight[0]["losses"][1:]
    expected, got = _masters(straight), _masters(resumed)
    assert got.keys() == expected.keys() and all(np.array_equal(expected[n], got[n]) for n in got)
    assert resumed[0]["replica_max_diff"] == 0.0


@pytest.mark.parametrize("world_size, timeout_s", [(4, 400)])  # blocks of 2 and 4 ranks
def test_split_ownership_on_the_cost_layout_is_the_plan_and_trains_as_whole_tensor_ownership(world_size, timeout_s):
    """Megatron-Core >= 0.18 with ``ns_split_target`` (issue 25): the cost layout puts each matrix the plan splits
    whole in its block's first rank's shard (that rank alone holds it); the block orthogonalizes it together. The
    splits and each rank's update cost are the ones ``nemo-muon plan`` computes for this model and DP size, every
    rank runs at most the target over the mean, the masters after a step equal whole-tensor ownership's within
    the distributed NS's fp32 rounding, replicas stay identical, and the bytes the split adds (the scatter of the
    NS input, the gather of the update, the Gram all-reduces) are counted."""
    from nemo_muon.accounting.model_ownership import model_plan
    from nemo_muon.models.specs import get_model_spec
    from tests.megatron_cpu.training import optimizer_config

    if layout_api_problems():
        assert MCORE.startswith(("0.16.", "0.17."))  # 0.16 / 0.17 split in their own optimizer (test_megatron_training)
        return
    target = 1.0  # as many splits as help: the largest matrices split on the tiny model
    args = (1, "muon", True, 0.0)  # one step, fp32 gradients, no clipping: the paths differ by the split's NS only
    whole = run_distributed(train_with_layout, world_size=world_size, args=("tiny_kimi_k2", "cost", *args),
                            timeout_s=timeout_s)
    split = run_distributed(train_with_layout, world_size=world_size,
                            args=("tiny_kimi_k2", "cost", *args, target), timeout_s=timeout_s)
    splits = split[0]["splits"]
    assert splits and whole[0]["splits"] == {}
    assert all(r["splits"] == splits for r in split)
    muon = optimizer_config("muon")
    planned = model_plan(get_model_spec("tiny_kimi_k2"), dp=world_size, balance_target=target, ns_steps=muon.ns_steps,
                         split_gate_up=muon.split_gate_up, split_qkv=muon.split_qkv, split_gather_update=True)
    stage = planned.stages[0]
    assert {n[n.index("decoder."):]: r for n, r in splits.items()} == {n: list(sp.ranks)
                                                                       for n, sp in stage.splits.items()}
    loads = split[0]["owned_costs"]  # Megatron's ownership from the layout, each split matrix at its member cost
    assert all(r["owned_costs"] == loads and r["plan_loads"] == loads for r in split)
    assert loads == pytest.approx(stage.flops, rel=1e-12)
    assert max(loads) / (sum(loads) / len(loads)) < max(whole[0]["owned_costs"]) / (
        sum(whole[0]["owned_costs"]) / world_size)
    for run in (whole, split):
        assert run[0]["replica_max_diff"] == 0.0
    expected, got = _masters(whole), _masters(split)
    assert sorted(got) == sorted(expected)
    assert split[0]["losses"] == whole[0]["losses"]
    for name in splits:
        assert name in got  # held by one rank, the block's first
    worst = max(float(np.abs(expected[n] - got[n]).max()) for n in got)
    assert worst <= MASTER_TOLERANCE, worst
    for ours, theirs in zip(split, whole, strict=True):
        kinds = ours["sent_by_kind"]
        assert "scatter" in kinds and "gather" in kinds, kinds
        extra = ours["sent_last_step"] - theirs["sent_last_step"]
        assert extra > 0


def _split_on_megatrons_layout(rank: int, world_size: int, group: Any) -> str:
    from tests.megatron_cpu.training import megatron_parallel, replica

    with megatron_parallel():
        try:
            replica("tiny_kimi_k2", "muon", layout="megatron", split_target=1.0)
        except ValueError as err:
            return str(err)
    return "built"


def test_a_split_target_on_a_layout_not_planned_with_it_is_refused_naming_the_field():
    """Megatron's own numel layout cannot hold a split: the builder refuses the target instead of ignoring it."""
    if layout_api_problems():
        assert MCORE.startswith(("0.16.", "0.17."))
        return
    message = run_distributed(_split_on_megatrons_layout, world_size=2, timeout_s=200)[0]
    assert message.startswith("optimizer.ns_split_target=1.0 needs DDP built on the cost layout planned with it"), \
        message


def _stage_of_two_chunks(rank: int, world_size: int, group: Any) -> dict[str, Any]:
    """Two model chunks of one pipeline rank (virtual stages, which name their layers alike), tagged together with a
    split target, then laid out one chunk at a time as DDP does."""
    import dataclasses

    from megatron.core.distributed import DistributedDataParallelConfig

    from nemo_muon.megatron.core_018_plus.cost_layout import plan_cost_layout, plan_items, tag_with_costs
    from nemo_muon.megatron.core_018_plus.split_plan import planned_owner
    from nemo_muon.preflight.wiring import ddp_config_kwargs
    from tests.megatron_cpu.training import _model, _pg_collection, megatron_parallel, optimizer_config

    with megatron_parallel():
        chunks = [_model("tiny_kimi_k2", 1, False, 1, 16)[0] for _ in range(2)]
        opt = dataclasses.replace(optimizer_config("muon"), ns_split_target=1.0)
        pgs = _pg_collection()
        tag_with_costs(chunks, opt, pgs)
        items = plan_items(chunks, opt, pgs)
        ddp_config = DistributedDataParallelConfig(**{**ddp_config_kwargs(opt), "use_distributed_optimizer": True})
        layouts = [plan_cost_layout([p for p in c.parameters() if p.requires_grad], None, ddp_config, pgs)
                   for c in chunks]
        shard_matches = []
        for chunk_layout in layouts:
            for key, layout in chunk_layout.layout.layouts.items():
                if not key.is_managed_by_layer_wise_optimizer:
                    continue
                for p, (start, _, bucket) in layout.param_index_map.items():
                    lo, hi = layout.bucket_indices[bucket]
                    shard = (start - lo) // ((hi - lo) // world_size)  # Megatron's _shard_params_from_layout
                    shard_matches.append(shard == planned_owner(p).rank)
        loads = [0.0] * world_size
        for p, item in items.items():
            split = planned_owner(p).split
            for r in (split.ranks if split else [planned_owner(p).rank]):
                loads[r] += split.member_cost if split else item.cost
        return {"names_unique": len({it.name for it in items.values()}) == len(items),
                "prefixes": sorted({it.name.split(".")[0] for it in items.values()}),
                "shard_matches": all(shard_matches) and len(shard_matches) == len(items),
                "splits_by_chunk": [len(c.splits) for c in layouts], "loads": loads,
                "layout_loads": [c.loads["dense"] for c in layouts], "target": layouts[0].stage_plan.target}


def test_a_stage_of_several_chunks_is_planned_together_and_each_chunk_laid_out_as_planned():
    """Virtual pipeline stages (Kimi K2's VP4): the split plan covers every chunk of the pipeline rank at once, as
    ``nemo-muon plan`` plans a stage, and each chunk's layout, computed alone, puts every matrix in its planned
    owner's shard; the chunks' layer names (alike) are told apart."""
    if layout_api_problems():
        assert MCORE.startswith(("0.16.", "0.17."))
        return
    ranks = run_distributed(_stage_of_two_chunks, world_size=4, timeout_s=300)
    for r in ranks:
        assert r["names_unique"] and r["prefixes"] == ["model0", "model1"]
        assert r["shard_matches"]
        assert sum(r["splits_by_chunk"]) > 0 and r["target"] == 1.0
        assert r["layout_loads"][0] == r["layout_loads"][1] == pytest.approx(r["loads"], rel=1e-12)
    assert ranks[0]["loads"] == ranks[1]["loads"]


def test_split_ownership_with_expert_parallelism_plans_experts_first_and_trains_as_whole_tensor_ownership():
    """EP=2 on 4 ranks (expert-DP 2): the stage plan places the routed experts over expert-DP first, then splits the
    dense matrices from each rank's expert work; each rank's dense cost plus its expert-DP group's expert cost, as
    Megatron derived them from the layout, is the plan's load, and one step equals the whole-tensor cost layout's
    within the distributed NS's fp32 rounding (experts compared within their EP rank: local names repeat)."""
    if layout_api_problems():
        assert MCORE.startswith(("0.16.", "0.17."))
        return
    args = (1, "muon", True, 0.0)
    whole = run_distributed(train_with_layout, world_size=4, args=("tiny_kimi_k2", "cost", *args, None, 2),
                            timeout_s=400)
    split = run_distributed(train_with_layout, world_size=4, args=("tiny_kimi_k2", "cost", *args, 1.0, 2),
                            timeout_s=400)
    assert split[0]["splits"] and split[0]["losses"] == whole[0]["losses"]
    for r in split:  # dp_cp rank b is EP rank b mod 2's expert-DP replica b div 2 (Megatron's order)
        executed = [dense + r["expert_owned_costs"][b // 2] for b, dense in enumerate(r["owned_costs"])]
        assert executed == pytest.approx(r["plan_loads"], rel=1e-12)

    def masters(run: list[dict[str, Any]]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for rank, result in enumerate(run):
            for name, value in result["masters"].items():
                key = (rank % 2, name) if ".experts." in name else name
                assert key not in out, key
                out[key] = value
        return out

    expected, got = masters(whole), masters(split)
    assert set(got) == set(expected)
    assert max(float(np.abs(expected[k] - got[k]).max()) for k in got) <= MASTER_TOLERANCE
