"""Our optimizer configs -> real megatron.core OptimizerConfig objects: 0.19.2 (installed) and 0.16.1 (NGC 26.02).

0.16.1 is installed with `pip install --no-deps --target` into a cache dir once and checked in a subprocess with
that dir first on sys.path (its OptimizerConfig imports on CPU with the venv's torch).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from megatron.core.optimizer import OptimizerConfig as MCoreOptimizerConfig
from megatron.core.optimizer.emerging_optimizers import TensorParallelMuon, _kwargs_from_config

from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig
from nemo_muon.megatron.optimizer_config import (
    API_018,
    MEGATRON_MUON_DEFAULTS,
    soap_accepts_precondition_frequency,
    to_megatron_optimizer_config,
)

MCORE_016 = "0.16.1"
MEGATRON_MUON = MEGATRON_MUON_DEFAULTS
"""What the megatron backend's Muon recipes set (Megatron cannot split gate/up or skip non-finite steps)."""


def install_no_deps(requirement: str) -> Path:
    """`pip install --no-deps --target` into a per-machine cache (reused across test files and runs)."""
    root = Path(tempfile.gettempdir()) / "nemo_muon_test_cache" / requirement.replace("==", "-")
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=root.parent))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging), requirement],
                   check=True, timeout=300)
    (staging / ".complete").touch()
    try:
        staging.rename(root)
    except OSError:  # another process finished first
        pass
    return root


