"""`nemo llm pretrain` says what is wrong before the cost, in one line, and a failed job fails `nemo` (issue 37 items 3,
5): a dry run needs no terminal and no --yes; a launch without a terminal needs --yes; a megatron recipe where
Megatron-Bridge is absent, a run folder that already holds a run and a bad override are refused before NeMo-Run prints
its plan; a NeMo-Run job that ends FAILED makes the command fail instead of exiting 0."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from typer.testing import CliRunner

HAS_BRIDGE = importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.bridge") is not None


@pytest.fixture(scope="module")
def nemo_app():
    """NeMo-Run's `nemo` app, built once for the `llm` namespace (as `.venv/bin/nemo llm ...` builds it)."""
    from nemo_run.cli.api import create_cli

    saved = sys.argv
    sys.argv = ["nemo", "llm"]
    try:
        yield create_cli()
    finally:
        sys.argv = saved


@pytest.fixture
def nemo(nemo_app, monkeypatch, tmp_path):
    import nemo_run.config

    monkeypatch.setattr(nemo_run.config, "_NEMORUN_HOME", str(tmp_path / "nemo_run"))
    monkeypatch.setattr(sys, "argv", ["nemo", "llm"])

    def invoke(*args: str):
        return CliRunner().invoke(nemo_app, list(args))  # stdin is no terminal here

    return invoke


def _said(output: str) -> list[str]:
    """What the command printed besides NeMo-Run's own first line."""
    return [line for line in output.splitlines() if line.strip() and line != "Configuring global options"]


def test_a_dry_run_needs_no_terminal_and_no_yes(nemo) -> None:
    result = nemo("llm", "pretrain", "--factory", "kimi_k2_muon", "--dryrun")
    assert result.exit_code == 0, result.output[-2000:]
    assert "# kimi_k2_muon: 256 x gb300" in result.output and "Unexpected error" not in result.output


def test_a_bad_override_is_one_line_before_nemo_run_prints_its_plan(nemo) -> None:
    result = nemo("llm", "pretrain", "--factory", "tiny_kimi_k2_muon", "trainer.max_steps=abc", "--dryrun")
    assert result.exit_code == 1
    assert _said(result.output) == ["Error: trainer.max_steps must be an integer (ASCII digits, at most 30); got 'abc'"]


def test_a_launch_without_a_terminal_needs_yes_said_in_one_line(nemo, tmp_path) -> None:
    result = nemo("llm", "pretrain", "--factory", "tiny_kimi_k2_muon", f"logging.root={tmp_path / 'runs'}")
    assert result.exit_code == 1
    assert _said(result.output) == ["Error: --yes must be given to launch without a terminal (nothing can answer "
                                    "'Continue?'); got no --yes: add --yes to launch, or --dryrun to print the recipe"]


@pytest.mark.skipif(HAS_BRIDGE, reason="Megatron-Bridge is installed: the recipe would train")
def test_a_megatron_recipe_without_bridge_is_refused_in_one_line_before_nemo_run_prints_its_plan(nemo) -> None:
    result = nemo("llm", "pretrain", "--factory", "qwen3_30b_a3b_muon", "optimizer.lr=3e-4", "trainer.max_steps=100",
                  "--yes")
    assert result.exit_code == 1
    (line,) = _said(result.output)
    assert line.startswith("Error: recipe qwen3_30b_a3b_muon has backend='megatron', which trains only where "
                           "Megatron-Bridge is installed")
    assert "got no Megatron-Bridge here" in line and "--dryrun" in line


def test_a_megatron_recipe_sent_to_another_machine_is_not_asked_for_bridge_here() -> None:
    from nemo_muon.recipes.nemo_run_registration import _runs_here

    assert _runs_here([]) and _runs_here(["run.executor=local"]) and _runs_here(["run.executor=local", "--yes"])
    assert not _runs_here(["run.executor=slurm"])


def test_a_run_folder_that_holds_a_run_is_refused_before_the_launch(nemo, tmp_path) -> None:
    folder = tmp_path / "runs" / "tiny_kimi_k2_muon"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"event": "run"}) + "\n")
    result = nemo("llm", "pretrain", "--factory", "tiny_kimi_k2_muon", f"logging.root={tmp_path / 'runs'}", "--yes")
    assert result.exit_code == 1
    assert _said(result.output) == [f"Error: logging.run_name must name a new run folder (or set checkpoint.resume=true);"
                                    f" '{folder}' already holds metrics.jsonl"]


def test_a_failed_nemo_run_job_fails_the_command(monkeypatch, tmp_path) -> None:
    """The job is a real NeMo-Run local job (one process) whose task refuses a damaged recipe document and exits 1:
    NeMo-Run logs `finished: FAILED` and returns; the launch must not."""
    import nemo_run as run
    import nemo_run.config
    from nemo_muon.recipes import nemo_run_registration as registration
    from nemo_run.cli.api import RunContext, RunContextError

    monkeypatch.setattr(nemo_run.config, "_NEMORUN_HOME", str(tmp_path / "nemo_run"))
    monkeypatch.setattr(registration, "to_document", lambda recipe, **_: {"format": "damaged"})
    ctx = RunContext(name="pretrain", skip_confirmation=True)
    ctx.executor = run.LocalExecutor()  # no launcher: the task runs in one process
    with pytest.raises(RunContextError, match=r"^job tiny_kimi_k2_muon of experiment .* finished FAILED; its logs: "):
        registration.launch(ctx, "tiny_kimi_k2_muon", [f"logging.root={tmp_path / 'runs'}"])
