"""One secret policy for every entry point: which names and values are secrets, and that no entry point prints them,
writes them or accepts them as overrides (`nemo-muon launch` and NeMo-Run's `nemo ... pretrain` refuse alike)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.run_recipe import LAUNCH_ENV_VAR, launch_record
from nemo_muon.recipes import get_recipe
from nemo_muon.recipes.execute import describe
from nemo_muon.recipes.overrides import apply_overrides

from nemo_muon.secret_policy import (
    MASK,
    is_secret_name,
    is_secret_value,
    mask_env,
    override_refusal,
    redact,
    shown_redacted,
    split_secrets,
)

SECRET = "s3cr3t-VALUE-9f8e7d"
DB_URL = f"postgres://trainer:{SECRET}@db.internal:5432/runs"

SECRET_NAMES = [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "NGC_API_KEY", "NGC_CLI_API_KEY", "OPENAI_API_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GITHUB_PAT", "GH_PAT", "GITHUB_TOKEN",
    "CI_JOB_TOKEN", "NEPTUNE_API_TOKEN", "MLFLOW_TRACKING_PASSWORD", "DB_PASSWORD", "PGPASSWORD", "MYSQL_PWD",
    "SMTP_PASS", "REDIS_PASSWD", "KEY_PASSPHRASE", "GOOGLE_APPLICATION_CREDENTIALS", "REGISTRY_CREDS",
    "AZURE_CLIENT_SECRET", "AZURE_STORAGE_CONNECTION_STRING", "SENTRY_DSN", "SLACK_WEBHOOK_URL", "SSH_PRIVATE_KEY",
    "SSH_KEY", "ENCRYPTION_KEY", "PROXY_AUTH", "SESSION_COOKIE", "TOKEN", "KEY", "SECRET", "PASSWORD", "apiKey",
    "hfToken", "dbPassword",
]
ORDINARY_NAMES = [
    "HF_HOME", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "TOKENIZERS_PARALLELISM", "TOKENIZER_DIR", "NUM_TOKENS",
    "MAX_TOKENS", "KEY_LENGTH", "KEYBOARD", "SSL_KEY_FILE", "MONKEY_PATCH", "NCCL_IB_PKEY", "PATH", "PYTHONPATH",
    "LD_LIBRARY_PATH", "PATTERN", "PWD", "OLDPWD", "SSH_AUTH_SOCK", "AUTHOR", "BYPASS_PROXY", "NCCL_DEBUG",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR",
    "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE", "TRANSFORMERS_OFFLINE", "PYTORCH_CUDA_ALLOC_CONF",
    "NVTE_FWD_LAYERNORM_SM_MARGIN", "SLURM_JOB_ID", "OMP_NUM_THREADS", "NEMO_MUON_LAUNCH_ENV", "AWS_REGION",
]
SECRET_VALUES = [
    DB_URL, "redis://:hunter2@cache:6379/0", "https://user:p%40ss@git.example.com/repo.git",
    "--db=mysql://root:toor@localhost/x", "hf_" + "a1B2c3D4" * 5, "ghp_" + "Z9y8X7w6" * 5,
    "github_pat_" + "11ABCDEFG0" * 3, "AKIAIOSFODNN7EXAMPLE", "sk-" + "proj_" * 6, "xoxb-1234-5678-abcdefgh",
    "nvapi-" + "Qw3rTy" * 5, "-----BEGIN OPENSSH PRIVATE KEY-----",
]
ORDINARY_VALUES = [
    "postgres://trainer@db.internal/runs", "https://host:8080/path", "user@host:/data", "/lustre/data:/data",
    "nvcr.io/nvidia/nemo:26.02", "expandable_segments:True", "WARN", "hf_small", "sk-short", "0",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_credential_names_are_secrets(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


@pytest.mark.parametrize("value", SECRET_VALUES)
def test_values_carrying_credentials_are_secrets_and_redacted(value: str) -> None:
    assert is_secret_value(value)
    assert MASK in redact(f"got {value}!") and MASK in shown_redacted(value)


@pytest.mark.parametrize("value", ORDINARY_VALUES)
def test_ordinary_values_are_not_secrets(value: str) -> None:
    assert not is_secret_value(value) and redact(value) == value


def test_masking_keeps_the_url_and_cuts_long_values() -> None:
    assert redact(DB_URL) == "postgres://trainer:****@db.internal:5432/runs"
    long = shown_redacted("x" * 5000)
    assert len(long) < 200 and long.endswith("(5002 chars)")
    env = {"DB_URL": DB_URL, "HF_TOKEN": SECRET, "NCCL_DEBUG": "WARN"}
    assert mask_env(env) == {"DB_URL": MASK, "HF_TOKEN": MASK, "NCCL_DEBUG": "WARN"}
    assert split_secrets(env) == ({"NCCL_DEBUG": "WARN"}, {"DB_URL": DB_URL, "HF_TOKEN": SECRET})


@pytest.mark.parametrize("override", [f"env.HF_TOKEN={SECRET}", f"env.GITHUB_PAT={SECRET}",
                                      f"env.AWS_ACCESS_KEY_ID={SECRET}", f"env.DB_URL={DB_URL}",
                                      f"data.tokenizer_dir=https://u:{SECRET}@host/tok"])
def test_overrides_carrying_secrets_are_refused_without_echoing_them(override: str) -> None:
    key = override.split("=", 1)[0]
    with pytest.raises(ValueError) as err:
        apply_overrides(get_recipe("tiny_kimi_k2_muon"), [override])
    assert str(err.value) == override_refusal(key) and SECRET not in str(err.value)
    result = CliRunner().invoke(main, ["launch", "--recipe", "tiny_kimi_k2_muon", "--dry-run", override])
    assert result.exit_code == 2 and override_refusal(key) in " ".join(result.output.split())
    assert SECRET not in result.output


def test_refusal_names_the_field_and_says_to_export_it_by_name() -> None:
    message = override_refusal("env.WANDB_API_KEY")
    assert message.startswith("override env.WANDB_API_KEY=**** is refused")
    assert "export WANDB_API_KEY" in message and "--env WANDB_API_KEY" in message


def test_ordinary_env_override_still_applies() -> None:
    recipe = apply_overrides(get_recipe("tiny_kimi_k2_muon"), ["env.NCCL_DEBUG=INFO", "env.HF_HOME=/data/hf"])
    assert recipe.env["NCCL_DEBUG"] == "INFO" and recipe.env["HF_HOME"] == "/data/hf"


def test_a_secret_passed_by_name_with_env_is_forwarded_and_a_value_is_refused(tmp_path: Path) -> None:
    """``--env NAME`` forwards a secret from the launching shell by name; ``--env NAME=value`` with a secret name or
    value is refused (the value would sit in the shell's history and the process list), saying how to pass it."""
    result = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--executor", "slurm", "--no-container",
                                       "--dry-run", "--json", "--env", "DB_URL", "--env", "GITHUB_PAT",
                                       f"logging.root={tmp_path}"], env={"GITHUB_PAT": SECRET, "DB_URL": DB_URL})
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["secrets"] == {"DB_URL": MASK, "GITHUB_PAT": MASK} and SECRET not in result.output
    assert "export DB_URL" not in plan["script"] and "DB_URL" not in plan["env"]
    for item, name in ((f"DB_URL={DB_URL}", "DB_URL"), (f"GITHUB_PAT={SECRET}", "GITHUB_PAT"),
                       ("MY_MIRROR=hf_" + "a" * 34, "MY_MIRROR")):  # a token-shaped value under a plain name
        refused = CliRunner().invoke(main, ["launch", "--recipe", "kimi_k2_muon", "--executor", "slurm",
                                            "--no-container", "--dry-run", "--env", item, f"logging.root={tmp_path}"])
        assert refused.exit_code == 2, refused.output
        message = " ".join(refused.output.split())
        assert f"--env {name}=**** is refused" in message and f"export {name}" in message
        assert SECRET not in refused.output and "a" * 34 not in refused.output


