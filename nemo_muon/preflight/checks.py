"""The verdicts of a preflight: each check with its tolerance, the figure the runs showed, and one line.

The order is the order a user should read a failure in: who updates each parameter, whether replicas agree, then the
numbers (losses, masters against the reference path, then against the single-process reference), the checkpoint
(resumed as saved, then at another layout), the non-finite policy, and the optimizer step's time last.
A check that cannot run for the request (the single-process reference of Megatron's own engine, the resharded resume
on one rank) says so and why (``ran=False``); it does not fail the preflight.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from nemo_muon.preflight.request import WARMUP_STEPS, PreflightRequest

CHECK_NAMES = ("owners", "replicas", "losses", "masters", "single_process", "resume", "reshard", "nonfinite",
               "step_time")
"""Every check, in the order they are reported (module doc)."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: its name, what it tolerates, what the runs showed, and whether that holds."""

    name: str
    tolerance: str
    figure: str
    passed: bool
    ran: bool = True
    """False: the check could not run for this request (its figure says why); it counts as passed."""

    def verdict(self) -> str:
        """One line: ``PASS`` / ``FAIL`` / ``NOT RUN``, the check, the figure and the tolerance."""
        word = "NOT RUN" if not self.ran else "PASS" if self.passed else "FAIL"
        return f"{word} {self.name}: {self.figure} (tolerance: {self.tolerance})"


def _first(problems: list[str], total: int | None, what: str) -> str:
    if not problems:
        return what if total is None else f"{what} ({total} checked)"
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"


def _loss_check(figures: Any, rtol: float) -> Check:
    ours, ref = figures.losses["ours"], figures.losses["reference"]
    worst_step, worst = 0, 0.0
    for step, (a, b) in enumerate(zip(ours, ref, strict=True)):
        figure = abs(a - b) / abs(b) if math.isfinite(a) and math.isfinite(b) and b != 0 else math.inf
        if figure > worst or step == 0:
            worst_step, worst = step, figure
    figure = (f"largest |ours - reference| / |reference| {worst:.3g} at step {worst_step + 1} of {len(ref)} "
              f"(ours {ours[worst_step]:.6g}, reference {ref[worst_step]:.6g})")
    skipped = {role: steps for role, steps in figures.skipped.items() if steps}
    if skipped:
        figure += f"; steps skipped: {skipped}"
    return Check("losses", f"<= {rtol:g} per step, no step skipped", figure, worst <= rtol and not skipped)


def _nonfinite_check(nonfinite: dict[str, Any]) -> Check:
    policy, ranks = nonfinite.get("policy"), nonfinite.get("ranks", [])
    wanted = {"skip": {"outcome": "skipped", "untouched": True}, "raise": {"outcome": "raised"}}.get(policy)
    tolerance = (f"policy {policy!r}: every rank " + ("skips the step, weights, masters and state untouched"
                                                     if policy == "skip" else "raises FloatingPointError"))
    bad = [r for r, got in enumerate(ranks) if wanted is None or any(got.get(k) != v for k, v in wanted.items())]
    outcomes = sorted({f"{got['outcome']}" + ("" if got.get("untouched") in (None, True) else " (state changed)")
                       for got in ranks})
    figure = (f"a NaN gradient on the last data-parallel rank: every rank {outcomes[0]}" if len(outcomes) == 1
              else f"a NaN gradient on the last data-parallel rank: ranks disagree {outcomes}")
    if bad and len(outcomes) == 1:
        figure += f" on ranks {bad}"
    return Check("nonfinite", tolerance, figure, bool(ranks) and not bad)


def _single_process_check(figures: Any, rtol: float) -> Check:
    tolerance = (f"after the first step, per matrix max |ours - single process| <= {rtol:g} x how far the single "
                 "process moved it")
    if figures.single_process is None:
        return Check("single_process", tolerance, str(figures.single_process_not_run), True, ran=False)
    key, worst = figures.single_process
    figure = (f"largest {worst:.3g} ({key}) against one process stepping the whole tiny model on every "
              "data-parallel batch")
    if figures.single_process_reference is not None:
        ref_key, ref_worst = figures.single_process_reference
        figure += f"; the reference path, not checked: {ref_worst:.3g} ({ref_key})"
    return Check("single_process", tolerance, figure, worst <= rtol)


