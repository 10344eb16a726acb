"""The stack rules as a function of versions, and which stack `check_recipe_stack` judges (the rules are shown to
be true against the real libraries in tests/container_stack)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from nemo_muon.recipes import get_recipe, list_recipes

from nemo_muon.megatron.shared import stack
from nemo_muon.versions import CONTAINER_RELEASES


def _rules(**versions: str | None) -> set[str]:
    names = {"mcore": stack.MCORE, "eo": stack.EMERGING_OPTIMIZERS, "nemo": stack.NEMO}
    return {p.rule for p in stack.stack_problems({names[k]: v for k, v in versions.items()})}


@pytest.mark.parametrize("versions, rules", [
    (dict(mcore="0.16.0", eo="0.3.0", nemo="2.7.0"), {"mcore016-muon-emerging-optimizers", "mcore-soap"}),
    (dict(mcore="0.16.1rc0+abc", eo="0.1.0", nemo=None), {"mcore-soap", "emerging-optimizers-too-old-for-nemo-muon"}),
    (dict(mcore="0.19.0", eo="0.2.0", nemo=None), set()),
    (dict(mcore="0.16.0", eo=None, nemo=None), {"mcore016-muon-no-emerging-optimizers", "mcore-soap"}),
    (dict(mcore="0.18.0", eo="0.3.0", nemo=None), set()),
    (dict(mcore="0.19.2", eo="0.3.0", nemo="2.7.3"), {"nemo27-mcore019"}),
    (dict(mcore=None, eo="0.3.0", nemo=None), set()),
])
def test_rules_fire_exactly_on_the_known_breaks(versions, rules):
    assert _rules(**versions) == rules


def test_megatrons_own_muon_breaks_are_engine_specific():
    """0.16 + emerging-optimizers 0.3.0 stops Megatron-Core's own Muon, and 0.16 has no SOAP of its own; neither
    stops nemo-muon's optimizers inside Megatron's layer-wise optimizer (the default engine)."""
    versions = {stack.MCORE: "0.16.0", stack.EMERGING_OPTIMIZERS: "0.3.0", stack.NEMO: None}
    assert stack.problems_for_optimizer("muon", versions) == []
    assert [p.rule for p in stack.problems_for_optimizer("muon", versions, engine="megatron")] == [
        "mcore016-muon-emerging-optimizers"]
    assert stack.problems_for_optimizer("soap", versions) == []
    assert [p.rule for p in stack.problems_for_optimizer("soap", versions, engine="megatron")] == ["mcore-soap"]
    with pytest.raises(ValueError, match=r"optimizer.name='muon' with optimizer.engine='megatron' cannot run on x:\n"
                                         r"  - \[mcore016-muon-emerging-optimizers\].*fix: use optimizer.engine=nemo_muon"):
        stack.check_stack("muon", versions, where="x", engine="megatron")


def test_a_bad_version_string_is_named():
    with pytest.raises(ValueError, match="version"):
        stack.stack_problems({stack.MCORE: "main"})


def test_without_megatron_installed_the_release_stack_is_judged(monkeypatch):
    monkeypatch.setattr(stack, "installed_versions", lambda: dict.fromkeys(stack.CHECKED_DISTRIBUTIONS))
    monkeypatch.setenv("NEMO_MUON_RELEASE", "26.02")
    stack.check_recipe_stack(get_recipe("kimi_k2_muon"))  # engine nemo_muon: runs on 26.02
    own = get_recipe("kimi_k2_muon")
    own = own.replace(optimizer=dataclasses.replace(own.optimizer, engine="megatron"))
    with pytest.raises(ValueError, match=r"cannot run on the nemo:26.02 container stack:\n  - \[mcore016-muon"):
        stack.check_recipe_stack(own)
    stack.check_recipe_stack(get_recipe("kimi_k2_soap"))
    soap = get_recipe("kimi_k2_soap")
    with pytest.raises(ValueError, match=r"cannot run on the nemo:26.02 container stack:\n  - \[mcore-soap\]"):
        stack.check_recipe_stack(soap.replace(optimizer=dataclasses.replace(soap.optimizer, engine="megatron")))
    stack.check_recipe_stack(get_recipe("kimi_k2_adamw"))
    stack.check_recipe_stack(get_recipe("tiny_kimi_k2_muon"))  # torch backend: no Megatron involved
    monkeypatch.setenv("NEMO_MUON_RELEASE", "26.08")  # Megatron-Core 0.19: Muon and SOAP both build; Bridge 0.6
    stack.check_recipe_stack(get_recipe("kimi_k2_muon").replace(hf_config="/configs/kimi_k2"))
    stack.check_recipe_stack(get_recipe("kimi_k2_soap").replace(hf_config="/configs/kimi_k2"))


@pytest.mark.parametrize("release", list(CONTAINER_RELEASES))
def test_every_megatron_recipe_passes_the_dry_run_check_on_every_release_without_hf_config(release, monkeypatch):
    """26.04 / 26.06 refused every megatron recipe ('perf configs outside the wheel'), 26.08 every one without
    hf_config: Bridge 0.4 / 0.5 now build from their library recipes, and the config.json of each model ships."""
    monkeypatch.setattr(stack, "installed_versions", lambda: dict.fromkeys(stack.CHECKED_DISTRIBUTIONS))
    monkeypatch.setenv("NEMO_MUON_RELEASE", release)
    for name in list_recipes():
        recipe = get_recipe(name)
        if recipe.backend == "megatron":
            stack.check_recipe_stack(recipe)


def test_a_model_without_a_shipped_config_needs_hf_config_naming_the_field(monkeypatch, tmp_path):
    from nemo_muon.megatron.bridge import hf_config

    monkeypatch.setattr(stack, "installed_versions", lambda: dict.fromkeys(stack.CHECKED_DISTRIBUTIONS))
    monkeypatch.setenv("NEMO_MUON_RELEASE", "26.08")
    monkeypatch.setattr(hf_config, "SHIPPED_HF_CONFIGS", tmp_path)  # an install without the package data
    with pytest.raises(ValueError, match=r"recipe 'qwen3_30b_a3b_muon' on the nemo:26.08 container stack \(megatron-"
                                         r"bridge 0.6.0\): hf_config must name a local folder holding "
                                         r"Qwen/Qwen3-30B-A3B's Hugging Face config.json"):
        stack.check_recipe_stack(get_recipe("qwen3_30b_a3b_muon"))
    stack.check_recipe_stack(get_recipe("qwen3_30b_a3b_muon").replace(hf_config="/configs/qwen3"))


def test_the_shipped_config_is_the_models_architecture():
    """The config.json each megatron model ships with states the architecture numbers of its ModelSpec."""
    import json

    from nemo_muon.megatron.bridge.hf_config import HF_MODEL_IDS, shipped_hf_config
    from nemo_muon.models import get_model_spec

    for model in HF_MODEL_IDS:
        config = json.loads((Path(shipped_hf_config(model)) / "config.json").read_text())
        spec = get_model_spec(model)
        assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
            spec.num_layers, spec.hidden_size, spec.vocab_size), model


def test_with_megatron_installed_the_installed_stack_is_judged():
    assert stack.installed_versions()[stack.MCORE] == "0.19.2"  # this environment (.venv)
    stack.check_recipe_stack(get_recipe("kimi_k2_muon"))
    stack.check_recipe_stack(get_recipe("kimi_k2_soap"))


def test_the_installed_stack_is_judged_once_per_process_and_a_refusal_every_time(monkeypatch):
    """A Bridge run checks from its container build and again from Bridge's optimizer setup: the rules run once for
    the same (optimizer, engine, installed versions); a refusal is raised on every call; other versions re-judge."""
    calls = []
    judge = stack.check_stack
    monkeypatch.setattr(stack, "check_stack", lambda *a, **k: (calls.append(a[0]), judge(*a, **k)))
    stack._check_installed_once.cache_clear()
    stack.check_installed_stack("muon", "nemo_muon")
    stack.check_installed_stack("muon", "nemo_muon")
    assert calls == ["muon"]
    broken = {stack.MCORE: "0.19.2", stack.EMERGING_OPTIMIZERS: "0.3.0", stack.NEMO: "2.7.0"}
    monkeypatch.setattr(stack, "installed_versions", lambda: broken)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"optimizer.name='muon' with optimizer.engine='nemo_muon' cannot run"):
            stack.check_installed_stack("muon", "nemo_muon")
    assert calls == ["muon"] * 3


def test_the_image_build_check_refuses_a_stack_that_cannot_run_the_required_optimizers(monkeypatch, capsys):
    """`python -m nemo_muon.megatron.shared.stack --require ...` (the Dockerfile's last step) on NeMo 2.7 + Megatron-Core
    0.19: exit 1 naming what cannot run; a stack without breaks passes."""
    broken = {stack.MCORE: "0.19.2", stack.EMERGING_OPTIMIZERS: "0.3.0", stack.NEMO: "2.7.0"}
    monkeypatch.setattr(stack, "installed_versions", lambda: broken)
    assert stack._main(["--require", "muon,adamw"]) == 1
    out = capsys.readouterr()
    assert "[nemo27-mcore019] any optimizer cannot run" in out.out
    assert "the image must run ['muon', 'adamw'], but ['adamw', 'muon'] cannot run on this stack" in out.err
    monkeypatch.setattr(stack, "installed_versions", lambda: {**broken, stack.NEMO: None})
    assert stack._main(["--require", "muon,soap,adamw"]) == 0


@pytest.mark.parametrize("checkpoint", [dict(save_interval=100), dict(resume=True, dir="/ckpt")])
@pytest.mark.parametrize("optimizer", ["soap", "normuon"])
def test_every_optimizer_inside_megatron_may_checkpoint(checkpoint, optimizer):
    """SOAP's factors and NorMuon's row-wise moments go through Megatron's dist_checkpointing as tensors keyed by
    their parameter (`nemo_muon.megatron.shared.state_checkpoint`; the save and resume run in tests/megatron_cpu): a
    recipe with checkpoints is valid."""
    from nemo_muon.recipes.overrides import apply_overrides

    from nemo_muon.config.recipe import CheckpointConfig
    from nemo_muon.run_checks import check_run

    recipe = apply_overrides(get_recipe("kimi_k2_muon"), [f"optimizer={optimizer}"])
    check_run(recipe.replace(checkpoint=CheckpointConfig(**checkpoint)))


def test_a_megatron_resume_refuses_a_cut_shard_before_bridge_runs(tmp_path):
    """`nemo_muon.megatron.bridge.container.pretrain` checks the checkpoint its resume would load (the tracker's iteration)
    before Bridge is imported or the model built: a shard cut short is refused naming the file."""
    import torch
    import torch.distributed.checkpoint as dcp

    from nemo_muon.config.recipe import CheckpointConfig
    from nemo_muon.layerwise.checkpoint import CheckpointError
    from nemo_muon.megatron.bridge import container as bridge

    folder = tmp_path / "iter_0000007"
    dcp.save({"weight": torch.arange(4096.0)}, checkpoint_id=str(folder), no_dist=True)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    (shard,) = folder.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:1000])
    recipe = get_recipe("kimi_k2_muon").replace(checkpoint=CheckpointConfig(resume=True, dir=str(tmp_path)))
    with pytest.raises(CheckpointError, match=rf"checkpoint {folder}: file {shard} is truncated: 1000 bytes"):
        bridge.pretrain(recipe)


def test_emerging_optimizers_older_than_ours_needs_stops_our_muon_only():
    """NGC 26.02 / 26.04 ship emerging-optimizers 0.1.0: it runs Megatron-Core 0.16's own Muon, not ours."""
    versions = {stack.MCORE: "0.16.0", stack.EMERGING_OPTIMIZERS: "0.1.0", stack.NEMO: None}
    assert [p.rule for p in stack.problems_for_optimizer("muon", versions)] == [
        "emerging-optimizers-too-old-for-nemo-muon"]
    assert stack.problems_for_optimizer("muon", versions, engine="megatron") == []
    assert stack.problems_for_optimizer("adamw", versions) == []
    with pytest.raises(ValueError, match=r"emerging-optimizers 0.1.0 cannot run nemo-muon's Muon: .*"
                                         r"get_coefficient_iterator, which arrives in 0.2.0.*fix: install "
                                         r"emerging-optimizers >= 0.2.0"):
        stack.check_stack("muon", versions, where="x")


@pytest.mark.parametrize("release, eo", [("26.02", "0.3.0"), ("26.04", "0.3.0"), ("26.06", "0.2.0"),
                                         ("26.08", "0.2.0")])
def test_the_image_keeps_the_bases_emerging_optimizers_only_where_ours_runs_on_it(release, eo):
    """The release ships 0.1.0 (26.02, 26.04: replaced by our pin) or 0.2.0 (26.06, 26.08: kept)."""
    assert stack.release_versions(release)[stack.EMERGING_OPTIMIZERS] == eo
    assert stack.problems_for_optimizer("muon", stack.release_versions(release)) == []


def test_a_login_node_with_megatron_core_but_no_bridge_judges_the_releases_bridge(monkeypatch):
    """.venv has Megatron-Core 0.19.2 and no Bridge: the run's config is built in the release's container."""
    assert stack.installed_versions()[stack.MCORE] is not None
    monkeypatch.setenv("NEMO_MUON_RELEASE", "26.08")
    assert stack.target_bridge() == ("0.6.0", "the nemo:26.08 container stack")
    stack.check_recipe_stack(get_recipe("kimi_k2_muon"))
    monkeypatch.setenv("NEMO_MUON_RELEASE", "26.02")
    stack.check_recipe_stack(get_recipe("kimi_k2_muon"))
