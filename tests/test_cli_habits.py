"""One syntax across `nemo-muon` subcommands (issue 37 item 6): overrides are `key=value` arguments everywhere
(`--set key=value` accepted too), the dry run is `--dry-run` (`--dryrun` accepted too), options are labelled in their
units, and a recipe for another GPU than the cluster profile's names the recipe to pick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.recipes import get_recipe


def _ok(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_plan_takes_overrides_as_arguments_like_launch_and_set_too() -> None:
    plain = json.loads(_ok("plan", "--recipe", "tiny_kimi_k2_muon", "--json"))
    argument = json.loads(_ok("plan", "--recipe", "tiny_kimi_k2_muon", "trainer.global_batch_size=16", "--json"))
    option = json.loads(_ok("plan", "--recipe", "tiny_kimi_k2_muon", "--set", "trainer.global_batch_size=16", "--json"))
    assert argument == option != plain
    seq = get_recipe("tiny_kimi_k2_muon").trainer.seq_length
    assert argument["tokens_per_step"] == 16 * seq != plain["tokens_per_step"]


@pytest.mark.parametrize("command", ["launch", "bench"])
def test_launch_and_bench_take_set_like_plan_and_dryrun_like_nemo(command: str, tmp_path: Path) -> None:
    root = f"logging.root={tmp_path}"
    argument = _ok(command, "--recipe", "tiny_kimi_k2_muon", "trainer.seed=7", root, "--dry-run", "--json")
    option = _ok(command, "--recipe", "tiny_kimi_k2_muon", "--set", "trainer.seed=7", root, "--dryrun", "--json")
    assert json.loads(argument) == json.loads(option)
    assert "trainer.seed=7" in argument


def test_help_names_one_override_syntax_and_one_dry_run_spelling() -> None:
    for command in ("launch", "bench", "plan"):
        text = _ok(command, "--help")
        assert "[OVERRIDES]..." in text and "--set KEY=VALUE" in text and "Same as a KEY=VALUE argument" in text
    for command in ("launch", "bench"):
        assert "--dry-run, --dryrun" in _ok(command, "--help")


def test_model_tflops_is_labelled_in_tflops_not_seconds() -> None:
    text = " ".join(_ok("plan", "--help").split())
    assert "--model-tflops TFLOP/s" in text and "--model-tflops SECONDS" not in text
    assert "--step-time SECONDS" in text


def test_a_recipe_for_another_gpu_than_the_clusters_names_the_recipe_to_pick(tmp_path: Path) -> None:
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text("eos:\n  executor: slurm\n  system: gb300\n  gpus_per_node: 4\n  image: nemo-muon:26.02\n")
    result = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon_b200", "--cluster", "eos", "--profiles",
                                       str(profiles), "--dry-run", f"logging.root={tmp_path}"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert ("--recipe kimi_k2_muon_b200 runs on system.gpu='b200', but cluster 'eos' has system 'gb300'; pick a recipe "
            "for gb300: kimi_k2_muon, ") in " ".join(result.output.split())
