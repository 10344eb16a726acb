"""write_report: run folders / log files -> report.md + PNG plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nemo_muon._validation import shown
from nemo_muon.config.files import make_folder, write_file
from nemo_muon.reporting.loader import load_run
from nemo_muon.reporting.machine_load import load_caveat
from nemo_muon.reporting.plots import device_kind, has_throughput, plot_loss, plot_throughput, short_labels
from nemo_muon.reporting.records import RunLog
from nemo_muon.reporting.summary import PairComparison, RunSummary, compare_pair, find_pairs, summarize
from nemo_muon.reporting.tables import markdown_table, text_table


def analyze(runs: Sequence[RunLog]) -> tuple[list[RunSummary], list[PairComparison]]:
    """Summaries of every run and the comparisons of every Muon/AdamW pair among them."""
    summaries = [summarize(r) for r in runs]
    pairs = [c for m, a in find_pairs(runs) if (c := compare_pair(m, a)) is not None]
    return summaries, pairs


def _brief(value: object) -> str:
    """A field of a ``stop`` record as the report prints it: short text as is, anything else shortened (`shown`)."""
    text = str(value)
    return text if isinstance(value, (str, int)) and len(text) <= 80 and text.isprintable() else shown(value)


def write_report(run_dirs: Sequence[Path], out_dir: Path) -> Path:
    """Read each run (folder with metrics.jsonl or Megatron logs, or a log file), write report.md, loss_vs_step.png,
    loss_vs_time.png and (when TFLOP/s are known) throughput.png into out_dir; return the markdown path."""
    if not run_dirs:
        raise ValueError("run_dirs must name at least one run folder or log file; got none")
    runs = [load_run(Path(p)) for p in run_dirs]
    return write_report_for(runs, Path(out_dir))


def write_report_for(runs: Sequence[RunLog], out_dir: Path) -> Path:
    """write_report for runs already loaded. Every file is written inside ``out_dir``, atomically and never through
    a symbolic link (`nemo_muon.config.files.write_file`); a folder that cannot be one, or a planted link, is one
    ValueError naming it."""
    out_dir = make_folder(out_dir, what="the report folder (--out)")
    summaries, pairs = analyze(runs)
    devices = [device_kind(r) for r in runs]
    images = [plot_loss(runs, out_dir / "loss_vs_step.png", x="step", pairs=pairs)]
    if any(p.elapsed_s is not None for r in runs for p in r.train):
        images.append(plot_loss(runs, out_dir / "loss_vs_time.png", x="time", pairs=pairs))
    if any(has_throughput(s) for s in summaries):
        images.append(plot_throughput(summaries, out_dir / "throughput.png", labels=short_labels(runs),
                                      devices=devices))
    lines = ["# nemo-muon run report", "", markdown_table(summaries, pairs).rstrip("\n"), ""]
    cpu = [r.name for r, d in zip(runs, devices, strict=True) if d == "cpu"]
    if cpu:
        lines += [f"On CPU runs ({', '.join(cpu)}) the TFLOP/s columns are per process (rank), not per GPU.", ""]
    caveat = load_caveat(list(runs))
    if caveat:
        lines += [caveat, ""]
    skipped = [s for s in summaries if s.skipped_lines]
    if skipped:
        lines += ["Unparsed lines (partial or interleaved writes): "
                  + ", ".join(f"{s.name}: {s.skipped_lines}" for s in skipped), ""]
    stopped = [r for r in runs if r.stop is not None]
    if stopped:
        lines += ["Stopped early: " + "; ".join(f"{r.name} at step {_brief(r.stop.get('step'))} "
                                                f"({_brief(r.stop.get('reason'))})" for r in stopped), ""]
    lines += ["Sources: " + "; ".join(f"{r.name} = " + ", ".join(str(s) for s in r.sources) for r in runs), ""]
    lines += [f"![{img.stem}]({img.name})" for img in images]
    return write_file(out_dir / "report.md", "\n".join(lines) + "\n", what="report.md")


def render_table(run_paths: Sequence[Path], *, markdown: bool = False) -> str:
    """Load runs and render their summary table (and Muon/AdamW comparisons) as text or markdown for printing."""
    summaries, pairs = analyze([load_run(Path(p)) for p in run_paths])
    return markdown_table(summaries, pairs) if markdown else text_table(summaries, pairs)
