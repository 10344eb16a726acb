"""Megatron-Bridge 0.3 builds nemo-muon's Muon and SOAP (engine 'nemo_muon') through its own setup_optimizer, on NGC
26.02's stack where Megatron-Core 0.16's own Muon cannot be built (emerging-optimizers 0.3.0) and it has no SOAP:
the version-pinned hook (`nemo_muon.megatron.bridge_03.hook`) and tiny MoE models trained by what Bridge builds."""

from __future__ import annotations

import types

import pytest

from nemo_muon.megatron.bridge_03 import hook as bridge_hook
from tests.distributed import run_distributed
from tests.megatron_cpu.training import train_through_bridge_setup_optimizer


@pytest.mark.parametrize("spec, optimizer, ours, collectives", [
    ("tiny_kimi_k2", "muon", "MegatronMuon", None),  # the default: Megatron's wiring
    ("tiny_qwen3_moe", "muon", "MegatronMuon", "reduce_scatter"),  # opted in
    ("tiny_qwen3_moe", "soap", "MegatronSOAP", None)])
def test_bridge_setup_optimizer_builds_and_trains_ours(spec, optimizer, ours, collectives):
    result = run_distributed(train_through_bridge_setup_optimizer, world_size=2,
                             args=(spec, 10, optimizer, "nemo_muon", collectives), timeout_s=300)[0]
    assert result["hook_installed"]
    assert "NsBalancedLayerWiseOptimizer" in result["optimizers"] and ours in result["optimizers"]  # 0.16: by NS cost
    assert "TensorParallelMuon" not in result["optimizers"]
    # by default DDP all-reduces, as Megatron wires it; opted in, gradients are reduced to their owners and
    # parameters gathered in the next forward (nemo_muon.megatron.core_016_017.owner_reduce / owner_gather)
    to_owners = collectives == "reduce_scatter"
    assert result["grads_to_owners"] and all(g == to_owners for g in result["grads_to_owners"])
    assert (result["gathers_in_flight_after_step"] > 0) == to_owners
    losses = result["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    assert result["replica_max_diff"] == 0.0


def test_hook_point_is_pinned(bridge):
    from megatron.bridge.training import optim

    bridge_hook.check_hook_point(optim, "0.3.0")  # the installed Bridge: the name is there and called
    with pytest.raises(RuntimeError, match=r"wired into Megatron-Bridge 0\.3\.x; installed megatron-bridge 0\.4\.0"):
        bridge_hook.check_hook_point(optim, "0.4.0")
    moved = types.SimpleNamespace(setup_optimizer=lambda config: None)  # a setup_optimizer without the call
    with pytest.raises(RuntimeError, match="no longer calls get_megatron_muon_optimizer"):
        bridge_hook.check_hook_point(moved, "0.3.1")
