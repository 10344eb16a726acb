"""`nemo-muon report`: our JSONL and Megatron logs -> printed table, report.md, PNGs; TFLOP/s from the accounting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.recipes import get_recipe

from nemo_muon.reporting.flops import recipe_flops_per_step


def _megatron_log(path: Path, step_ms: list[float], tflops: float, losses: list[float]) -> Path:
    total = len(step_ms)
    lines = ["  optimizer ....................................... muon",
             "  world_size ...................................... 256"]
    for it, (ms, loss) in enumerate(zip(step_ms, losses, strict=True), start=1):
        lines.append(f" [2026-11-29 08:00:00] iteration {it:8d}/{total:8d} | consumed samples: {it * 4096:12d} | "
                     f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | "
                     f"learning rate: 3.000000E-04 | global batch size:  4096 | lm loss: {loss:.6E} | "
                     "loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 |")
    path.write_text("\n".join(lines) + "\n")
    return path


def _jsonl_run(folder: Path, optimizer: str, losses: list[float]) -> Path:
    folder.mkdir()
    rows = [{"event": "run", "recipe": f"tiny_kimi_k2_{optimizer}", "optimizer": optimizer, "world_size": 2}]
    rows += [{"event": "train", "step": i, "loss": v, "step_time_s": 0.5, "optimizer_time_s": 0.1,
              "tokens_per_s": 1000.0, "elapsed_s": 0.5 * i} for i, v in enumerate(losses, start=1)]
    rows.append({"event": "val", "step": len(losses), "val_loss": losses[-1]})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def test_report_on_megatron_log_adds_ns_tflops_from_the_recipe(tmp_path: Path) -> None:
    log = _megatron_log(tmp_path / "kimi.log", [9000.0, 4000.0, 4000.0], 1029.0, [12.0, 11.0, 10.0])
    result = CliRunner().invoke(main, ["report", str(log), "--recipe", "kimi_k2_muon", "--out", str(tmp_path / "o"),
                                       "--json"])
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)["runs"][0]
    _, ns = recipe_flops_per_step(get_recipe("kimi_k2_muon"), 256)
    assert run["model_tflops"] == pytest.approx(1029.0)  # Megatron's own number is kept
    assert run["model_ns_tflops"] == pytest.approx(1029.0 + ns / 4.0 / 256 / 1e12)
    assert (tmp_path / "o" / "throughput.png").stat().st_size > 5000


def test_report_text_compares_muon_with_adamw_and_writes_files(tmp_path: Path) -> None:
    muon = _jsonl_run(tmp_path / "m", "muon", [5.0, 4.0, 3.0, 2.5])
    adamw = _jsonl_run(tmp_path / "a", "adamw", [5.0, 4.5, 4.0, 3.1])
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(muon), str(adamw), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "optimizer step share" in result.output and "20.0%" in result.output  # 0.1 s of 0.5 s
    assert f"report: {out / 'report.md'}" in result.output
    for name in ("report.md", "loss_vs_step.png", "loss_vs_time.png", "throughput.png"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "report.md").read_text()
    assert "| m | muon | 2 | 4 |" in md and "| a | adamw | 2 | 4 |" in md


def test_report_bad_paths_are_usage_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["report", str(tmp_path / "absent")])
    assert result.exit_code == 2
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["report", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no metrics.jsonl" in result.output and "Traceback" not in result.output
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "metrics.jsonl").write_text('{"loss": 1.0}\n[1, 2]\nnot json\n')  # lines, but no record of a run
    result = CliRunner().invoke(main, ["report", str(garbage), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{garbage / 'metrics.jsonl'} must hold nemo-muon metrics records" in result.output
    assert "got 3 lines and none of them is one" in result.output and not (tmp_path / "o").exists()
    log = _megatron_log(tmp_path / "x.log", [1.0], 1.0, [1.0])
    result = CliRunner().invoke(main, ["report", str(log), "--recipe", "nope", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--recipe must be one of" in result.output


def test_report_of_a_runs_glob_skips_what_is_not_a_run_saying_so(tmp_path: Path) -> None:
    """`nemo-muon report runs/*` after `make demo`: the tokenizer cache beside the run folders is no run."""
    runs = tmp_path / "runs"
    runs.mkdir()
    _jsonl_run(runs / "tiny_kimi_k2_muon-1", "muon", [5.0, 4.0, 3.0])
    _jsonl_run(runs / "tiny_kimi_k2_adamw-1", "adamw", [5.0, 4.5, 4.0])
    (runs / "_cache" / "tokenizer").mkdir(parents=True)
    (runs / "_cache" / "tokenizer" / "vocab.json").write_text("{}")
    paths = sorted(str(p) for p in runs.iterdir())  # what the shell's runs/* gives
    result = CliRunner().invoke(main, ["report", *paths, "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    assert f"skipped '{runs / '_cache'}': not a run (no metrics.jsonl" in result.stderr
    data = json.loads(result.stdout)
    assert [r["name"] for r in data["runs"]] == ["tiny_kimi_k2_adamw-1", "tiny_kimi_k2_muon-1"]
    assert data["skipped"] == [str(runs / "_cache")]
    only_cache = CliRunner().invoke(main, ["report", str(runs / "_cache"), "--out", str(tmp_path / "o2")])
    assert only_cache.exit_code == 2 and "got none among" in only_cache.output and "Traceback" not in only_cache.output
