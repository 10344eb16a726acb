"""Our optimizer configs -> the real `OptimizerConfig` of Megatron-Core 0.16.0 (NGC 26.02), imported directly."""

from __future__ import annotations

import megatron.core
import pytest
from megatron.core.optimizer import OptimizerConfig

from nemo_muon.config.optimizer import MuonConfig, SoapConfig
from nemo_muon.megatron.shared.optimizer_config import MEGATRON_MUON_DEFAULTS, to_megatron_optimizer_config


def test_muon_maps_to_real_016_config_with_traps_fixed():
    assert megatron.core.__version__.startswith("0.16.")
    cfg, spec = to_megatron_optimizer_config(MuonConfig(weight_decay=0.1, engine="megatron", **MEGATRON_MUON_DEFAULTS))
    assert isinstance(cfg, OptimizerConfig)
    assert (spec.api, spec.builder, spec.bridge_optimizer) == ("core_016_017", "get_megatron_muon_optimizer", "dist_muon")
    _, ours = to_megatron_optimizer_config(MuonConfig(weight_decay=0.1, **MEGATRON_MUON_DEFAULTS))
    assert (ours.api, ours.builder, ours.bridge_optimizer) == ("core_016_017", "nemo_muon", "dist_muon")
    assert (cfg.optimizer, cfg.use_distributed_optimizer) == ("dist_muon", False)
    assert OptimizerConfig().muon_use_nesterov is False and cfg.muon_use_nesterov is True  # 0.16's default trap
    assert (cfg.muon_momentum, cfg.muon_tp_mode, cfg.weight_decay) == (0.95, "duplicated", 0.1)


def test_soap_maps_to_016_for_our_engine():
    cfg, spec = to_megatron_optimizer_config(SoapConfig(nonfinite="raise", betas=(0.9, 0.98), precondition_frequency=5))
    assert (spec.api, spec.builder, spec.bridge_optimizer, spec.layer_wise) == ("core_016_017", "nemo_muon", "dist_soap", True)
    assert (cfg.optimizer, cfg.adam_beta1, cfg.adam_beta2) == ("dist_soap", 0.9, 0.98)


@pytest.mark.parametrize("opt, match", [
    (SoapConfig(nonfinite="raise", engine="megatron"), "SOAP needs megatron-core >= 0.18"),
    (MuonConfig(coefficients="polar_express", **{**MEGATRON_MUON_DEFAULTS, "engine": "megatron"}),
     "muon.coefficients='polar_express' cannot be honoured by Megatron-Core: megatron-core 0.16's own Muon always uses "
     "'quintic'"),
])
def test_what_016_cannot_honour_is_refused_naming_the_field(opt, match):
    with pytest.raises(ValueError, match=match):
        to_megatron_optimizer_config(opt)


def test_our_engine_runs_every_coefficient_set_where_016_has_no_field():
    """Engine 'nemo_muon' runs our Newton–Schulz with the recipe's set; 0.16's config has no field to record it."""
    for name in ("polar_express", "cans", "deepseekv4"):
        cfg, spec = to_megatron_optimizer_config(MuonConfig(coefficients=name, **MEGATRON_MUON_DEFAULTS))
        assert spec.builder == "nemo_muon" and not hasattr(cfg, "muon_coefficient_type")
