"""Read our metrics JSONL (docs/ARCHITECTURE.md: a 'run' header, 'train' and 'val' events, maybe a 'stop')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_muon.config.files import load_json, read_text
from nemo_muon.config.limits import MAX_STEPS, MAX_WORLD_SIZE
from nemo_muon.reporting.records import RunLog, TrainPoint, ValPoint

MAX_METRICS_BYTES = 1 << 30
"""Largest metrics.jsonl read (1 GiB: millions of steps at a few hundred bytes a line)."""

_TRAIN_FIELDS = ("loss", "lr", "grad_norm", "tokens", "step_time_s", "optimizer_time_s", "tokens_per_s",
                 "model_tflops", "ns_tflops", "elapsed_s", "load_1m")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range: not a metric value
        return None


def _count(value: Any) -> int | None:
    """A bool (``skipped``) as 0 / 1, an int in [0, `MAX_STEPS`] as itself, anything else None."""
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, int) and 0 <= value <= MAX_STEPS else None


def _step(value: Any) -> int | None:
    """A step: an int in [0, `MAX_STEPS`] (``10**400`` is no step of a run), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEPS:
        return None
    return value


def parse_metrics_jsonl(text: str, *, name: str, source: Path) -> RunLog:
    """Parse JSONL text; lines that are not complete JSON objects (a partial last write) are counted and skipped.

    Repeated steps (a resumed run re-logging them) keep the newest record.
    """
    run = RunLog(name=name, sources=[source], kind="jsonl")
    train: dict[int, TrainPoint] = {}
    val: dict[int, ValPoint] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:  # bounded: a line nested too deeply or holding a 5000-digit number is not a record
            obj = load_json(line, what="a metrics line")
        except ValueError:
            run.skipped_lines += 1
            continue
        if not isinstance(obj, dict):
            run.skipped_lines += 1
            continue
        event = obj.get("event")
        if event == "run":
            run.header = obj
            run.recipe = obj.get("recipe") if isinstance(obj.get("recipe"), str) else run.recipe
            run.optimizer = obj.get("optimizer") if isinstance(obj.get("optimizer"), str) else run.optimizer
            ws = obj.get("world_size")
            sized = isinstance(ws, int) and not isinstance(ws, bool) and 1 <= ws <= MAX_WORLD_SIZE
            run.world_size = ws if sized else run.world_size
        elif event == "train" and _step(obj.get("step")) is not None:
            step = obj["step"]
            train[step] = TrainPoint(step=step, **{k: _number(obj.get(k)) for k in _TRAIN_FIELDS},
                                     skipped=_count(obj.get("skipped")), skipped_total=_count(obj.get("skipped_steps")))
        elif event == "val" and _step(obj.get("step")) is not None and _number(obj.get("val_loss")) is not None:
            step = obj["step"]
            val[step] = ValPoint(step=step, val_loss=float(obj["val_loss"]), elapsed_s=_number(obj.get("elapsed_s")))
        elif event == "stop":
            run.stop = obj
        else:
            run.skipped_lines += 1
    run.train = [train[s] for s in sorted(train)]
    run.val = [val[s] for s in sorted(val)]
    return run


def read_metrics_jsonl(path: Path, *, name: str | None = None) -> RunLog:
    """Read a metrics.jsonl file (name defaults to its folder's name). A file with lines but not one record of a
    run (no header, step, validation or stop record) is not a run's metrics: a ValueError naming it."""
    path = Path(path)
    text = read_text(path, max_bytes=MAX_METRICS_BYTES, what="metrics.jsonl", errors="replace")
    run = parse_metrics_jsonl(text, name=name or path.parent.name or path.stem, source=path)
    if run.skipped_lines and not run.header and not run.stop and not run.train and not run.val:
        raise ValueError(f"{path} must hold nemo-muon metrics records (JSON objects with event run / train / val / "
                         f"stop, one per line); got {run.skipped_lines} lines and none of them is one")
    return run
