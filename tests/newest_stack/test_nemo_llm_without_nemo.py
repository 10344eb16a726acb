"""`nemo llm pretrain --factory <recipe>` on NGC 26.08's stack, which has NeMo-Run's `nemo` command but no NeMo
toolkit: nemo-muon's `nemo_run.cli` entry point serves the ``llm`` namespace itself (Bridge registers only an empty
``lm``). Through the real `nemo` command of this environment, as a user of that container types it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys

from nemo_muon.megatron.bridge.hf_config import SHIPPED_HF_CONFIGS
from tests.newest_stack.conftest import stack_release
from tests.test_nemo_cli import llm_entry_point_path, nemo  # noqa: F401 - the fixture, used by name

KIMI_CONFIG = SHIPPED_HF_CONFIGS / "kimi_k2" / "config.json"


def test_no_nemo_toolkit_and_ours_is_the_llm_namespace():
    assert importlib.metadata.packages_distributions().get("nemo") is None  # no NeMo toolkit to provide `llm`
    entries = importlib.metadata.entry_points().select(group="nemo_run.cli")
    assert {e.value for e in entries if e.name == "llm"} == {"nemo_muon.recipes.nemo_run_registration"}
    assert importlib.metadata.version("nemo-run") == stack_release().nemo_run


def test_help_lists_our_factories(llm_entry_point_path, tmp_path):  # noqa: F811
    out = nemo(["llm", "pretrain", "--help"], pythonpath=[llm_entry_point_path], home=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kimi_k2_muon" in out.stdout and "qwen3_30b_a3b_soap" in out.stdout


def test_dryrun_prints_the_recipe_with_its_local_hf_config(llm_entry_point_path, tmp_path):  # noqa: F811
    folder = tmp_path / "kimi"
    folder.mkdir()
    (folder / "config.json").write_text(KIMI_CONFIG.read_text())
    ok = nemo(["llm", "pretrain", "--factory", "kimi_k2_muon", f"hf_config={folder}", "--dryrun", "--yes"],
              pythonpath=[llm_entry_point_path], home=tmp_path)
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    assert "kimi_k2_muon: 256 x gb300 (64 nodes x 4), TP1 PP4 VP4 CP1 EP64 ETP1 DP64" in ok.stdout
    assert f"hf_config: {folder}" in ok.stdout


def test_dryrun_without_hf_config_reads_the_shipped_config_offline(llm_entry_point_path, tmp_path):  # noqa: F811
    """Was refused ('hf_config must name a local folder ...') after a traceback: the config.json ships with nemo-muon."""
    out = nemo(["llm", "pretrain", "--factory", "qwen3_30b_a3b_muon", "--dryrun", "--yes"],
               pythonpath=[llm_entry_point_path], home=tmp_path)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "qwen3_30b_a3b_muon: 8 x gb300" in out.stdout and "hf_config: null" in out.stdout
    assert "Traceback" not in out.stderr


def test_tiny_recipe_trains_through_the_local_executor(llm_entry_point_path, tmp_path):  # noqa: F811
    runs = tmp_path / "runs"
    proc = nemo(["llm", "pretrain", "--factory", "tiny_qwen3_moe_muon", "run.executor=local", "trainer.max_steps=2",
                 "scheduler.warmup_steps=1", "trainer.global_batch_size=4", "trainer.micro_batch_size=2",
                 "trainer.seq_length=32", "trainer.eval_interval=0", "data.kind=mock", f"logging.root={runs}", "--yes"],
                pythonpath=[llm_entry_point_path], home=tmp_path, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = (runs / "tiny_qwen3_moe_muon" / "metrics.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["event"] == "run" and events[0]["world_size"] == 2 and events[0]["optimizer"] == "muon"
    steps = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] == e["loss"] for e in steps)  # not NaN


def test_megatrons_absent_te_and_apex_warnings_are_one_line_from_our_entry_point_on():
    """NeMo-Run imports every nemo_run.cli entry point, and Bridge's ``lm`` (``megatron.bridge``) imports Megatron-Core:
    without TE / Apex that printed a dozen fallback warnings and two logged tracebacks before `nemo llm pretrain
    --dryrun`'s plan. Imported after ours (as NeMo-Run does where our entry point is listed first), one line."""
    from nemo_muon.megatron.shared.fallback_warnings import fallback_line

    code = ("import nemo_muon.recipes.nemo_run_registration\n"
            "try:\n    import megatron.bridge\nexcept ModuleNotFoundError as e:\n    print('lm:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if not re.match(r"W\d{4} ", line)]  # torch's no-CUDA log
    assert lines == [fallback_line(["Transformer Engine", "Apex"])]
