"""Render run summaries and each optimizer against its baseline (Muon vs AdamW, ...) as markdown or aligned text."""

from __future__ import annotations

from collections.abc import Sequence

from nemo_muon.reporting.summary import PairComparison, RunSummary

COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "name"),
    ("optimizer", "optimizer"),
    ("ranks", "world_size"),
    ("steps", "last_step"),
    ("final train loss", "final_train_loss"),
    ("final val loss", "final_val_loss"),
    ("tokens/s", "tokens_per_s"),
    ("model TFLOP/s/GPU", "model_tflops"),
    ("model+NS TFLOP/s/GPU", "model_ns_tflops"),
    ("optimizer step share", "optimizer_share"),
    ("peak mem GB", "peak_memory_gb"),
    ("skipped steps", "skipped_steps"),
)


def _fmt(attr: str, value: object) -> str:
    if value is None:
        return "-"
    if attr == "optimizer_share" and isinstance(value, float):
        return f"{100.0 * value:.1f}%"
    if attr in ("final_train_loss", "final_val_loss") and isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def _rows(summaries: Sequence[RunSummary]) -> list[list[str]]:
    return [[_fmt(attr, getattr(s, attr)) for _, attr in COLUMNS] for s in summaries]


def _pair_line(p: PairComparison) -> str:
    metric = "val loss" if p.metric == "val_loss" else "train loss"
    if p.muon_steps is None:
        reach = f"{p.muon} did not reach {p.adamw}'s final {metric} {p.target_loss:.4f} (step {p.adamw_steps})"
    else:
        reach = (f"{p.muon} reached {p.adamw}'s final {metric} {p.target_loss:.4f} (step {p.adamw_steps}) "
                 f"at step {p.muon_steps}: {p.step_ratio:.2f}x fewer steps")
    if p.throughput_ratio is not None:
        reach += f"; model TFLOP/s ratio {p.title.lower().replace(' vs ', '/')} = {p.throughput_ratio:.3f}"
    return reach


def markdown_table(summaries: Sequence[RunSummary], pairs: Sequence[PairComparison] = ()) -> str:
    """A markdown table (one row per run) followed by one bullet per pair, under its heading ('Muon vs AdamW:')."""
    header = [c for c, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in _rows(summaries)]
    for title in dict.fromkeys(p.title for p in pairs):
        lines += ["", f"{title}:"] + [f"- {_pair_line(p)}" for p in pairs if p.title == title]
    return "\n".join(lines) + "\n"


def text_table(summaries: Sequence[RunSummary], pairs: Sequence[PairComparison] = ()) -> str:
    """The same content as plain, column-aligned text for a terminal."""
    header = [c for c, _ in COLUMNS]
    rows = [header, *_rows(summaries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [_pair_line(p) for p in pairs]
    return "\n".join(lines) + "\n"
