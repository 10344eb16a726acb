"""Per-run summary numbers and each optimizer against its baseline (steps to reach the baseline's final loss).

Which optimizer a run used, and which baseline it is measured against, come from the registry (`nemo_muon.registry`:
``spec.baseline``; names in logs and run names read by `nemo_muon.registry.mentions`), so NorMuon is never Muon and
a newly registered optimizer pairs with its baseline without a line here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from nemo_muon.registry.mentions import mentioned, spec_called
from nemo_muon.registry.spec import OptimizerSpec
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
    """An optimizer against its baseline on the same recipe (Muon against AdamW, ...): how many steps it needs to
    reach the baseline's final loss. The fields keep Muon's and AdamW's names for the two sides."""

    muon: str
    """The run of the optimizer compared."""
    adamw: str
    """The run of its baseline."""
    title: str = "Muon vs AdamW"
    """The two optimizers' labels ('NorMuon vs AdamW'): the heading of the comparison."""
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


def run_spec(run: RunLog) -> OptimizerSpec | None:
    """The registered optimizer a run used: its log's optimizer name, exactly (ours: the registered name; Megatron's:
    'dist_muon', 'adam', ...) or as a token ('kimi_k2_adamw'), else the one its recipe or run name mentions."""
    for text in (run.optimizer, run.recipe, run.name):
        found = spec_called(text) or getattr(mentioned(text), "spec", None)
        if found is not None:
            return found
    return None


def optimizer_of(name: str | None) -> str | None:
    """The registered optimizer an optimizer, recipe or run name means ('dist_muon' and 'kimi_k2_muon' -> 'muon',
    'tiny_kimi_k2_normuon' -> 'normuon', 'adam' -> 'adamw'); None when it names none."""
    found = spec_called(name) or getattr(mentioned(name), "spec", None)
    return found.name if found is not None else None


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
        optimizer=run.optimizer or optimizer_of(run.name),
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
    """Steps for the run ``muon`` (an optimizer) to reach the final loss of ``adamw`` (its baseline's run; val when
    both validated); None when a curve is missing."""
    metric = "val_loss" if muon.val and adamw.val else "train_loss"
    m_curve, a_curve = _curve(muon, metric), _curve(adamw, metric)
    if not m_curve or not a_curve:
        return None
    adamw_steps, target = a_curve[-1]
    reached = next((step for step, loss in m_curve if loss <= target), None)
    m_sum, a_sum = summarize(muon), summarize(adamw)
    tput = (m_sum.model_tflops / a_sum.model_tflops
            if m_sum.model_tflops is not None and a_sum.model_tflops else None)
    labels = [getattr(run_spec(r), "label", None) or r.name for r in (muon, adamw)]
    return PairComparison(
        muon=muon.name, adamw=adamw.name, title=" vs ".join(labels), metric=metric, target_loss=target,
        adamw_steps=adamw_steps, muon_steps=reached, step_ratio=(adamw_steps / reached) if reached else None,
        throughput_ratio=tput,
    )


def _pair_key(run: RunLog) -> str:
    """The recipe (or run) name without its optimizer's token: runs of one recipe and its baseline share it."""
    text = run.recipe or run.name
    found = mentioned(text)
    if found is not None:
        text = text[:found.start] + text[found.end:]
    return text.strip("_-.").lower()


def find_pairs(runs: Sequence[RunLog]) -> list[tuple[RunLog, RunLog]]:
    """(run, its baseline's run) pairs (the registry's ``spec.baseline``): runs whose recipe (or name) differs only by
    the optimizer's token; else, with one run of one optimizer and one of its baseline, those two."""
    spec = {id(r): run_spec(r) for r in runs}
    compared = [r for r in runs if spec[id(r)] is not None and spec[id(r)].baseline is not None]

    def baselines_of(r: RunLog) -> list[RunLog]:
        return [b for b in runs if spec[id(b)] is not None and spec[id(b)].name == spec[id(r)].baseline]

    pairs = []
    for r in compared:
        match = next((b for b in baselines_of(r) if _pair_key(b) == _pair_key(r)), None)
        if match is not None:
            pairs.append((r, match))
    if not pairs and len(compared) == 1 and len(baselines_of(compared[0])) == 1:
        pairs.append((compared[0], baselines_of(compared[0])[0]))
    return pairs
