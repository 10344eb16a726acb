"""AdamW's entry in the optimizer registry (config: `nemo_muon.config.optimizer.AdamWConfig`): the baseline,
element-wise (``matrix=None``), so Megatron shards its state by elements (its distributed optimizer)."""

from __future__ import annotations

from nemo_muon.config.optimizer import AdamWConfig
from nemo_muon.registry.spec import MegatronSpec, OptimizerSpec

SPEC = OptimizerSpec(
    name="adamw",
    label="AdamW",
    config_class=AdamWConfig,
    implementation="torch.optim:AdamW",
    runtime_args=(),
    matrix=None,
    megatron=MegatronSpec(engines=(), bridge_name="adam"),
    baseline=None,
)
