"""`nemo-muon report` shows skipped steps: our JSONL (per-step `skipped`, cumulative `skipped_steps`, `stop`) and
Megatron's 'number of skipped iterations'."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from nemo_muon.launchers.cli import main

from nemo_muon.reporting import load_run
from nemo_muon.reporting.summary import summarize


def _jsonl(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    head = {"event": "run", "recipe": "tiny_kimi_k2_muon", "optimizer": "muon", "world_size": 1}
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [head, *rows]) + "\n")
    return folder


def _train(step: int, loss: float, skipped: bool, total: int | None = None) -> dict:
    row = {"event": "train", "step": step, "loss": loss, "skipped": skipped, "step_time_s": 0.5}
    return row if total is None else {**row, "skipped_steps": total}


def _megatron(path: Path, skipped: list[int]) -> Path:
    lines = [f" iteration {it:8d}/{len(skipped):8d} | elapsed time per iteration (ms): 100.0 | lm loss: 2.0E+00 | "
             f"grad norm: 1.000 | number of skipped iterations: {n:3d} | number of nan iterations:   0 |"
             for it, n in enumerate(skipped, start=1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_report_table_has_a_skipped_steps_column(tmp_path: Path) -> None:
    diverged = _jsonl(tmp_path / "diverged", [
        _train(1, 5.0, False, 0), _train(2, float("nan"), True, 1), _train(3, float("nan"), True, 2),
        {"event": "stop", "step": 3, "reason": "diverged", "message": "training diverged: ..."}])
    healthy = _jsonl(tmp_path / "healthy", [_train(1, 5.0, False, 0), _train(2, 4.0, False, 0)])
    old = _jsonl(tmp_path / "old", [_train(1, 5.0, True), _train(2, 4.0, False), _train(3, 4.0, True)])  # no totals
    meg = _megatron(tmp_path / "meg.log", [0, 2, 1])
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(diverged), str(healthy), str(old), str(meg), "--out", str(out)])
    assert result.exit_code == 0, result.output
    header, _, *rows = result.output.splitlines()
    assert header.rstrip().endswith("skipped steps")
    assert [r.split()[0] + " " + r.split()[-1] for r in rows[:4]] == ["diverged 2", "healthy 0", "old 2", "meg 3"]
    md = (out / "report.md").read_text()
    assert "skipped steps |" in md and "Stopped early: diverged at step 3 (diverged)" in md
    assert "Unparsed lines" not in md  # the stop event is understood, not counted as garbage


def test_resumed_run_counts_each_skipped_step_once(tmp_path: Path) -> None:
    """Steps re-logged after a resume keep the newest record; the cumulative count continues from the checkpoint."""
    run = load_run(_jsonl(tmp_path / "r", [_train(1, 5.0, True, 1), _train(2, 4.0, False, 1),
                                            _train(2, 4.0, False, 1), _train(3, 3.0, True, 2)]))
    assert summarize(run).skipped_steps == 2 and run.skipped_lines == 0
