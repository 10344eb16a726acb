"""nemo_muon.reporting on our JSONL and on Megatron/Bridge logs written here in the documented format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_muon.reporting import (
    analyze,
    load_run,
    parse_megatron_log,
    parse_metrics_jsonl,
    render_table,
    write_report,
)


def _write_jsonl_run(folder: Path, *, optimizer: str, losses: list[float], val: dict[int, float],
                     step_time: float = 2.0, opt_time: float = 0.5, model_tflops: float = 10.0,
                     ns_tflops: float = 0.0, tail: str = "") -> Path:
    folder.mkdir(parents=True)
    lines = [{"event": "run", "recipe": f"tiny_kimi_k2_{optimizer}", "optimizer": optimizer, "world_size": 2,
              "model_params": 1000}]
    for step, loss in enumerate(losses, start=1):
        lines.append({"event": "train", "step": step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, "tokens": 100 * step,
                      "step_time_s": step_time * (3 if step == 1 else 1), "optimizer_time_s": opt_time,
                      "tokens_per_s": 50.0 if step > 1 else 1.0, "model_tflops": model_tflops,
                      "ns_tflops": ns_tflops, "elapsed_s": step_time * step})
        if step in val:
            lines.append({"event": "val", "step": step, "val_loss": val[step], "elapsed_s": step_time * step})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(o) for o in lines) + "\n" + tail)
    return folder


def _megatron_line(it: int, total: int, ms: float, tflops: float, lr: float, loss: float, gnorm: float) -> str:
    # Field formats of Megatron-LM's training_log()
    return (f" [2026-11-29 08:00:{it:02d}] iteration {it:8d}/{total:8d} | consumed samples: {it * 4096:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | "
            f"learning rate: {lr:.6E} | global batch size:  4096 | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {gnorm:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")


def test_jsonl_summary_excludes_warmup_and_computes_optimizer_share(tmp_path: Path) -> None:
    run = load_run(_write_jsonl_run(tmp_path / "muon", optimizer="muon", losses=[5.0, 4.0, 3.5], val={3: 3.6},
                                    step_time=2.0, opt_time=0.5, model_tflops=10.0, ns_tflops=1.5))
    (s,), pairs = analyze([run])
    assert pairs == []
    assert (s.optimizer, s.world_size, s.last_step) == ("muon", 2, 3)
    assert s.final_train_loss == 3.5 and s.final_val_loss == 3.6
    assert s.tokens_per_s == 50.0  # step 1 (warm-up, 1.0 tokens/s) left out
    assert s.optimizer_share == pytest.approx(0.25)  # 0.5 s of 2.0 s in steady steps
    assert s.model_tflops == 10.0 and s.model_ns_tflops == pytest.approx(11.5)


def test_jsonl_partial_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    folder = _write_jsonl_run(tmp_path / "r", optimizer="adamw", losses=[5.0, 4.5], val={},
                              tail='{"event": "train", "step": 3, "loss": 1.')
    run = load_run(folder)
    assert [p.step for p in run.train] == [1, 2]
    assert run.skipped_lines == 1


def test_jsonl_resumed_steps_keep_newest_record() -> None:
    text = "\n".join(json.dumps(o) for o in [
        {"event": "train", "step": 1, "loss": 9.0}, {"event": "train", "step": 1, "loss": 8.0},
        {"event": "bogus"}, [1, 2]])
    run = parse_metrics_jsonl(text, name="x", source=Path("x"))
    assert [(p.step, p.loss) for p in run.train] == [(1, 8.0)]
    assert run.skipped_lines == 2


def test_muon_reaches_adamw_final_val_loss_in_fewer_steps(tmp_path: Path) -> None:
    muon = _write_jsonl_run(tmp_path / "tiny_kimi_k2_muon", optimizer="muon", losses=[5, 4, 3, 2.5, 2.2, 2.0],
                            val={2: 4.1, 4: 2.9, 6: 2.1}, model_tflops=9.0)
    adamw = _write_jsonl_run(tmp_path / "tiny_kimi_k2_adamw", optimizer="adamw", losses=[5, 4.5, 4, 3.5, 3.2, 3.0],
                             val={2: 4.6, 4: 3.6, 6: 3.1}, model_tflops=10.0)
    _, (pair,) = analyze([load_run(muon), load_run(adamw)])
    assert pair.metric == "val_loss" and pair.target_loss == 3.1 and pair.adamw_steps == 6
    assert pair.muon_steps == 4 and pair.step_ratio == pytest.approx(1.5)
    assert pair.throughput_ratio == pytest.approx(0.9)
    text = render_table([muon, adamw])
    assert "at step 4: 1.50x fewer steps" in text


def test_each_optimizer_pairs_with_its_registered_baseline_and_normuon_is_not_muon(tmp_path: Path) -> None:
    """Which optimizer a run used and its baseline come from the registry: NorMuon (whose name contains 'muon') is
    its own optimizer, paired with AdamW beside Muon; Megatron's log names ('dist_muon', 'adam') are read too."""
    from nemo_muon.reporting.summary import optimizer_of
    from nemo_muon.reporting.tables import markdown_table

    curves = {"muon": [5, 4, 3], "normuon": [5, 3.8, 2.9], "adamw": [5, 4.5, 4]}
    runs = [load_run(_write_jsonl_run(tmp_path / f"tiny_kimi_k2_{o}", optimizer=o, losses=c, val={}))
            for o, c in curves.items()]
    summaries, pairs = analyze(runs)
    assert [s.optimizer for s in summaries] == ["muon", "normuon", "adamw"]
    assert {(p.muon, p.adamw, p.title) for p in pairs} == {
        ("tiny_kimi_k2_muon", "tiny_kimi_k2_adamw", "Muon vs AdamW"),
        ("tiny_kimi_k2_normuon", "tiny_kimi_k2_adamw", "NorMuon vs AdamW")}
    assert "NorMuon vs AdamW:" in markdown_table(summaries, pairs) and "ratio normuon/adamw" in render_table(
        [tmp_path / "tiny_kimi_k2_normuon", tmp_path / "tiny_kimi_k2_adamw"])
    assert [optimizer_of(n) for n in ("tiny_kimi_k2_normuon-20250101", "dist_muon", "adam", "nemo_muon.normuon",
                                      "kimi_k2_adamw_bf16", "tiny_kimi_k2_soap")] == \
        ["normuon", "muon", "adamw", "normuon", "adamw", "soap"]


