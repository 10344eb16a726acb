"""Run metrics: the JSONL file (schema in docs/ARCHITECTURE.md), optional TensorBoard, and a progress line.

Only rank 0 writes. Each event is one JSON object per line, flushed immediately, so a crashed or running job
can be reported on. TensorBoard events are written when asked for and `torch.utils.tensorboard` imports;
when asked for but not installed, the run says so once (and records `tensorboard: false` in its run event).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, TextIO

METRICS_FILE = "metrics.jsonl"


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def progress_line(step: int, max_steps: int, loss: float, tokens_per_s: float, eta_s: float,
                  val_loss: float | None = None) -> str:
    """One progress line: `[ 12/300  4%] loss 5.1234 | 8.1k tok/s | ETA 1m23s`."""
    width = len(str(max_steps))
    pct = 100.0 * step / max_steps
    line = f"[{step:>{width}}/{max_steps} {pct:3.0f}%] loss {loss:.4f} | {tokens_per_s / 1e3:.1f}k tok/s"
    if val_loss is not None:
        line += f" | val {val_loss:.4f}"
    return line + f" | ETA {_format_duration(eta_s)}"


class MetricsWriter:
    """Appends events to <run_dir>/metrics.jsonl (and TensorBoard); a no-op on ranks other than 0."""

    def __init__(self, run_dir: str | Path, *, enabled: bool, tensorboard: bool = False,
                 stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.stream = stream
        """Where progress lines go; None = the process's stdout at the time of each line (not at construction:
        the stream may be replaced in between, e.g. by a test runner's capture)."""
        self._file = None
        self._tb = None
        self.tensorboard = False
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                warnings.warn("logging.tensorboard=True but the tensorboard package is not installed; "
                              "writing metrics.jsonl only", stacklevel=2)
            else:
                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
                self.tensorboard = True

    @property
    def path(self) -> Path:
        return self.run_dir / METRICS_FILE

    def write(self, event: str, **fields: Any) -> None:
        """Write one event line; numeric fields also go to TensorBoard under `<event>/<field>` at `step`."""
        if not self.enabled or self._file is None:
            return
        record = {"event": event, **fields}
        self._file.write(json.dumps(record, sort_keys=False) + "\n")
        self._file.flush()
        if self._tb is not None and "step" in fields:
            for k, v in fields.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{event}/{k}", v, fields["step"])

    def progress(self, line: str) -> None:
        """Print a progress line (rank 0 only)."""
        if self.enabled:
            print(line, file=self.stream if self.stream is not None else sys.stdout, flush=True)

    def warn(self, line: str) -> None:
        """Print ``warning: <line>`` to stderr (rank 0 only): the run goes on but something needs attention."""
        if self.enabled:
            print(f"warning: {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable and waiting tasks, every process on it), None where the OS
    has none: recorded with each step so a report can say when throughput was measured with other load."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_info() -> dict[str, Any]:
    """What the load average is compared with: the CPUs this process may run on, the ranks on this machine
    (torchrun's ``LOCAL_WORLD_SIZE``) and the intra-op threads of each."""
    import torch

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return {"cpus": cpus, "local_ranks": int(local) if local.isdigit() else None,
            "threads_per_rank": torch.get_num_threads()}


class Stopwatch:
    """Wall time since construction."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0
