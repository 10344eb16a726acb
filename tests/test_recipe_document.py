"""The resolved-recipe document (`nemo_muon.recipes.resolved`): a recipe is resolved once and what every rank and
every executor receives is this document, exactly, checked on load by the one validation; the job every launcher
builds passes the document, not the override strings, and training from it is training from name + overrides."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from nemo_muon.launchers.job import ENTRY_MODULE, LaunchOptions, build_plan
from nemo_muon.recipes import get_recipe, list_recipes
from nemo_muon.recipes.execute import build_recipe
from nemo_muon.recipes.resolved import (
    FORMAT,
    VERSION,
    document_path,
    document_text,
    from_document,
    read_document,
    to_document,
    write_document,
)

from nemo_muon.registry import names
from nemo_muon.secret_policy import is_secret_value

OVERRIDES = ["trainer.max_steps=77", "optim.lr=1.5e-4", "trainer.seed=7", "env.NM_DOC_CHECK=on",
             "logging.run_name=doc-run.1", "logging.tensorboard=true", "system.collective_timeout_s=120"]
SECRET = "hf_docdocdocdocdocdocdocdocdocdocdoc123"


def _types(value):
    """The value with every leaf's type next to it (1 and 1.0 compare equal; a round trip keeps the type too)."""
    if dataclasses.is_dataclass(value):
        return (type(value).__name__, {f.name: _types(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_types(v) for v in value])
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    return (type(value).__name__, value)


@pytest.mark.parametrize("name", list_recipes())
def test_every_recipe_round_trips_exactly_through_json(name: str) -> None:
    recipe = build_recipe(name, OVERRIDES)
    document = to_document(recipe, source=name, overrides=OVERRIDES)
    assert document["format"] == FORMAT and document["version"] == VERSION
    assert document["source"] == {"recipe": name, "overrides": OVERRIDES}
    loaded = from_document(json.loads(document_text(document)))
    assert loaded == recipe and _types(loaded) == _types(recipe)
    assert loaded.trainer.max_steps == 77 and loaded.env["NM_DOC_CHECK"] == "on"
    assert to_document(loaded, source=name, overrides=OVERRIDES) == document  # and back again, the same text


@pytest.mark.parametrize("kind", ["muon", "soap", "adamw"])
def test_each_optimizer_kind_comes_back_as_its_own_config(kind: str) -> None:
    recipe = build_recipe("tiny_kimi_k2_muon", [f"optimizer={kind}", "optim.weight_decay=0.05"])
    loaded = from_document(json.loads(document_text(to_document(recipe))))
    assert type(loaded.optimizer) is type(recipe.optimizer) and loaded == recipe


def _doc() -> dict:
    return json.loads(document_text(to_document(build_recipe("tiny_kimi_k2_muon"), source="tiny_kimi_k2_muon")))


def _damaged(change) -> dict:
    doc = copy.deepcopy(_doc())
    change(doc)
    return doc


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["recipe"]["trainer"].update(max_stepz=3),
     "recipe.trainer.max_stepz is not a field of TrainerConfig: the fields are ('max_steps', "),
    (lambda d: d["recipe"]["trainer"].pop("seed"),
     "recipe.trainer.seed is missing: TrainerConfig needs every one of the fields ("),
    (lambda d: d["recipe"].pop("optimizer"), "recipe.optimizer is missing"),
    (lambda d: d.update(extra=1), "document.extra is not a field of a nemo-muon/resolved-recipe document"),
    (lambda d: d["recipe"]["trainer"].update(max_steps="10"), "recipe.trainer.max_steps must be an integer; got '10'"),
    (lambda d: d["recipe"]["trainer"].update(max_steps=True), "recipe.trainer.max_steps must be an integer; got True"),
    (lambda d: d["recipe"]["trainer"].update(max_steps=2.0), "recipe.trainer.max_steps must be an integer; got 2.0"),
    (lambda d: d["recipe"].update(layerwise="yes"), "recipe.layerwise must be true or false; got 'yes'"),
    (lambda d: d["recipe"]["optimizer"].update(lr="3e-4"), "recipe.optimizer.lr must be a number; got '3e-4'"),
    (lambda d: d["recipe"]["optimizer"].update(adamw_betas=[0.9]),
     "recipe.optimizer.adamw_betas must be a list of 2 values; got [0.9]"),
    (lambda d: d["recipe"]["optimizer"].update(name="lion"),
     f"recipe.optimizer.name must be one of {names()}; got 'lion'"),
    (lambda d: d["recipe"]["optimizer"].update(betas=[0.9, 0.95]), "recipe.optimizer.betas is not a field of MuonConfig"),
    (lambda d: d["recipe"]["optimizer"].update(coefficients="cubic"),
     "recipe.optimizer.coefficients must be one of ('simple', 'quintic', 'polar_express', 'cans', 'aol', "
     "'deepseekv4'); got 'cubic'"),
    (lambda d: d["recipe"]["model"].update(family="llama"),
     "recipe.model.family must be one of ('deepseek_v3', 'qwen3_moe'); got 'llama'"),
    (lambda d: d["recipe"]["env"].update(NCCL_DEBUG=1), "recipe.env.NCCL_DEBUG must be a string; got 1"),
    (lambda d: d["recipe"].update(system=[]), "recipe.system must be an object with the fields ('gpu', "),
    (lambda d: d.update(format="nemo-muon/recipe"),
     "document.format must be 'nemo-muon/resolved-recipe'; got 'nemo-muon/recipe'"),
    (lambda d: d.update(version=2), "document.version must be 1 (the version this nemo-muon reads); got 2"),
    (lambda d: d["source"].update(overrides="a=b"), "source.overrides must be a list of key=value strings; got 'a=b'"),
    # well-typed but not a run: the one validation (run_checks.check_run) refuses it as build_recipe would
    (lambda d: d["recipe"]["scheduler"].update(warmup_steps=150),
     "scheduler.warmup_steps must be < trainer.max_steps (150)"),
    (lambda d: d["recipe"]["trainer"].update(max_steps=0), "trainer.max_steps must be an integer in [1, 1000000000]; got 0"),
])
def test_a_damaged_document_is_refused_naming_the_field(change, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        from_document(_damaged(change))
    assert str(refused.value).startswith(message), str(refused.value)


def test_not_a_document_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"document must be an object with the fields \('format', 'version', "):
        from_document([1, 2])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--recipe-file '.*bad.json' \(a JSON nemo-muon/resolved-recipe document\) must be valid JSON; got"):
        read_document(bad)
    with pytest.raises(ValueError, match="--recipe-file must be a readable regular file; got"):
        read_document(tmp_path / "missing.json")


