"""Engine 'nemo_muon' through Megatron-Bridge's own extension point, ``OptimizerConfig.provide()`` (Bridge >= 0.4):
Bridge's real ``setup_optimizer`` builds and trains nemo-muon's Muon, SOAP and NorMuon inside Megatron-Core's layer-wise
optimizer on 2 gloo ranks, with nothing of Bridge patched; Megatron's own Muon (engine 'megatron') still goes through
Bridge's name dispatch. Run on 26.08's stack (Bridge 0.6, Megatron-Core 0.19: the registry) and on 26.04's (Bridge
0.4, Megatron-Core 0.17: our layer-wise assembly)."""

from __future__ import annotations

import pytest

from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig
from nemo_muon.megatron.generations import CORE_016_017, core_generation
from tests.distributed import run_distributed
from tests.megatron_cpu.training import train_through_bridge_setup_optimizer
from tests.newest_stack.conftest import stack_release

ASSEMBLY = core_generation(stack_release().megatron_core).name == CORE_016_017
"""Megatron-Core 0.16 / 0.17: our layer-wise assembly (26.04 here); else the registry."""


@pytest.mark.parametrize("spec, optimizer, ours, opted_in", [("tiny_kimi_k2", "muon", "MegatronMuon", False),
                                                             ("tiny_qwen3_moe", "muon", "MegatronMuon", True),
                                                             ("tiny_qwen3_moe", "soap", "MegatronSOAP", False),
                                                             ("tiny_kimi_k2", "normuon", "MegatronNorMuon", False)])
def test_bridge_setup_optimizer_provides_and_trains_ours(spec, optimizer, ours, opted_in):
    """``opted_in``: ``optimizer.collectives='reduce_scatter'`` where provide() decides the wiring (the layer-wise
    assembly of 0.16 / 0.17; on >= 0.18 DDP's layout decides: test_bridge_layout.py)."""
    collectives = "reduce_scatter" if opted_in and ASSEMBLY else None
    result = run_distributed(train_through_bridge_setup_optimizer, world_size=2,
                             args=(spec, 10, optimizer, "nemo_muon", collectives), timeout_s=300)[0]
    assert result["config_class"] == "EngineOptimizerConfig" and result["provides"]
    assert not result["hook_installed"]  # nothing of Bridge rebound
    # Megatron-Core 0.17 (26.04): our layer-wise assembly, matrices owned by NS cost; >= 0.18: Megatron's registry
    layer_wise = ("NsBalancedLayerWiseOptimizer" if ASSEMBLY
                  else "LayerWiseDistributedOptimizer")
    assert ours in result["optimizers"] and layer_wise in result["optimizers"]
    assert "TensorParallelMuon" not in result["optimizers"]
    # 0.17: gradients reduced to their owners, parameters gathered in the next forward (owner_reduce); >= 0.18: the
    # legacy wiring here (Bridge's DDP on the cost layout: test_bridge_layout.py)
    to_owners = collectives == "reduce_scatter"
    assert all(g == to_owners for g in result["grads_to_owners"])
    assert (result["gathers_in_flight_after_step"] > 0) == to_owners
    losses = result["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    assert result["replica_max_diff"] == 0.0


def test_megatrons_own_muon_goes_through_bridges_name_dispatch():
    result = run_distributed(train_through_bridge_setup_optimizer, world_size=2,
                             args=("tiny_qwen3_moe", 10, "muon", "megatron"), timeout_s=300)[0]
    assert result["config_class"] == "OptimizerConfig" and not result["provides"]
    assert "TensorParallelMuon" in result["optimizers"] and "MegatronMuon" not in result["optimizers"]
    losses = result["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    assert result["replica_max_diff"] == 0.0


def test_the_installed_bridge_is_served_through_provide(bridge):
    from nemo_muon.megatron.generations import installed_bridge_generation

    assert installed_bridge_generation().engine_entry == "provide"


def test_engine_config_carries_our_validated_config_and_megatrons_fields(bridge):
    from megatron.bridge.training.config import OptimizerConfig as BridgeOptimizerConfig

    from nemo_muon.megatron.bridge.container import bridge_optimizer_config
    from nemo_muon.megatron.bridge_04_plus.provider import EngineOptimizerConfig
    from nemo_muon.megatron.shared.optimizer_config import to_megatron_optimizer_config

    ours = MuonConfig(lr=0.02, weight_decay=0.1, split_gate_up=False, nesterov=True)
    _, spec = to_megatron_optimizer_config(ours)
    config = bridge_optimizer_config(ours, spec)
    assert isinstance(config, EngineOptimizerConfig) and isinstance(config, BridgeOptimizerConfig)
    assert config.engine_config is ours
    nesterov = "muon_use_nesterov" if ASSEMBLY else "muon_nesterov"
    assert getattr(config, nesterov) is True and config.lr == 0.02 and config.weight_decay == 0.1
    config.finalize()  # what ConfigContainer.validate() runs on it
    megatron = bridge_optimizer_config(MuonConfig(lr=0.02, engine="megatron", split_gate_up=False), spec)
    assert type(megatron) is BridgeOptimizerConfig and megatron.optimizer == "dist_muon"
    adam = AdamWConfig(lr=1e-3)
    _, adam_spec = to_megatron_optimizer_config(adam)
    assert type(bridge_optimizer_config(adam, adam_spec)) is BridgeOptimizerConfig


def test_provide_refuses_a_config_without_ours(bridge):
    from nemo_muon.megatron.bridge_04_plus.provider import EngineOptimizerConfig

    with pytest.raises(ValueError, match=r"engine_config must be a registered matrix optimizer's config \(nemo_muon"
                                         r".registry: Muon, SOAP, NorMuon, ...\); got AdamWConfig"):
        EngineOptimizerConfig(engine_config=AdamWConfig(lr=1e-3)).provide(model_chunks=[])
    with pytest.raises(ValueError, match=r"has no field\(s\) \['muon_unknown_knob'\]"):
        from nemo_muon.megatron.bridge_04_plus.provider import engine_optimizer_config

        engine_optimizer_config(SoapConfig(lr=1e-3), {"muon_unknown_knob": True})
