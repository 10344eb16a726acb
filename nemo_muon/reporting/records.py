"""Plain records of one run's metrics, whatever log they were read from (our JSONL or Megatron/Bridge text)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(kw_only=True)
class TrainPoint:
    """One logged training step; a field is None when the log did not carry it."""

    step: int
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens: float | None = None
    step_time_s: float | None = None
    optimizer_time_s: float | None = None
    tokens_per_s: float | None = None
    model_tflops: float | None = None
    """Model TFLOP/s per GPU (Megatron's 'throughput per GPU'; our JSONL's model_tflops)."""
    ns_tflops: float | None = None
    """Newton-Schulz TFLOP/s per GPU (the optimizer's extra matmuls), when known."""
    elapsed_s: float | None = None
    """Wall time since the run started, at the end of this step."""
    skipped: int | None = None
    """Steps skipped (non-finite gradient) that this record covers: our JSONL's ``skipped`` as 0 / 1, Megatron's
    'number of skipped iterations' of the log interval."""
    skipped_total: int | None = None
    """Skipped steps of the run up to this step (our JSONL's ``skipped_steps``; continues over a resume)."""
    load_1m: float | None = None
    """The machine's 1-minute load average at this step (our JSONL's ``load_1m``): every process on it, the run's
    own ranks included (`nemo_muon.reporting.machine_load`)."""


@dataclass(kw_only=True)
class ValPoint:
    """One validation result."""

    step: int
    val_loss: float
    elapsed_s: float | None = None


@dataclass(kw_only=True)
class RunLog:
    """Everything read from one run: header facts, train and val curves, memory, and what could not be parsed."""

    name: str
    sources: list[Path]
    kind: str
    """'jsonl' (our metrics.jsonl) or 'megatron' (Megatron-LM / Megatron-Bridge text log)."""
    recipe: str | None = None
    optimizer: str | None = None
    world_size: int | None = None
    header: dict[str, Any] = field(default_factory=dict)
    train: list[TrainPoint] = field(default_factory=list)
    val: list[ValPoint] = field(default_factory=list)
    peak_memory_gb: float | None = None
    """Largest 'max allocated' (or max reserved when that is all there is) seen in the log, in GB."""
    skipped_lines: int = 0
    """Lines that looked like metrics but could not be parsed (partial writes, interleaving)."""
    stop: dict[str, Any] | None = None
    """Our JSONL's ``stop`` event (a run that ended early, e.g. ``reason: diverged``), if any."""