def test_a_document_never_holds_a_secret() -> None:
    recipe = build_recipe("tiny_kimi_k2_muon")
    for env in ({"HF_TOKEN": "not-a-token-shape"}, {"NM_URL": f"https://user:{SECRET}@host/x"}, {"NM_X": SECRET}):
        leaky = dataclasses.replace(recipe, env={**recipe.env, **env})
        with pytest.raises(ValueError, match="a resolved recipe document never holds a secret") as refused:
            to_document(leaky)
        assert SECRET not in str(refused.value)
    doc = _damaged(lambda d: d["recipe"]["data"].update(tokenizer_dir=f"/x/{SECRET}"))  # edited into a file
    with pytest.raises(ValueError, match="never holds a secret") as refused:
        from_document(doc)
    assert SECRET not in str(refused.value)
    for name in list_recipes():  # and none of ours carries one: the policy's check finds no value in any field
        text = document_text(to_document(build_recipe(name), source=name))
        assert not is_secret_value(text), name


def test_a_launch_forwards_secrets_by_name_and_the_document_holds_none(tmp_path: Path) -> None:
    plan = build_plan(LaunchOptions(recipe="tiny_kimi_k2_muon", executor="slurm", container=False,
                                    env=["HF_TOKEN"], overrides=[f"logging.root={tmp_path}"]),
                      environ={"HF_TOKEN": SECRET})
    assert plan.secrets == {"HF_TOKEN": SECRET}
    assert SECRET not in document_text(plan.document) and "HF_TOKEN" not in document_text(plan.document)


