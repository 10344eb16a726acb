"""SOAP's entry in the optimizer registry (config: `nemo_muon.config.optimizer.SoapConfig`)."""

from __future__ import annotations

from typing import Any

from nemo_muon.config.optimizer import SoapConfig
from nemo_muon.registry.cost import soap_cost, soap_state_elements
from nemo_muon.registry.spec import Hyperparameters, MatrixSpec, MegatronSpec, OptimizerSpec, Shape


def soap_routing(cfg: Any) -> dict[str, bool]:
    """SOAP preconditions a fused weight as one matrix."""
    return {"split_qkv": False, "split_gate_up": False}


def soap_update_flops(shape: Shape, hp: Hyperparameters) -> float:
    """Factor updates, rotations and the eigenbasis refresh every ``precondition_frequency`` steps."""
    return soap_cost(shape, hp["precondition_frequency"])


SPEC = OptimizerSpec(
    name="soap",
    label="SOAP",
    config_class=SoapConfig,
    implementation="nemo_muon.optim.soap:SOAP",
    runtime_args=("tp_group", "master_weights", "matrix_rule"),
    matrix=MatrixSpec(routing=soap_routing, update_flops=soap_update_flops, per_part=False,
                      # element_bytes: Muon's, the default (the step-time model does not model SOAP's own)
                      state_elements=soap_state_elements, newton_schulz=False, splittable=False),
    megatron=MegatronSpec(
        engines=("nemo_muon", "megatron"), bridge_name="soap", registered_name="nemo_muon.soap",
        fields="nemo_muon.megatron.shared.optimizer_config:soap_fields",
        recipe_defaults={"nonfinite": "raise"},
    ),
    baseline="adamw",
)
