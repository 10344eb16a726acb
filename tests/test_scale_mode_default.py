"""One learning-rate story (issue 37 item 2): Muon's one scale-mode default is ``match_rms_adamw`` (bench/lr_transfer.py,
bench/RESULTS.md) in the config, the class and the docs, its update has AdamW's RMS, and everything built for the
megatron backend keeps Megatron's ``spectral``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.optim.muon import Muon
from nemo_muon.registry.normuon import NorMuonConfig

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = "match_rms_adamw"


def test_one_default_in_config_class_and_docs() -> None:
    assert MuonConfig().scale_mode == NorMuonConfig().scale_mode == DEFAULT
    assert inspect.signature(Muon.__init__).parameters["scale_mode"].default == DEFAULT
    for doc in ("docs/optimizers.md", "docs/ARCHITECTURE.md"):
        signatures = re.findall(r'scale_mode="(\w+)"', (ROOT / doc).read_text(encoding="utf-8"))
        assert signatures and set(signatures) == {DEFAULT}, (doc, signatures)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f'the default `scale_mode="{DEFAULT}"`' in readme and "nemo_muon.Muon(model, lr=3e-4" in readme


def test_default_update_has_adamw_rms() -> None:
    """0.2·sqrt(max(m, n)) times an orthogonalized (m, n) matrix: RMS 0.2 when its singular values are 1 (quintic
    NS leaves them within ~3% of 1 on a 64 x 256 Gaussian), so lr means what it means for AdamW (update RMS ~0.2)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(64, 256))
    opt = Muon([("layers.0.mlp.down_proj.weight", p)], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False)
    p.grad = torch.randn(64, 256)
    opt.step()
    rms = p.detach().pow(2).mean().sqrt().item()
    assert 0.19 < rms < 0.21, rms


def test_megatron_recipes_keep_spectral_and_torch_recipes_transfer() -> None:
    from nemo_muon.recipes import get_recipe, list_recipes
    from nemo_muon.recipes.overrides import apply_overrides

    muon_like = {name: get_recipe(name) for name in list_recipes()
                 if isinstance(get_recipe(name).optimizer, MuonConfig)}
    assert len(muon_like) >= 10
    for name, recipe in muon_like.items():
        want = "spectral" if recipe.backend == "megatron" else DEFAULT
        assert recipe.optimizer.scale_mode == want, name
    switched = apply_overrides(get_recipe("kimi_k2_adamw"), ["layerwise=true", "optimizer=muon"])
    assert switched.optimizer.scale_mode == "spectral"
    assert apply_overrides(get_recipe("tiny_kimi_k2_adamw"), ["optimizer=muon"]).optimizer.scale_mode == DEFAULT


def test_megatron_mapping_of_the_default_is_spectral_times_0_2() -> None:
    """Engine 'megatron' runs the default exactly: Megatron's spectral with extra_scale_factor x 0.2."""
    pytest.importorskip("megatron.core")
    from nemo_muon.megatron.shared.optimizer_config import MEGATRON_MUON_DEFAULTS, to_megatron_optimizer_config

    assert MEGATRON_MUON_DEFAULTS["scale_mode"] == "spectral"
    fields = {**MEGATRON_MUON_DEFAULTS, "scale_mode": DEFAULT}
    cfg, _ = to_megatron_optimizer_config(MuonConfig(engine="megatron", **fields), layerwise=False)
    assert cfg.muon_scale_mode == "spectral" and cfg.muon_extra_scale_factor == pytest.approx(0.2)
