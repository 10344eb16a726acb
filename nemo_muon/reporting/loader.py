"""Find and read a run's metrics: a run folder (metrics.jsonl, else its *.log/*.out/*.txt) or a single file."""

from __future__ import annotations

from pathlib import Path

from nemo_muon.reporting.jsonl import read_metrics_jsonl
from nemo_muon.reporting.megatron_log import read_megatron_log
from nemo_muon.reporting.records import RunLog

LOG_SUFFIXES: tuple[str, ...] = (".log", ".out", ".txt", ".err")


class NotARun(ValueError):
    """A folder that holds no run: no metrics.jsonl and no Megatron/Bridge log with iteration lines (``runs/_cache``
    beside the run folders). ``nemo-muon report runs/*`` skips it, saying so; a damaged run is an error instead."""


def _merge(name: str, runs: list[RunLog]) -> RunLog:
    """Merge several log files of one run (e.g. per-node srun outputs): first value per step wins."""
    merged = RunLog(name=name, sources=[s for r in runs for s in r.sources], kind=runs[0].kind)
    train = {}
    val = {}
    for r in runs:
        for p in r.train:
            train.setdefault(p.step, p)
        for v in r.val:
            val.setdefault(v.step, v)
        merged.skipped_lines += r.skipped_lines
        merged.recipe = merged.recipe or r.recipe
        merged.optimizer = merged.optimizer or r.optimizer
        merged.world_size = merged.world_size or r.world_size
        if r.peak_memory_gb is not None:
            merged.peak_memory_gb = max(merged.peak_memory_gb or 0.0, r.peak_memory_gb)
    merged.train = [train[s] for s in sorted(train)]
    merged.val = [val[s] for s in sorted(val)]
    return merged


def load_run(path: Path) -> RunLog:
    """Read one run from a folder or a file; raises FileNotFoundError/ValueError naming the path when nothing fits
    (a FIFO or a device, given or as a folder's metrics.jsonl, is refused by kind before it is opened)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run path does not exist: {path}")
    if not path.is_dir():
        if path.suffix == ".jsonl":
            return read_metrics_jsonl(path)
        return read_megatron_log(path)
    jsonl = path / "metrics.jsonl"
    if jsonl.exists() or jsonl.is_symlink():
        return read_metrics_jsonl(jsonl, name=path.name)
    logs = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in LOG_SUFFIXES)
    runs = [r for r in (read_megatron_log(p, name=path.name) for p in logs) if r.train or r.val]
    if not runs:
        raise NotARun(
            f"run folder {path} has no metrics.jsonl and no Megatron/Bridge log ({', '.join(LOG_SUFFIXES)}) "
            "with iteration lines"
        )
    return runs[0] if len(runs) == 1 else _merge(path.name, runs)