def test_muon_that_never_reaches_target_is_reported_as_such(tmp_path: Path) -> None:
    muon = _write_jsonl_run(tmp_path / "m", optimizer="muon", losses=[5, 4.9], val={})
    adamw = _write_jsonl_run(tmp_path / "a", optimizer="adamw", losses=[5, 3.0], val={})
    _, (pair,) = analyze([load_run(muon), load_run(adamw)])
    assert pair.metric == "train_loss" and pair.muon_steps is None and pair.step_ratio is None
    assert "did not reach" in render_table([muon, adamw])


def test_megatron_log_fields_memory_val_and_arguments(tmp_path: Path) -> None:
    log = "\n".join([
        "------------------------ arguments ------------------------",
        "  optimizer ....................................... muon",
        "  world_size ...................................... 256",
        _megatron_line(1, 3, 9000.0, 800.0, 1e-5, 12.0, 50.0),
        "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1000.0 | max allocated: 150000.0 | "
        "reserved: 160000.0 | max reserved: 160000.0",
        _megatron_line(2, 3, 3500.0, 1080.0, 2e-5, 11.0, 20.0),
        _megatron_line(3, 3, 3600.0, 1070.0, 3e-5, 10.5, 10.0),
        " validation loss at iteration 3 | lm loss value: 1.040000E+01 | lm loss PPL: 3.2E+04 |",
    ]) + "\n"
    path = tmp_path / "kimi_k2.log"
    path.write_text(log)
    run = load_run(path)
    assert (run.kind, run.optimizer, run.world_size) == ("megatron", "muon", 256)
    assert [p.step for p in run.train] == [1, 2, 3]
    assert [p.loss for p in run.train] == [12.0, 11.0, 10.5]
    assert run.train[1].step_time_s == pytest.approx(3.5) and run.train[2].elapsed_s == pytest.approx(16.1)
    assert run.train[0].lr == pytest.approx(1e-5) and run.train[2].grad_norm == pytest.approx(10.0)
    assert [(v.step, v.val_loss) for v in run.val] == [(3, 10.4)]
    assert run.peak_memory_gb == pytest.approx(150000.0 / 1024)
    (s,), _ = analyze([run])
    assert s.model_tflops == pytest.approx(1075.0)  # warm-up step 1 excluded


