"""Parse Megatron-LM / Megatron-Bridge training logs (text), robust to partial and interleaved lines.

Recognised (research/B §3 "Logged metrics"):
- ``iteration   10/  50 | ... | elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 1080.2 |
  learning rate: 3.0E-04 | global batch size: 4096 | lm loss: 2.3E+00 | ... | grad norm: 1.234 |``
- Bridge's ``Step Time : 1.23s GPU utilization: 1080.2 MODEL_TFLOP/s/GPU``
- ``validation loss at iteration 50 | lm loss value: 2.3E+00 |``
- Megatron's argument dump: ``  optimizer ..... muon`` and ``  world_size ..... 256``
- memory: ``memory (MB) | allocated: .. | max allocated: .. | reserved: .. | max reserved: ..`` and
  ``mem-max-allocated-gigabytes: ..``

A value is accepted only when the text after it shows the number is complete (a ``|``, whitespace or the end of a
newline-terminated line), so a line cut mid-number never yields a wrong value. Several records run together on
one line (ranks writing to one file) are split at each ``iteration N/M`` marker. srun ``--label`` prefixes
(``3: ``) and timestamps are ignored.
"""

from __future__ import annotations

import re
from pathlib import Path

from nemo_muon.config.files import read_text
from nemo_muon.config.limits import MAX_STEPS
from nemo_muon.reporting.records import RunLog, TrainPoint, ValPoint

_A = re.ASCII
_NUM = r"([-+]?+(?:[0-9]++(?:\.[0-9]*+)?+|\.[0-9]++)(?:[eE][-+]?+[0-9]++)?+|nan|inf)"
"""A number, matched possessively (no backtracking into its digits): linear in its length, however long."""
_END = r"(?=\s*+\||\s*+\Z)"
_ITER = re.compile(r"\biteration\s++([0-9]++)\s*+/\s*+([0-9]++)\s*+\|", _A)
_VAL = re.compile(r"validation loss at iteration\s++([0-9]++)", _A)
_TRAIN_FIELDS: dict[str, re.Pattern[str]] = {
    "step_time_ms": re.compile(r"elapsed time per iteration \(ms\):\s*+" + _NUM + _END, _A),
    "model_tflops": re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*+" + _NUM + _END, _A),
    "lr": re.compile(r"learning rate:\s*+" + _NUM + _END, _A),
    "loss": re.compile(r"\blm loss:\s*+" + _NUM + _END, _A),
    "grad_norm": re.compile(r"grad norm:\s*+" + _NUM + _END, _A),
    "global_batch_size": re.compile(r"global batch size:\s*+" + _NUM + _END, _A),
    "skipped": re.compile(r"number of skipped iterations:\s*+" + _NUM + _END, _A),
}
_VAL_LOSS = re.compile(r"lm loss value:\s*+" + _NUM + _END, _A)
_BRIDGE_STEP = re.compile(r"Step Time\s*+:\s*+" + _NUM + r"s\s++GPU utilization:\s*+" + _NUM + r"\s*+MODEL_TFLOP/s/GPU",
                          _A)
_MEM_MB = re.compile(r"\bmax allocated:\s*+" + _NUM + _END, _A)
_MEM_RESERVED_MB = re.compile(r"\bmax reserved:\s*+" + _NUM + _END, _A)
_MEM_GB = re.compile(r"mem-max-(allocated|reserved)-gigabytes:\s*+" + _NUM + _END, _A)
_ARG = re.compile(r"\s*+(optimizer|world_size)\s\.{3,}+\s(\S++)\s*+\Z", _A)  # Megatron's argument dump
MAX_COUNT_DIGITS = 12
"""Longest iteration number or world size read from a log (digits); a longer one is not a record."""
MAX_LOG_BYTES = 1 << 30
"""Largest log file read (1 GiB: a million iterations of a verbose Megatron log)."""


def _count(text: str) -> int | None:
    """An iteration number or a size: ASCII digits, at most `MAX_COUNT_DIGITS` of them, else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= MAX_COUNT_DIGITS else None


def _float(text: str) -> float:
    return float(text)


def _skipped(value: float | None) -> int | None:
    """Megatron's skipped-iterations count as an int (None when absent or not a finite count)."""
    return int(value) if value is not None and 0 <= value <= MAX_STEPS else None


