"""`nemo llm pretrain --factory <recipe>` through NeMo-Run's real `nemo` command (subprocesses) and in-process.

The `llm` namespace is served by nemo-muon's `nemo_run.cli` entry point named ``llm``. If the installed metadata
lacks it, `llm_entry_point_path` adds a dist-info declaring exactly that entry point to PYTHONPATH, so these tests
exercise the same lookup NeMo-Run does. With NeMo 2.7's own ``llm`` namespace (our recipes join its ``pretrain``):
tests/container_stack/test_nemo_llm_beside_nemo.py, against the real NeMo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from nemo_muon.recipes import list_recipes
from typer.testing import CliRunner

VENV_BIN = Path(sys.executable).parent
NEMO = str(VENV_BIN / "nemo")
OWN_LLM_ENTRY = "nemo_muon.recipes.nemo_run_registration"


@pytest.fixture(scope="module")
def llm_entry_point_path(tmp_path_factory) -> str:
    """'' when nemo-muon's installed metadata declares `llm = nemo_muon...`, else a dir with a dist-info that does."""
    eps = metadata.entry_points().select(group="nemo_run.cli", name="llm")
    if any(ep.value == OWN_LLM_ENTRY for ep in eps):
        return ""
    root = tmp_path_factory.mktemp("llm_ep")
    info = root / "nemo_muon_llm_entry-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nemo-muon-llm-entry\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[nemo_run.cli]\nllm = {OWN_LLM_ENTRY}\n")
    return str(root)


def nemo(args: list[str], *, pythonpath: list[str], home: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    """The real `nemo` command of this environment, run as `.venv/bin/nemo ...` without the venv on PATH (not
    activated: the local executor must still find this environment's torchrun)."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != VENV_BIN)
    env = {**os.environ, "NEMORUN_HOME": str(home), "OMP_NUM_THREADS": "1", "PATH": path or os.defpath,
           "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run([NEMO, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_nemo_llm_pretrain_dryrun_shows_the_layout(llm_entry_point_path, tmp_path):
    ok = nemo(["llm", "pretrain", "--factory", "kimi_k2_muon", "optim.lr=1e-4", "--dryrun", "--yes"],
              pythonpath=[llm_entry_point_path], home=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ("kimi_k2_muon: 256 x gb300 (64 nodes x 4), TP1 PP4 VP4 CP1 EP64 ETP1 DP64, GBS 4096 MBS 2 seq 4096"
            in ok.stdout)
    assert "lr: 0.0001" in ok.stdout and "tp_mode: duplicated" in ok.stdout and "Couldn't load" not in ok.stdout
    # the recipe's system.preflight is said, not silently skipped: NeMo-Run runs the training task only
    from nemo_muon.recipes.nemo_run_registration import PREFLIGHT_NOT_RUN

    assert f"nemo-muon: {PREFLIGHT_NOT_RUN.format(recipe='kimi_k2_muon')}" in ok.stderr


def test_every_factory_dryruns_in_process(llm_entry_point_path, monkeypatch, tmp_path):
    """Each recipe through NeMo-Run's CLI app (one process, so all recipes fit the time budget)."""
    from nemo_run.cli.api import create_cli

    monkeypatch.setenv("NEMORUN_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["nemo", "nemo_muon"])  # NeMo-Run builds sub-commands for argv[1]
    app = create_cli()
    runner = CliRunner()
    for name in list_recipes():
        result = runner.invoke(app, ["nemo_muon", "pretrain", "--factory", name, "--dryrun", "--yes"])
        assert result.exit_code == 0, (name, result.output[-2000:])
        assert f"# {name}: " in result.output and f"name: {name}" in result.output
    for override, message in {
        "optim.tp_mode=dup": "tp_mode must be one of ('duplicated', 'distributed', 'blockwise', 'auto'); got 'dup'",
        "optim.lrr=1": "Error: override key 'optim.lrr' is unknown: optimizer (MuonConfig) has the fields ('lr', ",
    }.items():
        bad = runner.invoke(app, ["nemo_muon", "pretrain", "--factory", "kimi_k2_muon", override, "--dryrun", "--yes"])
        assert bad.exit_code == 1 and message in bad.output and "Traceback" not in bad.output
        assert bad.exception is None or isinstance(bad.exception, SystemExit)  # a clean exit, not a crash
    if "tiny_kimi_k2_muon" in list_recipes():  # an executor that would start the wrong number of ranks
        wrong = runner.invoke(app, ["nemo_muon", "pretrain", "--factory", "tiny_kimi_k2_muon", "run.executor=local",
                                    "run.executor.ntasks_per_node=3", "--dryrun", "--yes"])
        assert wrong.exit_code == 1 and "run.executor starts 3 processes but the recipe's world size is 2" in (
            wrong.output)
    dotted_path = "nemo_muon.recipes.qwen3_30b_a3b.qwen3_30b_a3b_soap"
    dotted = runner.invoke(app, ["nemo_muon", "pretrain", "--factory", dotted_path, "--dryrun", "--yes"])
    assert dotted.exit_code == 0 and "# qwen3_30b_a3b_soap: 8 x gb300" in dotted.output
    unknown = runner.invoke(app, ["nemo_muon", "pretrain", "--factory", "kimi_k2_moun", "--yes"])
    assert unknown.exit_code == 1 and "--factory must be one of (" in unknown.output


def test_tiny_recipe_trains_two_cpu_ranks_through_the_local_executor(llm_entry_point_path, tmp_path):
    if "tiny_kimi_k2_muon" not in list_recipes():
        pytest.fail("the tiny CPU recipes (recipes/tiny.py) are missing")
    runs = tmp_path / "runs"
    proc = nemo(["llm", "pretrain", "--factory", "tiny_kimi_k2_muon", "run.executor=local", "trainer.max_steps=2",
                 "scheduler.warmup_steps=1", "trainer.global_batch_size=4", "trainer.micro_batch_size=2", "trainer.seq_length=32",
                 "trainer.eval_interval=0", "data.kind=mock", f"logging.root={runs}", "--yes"],
                pythonpath=[llm_entry_point_path], home=tmp_path, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    events = [json.loads(line) for line in (runs / "tiny_kimi_k2_muon" / "metrics.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "run" and events[0]["world_size"] == 2 and events[0]["optimizer"] == "muon"
    steps = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] == e["loss"] for e in steps)  # not NaN
