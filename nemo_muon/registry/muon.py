"""Muon's entry in the optimizer registry (config: `nemo_muon.config.optimizer.MuonConfig`)."""

from __future__ import annotations

import math
from typing import Any

from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.registry.cost import ns_cost
from nemo_muon.registry.spec import Hyperparameters, MatrixSpec, MegatronSpec, OptimizerSpec, Shape

MUON_RUNTIME_ARGS: tuple[str, ...] = ("tp_group", "master_weights", "matrix_rule", "tp_mode", "fused_layouts")
"""What `nemo_muon.Muon` takes besides its config's fields (and so every optimizer built on it)."""


def muon_routing(cfg: Any) -> dict[str, bool]:
    """Muon orthogonalizes the parts of a fused QKV / gate-up weight separately when its config says so."""
    return {"split_qkv": cfg.split_qkv, "split_gate_up": cfg.split_gate_up}


def muon_update_flops(shape: Shape, hp: Hyperparameters) -> float:
    """Newton–Schulz of the part at the config's (or param group's) ``ns_steps``."""
    return ns_cost(shape, hp["ns_steps"])


def momentum_elements(shape: Shape) -> int:
    """One momentum buffer shaped like the matrix."""
    return math.prod(shape)


MUON_MATRIX = MatrixSpec(routing=muon_routing, update_flops=muon_update_flops, per_part=True,
                         state_elements=momentum_elements, newton_schulz=True, splittable=True)

SPEC = OptimizerSpec(
    name="muon",
    label="Muon",
    config_class=MuonConfig,
    implementation="nemo_muon.optim.muon:Muon",
    runtime_args=MUON_RUNTIME_ARGS,
    matrix=MUON_MATRIX,
    megatron=MegatronSpec(
        engines=("nemo_muon", "megatron"), bridge_name="muon", bridge_layer_wise_name="dist_muon",
        registered_name="nemo_muon.muon", fields="nemo_muon.megatron.shared.optimizer_config:muon_fields",
        adam_fields=("adamw_betas", "adamw_eps"),
        # Megatron fuses gate/up and has no skip-step; the perf recipes keep Bridge's (Megatron's) spectral scale
        recipe_defaults={"split_gate_up": False, "nonfinite": "raise", "scale_mode": "spectral"},
    ),
    baseline="adamw",
)
