"""Refusals and divergence stops of the torch backend, and how an entry point reports them: once, as one line.

A refusal is an expected, user-fixable end of a run (a checkpoint that cannot be resumed, a changed optimizer
setting, a folder that is in use); a divergence stop ends a run whose steps keep being skipped. Every rank raises
the same error together, so the entry points (`run_or_refuse`: ``python -m nemo_muon.launchers.run_recipe``,
``python -m nemo_muon.train.pretrain``, the demo) print it on rank 0 only, as ``error: <one line>``, with no
traceback, and exit with `REFUSED_EXIT` or `DIVERGED_EXIT` (the other ranks exit 0, so that a launcher's first
observed failure is rank 0's); `nemo_muon.train.spawn` re-raises it in the parent
without the rank's traceback. Anything else is a bug and keeps its traceback. Torch-free at import.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

REFUSED_EXIT = 2
"""Exit code of a refused run (same as a refused override)."""
DIVERGED_EXIT = 3
"""Exit code of a run stopped because it diverged."""


class RunRefused(ValueError):
    """The run cannot start or resume as configured (the message names the field, the value and the fix)."""


class TrainingDiverged(RuntimeError):
    """Training stopped: non-finite gradients made too many consecutive steps no-ops (or nonfinite='raise')."""


def _checkpoint_error() -> type[BaseException] | None:
    """`CheckpointError` when the checkpoint module is loaded (it is, whenever one can have been raised)."""
    module = sys.modules.get("nemo_muon.layerwise.checkpoint")
    return getattr(module, "CheckpointError", None)


def refusal_kind(err: BaseException) -> str | None:
    """'diverged', 'checkpoint' or 'refused' for the errors reported as one line; None for anything else."""
    if isinstance(err, TrainingDiverged):
        return "diverged"
    ckpt = _checkpoint_error()
    if ckpt is not None and isinstance(err, ckpt):
        return "checkpoint"
    if isinstance(err, RunRefused):
        return "refused"
    return None


def rebuild(kind: str, message: str) -> BaseException:
    """The error of `refusal_kind` ``kind`` with ``message`` (how a rank's refusal crosses a process boundary)."""
    if kind == "diverged":
        return TrainingDiverged(message)
    if kind == "checkpoint":
        from nemo_muon.layerwise.checkpoint import CheckpointError

        return CheckpointError(message)
    return RunRefused(message)


def one_line(err: BaseException) -> str:
    """The error's message on one line (whitespace runs collapsed)."""
    return " ".join(str(err).split())


def exit_code(err: BaseException) -> int:
    """`DIVERGED_EXIT` for a divergence stop, `REFUSED_EXIT` for every other refusal."""
    return DIVERGED_EXIT if isinstance(err, TrainingDiverged) else REFUSED_EXIT


def run_or_refuse(fn: Callable[[], Any], *, rank: int, stream: TextIO | None = None) -> int:
    """Call ``fn``; 0 when it returns. A refusal is printed by rank 0 only as ``error: <one line>`` (to ``stream``,
    default stderr), which returns its exit code; the other ranks return 0: torchrun and ``srun --kill-on-bad-exit``
    kill the remaining ranks at the first non-zero exit they see, which must be rank 0's, after its line (the
    launcher's exit code is then rank 0's: `nemo_muon.launchers.torchrun`). Any other exception propagates with its
    traceback."""
    try:
        fn()
    except Exception as err:
        if refusal_kind(err) is None:
            raise
        if rank != 0:
            return 0
        print(f"error: {one_line(err)}", file=stream if stream is not None else sys.stderr, flush=True)
        return exit_code(err)
    return 0
