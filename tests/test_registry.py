"""The optimizer registry (`nemo_muon.registry`): the one place that says which optimizer a config is.

What is checked: the name tables of recipes, overrides and documents are the registry's; a config subclassed from a
registered one is refused everywhere (never built, planned or launched as its parent); registration refuses a taken
name and a config whose ``name`` differs; a spec's references resolve into the layer that uses them; an optimizer
registered from outside the package is built, planned and costed through its entry.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from nemo_muon.recipes import get_recipe
from nemo_muon.recipes.overrides import apply_overrides
from nemo_muon.recipes.resolved import from_document, to_document

from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig
from nemo_muon.optim import build_optimizer
from nemo_muon.registry import BUILTIN, config_classes, names, register, resolve, spec_for, spec_named
from nemo_muon.registry.normuon import NorMuonConfig
from nemo_muon.registry.spec import OptimizerSpec
from nemo_muon.run_checks import check_run

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(kw_only=True)
class UnregisteredMuon(MuonConfig):
    """A researcher's Muon variant whose spec was never registered."""

    name: str = dataclasses.field(default="my_muon", init=False)


@dataclasses.dataclass(kw_only=True)
class ShadowMuon(MuonConfig):
    """A subclass that keeps Muon's name."""


def test_the_name_tables_are_the_registrys():
    assert names() == tuple(sorted(names())) and {"muon", "soap", "adamw", "normuon"} <= set(names())
    assert {"muon": MuonConfig, "soap": SoapConfig, "adamw": AdamWConfig, "normuon": NorMuonConfig}.items() <= \
        config_classes().items()
    for spec in BUILTIN:
        assert spec_for(spec.config_class()) is spec is spec_named(spec.name)
        assert spec.config_class().name == spec.name


def test_megatrons_registry_names_ours_by_package_then_optimizer_never_by_the_engine_word():
    """One word per meaning: the package and engine are ``nemo_muon``; an entry in Megatron's emerging-optimizer
    registry is ``nemo_muon.<optimizer>`` (Muon's was ``nemo_muon`` too, the engine's word)."""
    registered = {s.name: s.megatron.registered_name for s in BUILTIN if s.megatron and s.megatron.registered_name}
    assert {"muon", "soap", "normuon", "adamuon"} <= set(registered)
    assert all(value == f"nemo_muon.{name}" for name, value in registered.items())


def test_a_module_with_a_spec_is_discovered_without_a_line_elsewhere(tmp_path, monkeypatch):
    """Registry entries are the package's modules that define ``SPEC`` (in the order of their names), so a new
    optimizer's file is all the registry needs; a ``SPEC`` that is not an `OptimizerSpec` is refused."""
    import nemo_muon.registry as registry

    (tmp_path / "zz_sign.py").write_text("import dataclasses\nfrom nemo_muon.registry.muon import SPEC as MUON\n"
                                         "SPEC = dataclasses.replace(MUON, name='zz_sign')\n")
    (tmp_path / "helper_module.py").write_text("VALUE = 1\n")
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    found = registry.discover()
    assert [s.name for s in found] == [*names(), "zz_sign"]
    (tmp_path / "zz_bad.py").write_text("SPEC = 'muon'\n")
    with pytest.raises(ValueError, match=r"nemo_muon.registry.zz_bad.SPEC must be an OptimizerSpec; got str"):
        registry.discover()


def test_an_override_switches_to_any_registered_optimizer_and_a_document_round_trips_it():
    recipe = apply_overrides(get_recipe("tiny_kimi_k2_muon"), ["optimizer=normuon"])
    assert type(recipe.optimizer) is NorMuonConfig
    # a variant of the current optimizer keeps every field they share (the tiny recipes' learning-rate transfer)
    assert recipe.optimizer.scale_mode == "match_rms_adamw" == get_recipe("tiny_kimi_k2_muon").optimizer.scale_mode
    doc = json.loads(json.dumps(to_document(recipe, source="tiny_kimi_k2_muon", overrides=["optimizer=normuon"])))
    assert doc["recipe"]["optimizer"]["name"] == "normuon"
    assert from_document(doc).optimizer == recipe.optimizer
    with pytest.raises(ValueError, match=re.escape(f"optimizer must be one of {names()}; got 'lion'")):
        apply_overrides(get_recipe("tiny_kimi_k2_muon"), ["optimizer=lion"])