def run_with_path(first_on_path: Path, code: str) -> dict:
    """Run ``code`` (which prints one JSON object last) with ``first_on_path`` ahead of site-packages."""
    env = {**os.environ, "PYTHONPATH": str(first_on_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- megatron-core 0.19.2 (installed)

def test_muon_maps_to_real_019_config_with_traps_fixed():
    cfg, spec = to_megatron_optimizer_config(MuonConfig(lr=2e-4, weight_decay=0.1, **MEGATRON_MUON), grad_clip=0.5)
    assert isinstance(cfg, MCoreOptimizerConfig)
    assert spec.api == API_018 and spec.builder == "get_megatron_optimizer" and spec.bridge_optimizer == "dist_muon"
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
    cfg, _ = to_megatron_optimizer_config(MuonConfig(scale_mode="match_rms_adamw", extra_scale_factor=2.0,
                                                     **MEGATRON_MUON))
    assert cfg.muon_scale_mode == "spectral" and cfg.muon_extra_scale_factor == pytest.approx(0.4)


def test_non_layerwise_muon_and_adamw():
    cfg, spec = to_megatron_optimizer_config(MuonConfig(**MEGATRON_MUON), layerwise=False)
    assert cfg.use_layer_wise_distributed_optimizer is False and spec.bridge_optimizer == "muon"
    cfg, spec = to_megatron_optimizer_config(AdamWConfig(betas=(0.9, 0.98), eps=1e-5, weight_decay=0.05))
    assert (cfg.optimizer, cfg.use_distributed_optimizer, cfg.decoupled_weight_decay) == ("adam", True, True)
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps, cfg.weight_decay) == (0.9, 0.98, 1e-5, 0.05)


def test_soap_precondition_frequency_refused_where_installed_soap_ignores_it():
    from emerging_optimizers.soap import SOAP

    # emerging-optimizers 0.3.0's SOAP has no such argument, so Megatron-Core would drop the config field
    assert not soap_accepts_precondition_frequency()
    cfg, spec = to_megatron_optimizer_config(SoapConfig(shampoo_beta=0.9, nonfinite="raise"))
    assert "precondition_frequency" not in _kwargs_from_config(SOAP, "soap", cfg)
    assert (cfg.optimizer, cfg.soap_shampoo_beta, cfg.soap_precondition_frequency) == ("soap", 0.9, 1)
    with pytest.raises(ValueError, match=r"soap\.precondition_frequency=10 .*every step"):
        to_megatron_optimizer_config(SoapConfig(precondition_frequency=10, nonfinite="raise"))


@pytest.mark.parametrize(
    ("opt", "match"),
    [
        (MuonConfig(tp_mode="auto", **MEGATRON_MUON), r"muon\.tp_mode .*'duplicated'.*got 'auto'"),
        (MuonConfig(split_gate_up=True, nonfinite="raise"), r"muon\.split_gate_up=True"),
        (MuonConfig(adamw_lr=1e-3, **MEGATRON_MUON), r"muon\.adamw_lr=0\.001"),
        (MuonConfig(split_gate_up=False), r"muon\.nonfinite='skip'"),
        (SoapConfig(eps=1e-6, nonfinite="raise"), r"soap\.eps=1e-06"),
    ],
)
def test_unhonourable_settings_are_refused(opt, match):
    with pytest.raises(ValueError, match=match):
        to_megatron_optimizer_config(opt)


# ---------------------------------------------------------------- megatron-core 0.16.1 (NGC 26.02)

_CHECK_016 = """
import dataclasses, json
import megatron.core
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer.transformer_config import TransformerConfig
from nemo_muon.config.optimizer import MuonConfig, SoapConfig
from nemo_muon.megatron.optimizer_config import megatron_optimizer_spec
fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
spec = megatron_optimizer_spec(MuonConfig(weight_decay=0.1, split_gate_up=False, nonfinite="raise"), fields=fields)
cfg = OptimizerConfig(**spec.kwargs)
errors = {}
for name, opt in {"soap": SoapConfig(nonfinite="raise"),
                  "polar": MuonConfig(coefficients="polar_express", split_gate_up=False, nonfinite="raise")}.items():
    try:
        megatron_optimizer_spec(opt, fields=fields)
    except ValueError as e:
        errors[name] = str(e)
print(json.dumps({"version": megatron.core.__version__, "api": spec.api, "builder": spec.builder,
                  "bridge": spec.bridge_optimizer, "optimizer": cfg.optimizer,
                  "use_distributed_optimizer": cfg.use_distributed_optimizer,
                  "momentum": cfg.muon_momentum, "nesterov": cfg.muon_use_nesterov,
                  "default_nesterov": OptimizerConfig().muon_use_nesterov, "tp_mode": cfg.muon_tp_mode,
                  "weight_decay": cfg.weight_decay, "errors": errors,
                  "fields": {c.__name__: [f.name for f in dataclasses.fields(c)] for c in
                             (TransformerConfig, DistributedDataParallelConfig, GPTDatasetConfig, OptimizerConfig)}}))
"""


@functools.cache
def mcore016_report() -> dict:
    """One subprocess with megatron-core 0.16.1 first on sys.path: our 0.16 mapping and its dataclass fields."""
    return run_with_path(install_no_deps(f"megatron-core=={MCORE_016}"), _CHECK_016)


def test_muon_maps_to_real_016_config():
    result = mcore016_report()
    assert result["version"] == MCORE_016
    assert (result["api"], result["builder"], result["bridge"]) == ("0.16", "get_megatron_muon_optimizer", "dist_muon")
    assert (result["optimizer"], result["use_distributed_optimizer"]) == ("dist_muon", False)
    # 0.16's field default for Nesterov is False; we always write it
    assert result["default_nesterov"] is False and result["nesterov"] is True
    assert (result["momentum"], result["tp_mode"], result["weight_decay"]) == (0.95, "duplicated", 0.1)
    assert "SOAP needs megatron-core >= 0.18" in result["errors"]["soap"]
    assert "muon.coefficients='polar_express'" in result["errors"]["polar"]


# ---------------------------------------------------------------- NeMo 2 one-line switch

def test_nemo2_muon_one_line_switch_maps_to_mcore_config():
    import importlib.util

    from nemo_muon.megatron import nemo2

    cfg, spec = nemo2.muon_optimizer_config(lr=1e-4, weight_decay=0.01)
    assert isinstance(cfg, MCoreOptimizerConfig) and spec.layer_wise
    assert (cfg.lr, cfg.weight_decay, cfg.muon_momentum, cfg.muon_tp_mode) == (1e-4, 0.01, 0.95, "duplicated")
    if importlib.util.find_spec("nemo") is None:  # CPU install: the module says what it needs instead of failing late
        with pytest.raises(ImportError, match="needs NeMo 2.7"):
            nemo2.Muon(lr=1e-4, weight_decay=0.01)
