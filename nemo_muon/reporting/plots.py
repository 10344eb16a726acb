"""PNG plots of runs (matplotlib with the Agg backend, imported only when a plot is drawn).

Legends use short names (`short_labels`: the optimizers' labels, Muon and AdamW, where they tell the runs apart); the
loss plots mark where each compared run first reaches its baseline's final loss; the throughput plot has one panel per
device kind, in its unit (TFLOP/s per GPU; GFLOP/s per process on CPU runs), horizontal bars labelled at their ends.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_muon.config.files import write_file
from nemo_muon.reporting.records import RunLog
from nemo_muon.reporting.summary import PairComparison, RunSummary, run_spec

DEVICE_UNITS: dict[str, tuple[str, float]] = {"gpu": ("model TFLOP/s per GPU", 1.0),
                                              "cpu": ("model GFLOP/s per CPU process", 1e3)}
"""Device kind -> (axis label, factor from TFLOP/s)."""


def device_kind(run: RunLog) -> str:
    """'cpu' for a run whose metrics say it trained on CPUs (our JSONL's ``device``), else 'gpu'."""
    return "cpu" if run.header.get("device") == "cpu" else "gpu"


def short_labels(runs: Sequence[RunLog]) -> list[str]:
    """A short legend name per run: its optimizer's label where those tell the runs apart ('Muon', 'AdamW'), else
    the part of the run names that differs ('muon-2', 'muon-3'), else the names."""
    labels = [getattr(run_spec(run), "label", None) for run in runs]
    if all(labels) and len(set(labels)) == len(labels):
        return labels  # type: ignore[return-value]
    tokens = [re.split(r"[_.-]", run.name) for run in runs]
    if len(runs) > 1:
        lead = 0
        while all(len(t) > lead + 1 and t[lead] == tokens[0][lead] for t in tokens):
            lead += 1
        tail = 0
        while all(len(t) > lead + tail + 1 and t[-1 - tail] == tokens[0][-1 - tail] for t in tokens):
            tail += 1
        short = ["-".join(t[lead:len(t) - tail]) for t in tokens]
        if len(set(short)) == len(short):
            return short
    return [run.name for run in runs]


def _save(fig: Any, path: Path) -> Path:
    """The figure as a PNG at ``path``, written by `nemo_muon.config.files.write_file` (atomic, never through a
    symbolic link)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=100, format="png")
    return write_file(path, buffer.getvalue(), what=path.name)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _at(run: RunLog, step: int, attr: str, metric: str) -> tuple[float, float] | None:
    """(x, loss) of ``run`` at ``step``: x is ``attr`` ('step' or 'elapsed_s'), the loss its ``metric`` there."""
    points = [(v, v.val_loss) for v in run.val if v.step == step] if metric == "val_loss" else \
        [(p, p.loss) for p in run.train if p.step == step and p.loss is not None]
    for point, loss in points:
        x = float(step) if attr == "step" else point.elapsed_s
        if x is not None and math.isfinite(x) and math.isfinite(loss):
            return x, loss
    return None


def _mark_crossing(ax: Any, pair: PairComparison, runs: dict[str, tuple[RunLog, str, Any]], attr: str) -> None:
    """The baseline's final loss as a dotted line, and a star where the compared run first reaches it."""
    if pair.muon not in runs or pair.adamw not in runs or pair.muon_steps is None:
        return
    (run, label, color), (base, base_label, base_color) = runs[pair.muon], runs[pair.adamw]
    reached, final = _at(run, pair.muon_steps, attr, pair.metric), _at(base, pair.adamw_steps, attr, pair.metric)
    if reached is None or final is None:
        return
    (x, loss), base_x = reached, final[0]
    metric = "val" if pair.metric == "val_loss" else "train"
    ax.axhline(pair.target_loss, color=base_color, linestyle=":", linewidth=1)
    ax.plot([x], [loss], marker="*", markersize=15, color=color, markeredgecolor="black", zorder=5, linestyle="none")
    where = (f"step {pair.muon_steps} ({base_label}: {pair.adamw_steps})" if attr == "step"
             else f"{x:,.0f} s ({base_label}: {base_x:,.0f} s)")
    ax.annotate(f"{label} reaches {base_label}'s final {metric} loss\nat {where}", xy=(x, loss),
                xytext=(0.97, 0.72), textcoords="axes fraction", ha="right", fontsize=9,
                arrowprops={"arrowstyle": "->", "color": "0.3"},
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7"})


def plot_loss(runs: Sequence[RunLog], path: Path, *, x: str, pairs: Sequence[PairComparison] = ()) -> Path:
    """Train loss (lines) and val loss (markers) against x='step' or x='time' (seconds since start); each pair's
    crossing (`PairComparison`: the compared run first at its baseline's final loss) marked."""
    if x not in ("step", "time"):
        raise ValueError(f"x must be one of ('step', 'time'); got {x!r}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    attr = "step" if x == "step" else "elapsed_s"
    drawn: dict[str, tuple[RunLog, str, Any]] = {}
    for run, label in zip(runs, short_labels(runs), strict=True):
        pts = [(getattr(p, attr), p.loss) for p in run.train if p.loss is not None and getattr(p, attr) is not None]
        (line,) = ax.plot([a for a, _ in pts], [b for _, b in pts], label=f"{label} train", linewidth=1.5)
        vals = [(getattr(v, attr), v.val_loss) for v in run.val if getattr(v, attr) is not None]
        if vals:
            ax.plot([a for a, _ in vals], [b for _, b in vals], "o--", label=f"{label} val", color=line.get_color(),
                    markersize=4)
        drawn[run.name] = (run, label, line.get_color())
    for pair in pairs:
        _mark_crossing(ax, pair, drawn, attr)
    ax.set_xlabel("step" if x == "step" else "time since the run started (s)")
    ax.set_ylabel("loss")
    ax.set_title(f"loss vs {'step' if x == 'step' else 'time'}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=9, loc="lower left" if pairs else "best")
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def has_throughput(summary: RunSummary) -> bool:
    """The run has a finite model TFLOP/s to plot (a log's NaN step time gives none)."""
    return summary.model_tflops is not None and math.isfinite(summary.model_tflops)


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def plot_throughput(summaries: Sequence[RunSummary], path: Path, *, labels: Sequence[str] | None = None,
                    devices: Sequence[str] | None = None) -> Path:
    """Horizontal bars of model FLOP/s per device per run (one panel per device kind, in its unit, `DEVICE_UNITS`),
    the Newton-Schulz part stacked where a run has one; each bar labelled at its end with its total."""
    labels = list(labels) if labels is not None else [s.name for s in summaries]
    devices = list(devices) if devices is not None else ["gpu"] * len(summaries)
    rows = [(s, label, device) for s, label, device in zip(summaries, labels, devices, strict=True)
            if has_throughput(s)]
    if not rows:
        raise ValueError("no run has model TFLOP/s to plot")
    kinds = [k for k in DEVICE_UNITS if any(d == k for _, _, d in rows)]
    plt = _pyplot()
    heights = [len([r for r in rows if r[2] == k]) for k in kinds]
    fig, axes = plt.subplots(len(kinds), 1, figsize=(8, 1.3 + 0.6 * sum(heights) + 0.6 * len(kinds)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, kind in zip(axes[:, 0], kinds, strict=True):
        unit, factor = DEVICE_UNITS[kind]
        panel = [(s, label) for s, label, d in rows if d == kind][::-1]  # first run on top
        model = [s.model_tflops * factor for s, _ in panel]  # type: ignore[operator]
        ns = [max(0.0, (s.model_ns_tflops - s.model_tflops) * factor)
              if s.model_ns_tflops is not None and math.isfinite(s.model_ns_tflops) else 0.0 for s, _ in panel]
        y = range(len(panel))
        ax.barh(y, model, height=0.6, label="model", color="tab:blue")
        if any(ns):
            ax.barh(y, ns, left=model, height=0.6, label="Newton-Schulz", color="tab:orange")
        top = max(m + n for m, n in zip(model, ns, strict=True)) or 1.0
        for i, (m, n) in enumerate(zip(model, ns, strict=True)):
            text = _number(m + n) + (f"  (NS {_number(n)})" if n > 0 else "")
            ax.text(m + n + 0.01 * top, i, text, va="center", fontsize=9)
        ax.set_yticks(list(y), [label for _, label in panel])
        ax.set_xlim(0, top * 1.35)
        ax.set_xlabel(unit)
        ax.grid(axis="x", alpha=0.3)
        if any(ns):  # above the panel, beside the title: never over a bar or its label
            ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False)
    axes[0, 0].set_title("throughput (mean over steps after the first)", loc="left")
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)
