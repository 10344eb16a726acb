"""Our optimizer configs -> real megatron.core OptimizerConfig objects of the installed 0.19.2 (the 0.16.0 of NGC
26.02 is checked in the container-stack environment: tests/container_stack/test_optimizer_config_core_016_017.py)."""

from __future__ import annotations

import dataclasses
import types

import pytest
from megatron.core.optimizer import OptimizerConfig as MCoreOptimizerConfig
from megatron.core.optimizer.emerging_optimizers import TensorParallelMuon, _kwargs_from_config

from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig
from nemo_muon.megatron.generations import CORE_018_PLUS
from nemo_muon.megatron.shared.optimizer_config import (
    MEGATRON_MUON_DEFAULTS,
    soap_accepts_precondition_frequency,
    to_megatron_optimizer_config,
)

MEGATRON_MUON = MEGATRON_MUON_DEFAULTS
"""What the megatron backend's Muon recipes set (Megatron cannot split gate/up or skip non-finite steps)."""


# ---------------------------------------------------------------- megatron-core 0.19.2 (installed)

def test_muon_maps_to_real_019_config_with_traps_fixed():
    cfg, spec = to_megatron_optimizer_config(MuonConfig(lr=2e-4, weight_decay=0.1, engine="megatron", **MEGATRON_MUON),
                                             grad_clip=0.5)
    assert isinstance(cfg, MCoreOptimizerConfig)
    assert spec.api == CORE_018_PLUS and spec.builder == "get_megatron_optimizer" and spec.bridge_optimizer == "dist_muon"
    ours = to_megatron_optimizer_config(MuonConfig(lr=2e-4, weight_decay=0.1, **MEGATRON_MUON), grad_clip=0.5)
    assert ours[1].builder == "nemo_muon" and ours[0] == cfg  # the same Megatron config, our Muon built inside it
    with pytest.raises(ValueError, match="muon.engine='nemo_muon' cannot be honoured by Megatron-Core: nemo-muon's "
                                         "Muon runs inside Megatron's layer-wise"):
        to_megatron_optimizer_config(MuonConfig(**MEGATRON_MUON), layerwise=False)
    assert (cfg.optimizer, cfg.use_layer_wise_distributed_optimizer, cfg.use_distributed_optimizer) == (
        "muon", True, False)
    # traps: momentum 0.95 and Nesterov explicit, TP mode duplicated (Megatron's default is blockwise),
    # weight decay as set (Bridge's helper pins 0.033)
    assert MCoreOptimizerConfig().muon_tp_mode == "blockwise"
    assert (cfg.muon_momentum, cfg.muon_nesterov, cfg.muon_tp_mode) == (0.95, True, "duplicated")
    assert (cfg.lr, cfg.weight_decay, cfg.clip_grad) == (2e-4, 0.1, 0.5)
    # the settings reach TensorParallelMuon's constructor the way Megatron-Core passes them
    kwargs = _kwargs_from_config(TensorParallelMuon, "muon", cfg)
    assert kwargs["momentum"] == 0.95 and kwargs["nesterov"] is True and kwargs["tp_mode"] == "duplicated"
    assert kwargs["coefficient_type"] == "quintic" and kwargs["num_ns_steps"] == 5
    assert kwargs["weight_decay"] == 0.1 and kwargs["fp32_matmul_prec"] == "highest"


def test_match_rms_adamw_becomes_spectral_times_0_2():
    cfg, _ = to_megatron_optimizer_config(MuonConfig(**{**MEGATRON_MUON, "scale_mode": "match_rms_adamw"},
                                                     extra_scale_factor=2.0))
    assert cfg.muon_scale_mode == "spectral" and cfg.muon_extra_scale_factor == pytest.approx(0.4)


def test_non_layerwise_muon_and_adamw():
    cfg, spec = to_megatron_optimizer_config(MuonConfig(engine="megatron", **MEGATRON_MUON), layerwise=False)
    assert cfg.use_layer_wise_distributed_optimizer is False and spec.bridge_optimizer == "muon"
    cfg, spec = to_megatron_optimizer_config(AdamWConfig(betas=(0.9, 0.98), eps=1e-5, weight_decay=0.05))
    assert (cfg.optimizer, cfg.use_distributed_optimizer, cfg.decoupled_weight_decay) == ("adam", True, True)
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps, cfg.weight_decay) == (0.9, 0.98, 1e-5, 0.05)


def test_soap_precondition_frequency_refused_where_installed_soap_ignores_it():
    from emerging_optimizers.soap import SOAP

    # emerging-optimizers 0.3.0's SOAP has no such argument, so Megatron-Core would drop the config field
    assert not soap_accepts_precondition_frequency()
    cfg, spec = to_megatron_optimizer_config(SoapConfig(shampoo_beta=0.9, nonfinite="raise", engine="megatron"))
    assert "precondition_frequency" not in _kwargs_from_config(SOAP, "soap", cfg)
    assert (cfg.optimizer, cfg.soap_shampoo_beta, cfg.soap_precondition_frequency) == ("soap", 0.9, 1)
    with pytest.raises(ValueError, match=r"soap\.precondition_frequency=10 .*every step"):
        to_megatron_optimizer_config(SoapConfig(precondition_frequency=10, nonfinite="raise", engine="megatron"))
    # nemo-muon's SOAP (the default engine) honours both: the fields reach it through Megatron's config
    cfg, spec = to_megatron_optimizer_config(SoapConfig(precondition_frequency=10, eps=1e-6, nonfinite="raise"))
    assert spec.builder == "nemo_muon" and (cfg.soap_precondition_frequency, cfg.adam_eps) == (10, 1e-6)


