"""A failed run exits non-zero from what nemo-muon generates (issue 37 item 5): the sbatch script ends with its srun's
exit code, and `nemo-muon launch --executor docker` with the container's (the local and NeMo-Run paths:
tests/test_run_recipe_refusal.py, tests/test_slurm_e2e.py, tests/test_nemo_launch_checks.py)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.job import LaunchOptions, build_plan


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_sbatch_script_exits_with_the_code_of_its_failed_srun(tmp_path: Path) -> None:
    plan = build_plan(LaunchOptions(recipe="tiny_kimi_k2_muon", executor="slurm", container=False,
                                    overrides=[f"logging.root={tmp_path / 'runs'}"]))
    script = tmp_path / "job.sbatch"
    script.write_text(plan.script)
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "scontrol", "echo node1")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node1"}
    for code in (0, 7):
        _fake(bin_dir, "srun", f"exit {code}")
        assert subprocess.run(["bash", str(script)], env=env, capture_output=True).returncode == code


def test_a_failed_docker_run_fails_launch_with_the_containers_exit_code(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "docker", "exit 5")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = CliRunner().invoke(main, ["launch", "--recipe", "tiny_kimi_k2_muon", "--executor", "docker", "--image",
                                       "nemo-muon:26.02", f"logging.root={tmp_path / 'runs'}"])
    assert result.exit_code == 5 and "Traceback" not in result.output
