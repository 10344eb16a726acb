"""Values given by an attacker: secrets spelled so the text hides them, inputs that make a parser quadratic or an
error message unbounded, digits of other scripts and trailing newlines that patterns let through, huge numbers.
Each is refused in one line naming the field and what is allowed (or, for a log or metrics line, skipped), quickly,
and no secret value reaches any output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.launch_input import parse_env
from nemo_muon.recipes.execute import build_recipe
from nemo_muon.recipes.nemo_run_registration import check_cli_secrets
from nemo_muon.recipes.resolved import from_document, to_document

from nemo_muon._validation import MAX_SHOWN
from nemo_muon.registry import names
from nemo_muon.secret_policy import is_secret_value, override_refusal, redact

SECRET = "s3cr3t-Value-42"
QUICK_S = 10
"""A linear parse of the inputs below takes milliseconds; the quadratic ones took minutes (issue 35)."""


def _in_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, stopped (failing the test) after `QUICK_S` seconds."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=QUICK_S,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)


# ---- secrets: decided on the parsed value -------------------------------------------------------------------------

SPELLED_NAMES = [
    "{'HF_' 'TOKEN': '%s'}",  # implicit string concatenation
    "{'HF_TOKE\\x4e': '%s'}",  # an escape
    "{'''HF_TOKEN''': '%s'}",  # triple quotes
    "dict([('HF_TOKEN', '%s')])",  # dict() of pairs
    "dict(HF_TOKEN='%s')",  # dict() keywords
    "{'HF_' + 'TOKEN': '%s'}",  # a sum of literals
    "{'HF_TOKE\\x4e': '%s'",  # does not parse: NeMo-Run would echo it in its parse error
]


@pytest.mark.parametrize("spelled", SPELLED_NAMES)
def test_an_env_var_name_spelled_through_python_syntax_is_the_name_it_spells(spelled: str) -> None:
    arg = "run.executor.env_vars=" + spelled % SECRET
    with pytest.raises(ValueError) as refused:
        check_cli_secrets([arg], [])
    assert str(refused.value) == override_refusal("run.executor.env_vars", "HF_TOKEN") and SECRET not in str(refused.value)


def test_a_computed_env_mapping_is_refused_and_a_literal_one_passes() -> None:
    with pytest.raises(ValueError, match=r"run.executor.env_vars=\*\*\*\* is refused: .* must be literal data"):
        check_cli_secrets([f"run.executor.env_vars={{k: '{SECRET}' for k in ['A']}}"], [])
    check_cli_secrets(["run.executor.env_vars={'NCCL_DEBUG': 'INFO'}", "run.executor.env_vars.PATH=/usr/bin",
                       "run.executor=local"], [])


def test_nemo_run_never_prints_a_secret_spelled_through_an_escape(monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    from nemo_run.cli.api import create_cli
    from typer.testing import CliRunner as TyperRunner

    monkeypatch.setenv("NEMORUN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "argv", ["nemo", "nemo_muon"])
    app = create_cli()
    for spelled in (SPELLED_NAMES[1], SPELLED_NAMES[3]):
        result = TyperRunner().invoke(app, ["nemo_muon", "pretrain", "--factory", "tiny_kimi_k2_muon",
                                            "run.executor=local", "run.executor.env_vars=" + spelled % SECRET,
                                            "--dryrun", "--yes"])
        assert result.exit_code == 1 and SECRET not in result.output, result.output
        assert "must not carry a secret" in " ".join(result.output.split())


@pytest.mark.parametrize("value", ["me:hunter2@nvcr.io/nvidia/nemo:26.02", "me:hunter2@registry#nvidia/nemo:26.02",
                                   "postgres://trainer:p@ss-word@db.internal/runs"])
def test_credentials_without_a_scheme_or_holding_an_at_sign_are_secrets_masked_whole(value: str) -> None:
    assert is_secret_value(value)
    masked = redact(f"got {value}!")
    assert "hunter2" not in masked and "p@ss-word" not in masked and "ss-word" not in masked and "****@" in masked


@pytest.mark.parametrize("value", ["nvcr.io/nvidia/nemo:26.02", "nemo:26.02@sha256:" + "ab" * 32,
                                   "https://host:8080/a@b", "user@host:/data", "git@github.com:org/repo.git"])
def test_image_references_ports_and_user_at_host_are_not_secrets(value: str) -> None:
    assert not is_secret_value(value) and redact(value) == value


def test_a_profile_image_carrying_a_password_is_refused_and_never_printed(tmp_path: Path) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text(f"eos:\n  image: 'me:{SECRET}@nvcr.io/nvidia/nemo:26.02'\n")
    result = CliRunner().invoke(main, ["profiles", "--profiles", str(path)])
    assert result.exit_code == 2 and SECRET not in result.output and "eos.image must be free of credentials" in \
        " ".join(result.output.split())
    launched = CliRunner().invoke(main, ["launch", "--recipe", "tiny_kimi_k2_muon", "--executor", "slurm",
                                         "--image", f"me:{SECRET}@nvcr.io/nvidia/nemo:26.02", "--dry-run"])
    assert launched.exit_code == 2 and SECRET not in launched.output and "--image=**** is refused" in launched.output


@pytest.mark.parametrize("value", ["a" * 250_000, "sk-" * 80_000, "a://b:" * 40_000, "a://b:1/" * 30_000 + "@x",
                                   "x:" * 120_000 + "@h", "@" * 250_000])
def test_secret_detection_is_linear_in_the_value(value: str) -> None:
    """The old URL-password pattern took 13 s per 100 KB (a 250 KB profile value, a 900 KB document string)."""
    code = ("import sys; from nemo_muon.secret_policy import is_secret, redact, shown_redacted; "
            "v = sys.stdin.read(); is_secret('DB_URL', v); redact(v); shown_redacted(v)")
    subprocess.run([sys.executable, "-c", code], input=value, text=True, timeout=QUICK_S, check=True)


@pytest.mark.parametrize("value", ["a" * 100_000, "{'" + "a" * 100_000, "{" + "a:" * 50_000])
def test_the_nemo_run_secret_check_is_linear_in_the_value(value: str) -> None:
    """What check_cli_secrets decides on (`python_strings`, `is_secret_value`): the old name pattern backtracked
    into every identifier, 400 s on 100,000 letters."""
    code = ("import sys; from nemo_muon.secret_policy import is_secret_value, python_strings; "
            "v = sys.stdin.read(); python_strings(v); is_secret_value(v)")
    subprocess.run([sys.executable, "-c", code], input=value, text=True, timeout=QUICK_S, check=True)


# ---- error messages stay short; overrides parse ASCII numbers --------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["launch", "--recipe", "tiny_kimi_k2_muon", "--dry-run", "trainer.max_steps=" + "9" * 100_000],
    ["launch", "--recipe", "tiny_kimi_k2_muon", "--dry-run", "data.seq_length_typo=" + "x" * 100_000],
    ["launch", "--recipe", "x" * 100_000, "--dry-run"],
    ["launch", "--recipe", "tiny_kimi_k2_muon", "--executor", "slurm", "--time", "1" * 100_000, "--dry-run"],
    ["plan", "--recipe", "tiny_kimi_k2_muon", "--set", "optimizer.lr=" + "1" * 100_000],
    ["cancel", "1" * 100_000],
])
def test_an_error_quotes_a_huge_value_shortened(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output) < 3 * MAX_SHOWN + 2000, len(result.output)


def test_overrides_take_ascii_numbers_only() -> None:
    with pytest.raises(ValueError, match=r"trainer.max_steps must be an integer \(ASCII digits, at most 30\); got '١٠'"):
        build_recipe("tiny_kimi_k2_muon", ["trainer.max_steps=١٠"])
    with pytest.raises(ValueError, match=r"optimizer.lr must be a number \(ASCII digits"):
        build_recipe("tiny_kimi_k2_muon", ["optimizer.lr=٠.١"])
    assert build_recipe("tiny_kimi_k2_muon", ["trainer.max_steps=100", "optimizer.lr=3e-4"]).trainer.max_steps == 100


# ---- digits of other scripts and trailing newlines ------------------------------------------------------------------

def test_digits_of_other_scripts_are_refused_in_slurm_time_limits_and_profiles(tmp_path: Path) -> None:
    arabic = "٠١:٠٠:٠٠"
    result = CliRunner().invoke(main, ["launch", "--recipe", "tiny_kimi_k2_muon", "--executor", "slurm",
                                       "--no-container", "--time", arabic, "--dry-run"])
    assert result.exit_code == 2 and "slurm time must be [D-]HH:MM:SS" in result.output
    path = tmp_path / "clusters.yaml"
    path.write_text(f"eos:\n  time: '{arabic}'\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["profiles", "--profiles", str(path)])
    assert result.exit_code == 2 and "eos.time must be a Slurm time limit" in result.output


def test_a_trailing_newline_is_refused_in_env_names_job_ids_and_documents(tmp_path: Path) -> None:
    from nemo_muon.launchers.launch_input import LaunchError

    with pytest.raises(LaunchError, match=r"--env must be NAME=value or NAME"):
        parse_env(["FOO\n=1"], {})
    with pytest.raises(LaunchError, match=r"--env must be NAME=value or NAME"):
        parse_env(["FOO\n"], {"FOO\n": "1"})
    result = CliRunner(env={"PATH": str(tmp_path)}).invoke(main, ["cancel", "1234\n"])
    assert result.exit_code == 2 and "slurm job id must be ASCII digits" in result.output  # scancel never ran
    for job_id in ("١٢٣", "12_٣"):
        assert CliRunner().invoke(main, ["cancel", job_id]).exit_code == 2
    document = to_document(build_recipe("tiny_kimi_k2_muon"), source="tiny_kimi_k2_muon")
    document["recipe"]["env"] = {"NCCL_DEBUG\n": "INFO"}
    with pytest.raises(ValueError, match=r"recipe.env name must be an environment variable name"):
        from_document(json.loads(json.dumps(document)))


def test_the_env_override_key_refuses_a_trailing_newline() -> None:
    from nemo_muon.recipes import get_recipe
    from nemo_muon.recipes.overrides import apply_overrides

    with pytest.raises(ValueError, match="override key env.<NAME> must name an environment variable"):
        apply_overrides(get_recipe("tiny_kimi_k2_muon"), {"env.FOO\n": "1"})


# ---- bench --compare is an optimizer name, never a template ---------------------------------------------------------

@pytest.mark.parametrize("compare", ["\\", "\\g<1>", "muon", "adamw_x"])
def test_bench_compare_must_be_another_registered_optimizer(compare: str) -> None:
    result = CliRunner().invoke(main, ["bench", "--recipe", "tiny_kimi_k2_muon", "--compare", compare, "--dry-run"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    others = tuple(n for n in names() if n != "muon")  # the registry's, in its order
    assert f"--compare must be one of {others}" in " ".join(result.output.split())


def test_bench_compare_adamw_plans_the_adamw_baseline() -> None:
    result = CliRunner().invoke(main, ["bench", "--recipe", "tiny_kimi_k2_muon", "--compare", "adamw", "--dry-run",
                                       "--json"])
    assert result.exit_code == 0, result.output
    assert [run["recipe"] for run in json.loads(result.stdout)["runs"]] == ["tiny_kimi_k2_muon", "tiny_kimi_k2_adamw"]


# ---- logs and metrics: linear, bounded, no traceback --------------------------------------------------------------

def test_a_fifty_thousand_digit_loss_in_a_megatron_log_parses_in_linear_time() -> None:
    """The old number pattern backtracked: 57 s on this line."""
    line = " iteration 1/ 10 | lm loss: " + "1" * 50_000 + "x |\n"
    code = ("import sys; from pathlib import Path; from nemo_muon.reporting.megatron_log import parse_megatron_log; "
            "run = parse_megatron_log(sys.argv[1], name='a', source=Path('a.log')); "
            "assert run.train == [] and run.skipped_lines == 1, run")
    _in_child(code, line)


def test_megatron_log_numbers_are_ascii_and_bounded() -> None:
    from nemo_muon.reporting.megatron_log import parse_megatron_log

    text = (" iteration ١/ 10 | lm loss: 2.0 |\n iteration " + "9" * 5000 + "/ 10 | lm loss: 2.0 |\n"
            " iteration 3/ 10 | lm loss: 1.5 | number of skipped iterations: 1e999 |\n")
    run = parse_megatron_log(text, name="a", source=Path("a.log"))
    assert [(p.step, p.loss, p.skipped) for p in run.train] == [(3, 1.5, None)] and run.skipped_lines == 1


@pytest.mark.parametrize("line", ["[" * 100_000 + "]" * 100_000,
                                  '{"event": "train", "step": 1, "loss": ' + "1" * 5000 + "}",
                                  '{"event": "train", "step": 1' + "0" * 400 + ', "loss": 2.0}'])
def test_hostile_metrics_lines_are_skipped_and_the_report_is_written(tmp_path: Path, line: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    good = json.dumps({"event": "train", "step": 1, "loss": 2.0})
    (run / "metrics.jsonl").write_text(f"{good}\n{line}\n")
    result = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    summary = json.loads(result.stdout)["runs"][0]
    assert summary["last_step"] == 1 and summary["final_train_loss"] == 2.0 and summary["skipped_lines"] == 1
