"""`nemo-muon bench` fails before the cost (issue 37 items 5, 6): the baseline has its own run folder, both folders
are checked before the first run starts, a failed first run stops the bench, and the baseline recipe comes from the
registry (the recipe's optimizer, a whole name token), not from substrings of the name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers import bench as bench_module
from nemo_muon.launchers.bench import baseline_name
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.launch import LaunchResult


def _runs(tmp_path: Path, *args: str) -> list[dict]:
    result = CliRunner().invoke(main, ["bench", *args, "--dry-run", "--json", f"logging.root={tmp_path}"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["runs"]


def test_the_baseline_gets_its_own_run_folder_when_a_run_name_is_set(tmp_path: Path) -> None:
    first, second = _runs(tmp_path, "--recipe", "tiny_kimi_k2_muon", "logging.run_name=b1")
    assert (first["recipe"], second["recipe"]) == ("tiny_kimi_k2_muon", "tiny_kimi_k2_adamw")
    assert (first["run_dir"], second["run_dir"]) == (str(tmp_path / "b1"), str(tmp_path / "b1-adamw"))
    assert second["document"]["recipe"]["logging"]["run_name"] == "b1-adamw"


@pytest.mark.parametrize(("recipe", "compare", "baseline"), [
    ("tiny_kimi_k2_normuon", "adamw", "tiny_kimi_k2_adamw"),
    ("tiny_kimi_k2_muon", "normuon", "tiny_kimi_k2_normuon"),
    ("kimi_k2_muon_bf16", "adamw", "kimi_k2_adamw_bf16"),
    ("kimi_k2_muon_qk_clip", "adamw", "kimi_k2_muon_qk_clip"),  # no kimi_k2_adamw_qk_clip: the same recipe
])
def test_the_baseline_is_the_registered_recipe_of_the_compared_optimizer(recipe: str, compare: str,
                                                                         baseline: str) -> None:
    assert baseline_name(recipe, compare) == baseline


def test_without_a_baseline_recipe_the_optimizer_is_switched_in_its_own_folder(tmp_path: Path) -> None:
    first, second = _runs(tmp_path, "--recipe", "tiny_qwen3_moe_muon", "--compare", "soap")
    assert first["recipe"] == second["recipe"] == "tiny_qwen3_moe_muon"
    assert second["document"]["recipe"]["optimizer"]["name"] == "soap"
    assert second["run_dir"] == str(tmp_path / "tiny_qwen3_moe_muon-soap") != first["run_dir"]


def test_both_run_folders_are_checked_before_the_first_run_starts(tmp_path: Path, monkeypatch) -> None:
    started = []
    monkeypatch.setattr(bench_module, "execute", lambda plan, **_: started.append(plan) or LaunchResult(exit_code=0))
    taken = tmp_path / "b1-adamw"
    taken.mkdir()
    (taken / "metrics.jsonl").write_text('{"event": "run"}\n')
    result = CliRunner().invoke(main, ["bench", "--recipe", "tiny_kimi_k2_muon", "logging.run_name=b1",
                                       f"logging.root={tmp_path}"])
    assert result.exit_code == 2 and started == [] and "Traceback" not in result.output
    assert f"'{taken}' already holds metrics.jsonl" in result.output


def test_a_failed_first_run_stops_the_bench_before_the_baseline(tmp_path: Path, monkeypatch) -> None:
    started = []
    monkeypatch.setattr(bench_module, "execute", lambda plan, **_: started.append(plan) or LaunchResult(exit_code=3))
    result = CliRunner().invoke(main, ["bench", "--recipe", "tiny_kimi_k2_muon", f"logging.root={tmp_path}"])
    assert result.exit_code == 1 and [p.recipe_name for p in started] == ["tiny_kimi_k2_muon"]
    assert "tiny_kimi_k2_muon failed (exit 3; its run folder: " in result.output
    assert "the baseline tiny_kimi_k2_adamw was not started" in result.output
