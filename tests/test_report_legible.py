"""A report people read (issue 37 item 7): the throughput plot's labels do not overlap and carry no stray text, its
unit follows the device (a CPU run is not 'per GPU'), the loss plots mark where Muon reaches AdamW's final loss, the
legends use short names, and report.md warns when throughput was measured with other load on the machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_muon.reporting import load_run, summarize, write_report
from nemo_muon.reporting import plots as plots_module
from nemo_muon.reporting.machine_load import load_caveat, machine_load


def _run(folder: Path, optimizer: str, losses: list[float], *, device: str = "cpu", load: float | None = None,
         cpus: int = 2, model_tflops: float = 0.0021, ns_tflops: float = 0.0) -> Path:
    """A demo-like run of the tiny recipe: 2 CPU ranks, a validation every 2 steps, tiny TFLOP/s."""
    folder.mkdir(parents=True)
    rows: list[dict[str, Any]] = [{"event": "run", "recipe": f"tiny_kimi_k2_{optimizer}", "optimizer": optimizer,
                                   "world_size": 2, "device": device, "cpus": cpus, "local_ranks": None,
                                   "threads_per_rank": 1}]
    for step, loss in enumerate(losses, start=1):
        rows.append({"event": "train", "step": step, "loss": loss, "step_time_s": 0.5, "optimizer_time_s": 0.1,
                     "tokens_per_s": 4000.0, "model_tflops": model_tflops, "ns_tflops": ns_tflops,
                     "elapsed_s": 0.5 * step, "load_1m": load})
        if step % 2 == 0:
            rows.append({"event": "val", "step": step, "val_loss": loss + 0.1, "elapsed_s": 0.5 * step})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> tuple[str, dict[str, Any]]:
    """report.md of a demo-like Muon / AdamW pair, and every figure it drew by file name (drawn, so text extents are
    known)."""
    root = tmp_path_factory.mktemp("demo")
    muon = _run(root / "tiny_kimi_k2_muon-20260101-000000", "muon", [8.0, 7.0, 6.0, 5.2, 4.8, 4.5], ns_tflops=0.0004)
    adamw = _run(root / "tiny_kimi_k2_adamw-20260101-000000", "adamw", [8.0, 7.5, 7.0, 6.5, 6.0, 5.5])
    drawn: dict[str, Any] = {}
    save = plots_module._save

    def keep(fig: Any, path: Path) -> Path:
        fig.canvas.draw()
        drawn[path.name] = fig
        return save(fig, path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots_module, "_save", keep)
        md = write_report([muon, adamw], root / "out")
    return md.read_text(), drawn


def _texts(fig: Any) -> list[Any]:
    """Every text drawn on the figure's panels: values, tick labels of the runs, legends, titles."""
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [t for ax in fig.axes for t in (*ax.texts, *ax.get_yticklabels(), ax.title) if t.get_text()] + legends


def test_throughput_of_cpu_runs_is_per_process_legible_and_without_stray_text(demo_report) -> None:
    fig = demo_report[1]["throughput.png"]
    (ax,) = fig.axes
    assert ax.get_xlabel() == "model GFLOP/s per CPU process"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["AdamW", "Muon"]  # first run on top
    values = sorted(t.get_text() for t in ax.texts)
    assert values == ["2.1", "2.5  (NS 0.4)"]  # 0.0021 TFLOP/s = 2.1 GFLOP/s, never a bare '0'
    boxes = [t.get_window_extent() for t in _texts(fig)]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    figure_box = fig.bbox
    assert all(figure_box.x0 <= b.x0 and b.x1 <= figure_box.x1 for b in boxes)  # nothing cut off


