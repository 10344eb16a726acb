"""Cluster profiles: a YAML file picked with --cluster; command-line options win; malformed files are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.profiles import ClusterProfile, load_profiles

PROFILES = """
eos:
  executor: slurm
  system: gb300
  account: ops_acct
  partition: batch
  time: "04:00:00"
  image: nvcr.io/nvidia/nemo:26.02
  mounts: ["/lustre/data:/data"]
  env: {NCCL_DEBUG: WARN}
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


def test_profiles_file_from_environment_variable_and_listing(profiles_file: Path) -> None:
    result = CliRunner(env={"NEMO_MUON_PROFILES": str(profiles_file)}).invoke(main, ["profiles", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["file"] == str(profiles_file) and sorted(data["profiles"]) == ["eos", "laptop"]
    assert data["profiles"]["eos"]["env"] == {"NCCL_DEBUG": "WARN"}


@pytest.mark.parametrize(("text", "message"), [
    ("eos:\n  acount: x\n", "eos.acount must be one of the keys ("),
    ("eos:\n  gpus_per_node: four\n", "eos.gpus_per_node must be an integer from 1 to 256; got 'four'"),
    ("eos:\n  executor: k8s\n", "eos.executor must be one of ('local', 'slurm', 'docker'); got 'k8s'"),
    ("eos:\n  system: a100\n", "eos.system must be one of ("),
    ("eos:\n  mounts: /a:/b\n", "eos.mounts must be a list of 'SRC:DST' or 'SRC:DST:ro|rw' with absolute paths"),
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


ALIAS_BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
                     for p, c in zip(["", *"abcdefgh"], "abcdefghi", strict=True))
"""Nine levels of nine aliases (~450 bytes): 9^9 = 387 million strings once expanded."""


@pytest.mark.parametrize(("text", "message"), [
    (ALIAS_BOMB, "aliases (*a) are not allowed"),
    ("eos:\n  account: a\nlaptop: {}\neos:\n  account: b\n", "(top level): key 'eos' must appear once; got it again at "
                                                             "line 4 (first at line 1)"),
    ("eos:\n  account: a\n  account: b\n", "eos: key 'account' must appear once"),
    ("eos:\n  env: {NCCL_DEBUG: WARN, NCCL_DEBUG: INFO}\n", "eos.env: key 'NCCL_DEBUG' must appear once"),
    ("eos:\n  <<: {account: a}\n", "eos: merge keys (<<) are not allowed"),
    ("eos: " + "[" * 50 + "]" * 50 + "\n", "nesting deeper than 16 is not allowed"),
    ('eos:\n  account: "$(touch pwned)"\n', "eos.account must be a Slurm account of [A-Za-z0-9_.:@+-/] (no spaces or "
                                            "shell characters); got '$(touch pwned)'"),
    ("eos:\n  partition: 'batch;id'\n", "eos.partition must be a Slurm partition"),
    ("eos:\n  time: 4h\n", "eos.time must be a Slurm time limit [D-]HH:MM:SS"),
    ("eos:\n  image: 'img:1 --privileged'\n", "eos.image must be an image reference or path"),
    ("eos:\n  image: 'https://u:pw@registry/img:1'\n", "eos.image must be free of credentials (no 'user:password' "
                                                      "before an '@', no tokens); got 'https://u:****@registry/img:1'"),
    ("eos:\n  env: {'BAD NAME': 1}\n", "eos.env name must be an environment variable name [A-Za-z_][A-Za-z0-9_]*; got "
                                       "'BAD NAME'"),
    ("eos:\n  env: {'X=$(id)': 1}\n", "eos.env name must be an environment variable name"),
    ("eos:\n  env: {NCCL_DEBUG: .inf}\n", "eos.env.NCCL_DEBUG must be a string or a finite number"),
    ("eos:\n  env: {HF_TOKEN: [leaked-value]}\n", "eos.env.HF_TOKEN must be a string or a finite number (no NUL "
                                                  "characters); got ****"),
    ("eos:\n  gpus_per_node: 1e20\n", "eos.gpus_per_node must be an integer from 1 to 256; got '1e20'"),
    ("eos:\n  gpus_per_node: 100000000000000000000\n", "eos.gpus_per_node must be an integer from 1 to 256; got "
                                                       "100000000000000000000"),
    ("eos:\n  gpus_per_node: .inf\n", "eos.gpus_per_node must be an integer from 1 to 256; got inf"),
    ("eos:\n  system: gb300\n  gpus_per_node: 8\n", "eos.gpus_per_node must be an integer from 1 to 4 on gb300; got 8"),
    ("eos:\n  mounts: ['/a:/b', 'data:/data']\n", "eos.mounts[1] must be 'SRC:DST' or 'SRC:DST:ro|rw'"),
    ("e" * 500 + ":\n  account: a\n", "profile name must be 1-64 letters, digits, '_', '.', '-'"),
    ("eos:\n  account: a\0b\n", "must be valid YAML; got unacceptable character #x0000"),
    ("eos: [" + "x" * 100_000 + "\n", "must be valid YAML"),
])
def test_hostile_profiles_are_refused_briefly_with_file_field_value_and_rule(tmp_path: Path, text: str,
                                                                             message: str) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_profiles(path)
    text_of = str(err.value)
    assert text_of.startswith(f"{path}: ") and message in text_of and "leaked-value" not in text_of
    assert len(text_of) <= 400 + len(str(path))
    result = CliRunner().invoke(main, ["profiles", "--profiles", str(path)])
    assert result.exit_code == 2 and message in " ".join(result.output.split()) and "Traceback" not in result.output


@pytest.mark.parametrize(("content", "message"), [
    (bytes(range(256)) * 4, "must be UTF-8 text (YAML); got byte 0x80 at offset 128, not UTF-8 (a binary file?)"),
    (b"eos:\n  account: a\n" * 20_000, "must be at most 262144 bytes; got {path!r}, a larger file"),
])
def test_binary_and_oversized_files_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--cluster", "eos", "--profiles",
                                       str(path), "--dry-run"])
    assert result.exit_code == 2 and f"{path}: {message.format(path=str(path))}" in " ".join(result.output.split())


def test_a_folder_given_as_the_profiles_file_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["profiles", "--profiles", str(tmp_path)])
    assert result.exit_code == 2 and f"{tmp_path}: must be a regular file; got {str(tmp_path)!r}, a folder" in \
        " ".join(result.output.split())