def test_a_subclass_config_never_runs_as_its_parent():
    cfg = UnregisteredMuon(lr=0.01)
    match = "optimizer config UnregisteredMuon is not registered"
    with pytest.raises(ValueError, match=match):
        spec_for(cfg)
    with pytest.raises(ValueError, match=match):
        build_optimizer(cfg, [("w", torch.nn.Parameter(torch.randn(4, 4)))])
    recipe = dataclasses.replace(get_recipe("tiny_kimi_k2_muon"), optimizer=cfg)
    with pytest.raises(ValueError, match=match):
        check_run(recipe)  # what every entry point runs before launch (plan, --dryrun, launch, the job)


def test_registration_refuses_a_taken_name_or_class_and_a_mismatched_config_name():
    muon = spec_named("muon")
    with pytest.raises(ValueError, match="optimizer 'muon' is registered already"):
        register(dataclasses.replace(muon, config_class=ShadowMuon))
    with pytest.raises(ValueError, match=r"UnregisteredMuon.name must be 'other'; got 'my_muon'"):
        register(dataclasses.replace(muon, config_class=UnregisteredMuon, name="other"))
    assert not any(s.config_class is UnregisteredMuon for s in BUILTIN)


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda s: s.name)
def test_each_reference_resolves_into_the_layer_that_uses_it(spec: OptimizerSpec):
    implementation = resolve(spec.implementation)
    assert issubclass(implementation, torch.optim.Optimizer)
    assert spec.implementation.startswith(("nemo_muon.optim.", "torch.optim:"))
    if spec.matrix is not None:
        assert implementation.registry_name == spec.name  # an instance finds its own entry
    if spec.megatron.fields is not None:
        assert spec.megatron.fields.startswith("nemo_muon.megatron.")
        assert callable(resolve(spec.megatron.fields))
    assert set(spec.megatron.engines) <= {"nemo_muon", "megatron"}


def test_an_optimizer_registered_outside_the_package_is_built_planned_and_costed_through_its_entry():
    """A signSGD-like matrix optimizer in a user's module: one config, one spec, `register`; nothing of the house is
    edited. Run in a fresh interpreter so the registration does not leak into other tests."""
    script = r'''
import dataclasses, json, math, torch
from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.registry import register, spec_for
from nemo_muon.registry.spec import MatrixSpec, MegatronSpec, OptimizerSpec
from nemo_muon.layerwise.plan_items import plan_item

@dataclasses.dataclass(kw_only=True)
class SignConfig(BaseOptimizerConfig):
    name: str = dataclasses.field(default="sign", init=False)

class Sign(torch.optim.Optimizer):
    def __init__(self, params, lr, weight_decay):
        super().__init__([p for _, p in params], {"lr": lr, "weight_decay": weight_decay})
    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                p.add_(p.grad.sign(), alpha=-g["lr"])

import __main__
__main__.Sign = Sign
register(OptimizerSpec(name="sign", label="Sign", config_class=SignConfig, implementation="__main__:Sign",
                       runtime_args=(), matrix=MatrixSpec(routing=lambda c: {"split_qkv": False,
                       "split_gate_up": False}, update_flops=lambda s, hp: 2.0 * math.prod(s), per_part=False,
                       state_elements=lambda s: 0, newton_schulz=False, splittable=False),
                       megatron=MegatronSpec(engines=("nemo_muon",), bridge_name="muon")))
from nemo_muon.optim import build_optimizer
w = torch.nn.Parameter(torch.ones(8, 4))
opt = build_optimizer(SignConfig(lr=0.5, weight_decay=0.0), [("layers.0.mlp.linear_fc2.weight", w)])
w.grad = -torch.ones(8, 4); opt.step()
item = plan_item("layers.0.mlp.linear_fc2.weight", w, SignConfig(lr=0.5), splittable=True)
print(json.dumps({"cls": type(opt).__name__, "w": float(w[0, 0]), "cost": item.cost, "spec": spec_for(SignConfig()).name}))
'''
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"cls": "Sign", "w": 1.5, "cost": 64.0, "spec": "sign"}