def test_gpu_and_cpu_runs_get_a_panel_each_in_their_unit(tmp_path, monkeypatch) -> None:
    runs = [load_run(_run(tmp_path / "cpu_run", "muon", [5.0, 4.0, 3.0])),
            load_run(_run(tmp_path / "gpu_run", "muon", [5.0, 4.0, 3.0], device="cuda", model_tflops=1029.0,
                          ns_tflops=14.0))]
    drawn = []
    monkeypatch.setattr(plots_module, "_save", lambda fig, path: drawn.append(fig) or path)
    plots_module.plot_throughput([summarize(r) for r in runs], tmp_path / "t.png", labels=["cpu", "gpu"],
                                 devices=[plots_module.device_kind(r) for r in runs])
    assert [ax.get_xlabel() for ax in drawn[0].axes] == ["model TFLOP/s per GPU", "model GFLOP/s per CPU process"]
    assert [t.get_text() for t in drawn[0].axes[0].texts] == ["1,043  (NS 14)"]


def test_loss_plots_mark_where_muon_reaches_adamws_final_loss(demo_report) -> None:
    md, figures = demo_report
    assert "reached tiny_kimi_k2_adamw-20260101-000000's final val loss 5.6000 (step 6) at step 4" in md
    for name, where in (("loss_vs_step.png", "step 4 (AdamW: 6)"), ("loss_vs_time.png", "2 s (AdamW: 3 s)")):
        (ax,) = figures[name].axes
        notes = [t.get_text() for t in ax.texts]
        assert notes == [f"Muon reaches AdamW's final val loss\nat {where}"], name
        stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
        assert len(stars) == 1 and list(stars[0].get_ydata()) == [pytest.approx(5.3)]  # Muon's val loss there
        assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"] == [pytest.approx(5.6)]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Muon train", "Muon val", "AdamW train",
                                                                      "AdamW val"]


def test_report_warns_when_throughput_was_measured_with_other_load(tmp_path) -> None:
    quiet = [_run(tmp_path / "q" / name, opt, [5.0, 4.0, 3.0], load=2.2) for name, opt in (("m", "muon"),
                                                                                             ("a", "adamw"))]
    assert load_caveat([load_run(p) for p in quiet]) is None
    loaded = [_run(tmp_path / "l" / "m", "muon", [5.0, 4.0, 3.0], load=4.6), quiet[1]]
    text = write_report(loaded, tmp_path / "loaded").read_text()
    assert ("**Caveat: throughput measured with other load on the machine** (m: load 4.6 on 2 CPUs, 2 of it the "
            "run's own threads; median 1-minute load average over the steps)") in text
    found = machine_load(load_run(loaded[0]))
    assert found is not None and found.busy and (found.load, found.cpus, found.own) == (4.6, 2, 2)


def test_a_run_that_oversubscribes_its_machine_itself_is_no_other_load(tmp_path) -> None:
    folder = _run(tmp_path / "m", "muon", [5.0, 4.0, 3.0], load=8.1, cpus=2)
    run = load_run(folder)
    run.header["threads_per_rank"] = 4  # 2 ranks x 4 threads on 2 CPUs: the run's own load
    found = machine_load(run)
    assert found is not None and not found.busy


def test_the_training_loop_records_the_machine_load() -> None:
    from nemo_muon.train.metrics import load_average, machine_info

    load = load_average()
    assert load is None or load >= 0.0
    info = machine_info()
    assert info["cpus"] >= 1 and info["threads_per_rank"] >= 1 and set(info) == {"cpus", "local_ranks",
                                                                                  "threads_per_rank"}


def test_report_takes_the_device_of_an_older_run_from_its_recipe(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner
    from nemo_muon.launchers.cli import main

    folder = _run(tmp_path / "old", "muon", [5.0, 4.0, 3.0])
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    del header["device"]  # written before the metrics said their device
    (folder / "metrics.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    drawn = {}
    monkeypatch.setattr(plots_module, "_save", lambda fig, path: drawn.setdefault(path.name, fig) and path)
    result = CliRunner().invoke(main, ["report", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert [ax.get_xlabel() for ax in drawn["throughput.png"].axes] == ["model GFLOP/s per CPU process"]
