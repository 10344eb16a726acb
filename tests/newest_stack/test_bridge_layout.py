"""The reduce-scatter layout owned by update cost inside Megatron-Bridge's own model setup
(`nemo_muon.megatron.bridge_05_06.layout`): Bridge's provider runs our tagging pre-wrap hook, Megatron-Core's ``_ddp_wrap``
builds DDP on our layout, Bridge's setup_optimizer builds our Muon on it; 2 gloo ranks, against the legacy path."""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.megatron_cpu.bridge_layout_training import train_through_bridge_model_setup
from tests.newest_stack.conftest import stack_release

STEPS = 10
SPLIT_STEPS = 1
"""One step of the split and of whole-tensor ownership from the same weights: their fp32 masters differ by the
distributed NS's summation order alone. A second step would start from bf16 weights in which that difference may
have flipped a rounding, and from there the tiny bf16 MoE model amplifies it by an amount that depends on the CPU."""
LAYOUT_STACK = stack_release().tag != "26.04"
"""Bridge 0.4 (26.04, Megatron-Core 0.17) has no parameter layout: there the tests below check it stays legacy."""


def _stays_on_the_legacy_path() -> None:
    """26.04: nothing routes to the cost layout, and the layout API's absence is named."""
    import importlib.metadata

    from nemo_muon.config.optimizer import MuonConfig
    from nemo_muon.megatron.bridge.container import routes_cost_layout as routes
    from nemo_muon.megatron.core_018_plus.cost_layout import layout_api_problems

    assert not routes(MuonConfig(lr=0.02, split_gate_up=False, collectives="reduce_scatter"),
                      importlib.metadata.version("megatron-bridge"))  # even opted in: Bridge 0.4 has no layout
    assert layout_api_problems()


@pytest.fixture(scope="module")
def runs():
    # clipping off: the two wirings sum the clipping norm in different fp32 orders (one ulp apart), which a bf16 MoE
    # model amplifies step by step, by an amount that depends on the CPU's matmul kernels; without it they must agree
    # bit for bit (test_the_loss_curve_is_the_legacy_paths)
    out = {layout: run_distributed(train_through_bridge_model_setup, world_size=2,
                                   args=("tiny_qwen3_moe", STEPS, layout == "cost", "muon", None, 0.0), timeout_s=300)
           for layout in ("legacy", "cost")}
    # tiny Qwen3-MoE balances exactly at DP=2: the split runs on tiny Kimi K2, against its whole-tensor cost layout
    for name, target in (("kimi_whole", None), ("kimi_split", 1.0)):
        out[name] = run_distributed(train_through_bridge_model_setup, world_size=2,
                                    args=("tiny_kimi_k2", SPLIT_STEPS, True, "muon", target), timeout_s=300)
    return out


def test_bridge_builds_ddp_on_our_cost_layout_and_trains(request):
    if not LAYOUT_STACK:
        return _stays_on_the_legacy_path()
    runs = request.getfixturevalue("runs")
    for result in runs["cost"]:
        assert result["use_distributed_optimizer"] and result["full_param_layout"]
        assert result["overlap_param_gather"]  # the all-gather runs in the next forward
        assert result["hook_installed"] and result["planned"] == 1 and result["owners_match"]
        assert "MegatronMuon" in result["optimizers"] and "LayerWiseDistributedOptimizer" in result["optimizers"]
        losses = result["losses"]
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
        assert result["replica_max_diff"] == 0.0
        assert "DistributedOptimizer" in result["optimizers"]  # the rest (Adam) sharded in Megatron's layout


def test_the_loss_curve_is_the_legacy_paths(request):
    """Clipping off, the cost layout and the legacy path compute the same updates (at DP=2 both collectives add the
    same two bf16 gradients; Muon's and Adam's updates are per tensor / per element, whoever owns them): ten steps
    of losses and every matrix master equal bit for bit, on any CPU."""
    if not LAYOUT_STACK:
        return _stays_on_the_legacy_path()
    import numpy as np

    from tests.megatron_cpu.test_megatron_training import _all_masters

    runs = request.getfixturevalue("runs")
    for legacy, cost in zip(runs["legacy"], runs["cost"], strict=True):
        assert legacy["losses"] == cost["losses"]
    expected, got = _all_masters(runs["legacy"]), _all_masters(runs["cost"])
    assert got and set(got) <= set(expected)  # the cost layout's matrices (Adam's masters: the distributed optimizer)
    assert all(np.array_equal(expected[n], got[n]) for n in got)


