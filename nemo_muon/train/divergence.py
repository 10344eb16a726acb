"""Notice divergence: warn on a non-finite loss or a skipped step, stop after too many consecutive skipped steps.

With ``optimizer.nonfinite='skip'`` a step whose global gradient is non-finite is a no-op. One such step can be a
glitch; a run of them means the model has diverged (its parameters or activations are no longer finite) and
every further step would be skipped too. `DivergenceWatch` sees every step's outcome (the same on every rank:
the loss is all-reduced and the skip decision is global), returns the warning line to print, and raises
`TrainingDiverged` once ``trainer.max_consecutive_skips`` steps in a row were skipped (0 = never stop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nemo_muon._validation import check_positive_int
from nemo_muon.train.refusals import TrainingDiverged

LIMIT_FIELD = "trainer.max_consecutive_skips"


@dataclass(kw_only=True)
class DivergenceWatch:
    """Counts consecutive skipped steps; see the module docstring."""

    limit: int
    """Stop after this many consecutive skipped steps; 0 = warn only, never stop."""
    consecutive: int = 0
    """Skipped steps in a row so far."""
    first_skipped: int | None = None
    """The first step of the current run of skipped steps."""

    def __post_init__(self) -> None:
        check_positive_int(LIMIT_FIELD, self.limit, minimum=0)

    def observe(self, step: int, loss: float, grad_norm: float, skipped: bool) -> str | None:
        """Record step ``step`` (1-based); the warning to print, or None for a healthy step.

        Raises `TrainingDiverged` when this step makes ``limit`` consecutive skipped steps.
        """
        bad_loss = not math.isfinite(loss)
        if not skipped:
            self.consecutive, self.first_skipped = 0, None
            return f"step {step}: loss is {loss} (non-finite): training is diverging" if bad_loss else None
        self.consecutive += 1
        self.first_skipped = step if self.first_skipped is None else self.first_skipped
        cause = f"non-finite gradient (grad norm {grad_norm})" + (f" and loss {loss}" if bad_loss else "")
        if self.limit and self.consecutive >= self.limit:
            raise TrainingDiverged(
                f"training diverged: steps {self.first_skipped}-{step} were all skipped ({self.consecutive} in a row, "
                f"{LIMIT_FIELD}={self.limit}) because of a {cause}; lower optimizer.lr (or raise {LIMIT_FIELD}, 0 "
                "never stops) and resume from a checkpoint before the divergence")
        stop = f"training stops at {self.limit} ({LIMIT_FIELD})" if self.limit else f"{LIMIT_FIELD}=0: never stops"
        return f"step {step} skipped: {cause}; {self.consecutive} consecutive skipped step(s), {stop}"

    @staticmethod
    def nonfinite_raised(step: int, err: BaseException) -> TrainingDiverged:
        """The stop for ``optimizer.nonfinite='raise'`` (the optimizer raised FloatingPointError at ``step``)."""
        return TrainingDiverged(f"training diverged at step {step}: {err}; lower optimizer.lr, or set "
                                "optimizer.nonfinite=skip to skip such steps")
