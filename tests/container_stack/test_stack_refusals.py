"""On NGC 26.02's stack (Megatron-Core 0.16 + emerging-optimizers 0.3.0) Megatron-Core's own Muon and SOAP
(``optimizer.engine=megatron``) are refused before launch by every entry point, with the same message; the Muon and
SOAP recipes (nemo-muon's engine by default) pass; the architecture mapping equals Bridge's providers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_muon.models.megatron_fields import transformer_config_fields
from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B

NEMO_MUON = str(Path(sys.executable).parent / "nemo-muon")


def test_doctor_warns_about_megatrons_own_optimizers():
    out = subprocess.run([NEMO_MUON, "doctor"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout  # the default engine runs Muon and SOAP here; Megatron's own cannot
    assert "[warn] stack:mcore-soap" in out.stdout and "soap with engine 'megatron' cannot run" in out.stdout
    assert "[warn] stack:mcore016-muon-emerging-optimizers" in out.stdout and "use_nesterov" in out.stdout


@pytest.mark.parametrize("name, overrides, ok", [
    ("kimi_k2_muon", [], True), ("kimi_k2_muon", ["optim.engine=megatron"], False),
    ("qwen3_30b_a3b_soap", [], True), ("qwen3_30b_a3b_soap", ["optim.engine=megatron"], False),
    ("kimi_k2_adamw", [], True)])
def test_dry_run_refuses_what_the_stack_cannot_build(name, overrides, ok):
    from nemo_muon.recipes.execute import build_recipe

    if ok:
        assert build_recipe(name, overrides).name == name
    else:
        with pytest.raises(ValueError, match="cannot run on the installed stack"):
            build_recipe(name, overrides)


def test_launch_dry_run_refuses_it_too():
    out = subprocess.run([NEMO_MUON, "launch", "--recipe", "kimi_k2_soap", "--executor", "slurm", "--dry-run",
                          "optim.engine=megatron"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "cannot run on the installed stack" in out.stderr + out.stdout


@pytest.mark.parametrize("spec, provider", [(KIMI_K2, "kimi"), (QWEN3_30B_A3B, "qwen")])
def test_architecture_fields_equal_bridges_model_providers(spec, provider, bridge):
    if provider == "kimi":
        from megatron.bridge.models.kimi.kimi_provider import KimiK2Provider

        prov = KimiK2Provider()
    else:
        from megatron.bridge.models.conversion.auto_bridge import AutoBridge

        prov = AutoBridge.from_hf_pretrained("Qwen/Qwen3-30B-A3B").to_megatron_provider(load_weights=False)
    names = {f.name for f in dataclasses.fields(prov)}
    ours = transformer_config_fields(spec)
    assert set(ours) <= names, f"fields Bridge's provider lacks: {set(ours) - names}"
    differ = {k: (v, getattr(prov, k)) for k, v in ours.items() if getattr(prov, k) != v}
    assert not differ, f"ours vs Bridge {type(prov).__name__}: {differ}"
    assert prov.vocab_size == spec.vocab_size


@pytest.mark.parametrize("require", ["muon", "soap", "adamw", "muon,soap,adamw"])
def test_container_build_check_builds_an_image_for_every_optimizer(require):
    """The Dockerfile's last RUN step on this stack: Muon, SOAP (nemo-muon's engine) and AdamW images build; the
    breaks of Megatron's own optimizers are reported, not fatal (the stack CLI's refusal: tests/test_megatron_stack)."""
    out = subprocess.run([sys.executable, "-P", "-m", "nemo_muon.megatron.shared.stack", "--require", require],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[mcore016-muon-emerging-optimizers] muon (engine 'megatron') cannot run" in out.stdout
    assert "[mcore-soap] soap (engine 'megatron') cannot run" in out.stdout