def _split_records(line: str) -> list[str]:
    """Split a line at each 'iteration N/M |' marker so run-together records parse separately."""
    starts = [m.start() for m in _ITER.finditer(line)]
    if len(starts) <= 1:
        return [line]
    return [line[a:b] for a, b in zip([0, *starts[1:]], [*starts[1:], len(line)], strict=True)]


def parse_megatron_log(text: str, *, name: str, source: Path) -> RunLog:
    """Parse log text into a RunLog; elapsed time is the running sum of per-iteration times."""
    run = RunLog(name=name, sources=[source], kind="megatron")
    lines = text.split("\n")
    complete = text.endswith("\n")
    fields_by_step: dict[int, dict[str, float]] = {}
    val: dict[int, float] = {}
    bridge_steps: list[tuple[float, float]] = []
    mem_alloc_gb: list[float] = []
    mem_reserved_gb: list[float] = []
    for i, raw in enumerate(lines):
        if m := _ARG.match(raw):
            if m.group(1) == "optimizer":
                run.optimizer = run.optimizer or m.group(2)
            elif (size := _count(m.group(2))) is not None:
                run.world_size = run.world_size or size
            continue
        line = raw if (complete or i < len(lines) - 1) else raw + "\u0000"  # an unterminated tail has no clean end
        for record in _split_records(line):
            it = _ITER.search(record)
            vm = _VAL.search(record)
            step = _count(it.group(1)) if it else None
            if it and step is None:  # an iteration number no run reaches: not a record
                run.skipped_lines += 1
                continue
            if step is not None:
                got = {key: _float(m.group(1)) for key, rx in _TRAIN_FIELDS.items() if (m := rx.search(record))}
                if not got:
                    run.skipped_lines += 1
                    continue
                merged = fields_by_step.setdefault(step, {})
                for key, value in got.items():
                    merged.setdefault(key, value)
            elif vm:
                m = _VAL_LOSS.search(record)
                if m and (val_step := _count(vm.group(1))) is not None:
                    val.setdefault(val_step, _float(m.group(1)))
                else:
                    run.skipped_lines += 1
            if m := _BRIDGE_STEP.search(record):
                bridge_steps.append((_float(m.group(1)), _float(m.group(2))))
            if m := _MEM_MB.search(record):
                mem_alloc_gb.append(_float(m.group(1)) / 1024.0)
            if m := _MEM_RESERVED_MB.search(record):
                mem_reserved_gb.append(_float(m.group(1)) / 1024.0)
            for m in _MEM_GB.finditer(record):
                (mem_alloc_gb if m.group(1) == "allocated" else mem_reserved_gb).append(_float(m.group(2)))
    elapsed = 0.0
    for step in sorted(fields_by_step):
        f = fields_by_step[step]
        step_time_s = f["step_time_ms"] / 1000.0 if "step_time_ms" in f else None
        elapsed = elapsed + step_time_s if step_time_s is not None else elapsed
        run.train.append(TrainPoint(step=step, loss=f.get("loss"), lr=f.get("lr"), grad_norm=f.get("grad_norm"),
                                    step_time_s=step_time_s, model_tflops=f.get("model_tflops"),
                                    elapsed_s=elapsed if step_time_s is not None else None,
                                    skipped=_skipped(f.get("skipped"))))
    if not run.train and bridge_steps:  # Bridge's own step lines when no Megatron iteration lines are present
        elapsed = 0.0
        for idx, (secs, tflops) in enumerate(bridge_steps, start=1):
            elapsed += secs
            run.train.append(TrainPoint(step=idx, step_time_s=secs, model_tflops=tflops, elapsed_s=elapsed))
    by_step = {p.step: p for p in run.train}
    run.val = [ValPoint(step=s, val_loss=v, elapsed_s=by_step[s].elapsed_s if s in by_step else None)
               for s, v in sorted(val.items())]
    peak = mem_alloc_gb or mem_reserved_gb
    run.peak_memory_gb = max(peak) if peak else None
    return run


def read_megatron_log(path: Path, *, name: str | None = None) -> RunLog:
    """Read one Megatron/Bridge log file (name defaults to the file's stem): a regular file of at most
    `MAX_LOG_BYTES` (`nemo_muon.config.files.read_text`; anything else is one ValueError naming it)."""
    path = Path(path)
    text = read_text(path, max_bytes=MAX_LOG_BYTES, what="a Megatron log", errors="replace")
    return parse_megatron_log(text, name=name or path.stem, source=path)