def test_megatron_log_interleaved_labelled_and_truncated_lines() -> None:
    a = _megatron_line(1, 4, 1000.0, 700.0, 1e-4, 3.0, 1.0)
    b = _megatron_line(2, 4, 1100.0, 710.0, 1e-4, 2.9, 1.0)
    c = _megatron_line(3, 4, 1200.0, 720.0, 1e-4, 2.8, 1.0)
    cut = _megatron_line(4, 4, 1300.0, 730.0, 1e-4, 2.7, 1.0)
    cut = cut[: cut.index("lm loss: ") + len("lm loss: 2.700000E")]  # the writer died mid-number
    text = f"0: {a}{b}\n1: garbage without fields\n3: {c}\n{cut}"
    run = parse_megatron_log(text, name="x", source=Path("x"))
    assert [p.step for p in run.train] == [1, 2, 3, 4]
    assert [p.loss for p in run.train[:3]] == [3.0, 2.9, 2.8]
    assert run.train[3].loss is None  # never 2.7 read from '2.700000E' (the exponent is lost)
    assert run.train[3].step_time_s == pytest.approx(1.3)


def test_bridge_step_time_lines_are_read_without_iteration_lines() -> None:
    text = ("Step Time : 4.10s GPU utilization: 1029.5 MODEL_TFLOP/s/GPU\n"
            "Step Time : 4.00s GPU utilization: 1051.0 MODEL_TFLOP/s/GPU\n")
    run = parse_megatron_log(text, name="x", source=Path("x"))
    assert [(p.step, p.step_time_s, p.model_tflops) for p in run.train] == [(1, 4.1, 1029.5), (2, 4.0, 1051.0)]


def test_write_report_writes_markdown_and_nonempty_pngs(tmp_path: Path) -> None:
    muon = _write_jsonl_run(tmp_path / "tiny_muon", optimizer="muon", losses=[5, 4, 3], val={2: 3.9, 3: 3.0},
                            ns_tflops=1.0)
    adamw = _write_jsonl_run(tmp_path / "tiny_adamw", optimizer="adamw", losses=[5, 4.5, 4], val={3: 4.0})
    meg = tmp_path / "meg.log"
    meg.write_text(_megatron_line(1, 2, 1000.0, 700.0, 1e-4, 3.0, 1.0) + "\n")
    md = write_report([muon, adamw, meg], tmp_path / "out")
    assert md == tmp_path / "out" / "report.md"
    text = md.read_text()
    assert "| tiny_muon | muon | 2 | 3 | 3.0000 | 3.0000 |" in text
    assert "tiny_muon reached tiny_adamw's final val loss 4.0000 (step 3) at step 2" in text
    for png in ("loss_vs_step.png", "loss_vs_time.png", "throughput.png"):
        data = (tmp_path / "out" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
        assert f"]({png})" in text


def test_load_run_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no metrics.jsonl"):
        load_run(tmp_path / "empty")


def test_reporting_imports_neither_torch_nor_matplotlib() -> None:
    code = "import sys, nemo_muon.reporting; print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
