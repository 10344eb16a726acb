"""`nemo-muon launch --preflight`: the preflight is the job's first step (Slurm: its own srun step in the allocation;
docker / local: the command before the run's), on the same resolved recipe, and the run starts only when it passed.
The GB300 Muon / SOAP recipes turn it on (``system.preflight``); a recipe preflight cannot prove is refused naming
the field. The real Slurm job (a failing preflight stops it, a passing one trains) is in tests/test_slurm_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.recipes import get_recipe, list_recipes

from nemo_muon.registry import spec_for
from nemo_muon.train.refusals import REFUSED_EXIT

IMAGE = "nvcr.io/nvidia/nemo:26.02"
LOCAL = ["--recipe", "qwen3_30b_a3b_muon", "--nodes", "1", "--gpus-per-node", "2", "parallelism.ep=2"]
"""A GB300 Muon recipe scaled to this machine's two processes (its preflight is on by default)."""


def _plan(tmp_path: Path, *args: str) -> dict:
    result = CliRunner().invoke(main, ["launch", *args, "--dry-run", "--json", f"logging.root={tmp_path / 'runs'}"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _refusal(tmp_path: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["launch", *args, "--executor", "slurm", "--image", IMAGE, "--dry-run",
                                       f"logging.root={tmp_path / 'runs'}"])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "runs").exists()
    return result.output.strip().splitlines()[-1]


def test_the_gb300_matrix_optimizer_recipes_and_only_they_preflight_by_default() -> None:
    on = {name for name in list_recipes() if get_recipe(name).system.preflight}
    assert on == {name for name in list_recipes() if (r := get_recipe(name)).system.gpu == "gb300"
                  and r.backend == "megatron" and spec_for(r.optimizer).matrix is not None}
    assert {"kimi_k2_muon", "kimi_k2_soap", "qwen3_30b_a3b_muon", "kimi_k2_muon_split"} <= on
    assert not on & {"kimi_k2_adamw", "qwen3_30b_a3b_muon_h100", "kimi_k2_muon_b200", "tiny_kimi_k2_muon"}


def test_system_preflight_is_a_boolean() -> None:
    from nemo_muon.config.recipe import SystemConfig

    with pytest.raises(ValueError, match=r"system.preflight must be true or false; got 1"):
        SystemConfig(preflight=1)


def test_a_slurm_job_runs_the_preflight_as_its_first_step_on_the_same_recipe(tmp_path) -> None:
    plan = _plan(tmp_path, "--recipe", "kimi_k2_muon", "--executor", "slurm", "--image", IMAGE)
    lines = plan["script"].splitlines()
    preflight, training = [line for line in lines if line.startswith("srun ")]
    run_dir = tmp_path / "runs" / "kimi_k2_muon"
    assert preflight.endswith(f"python -m nemo_muon.preflight.main --recipe-file {plan['recipe_file']} --out "
                              f"{run_dir}/preflight --pp 4 --ep 8")  # the recipe's PP=4 and EP=64 on its 256 GPUs, scaled to the tiny
    # model's 4 layers and 8 experts
    assert training.endswith(f"python -m nemo_muon.launchers.run_recipe --recipe-file {plan['recipe_file']}")
    # the same image, nodes and tasks; the preflight's ranks end with their own code (slurm.PREFLIGHT_STEP_END)
    assert preflight.split(" python ")[0].replace("--kill-on-bad-exit=0 --wait=60", "--kill-on-bad-exit=1") == \
        training.split(" python ")[0]
    assert lines.index("set -euo pipefail") < lines.index(preflight) < lines.index(training)
    assert plan["preflight_command"] is None  # Slurm: the script holds both steps
    assert plan["document"]["recipe"]["system"]["preflight"] is True


@pytest.mark.parametrize("executor", ["local", "docker"])
def test_docker_and_local_print_the_preflight_before_the_run(tmp_path, executor) -> None:
    args = [*LOCAL, "--executor", executor, *(["--image", IMAGE] if executor == "docker" else [])]
    plan = _plan(tmp_path, *args)
    run_dir = tmp_path / "runs" / "qwen3_30b_a3b_muon"
    step = f"-m nemo_muon.preflight.main --recipe-file {plan['recipe_file']} --out {run_dir}/preflight --pp 1 --ep 2"
    assert plan["preflight_command"].endswith(step)
    assert plan["command"].endswith(f"-m nemo_muon.launchers.run_recipe --recipe-file {plan['recipe_file']}")
    assert plan["preflight_command"].removesuffix(step) == plan["command"].removesuffix(
        f"-m nemo_muon.launchers.run_recipe --recipe-file {plan['recipe_file']}")  # same torchrun / docker run
    text = CliRunner().invoke(main, ["launch", *args, "--dry-run", f"logging.root={tmp_path / 'runs'}"]).stdout
    assert text.index("# step 1: nemo-muon preflight") < text.index("# step 2, only when the preflight passed (exit 0)")


def test_no_preflight_is_one_override_and_preflight_turns_it_on(tmp_path) -> None:
    off = _plan(tmp_path, "--recipe", "kimi_k2_muon", "--executor", "slurm", "--image", IMAGE, "--no-preflight")
    assert "system.preflight=false" in off["overrides"] and "nemo_muon.preflight.main" not in off["script"]
    assert off["document"]["recipe"]["system"]["preflight"] is False
    on = _plan(tmp_path, "--recipe", "qwen3_30b_a3b_muon_h100", "--executor", "slurm", "--image", IMAGE, "--preflight")
    assert "system.preflight=true" in on["overrides"] and "nemo_muon.preflight.main" in on["script"]
    same = _plan(tmp_path, "--recipe", "kimi_k2_muon", "--executor", "slurm", "--image", IMAGE, "--preflight")
    assert "system.preflight=true" not in same["overrides"]  # already the recipe's: nothing to record


@pytest.mark.parametrize(("args", "message"), [
    (["--recipe", "kimi_k2_adamw", "--preflight"], "system.preflight must be false for backend='megatron' with "
     "optimizer.kind='adamw'"),
    (["--recipe", "tiny_kimi_k2_muon", "system.preflight=true"], "system.preflight must be false for backend='torch'"),
    (["--recipe", "kimi_k2_muon", "--no-preflight", "system.preflight=true"],
     "--no-preflight and 'system.preflight=true' both set system.preflight; pass one of them"),
    (["--recipe", "kimi_k2_muon", "system.preflight=maybe"], "system.preflight must be a boolean (one of ("),
])
def test_a_preflight_that_cannot_run_is_refused_naming_the_field(tmp_path, args, message) -> None:
    assert message in _refusal(tmp_path, *args)


def test_a_failed_local_preflight_never_starts_the_run(tmp_path) -> None:
    """The real local gate: torchrun over the preflight entry point on 2 CPU processes, which refuses a machine
    without CUDA on rank 0's one line (exit 2); the run is not started (its rank 0 would write launch.json)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the preflight runs here (bench/gpu runs it) instead of refusing")
    cli = [sys.executable, "-c", "from nemo_muon.launchers.cli import main; main()"]
    done = subprocess.run([*cli, "launch", *LOCAL, "--executor", "local", f"logging.root={tmp_path / 'runs'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == REFUSED_EXIT, done.stderr
    run_dir = tmp_path / "runs" / "qwen3_30b_a3b_muon"
    said = [line for line in done.stderr.splitlines() if line.startswith(("preflight", "W"))]  # W: torchrun's banner
    assert [line for line in said if not line.startswith("W")] == [
        "preflight refused: preflight.device='cuda' needs a CUDA device; got none on this machine (preflight proves "
        "the GPU path; on CPU it runs in the test harness, tests/megatron_cpu/test_preflight.py)",
        f"preflight failed (exit {REFUSED_EXIT}): the run was not started; report: {run_dir}/preflight/preflight.md"]
    assert not (run_dir / "launch.json").exists() and list(run_dir.glob("recipe-*.json"))