@pytest.mark.parametrize("executor", ["local", "docker", "slurm"])
def test_the_job_every_launcher_builds_passes_the_document_not_the_overrides(tmp_path: Path, executor: str) -> None:
    overrides = [f"logging.root={tmp_path}", "trainer.max_steps=19", "optim.lr=2e-3"]
    plan = build_plan(LaunchOptions(recipe="tiny_kimi_k2_muon", executor=executor, image="img", container=False,
                                    overrides=overrides))
    command = " ".join(plan.argv) if plan.script is None else "\n".join(  # the script's commands, not its comments
        line for line in plan.script.splitlines() if not line.lstrip().startswith("#"))
    assert f"-m {ENTRY_MODULE} --recipe-file {plan.recipe_file}" in command
    assert "trainer.max_steps=19" not in command and "optim.lr" not in command and "--recipe " not in command
    assert plan.recipe_file == document_path(tmp_path / "tiny_kimi_k2_muon", plan.document)
    assert plan.recipe_file.name.startswith("recipe-") and not plan.recipe_file.exists()  # written at launch
    assert from_document(plan.document) == plan.recipe == build_recipe("tiny_kimi_k2_muon", overrides)
    assert plan.document["source"] == {"recipe": "tiny_kimi_k2_muon", "overrides": overrides}


def test_the_document_name_follows_its_content(tmp_path: Path) -> None:
    a = to_document(build_recipe("tiny_kimi_k2_muon", ["trainer.max_steps=20"]))
    b = to_document(build_recipe("tiny_kimi_k2_muon", ["trainer.max_steps=21"]))
    assert document_path(tmp_path, a) != document_path(tmp_path, b)  # a queued job's file is never replaced
    path = write_document(document_path(tmp_path, a), a)
    assert read_document(path) == a and [p.name for p in tmp_path.iterdir()] == [path.name]


TINY = ["system.gpus_per_node=1", "trainer.max_steps=3", "scheduler.warmup_steps=1", "trainer.global_batch_size=4",
        "trainer.micro_batch_size=2", "trainer.seq_length=32", "trainer.eval_interval=0", "data.kind=mock"]


def _losses(run_dir: Path) -> list[tuple[int, float, float]]:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(e["step"], e["loss"], e["grad_norm"]) for e in events if e["event"] == "train"]


def test_the_job_trains_from_a_document_exactly_as_from_name_and_overrides(tmp_path: Path, monkeypatch) -> None:
    from nemo_muon.launchers.run_recipe import main as job_main

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NEMO_MUON_LAUNCH_ENV"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "runs"
    by_name = [*TINY, f"logging.root={root}", "logging.run_name=by-name"]
    assert job_main(["--recipe", "tiny_kimi_k2_muon", *by_name]) == 0
    by_doc = [*TINY, f"logging.root={root}", "logging.run_name=by-doc"]
    document = to_document(build_recipe("tiny_kimi_k2_muon", by_doc), source="tiny_kimi_k2_muon", overrides=by_doc)
    path = write_document(document_path(root / "by-doc", document), document)
    assert job_main(["--recipe-file", str(path)]) == 0
    first, second = _losses(root / "by-name"), _losses(root / "by-doc")
    assert [s for s, _, _ in first] == [1, 2, 3] and first == second
    launched = json.loads((root / "by-doc" / "launch.json").read_text())
    assert launched["recipe"] == "tiny_kimi_k2_muon" and launched["overrides"] == by_doc
    assert launched["recipe_file"] == str(path)
    assert json.loads((root / "by-name" / "launch.json").read_text())["recipe_file"] is None


def test_the_job_refuses_overrides_beside_a_document_and_a_damaged_file(tmp_path: Path, capsys) -> None:
    from nemo_muon.launchers.run_recipe import main as job_main

    document = to_document(get_recipe("tiny_kimi_k2_muon"))
    path = write_document(tmp_path / "recipe.json", document)
    assert job_main(["--recipe-file", str(path), "trainer.max_steps=3"]) == 2
    assert "error: overrides must be empty with --recipe-file" in capsys.readouterr().err
    damaged = json.loads(path.read_text())
    damaged["recipe"]["trainer"]["max_steps"] = "3"
    path.write_text(json.dumps(damaged), encoding="utf-8")
    assert job_main(["--recipe-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: recipe.trainer.max_steps must be an integer; got '3'") and "Traceback" not in err
    with pytest.raises(SystemExit):  # exactly one of --recipe / --recipe-file
        job_main(["--recipe", "tiny_kimi_k2_muon", "--recipe-file", str(path)])