def test_launch_record_and_recipe_print_mask_secrets() -> None:
    env = {LAUNCH_ENV_VAR: "DB_URL,AWS_ACCESS_KEY_ID,NCCL_DEBUG", "DB_URL": DB_URL, "AWS_ACCESS_KEY_ID": SECRET,
           "NCCL_DEBUG": "WARN"}
    record = launch_record("tiny_kimi_k2_muon", [], env)
    assert record["env"] == {"DB_URL": "**** (set)", "AWS_ACCESS_KEY_ID": "**** (set)", "NCCL_DEBUG": "WARN"}
    recipe = dataclasses.replace(get_recipe("tiny_kimi_k2_muon"), env={"HF_TOKEN": SECRET, "NCCL_DEBUG": "WARN"})
    text = describe(recipe)
    assert SECRET not in text and "HF_TOKEN: '****'" in text and "NCCL_DEBUG: WARN" in text


def test_nemo_run_cli_refuses_secrets_like_nemo_muon_launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """NeMo-Run's `nemo nemo_muon pretrain` (the same context class serves `nemo llm pretrain`): the refusal comes
    before NeMo-Run prints its context (--dryrun) or writes its experiment configs (a real run)."""
    from nemo_run.cli.api import create_cli
    from typer.testing import CliRunner as TyperRunner

    home = tmp_path / "nemo_run_home"
    monkeypatch.setenv("NEMORUN_HOME", str(home))
    monkeypatch.setattr(sys, "argv", ["nemo", "nemo_muon"])
    app = create_cli()

    def pretrain(*args: str):  # noqa: ANN202 - typer's Result
        return TyperRunner().invoke(app, ["nemo_muon", "pretrain", "--factory", "tiny_kimi_k2_muon", *args, "--yes"])

    for args, key in [([f"env.HF_TOKEN={SECRET}", "--dryrun"], "env.HF_TOKEN"),
                      (["run.executor=local", f"env.WANDB_API_KEY={SECRET}"], "env.WANDB_API_KEY"),
                      ([f"env.DB_URL={DB_URL}", "--dryrun"], "env.DB_URL")]:
        result = pretrain(*args)
        assert result.exit_code == 1 and override_refusal(key) in " ".join(result.output.split()), result.output
        assert SECRET not in result.output and "Traceback" not in result.output
    executor_env = pretrain("run.executor=local", f"run.executor.env_vars={{'GITHUB_PAT': '{SECRET}'}}", "--dryrun")
    assert executor_env.exit_code == 1 and SECRET not in executor_env.output
    assert override_refusal("run.executor.env_vars", "GITHUB_PAT") in " ".join(executor_env.output.split())
    written = [p for p in home.rglob("*") if p.is_file() and SECRET in p.read_text(errors="ignore")]
    assert written == []
    ok = pretrain("env.NCCL_DEBUG=INFO", "--dryrun")
    assert ok.exit_code == 0 and "NCCL_DEBUG: INFO" in ok.output