@pytest.mark.parametrize(
    ("opt", "match"),
    [
        (MuonConfig(tp_mode="auto", **MEGATRON_MUON), r"muon\.tp_mode .*'duplicated'.*got 'auto'"),
        (MuonConfig(split_gate_up=True, nonfinite="raise"), r"muon\.split_gate_up=True"),
        (MuonConfig(adamw_lr=1e-3, **MEGATRON_MUON), r"muon\.adamw_lr=0\.001"),
        (MuonConfig(split_gate_up=False, engine="megatron"), r"muon\.nonfinite='skip'.*engine='nemo_muon'"),
        (SoapConfig(eps=1e-6, nonfinite="raise", engine="megatron"), r"soap\.eps=1e-06"),
    ],
)
def test_unhonourable_settings_are_refused(opt, match):
    with pytest.raises(ValueError, match=match):
        to_megatron_optimizer_config(opt)


def test_engine_nemo_muon_builds_from_our_config_never_from_megatrons_copy():
    """Hyperparameters are stated once: Megatron's config shows ours (for its validation and log), but the optimizer
    inside Megatron takes its keyword arguments from our validated config; only lr and weight decay come from
    Megatron's config, where frameworks and Megatron's scheduler set them."""
    import torch

    from nemo_muon.megatron.shared.engine import engine_class_of, engine_kwargs
    from nemo_muon.registry import spec_for
    from nemo_muon.registry.normuon import NorMuonConfig

    class Chunk(torch.nn.Module):  # a model chunk: named parameters and Megatron's TransformerConfig fields
        def __init__(self) -> None:
            super().__init__()
            self.config = types.SimpleNamespace(num_attention_heads=4, num_query_groups=2, kv_channels=8)
            self.linear_proj = torch.nn.Linear(8, 8, bias=False)
            self.linear_qkv = torch.nn.Linear(8, 64, bias=False)  # a fused QKV: its layout comes from the config

    ours = NorMuonConfig(lr=2e-4, momentum=0.9, ns_steps=7, coefficients="polar_express", beta2=0.8,
                         **MEGATRON_MUON)
    cfg, _ = to_megatron_optimizer_config(dataclasses.replace(ours, coefficients="quintic"))
    cfg.muon_momentum, cfg.muon_num_ns_steps, cfg.lr = 0.5, 3, 1e-3  # a framework changed Megatron's copy
    chunk = Chunk()
    kwargs = engine_kwargs(ours, cfg, [chunk], types.SimpleNamespace(tp=None, expt_tp=None))
    assert (kwargs["momentum"], kwargs["ns_steps"], kwargs["coefficients"], kwargs["beta2"]) == (
        0.9, 7, "polar_express", 0.8)
    assert kwargs["lr"] == 1e-3 and kwargs["nonfinite"] == "raise" and "linear_qkv" in kwargs["fused_layouts"]
    optimizer = engine_class_of(spec_for(ours))([{"params": [chunk.linear_proj.weight]}], **kwargs)
    assert type(optimizer).__name__ == "MegatronNorMuon" and optimizer.param_groups[0]["momentum"] == 0.9


def test_nonfinite_skip_maps_for_our_engine_only():
    """Engine 'nemo_muon' skips a non-finite step on every rank (`nemo_muon.megatron.shared.nonfinite`); Megatron's own
    Muon has no skip-step in bf16, so there the policy is refused above."""
    skip, _ = to_megatron_optimizer_config(MuonConfig(split_gate_up=False, nonfinite="skip"))
    raise_, _ = to_megatron_optimizer_config(MuonConfig(split_gate_up=False, nonfinite="raise"))
    assert vars(skip) == vars(raise_)  # the policy is ours, outside Megatron's config


# ---------------------------------------------------------------- NeMo 2 one-line switch

def test_nemo2_without_nemo_names_what_it_needs():
    """.venv has no NeMo (NeMo 2.7 cannot share it with Megatron-Core 0.19): the module says what to install; its
    behaviour with NeMo is tested in tests/container_stack/test_nemo2_optimizer_module.py."""
    import importlib.util

    import nemo_muon

    assert importlib.util.find_spec("nemo") is None, "the CPU dev environment must not have NeMo"
    with pytest.raises(ImportError, match=r"needs NeMo 2.7 with its LLM collection .*No module named 'nemo'"):
        nemo_muon.megatron.nemo2.muon_with_cosine_annealing  # noqa: B018