@pytest.mark.parametrize(("name", "value"), [("WANDB_API_KEY", "profile-secret-123"),
                                           ("DB_URL", "postgres://u:pw-123@h/db"),
                                           ("HF_HOME_MIRROR", "hf_" + "a" * 34)])
def test_a_profile_holding_a_credential_is_refused_without_echoing_it(tmp_path: Path, name: str, value: str) -> None:
    """A profiles file is on disk and often shared: a credential's name or value in its env is refused (every
    command that reads the file), naming the file, the profile and the variable, saying where it belongs instead,
    and never echoing the value; a launch writes nothing."""
    path = tmp_path / "clusters.yaml"
    path.write_text(f"eos:\n  executor: local\n  env: {{{name}: '{value}', HF_HOME: /data/hf}}\n")
    for args in (["profiles", "--profiles", str(path)], ["profiles", "--profiles", str(path), "--json"],
                 ["launch", "--recipe", "tiny_kimi_k2_muon", "--cluster", "eos", "--profiles", str(path),
                  f"logging.root={tmp_path / 'runs'}"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        message = " ".join(result.output.split())
        assert f"{path}: eos.env.{name}=**** is refused" in message and f"--env {name}" in message
        assert "secrets file your executor mounts" in message
        assert value not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_a_profile_built_in_code_is_validated_at_construction() -> None:
    source = Path("clusters.yaml")
    with pytest.raises(ValueError, match=r"^clusters.yaml: eos.account must be a Slurm account .*; got '\$\(id\)'$"):
        ClusterProfile(name="eos", source=source, account="$(id)")
    with pytest.raises(ValueError, match=r"^clusters.yaml: eos.env.HF_TOKEN must be a string .*; got \*\*\*\*$"):
        ClusterProfile(name="eos", source=source, env={"HF_TOKEN": None})  # type: ignore[dict-item]
    assert ClusterProfile(name="eos", source=source, gpus_per_node=4, system="gb300").gpus_per_node == 4
