"""PNG plots of runs (matplotlib with the Agg backend, imported only when a plot is drawn)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_muon.config.files import write_file
from nemo_muon.reporting.records import RunLog
from nemo_muon.reporting.summary import RunSummary


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


def plot_loss(runs: Sequence[RunLog], path: Path, *, x: str) -> Path:
    """Train loss (lines) and val loss (markers) against x='step' or x='time' (seconds since start)."""
    if x not in ("step", "time"):
        raise ValueError(f"x must be one of ('step', 'time'); got {x!r}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        attr = "step" if x == "step" else "elapsed_s"
        pts = [(getattr(p, attr), p.loss) for p in run.train if p.loss is not None and getattr(p, attr) is not None]
        line = None
        if pts:
            (line,) = ax.plot([a for a, _ in pts], [b for _, b in pts], label=f"{run.name} train")
        vals = [(getattr(v, attr), v.val_loss) for v in run.val if getattr(v, attr) is not None]
        if vals:
            ax.plot([a for a, _ in vals], [b for _, b in vals], "o--", label=f"{run.name} val",
                    color=line.get_color() if line is not None else None)
    ax.set_xlabel("step" if x == "step" else "time (s)")
    ax.set_ylabel("loss")
    ax.set_title(f"loss vs {x}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_throughput(summaries: Sequence[RunSummary], path: Path) -> Path:
    """Bars of model TFLOP/s/GPU per run, with the Newton-Schulz share stacked on top where known."""
    plt = _pyplot()
    rows = [s for s in summaries if s.model_tflops is not None]
    if not rows:
        raise ValueError("no run has model TFLOP/s to plot")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(rows) + 2), 4.5))
    names = [s.name for s in rows]
    model = [s.model_tflops for s in rows]
    ns = [(s.model_ns_tflops - s.model_tflops) if s.model_ns_tflops is not None else 0.0 for s in rows]
    ax.bar(names, model, label="model")
    if any(ns):
        ax.bar(names, ns, bottom=model, label="Newton-Schulz")
    for i, (m, n) in enumerate(zip(model, ns, strict=True)):
        ax.text(i, m + n, f"{m + n:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)
