"""Cluster profiles: a YAML file picked with --cluster; command-line options win; malformed files are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.profiles import load_profiles

PROFILES = """
eos:
  executor: slurm
  system: gb300
  account: ops_acct
  partition: batch
  time: "04:00:00"
  image: nvcr.io/nvidia/nemo:26.02
  mounts: ["/lustre/data:/data"]
  env: {NCCL_DEBUG: WARN, WANDB_API_KEY: profile-secret-123}
laptop:
  executor: local
  system: cpu
"""


@pytest.fixture()
def profiles_file(tmp_path: Path) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(PROFILES)
    return path


def _launch(profiles_file: Path, tmp_path: Path, *args: str):
    return CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--cluster", "eos", "--profiles",
                                     str(profiles_file), "--dry-run", *args, f"logging.root={tmp_path}"])


def test_profile_supplies_executor_account_image_mounts_and_env(profiles_file: Path, tmp_path: Path) -> None:
    result = _launch(profiles_file, tmp_path)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for line in ("#SBATCH --account=ops_acct", "#SBATCH --partition=batch", "#SBATCH --time=04:00:00",
                 "export NCCL_DEBUG=WARN"):
        assert line in out.splitlines()
    assert "--container-image=nvcr.io/nvidia/nemo:26.02" in out and "--container-mounts=/lustre/data:/data," in out
    assert "profile-secret-123" not in out and "WANDB_API_KEY='****' sbatch" in out


def test_command_line_options_override_the_profile(profiles_file: Path, tmp_path: Path) -> None:
    result = _launch(profiles_file, tmp_path, "--account", "mine", "--time", "00:10:00", "--image", "other:1",
                     "--env", "NCCL_DEBUG=INFO")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "#SBATCH --account=mine" in lines and "#SBATCH --time=00:10:00" in lines
    assert "export NCCL_DEBUG=INFO" in lines and "export NCCL_DEBUG=WARN" not in lines
    assert "--container-image=other:1" in result.stdout


def test_profile_for_another_system_refuses_the_recipe(profiles_file: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--cluster", "laptop", "--profiles",
                                       str(profiles_file), "--dry-run"])
    assert result.exit_code == 2
    assert "system.gpu='gb300'" in result.output and "cluster 'laptop' has system 'cpu'" in result.output


def test_profiles_file_from_environment_variable_and_listing_masks_secrets(profiles_file: Path) -> None:
    result = CliRunner(env={"NEMO_MUON_PROFILES": str(profiles_file)}).invoke(main, ["profiles", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["file"] == str(profiles_file) and sorted(data["profiles"]) == ["eos", "laptop"]
    assert data["profiles"]["eos"]["env"] == {"NCCL_DEBUG": "WARN", "WANDB_API_KEY": "****"}


@pytest.mark.parametrize(("text", "message"), [
    ("eos:\n  acount: x\n", "eos.acount must be one of the keys ("),
    ("eos:\n  gpus_per_node: four\n", "eos.gpus_per_node must be an integer >= 1; got 'four'"),
    ("eos:\n  executor: k8s\n", "eos.executor must be one of ('local', 'slurm', 'docker'); got 'k8s'"),
    ("eos:\n  system: a100\n", "eos.system must be one of ("),
    ("eos:\n  mounts: /a:/b\n", "eos.mounts must be a list of 'SRC:DST' strings"),
    ("eos:\n  env: [A, B]\n", "eos.env must be a mapping of NAME: value"),
    ("eos:\n  container: maybe\n", "eos.container must be true or false"),
    ("- just\n- a list\n", "(top level) must be a mapping of profile name -> settings"),
    ("eos: [unclosed\n", "must be valid YAML"),
])
def test_malformed_profile_names_file_key_and_allowed(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_profiles(path)
    assert message in str(err.value) and str(path) in str(err.value)
    result = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--cluster", "eos", "--profiles",
                                       str(path), "--dry-run"])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_unknown_cluster_and_missing_file_are_usage_errors(profiles_file: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--cluster", "nope", "--profiles",
                                       str(profiles_file), "--dry-run"])
    assert result.exit_code == 2 and "--cluster must be one of ('eos', 'laptop')" in result.output
    result = CliRunner().invoke(main, ["profiles", "--profiles", str(tmp_path / "absent.yaml")])
    assert result.exit_code == 2 and "absent.yaml" in result.output
