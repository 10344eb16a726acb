"""Per-run summary numbers and the Muon-vs-AdamW comparison (steps to reach AdamW's final loss)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from nemo_muon.reporting.records import RunLog, TrainPoint


@dataclass(kw_only=True)
class RunSummary:
    """What the report table shows for one run (None = the log did not carry it)."""

    name: str
    recipe: str | None
    optimizer: str | None
    world_size: int | None
    last_step: int | None
    final_train_loss: float | None
    final_val_loss: float | None
    tokens_per_s: float | None
    model_tflops: float | None
    """Mean model TFLOP/s per GPU over steady-state steps (the first logged step is warm-up and left out)."""
    model_ns_tflops: float | None
    """Model + Newton-Schulz TFLOP/s per GPU (Muon's orthogonalization counted as useful work)."""
    optimizer_share: float | None
    """sum(optimizer_time_s) / sum(step_time_s) over steady-state steps."""
    peak_memory_gb: float | None
    skipped_steps: int | None
    """Steps skipped for a non-finite gradient (None: the log does not say)."""
    skipped_lines: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class PairComparison:
    """Muon against AdamW on the same recipe: how many steps Muon needs to reach AdamW's final loss."""

    muon: str
    adamw: str
    metric: str
    """'val_loss' when both runs validated, else 'train_loss'."""
    target_loss: float
    adamw_steps: int
    muon_steps: int | None
    """First step at which Muon's loss <= target; None if it never got there."""
    step_ratio: float | None
    """adamw_steps / muon_steps (> 1: Muon needs fewer steps)."""
    throughput_ratio: float | None
    """Muon model TFLOP/s / AdamW model TFLOP/s."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def optimizer_family(name: str | None) -> str | None:
    """'muon', 'soap' or 'adamw' from an optimizer (or run) name such as 'dist_muon', 'adam', 'kimi_k2_adamw'."""
    if not name:
        return None
    low = name.lower()
    for family, token in (("muon", "muon"), ("soap", "soap"), ("adamw", "adam")):
        if token in low:
            return family
    return None


def _steady(points: Sequence[TrainPoint], attr: str) -> list[TrainPoint]:
    have = [p for p in points if getattr(p, attr) is not None]
    return have[1:] if len(have) >= 2 else have


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def skipped_steps(points: Sequence[TrainPoint]) -> int | None:
    """The run's skipped steps: the last cumulative count when the log has one, else the sum of the per-record
    counts; None when no record says."""
    totals = [p.skipped_total for p in points if p.skipped_total is not None]
    if totals:
        return totals[-1]
    counts = [p.skipped for p in points if p.skipped is not None]
    return sum(counts) if counts else None


def summarize(run: RunLog) -> RunSummary:
    """Reduce a run to its table row."""
    losses = [p for p in run.train if p.loss is not None]
    tflops = _steady(run.train, "model_tflops")
    model = _mean([p.model_tflops for p in tflops])  # type: ignore[misc]
    with_ns = [p for p in tflops if p.ns_tflops is not None]
    model_ns = _mean([p.model_tflops + p.ns_tflops for p in with_ns]) if with_ns else None  # type: ignore[operator]
    timed = [p for p in _steady(run.train, "step_time_s") if p.optimizer_time_s is not None and p.step_time_s]
    share = (sum(p.optimizer_time_s for p in timed) / sum(p.step_time_s for p in timed)  # type: ignore[misc]
             if timed else None)
    return RunSummary(
        name=run.name,
        recipe=run.recipe,
        optimizer=run.optimizer or optimizer_family(run.name),
        world_size=run.world_size,
        last_step=run.train[-1].step if run.train else None,
        final_train_loss=losses[-1].loss if losses else None,
        final_val_loss=run.val[-1].val_loss if run.val else None,
        tokens_per_s=_mean([p.tokens_per_s for p in _steady(run.train, "tokens_per_s")]),  # type: ignore[misc]
        model_tflops=model,
        model_ns_tflops=model_ns,
        optimizer_share=share,
        peak_memory_gb=run.peak_memory_gb,
        skipped_steps=skipped_steps(run.train),
        skipped_lines=run.skipped_lines,
    )


def _curve(run: RunLog, metric: str) -> list[tuple[int, float]]:
    if metric == "val_loss":
        return [(v.step, v.val_loss) for v in run.val]
    return [(p.step, p.loss) for p in run.train if p.loss is not None]


def compare_pair(muon: RunLog, adamw: RunLog) -> PairComparison | None:
    """Steps for Muon to reach AdamW's final loss (val when both validated); None when a curve is missing."""
    metric = "val_loss" if muon.val and adamw.val else "train_loss"
    m_curve, a_curve = _curve(muon, metric), _curve(adamw, metric)
    if not m_curve or not a_curve:
        return None
    adamw_steps, target = a_curve[-1]
    reached = next((step for step, loss in m_curve if loss <= target), None)
    m_sum, a_sum = summarize(muon), summarize(adamw)
    tput = (m_sum.model_tflops / a_sum.model_tflops
            if m_sum.model_tflops is not None and a_sum.model_tflops else None)
    return PairComparison(
        muon=muon.name, adamw=adamw.name, metric=metric, target_loss=target, adamw_steps=adamw_steps,
        muon_steps=reached, step_ratio=(adamw_steps / reached) if reached else None, throughput_ratio=tput,
    )


_OPT_TOKEN = re.compile(r"(^|[_\-.])(dist_)?(muon|adamw|adam|soap)(?=\Z|[_\-.])", re.IGNORECASE | re.ASCII)


def _pair_key(run: RunLog) -> str:
    return _OPT_TOKEN.sub(r"\1", run.recipe or run.name).strip("_-.").lower()


def find_pairs(runs: Sequence[RunLog]) -> list[tuple[RunLog, RunLog]]:
    """Muon/AdamW pairs: runs whose recipe (or name) differs only by the optimizer token; else the only two."""
    fam = {id(r): optimizer_family(r.optimizer) or optimizer_family(r.name) for r in runs}
    muons = [r for r in runs if fam[id(r)] == "muon"]
    adams = [r for r in runs if fam[id(r)] == "adamw"]
    pairs = []
    for m in muons:
        match = next((a for a in adams if _pair_key(a) == _pair_key(m)), None)
        if match is not None:
            pairs.append((m, match))
    if not pairs and len(muons) == 1 and len(adams) == 1:
        pairs.append((muons[0], adams[0]))
    return pairs