def _reshard_check(figures: Any, request: PreflightRequest) -> Check:
    tolerance = (f"saved at one layout, loaded at another (another pipeline size: the data-parallel size changes; "
                 f"another expert-parallel size: the experts' changes), the same global batch: "
                 f"weights and masters bit for bit at the load; the next step's loss <= {request.loss_rtol:g} "
                 f"relative, per matrix max |resharded - uninterrupted| <= {request.master_rtol:g} x the step's "
                 "movement, replicas bit-identical")
    if figures.reshard is None or figures.resharded is None:
        return Check("reshard", tolerance, str(figures.reshard_not_run), True, ran=False)
    (saved, loaded), outcome = figures.reshard, figures.resharded
    where = f"saved at {saved.describe()}, resumed at {loaded.describe()}"
    if outcome.problems:
        return Check("reshard", tolerance, f"{where}: {_first(outcome.problems, None, '')}", False)
    key, worst = outcome.master_worst or ("", math.inf)
    figure = (f"{where}: loaded bit for bit; the next step's loss {outcome.loss_diff:.3g} relative, masters "
              f"largest {worst:.3g} ({key})")
    return Check("reshard", tolerance, figure, True)


def _last(figures: Any) -> str:
    if figures.master_worst_last is None:
        return ""
    key, worst = figures.master_worst_last
    return f"; after step {len(figures.losses['ours'])}, not checked: {worst:.3g} ({key})"


def evaluate(figures: Any, request: PreflightRequest) -> list[Check]:
    """Every check of `CHECK_NAMES` on the figures of `nemo_muon.preflight.run.run_preflight`, in that order."""
    from nemo_muon.preflight.run import PLAN_KINDS

    planned = "".join(f"; the owners of {role} are {PLAN_KINDS[kind]}" for role, kind in sorted(figures.planned.items()))
    owners = Check("owners", "every matrix of the layer-wise optimizer has exactly one owner, or split owners that "
                   "agree; where a plan of ours decides them (the cost layout: Megatron-Core >= 0.18 with "
                   "collectives='reduce_scatter'; the NS-cost ownership: 0.16 / 0.17) the planned one",
                   _first(figures.owner_problems, figures.matrices, "every matrix has its owner")
                   + ("" if figures.owner_problems else planned), not figures.owner_problems)
    replicas = Check("replicas", "bit-identical weights on every data-parallel replica", _first(
        figures.replica_problems, None, "every parameter identical on every replica"),
        not figures.replica_problems)
    key, worst = figures.master_worst or ("", math.inf)
    masters = Check("masters", f"after the first step, per matrix max |ours - reference| <= {request.master_rtol:g} "
                    "x how far the reference moved it",
                    f"largest {worst:.3g} ({key}) after step 1" + _last(figures), worst <= request.master_rtol)
    resume = Check("resume", f"saved after step {request.checkpoint_step}, resumed: losses, masters and replicas "
                   "bit for bit", _first(figures.resume_problems, request.steps - request.checkpoint_step,
                                         "the resumed run continues bit for bit, steps after the resume"),
                   not figures.resume_problems)
    ratio = figures.step_time_ratio()
    step_time = Check("step_time", f"median optimizer step, ours / reference <= {request.step_time_ratio:g}",
                      f"{ratio:.2f}x (medians of steps after the first {WARMUP_STEPS})", ratio <= request.step_time_ratio)
    return [owners, replicas, _loss_check(figures, request.loss_rtol), masters,
            _single_process_check(figures, request.master_rtol), resume, _reshard_check(figures, request),
            _nonfinite_check(figures.nonfinite), step_time]


def first_failure(checks: list[Check]) -> Check | None:
    """The first check that failed, in report order; None when all passed."""
    return next((c for c in checks if not c.passed), None)