def test_split_ownership_runs_inside_bridges_setup_on_the_cost_layout(request):
    """``ns_split_target`` through Bridge's own model and optimizer setup: the layout splits the largest matrices
    over both ranks, each rank's Muon takes its block share (the first holds, the other helps), and one step's fp32
    masters equal the whole-tensor cost layout's within the distributed NS's fp32 rounding (`MASTER_TOLERANCE`)."""
    if not LAYOUT_STACK:
        return _stays_on_the_legacy_path()
    import numpy as np

    from tests.megatron_cpu.test_megatron_training import MASTER_TOLERANCE, _all_masters

    runs = request.getfixturevalue("runs")
    for split, whole in zip(runs["kimi_split"], runs["kimi_whole"], strict=True):
        assert split["planned_splits"] > 0 and whole["planned_splits"] == 0
        assert split["split_shares"] == split["planned_splits"] and whole["split_shares"] == 0
        assert split["owners_match"] and split["replica_max_diff"] == 0.0
        assert split["losses"] == whole["losses"]  # the first forward: the same weights and data
        assert split["sent_last_step"] > whole["sent_last_step"]  # the scatter, the Gram all-reduces, the gather
    expected, got = _all_masters(runs["kimi_whole"]), _all_masters(runs["kimi_split"])
    assert got.keys() == expected.keys()
    worst = max(float(np.abs(expected[n] - got[n]).max()) for n in got)
    assert worst <= MASTER_TOLERANCE, worst


def test_cost_layout_sends_at_most_070_of_the_legacy_bytes(request):
    if not LAYOUT_STACK:
        return _stays_on_the_legacy_path()
    runs = request.getfixturevalue("runs")
    for legacy, cost in zip(runs["legacy"], runs["cost"], strict=True):
        assert not legacy["use_distributed_optimizer"] and not legacy["hook_installed"]
        assert cost["sent_last_step"] <= 0.70 * legacy["sent_last_step"], (cost["sent_last_step"],
                                                                           legacy["sent_last_step"])


@pytest.mark.parametrize("version, expected", [("0.6.2", True), ("0.5.1", True), ("0.4.0", False), ("0.3.0", False)])
def test_only_bridge_05_and_06_route_our_matrix_optimizers_to_the_cost_layout(version, expected):
    from nemo_muon.config.optimizer import AdamWConfig, MuonConfig
    from nemo_muon.megatron.bridge.container import routes_cost_layout as routes

    assert routes(MuonConfig(lr=0.02, split_gate_up=False, collectives="reduce_scatter"), version) is expected
    assert not routes(MuonConfig(lr=0.02, split_gate_up=False), version)  # the default: Megatron's wiring
    assert not routes(MuonConfig(lr=0.02, split_gate_up=False, engine="megatron"), version)
    assert not routes(AdamWConfig(lr=1e-3), version)


def test_the_hook_point_is_pinned(bridge):
    if not LAYOUT_STACK:
        return _stays_on_the_legacy_path()
    import types

    from megatron.training.models import dist_utils

    from nemo_muon.megatron.bridge_05_06.layout import check_hook_point

    check_hook_point(dist_utils, "0.6.2")
    with pytest.raises(RuntimeError, match=r"wired into Megatron-Bridge 0.5.x / 0.6.x; installed megatron-bridge 0.7"):
        check_hook_point(dist_utils, "0.7.0")
    moved = types.ModuleType("dist_utils")
    exec("DistributedOptimizer = object\ndef _ddp_wrap(model):\n    return model\n", moved.__dict__)
    moved.__file__ = __file__  # inspect needs a source: this file, which never calls the hooked name that way
    with pytest.raises(RuntimeError, match="hook point moved"):
        check_hook_point(moved, "0.6.2")


def test_provide_refuses_ddp_on_megatrons_untagged_layout(bridge):
    import types

    import torch

    from nemo_muon.config.optimizer import MuonConfig
    from nemo_muon.megatron.bridge_04_plus.provider import EngineOptimizerConfig

    chunk = torch.nn.Linear(4, 4)
    chunk.ddp_config = types.SimpleNamespace(use_distributed_optimizer=True)
    with pytest.raises(ValueError, match="no layer-wise layout tagged"):
        EngineOptimizerConfig(engine_config=MuonConfig(lr=0.02, split_gate_up=False)).provide(model_chunks=[chunk])
