"""Hostile strings never execute, secrets never print, bad input is a usage error (exit 2) and submits nothing.

The rendered sbatch script is run by bash with stand-in `srun`/`scontrol` on PATH that record the argv and
environment they receive: the hostile values must arrive verbatim and nothing else may run.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.recipes.resolved import from_document

HOSTILE = "; rm -rf ~ $(touch pwned1) `touch pwned2` \"'\n touch pwned3 #"
SECRET = "hf_s3cr3t-value-XYZ"


def _invoke(args: list[str], env: dict[str, str] | None = None):
    return CliRunner(env=env).invoke(main, args)


def _shims(folder: Path) -> Path:
    folder.mkdir()
    srun = folder / "srun"
    srun.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(os.environ['SHIM_OUT'], 'w'))\n")
    scontrol = folder / "scontrol"
    scontrol.write_text("#!/bin/sh\necho node0\n")
    for f in (srun, scontrol):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return folder


def _no_pwned(tmp: Path) -> None:
    """No file named pwned* under the test's folder, in the current folder or in the home folder."""
    assert not list(tmp.rglob("pwned*")), f"something executed in {tmp}"
    for folder in (Path.cwd(), Path.home()):
        assert not list(folder.glob("pwned*")), f"something executed in {folder}"


def test_hostile_env_and_override_values_arrive_verbatim_and_execute_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    hostile_override = f"data.tokenizer_dir={HOSTILE}"
    result = _invoke(["launch", "--recipe", "kimi_k2_muon", "--executor", "slurm", "--no-container", "--dry-run",
                      "--json", "--env", f"NM_HOSTILE={HOSTILE}", "--env", "HF_TOKEN", f"logging.root={work}",
                      hostile_override], env={"HF_TOKEN": SECRET})
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert SECRET not in result.output and plan["secrets"] == {"HF_TOKEN": "****"}
    script = work / "job.sbatch"
    script.write_text(plan["script"])
    shim_out = tmp_path / "srun.json"
    env = {**os.environ, "PATH": f"{_shims(tmp_path / 'bin')}:{os.environ['PATH']}", "SHIM_OUT": str(shim_out),
           "SLURM_JOB_NODELIST": "node0", "SLURM_NNODES": "64", "SLURM_JOB_ID": "1", "HOME": str(tmp_path),
           "HF_TOKEN": SECRET}
    run = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    seen = json.loads(shim_out.read_text())
    assert seen["argv"] == ["--kill-on-bad-exit=1", "--mpi=pmix", sys.executable, "-m", "nemo_muon.launchers.run_recipe",
                            "--recipe-file", plan["recipe_file"]]  # the resolved document, not the override strings
    assert plan["document"]["source"]["overrides"] == [f"logging.root={work}", hostile_override]  # byte for byte
    assert from_document(plan["document"]).data.tokenizer_dir == HOSTILE
    assert seen["env"]["NM_HOSTILE"] == HOSTILE
    assert seen["env"]["HF_TOKEN"] == SECRET  # forwarded from the submitting environment ...
    assert SECRET not in plan["script"]  # ... and never written into the script
    _no_pwned(tmp_path)


def test_secret_values_are_masked_in_text_json_and_docker_lines(tmp_path: Path) -> None:
    env = {"HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET + "w", "DB_PASSWORD": SECRET + "p"}
    for executor in ("slurm", "docker", "local"):  # secrets travel by name (a value on --env is refused)
        args = ["launch", "--recipe", "qwen3_30b_a3b_muon", "--executor", executor, "--image", "img", "--dry-run",
                "--env", "HF_TOKEN", "--env", "WANDB_API_KEY", "--env", "DB_PASSWORD", f"logging.root={tmp_path}"]
        if executor == "local":
            args += ["--gpus-per-node", "4", "--nodes", "1", "parallelism.ep=4", "trainer.global_batch_size=64"]
        for extra in ([], ["--json"]):
            result = _invoke(args + extra, env=env)
            assert result.exit_code == 0, result.output
            assert SECRET not in result.output, (executor, extra)
            assert "****" in result.output
    docker = _invoke(["launch", "--recipe", "qwen3_30b_a3b_muon", "--executor", "docker", "--image", "img",
                      "--dry-run", "--env", "HF_TOKEN", f"logging.root={tmp_path}"], env=env).stdout
    assert " -e HF_TOKEN " in docker  # docker copies the value from the environment it is run in


def test_secret_looking_override_is_refused(tmp_path: Path) -> None:
    result = _invoke(["launch", "--recipe", "kimi_k2_muon", "--dry-run", f"env.HF_TOKEN={SECRET}"])
    assert result.exit_code == 2 and "--env HF_TOKEN" in result.output and SECRET not in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--recipe", "no_such_recipe"], "--recipe must be one of ("),
    (["--recipe", "kimi_k2_muon", "--nodes", "3"], "3 x 4 = 12 GPUs does not fit recipe kimi_k2_muon's layout"),
    (["--recipe", "kimi_k2_muon", "--gpus-per-node", "8"], "system.gpus_per_node must be <= 4 (GPUs per gb300 node); got 8"),
    (["--recipe", "kimi_k2_muon", "--mount", "data:/data"], "--mount must be SRC:DST"),
    (["--recipe", "kimi_k2_muon", "--mount", "/a:/b,/etc:/x"], "--mount must be SRC:DST"),
    (["--recipe", "kimi_k2_muon", "--mount", "/a:/b:rx"], "--mount must be SRC:DST"),
    (["--recipe", "kimi_k2_muon", "--account", "a;rm -rf ~"], "slurm account must match"),
    (["--recipe", "kimi_k2_muon", "--time", "1h"], "slurm time must be"),
    (["--recipe", "kimi_k2_muon", "--env", "BAD NAME=1"], "--env must be NAME=value"),
    (["--recipe", "kimi_k2_muon", "--env", "NM_UNSET_VARIABLE"], "NM_UNSET_VARIABLE is not set"),
    (["--recipe", "kimi_k2_muon", "trainer.max_steps=many"], "trainer.max_steps must be an integer"),
    (["--recipe", "kimi_k2_muon", "logging.run_name=$(touch pwned)"], "logging.run_name must match"),
    (["--recipe", "kimi_k2_muon", "--container"], "--image must be set"),
    (["--recipe", "kimi_k2_muon", "--executor", "local"], "--nodes must be 1 with --executor local"),
])
def test_invalid_input_is_a_usage_error_that_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    executor = [] if "--executor" in args else ["--executor", "slurm"]
    result = _invoke(["launch", *executor, *args, f"logging.root={tmp_path / 'runs'}"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()
    _no_pwned(tmp_path)


def test_secret_values_are_masked_in_usage_errors() -> None:
    result = _invoke(["launch", "--recipe", "kimi_k2_muon", "--dry-run", "--env", f"BAD NAME_TOKEN={SECRET}"])
    assert result.exit_code == 2 and "--env must be NAME=value" in result.output
    assert SECRET not in result.output and "****" in result.output
