"""``python -m nemo_muon.launchers.torchrun``: PyTorch's torchrun (same arguments), where a refused run ends as one line.

torchrun (``torch.distributed.run``) reports any rank that exits non-zero with its ChildFailedError block and exit code
1, after its agent logged the SIGTERM it sent the other ranks and the failure. A refused or diverged run is not a
failure of the launcher: rank 0 already said why, on one line, and the other ranks exit 0 (`nemo_muon.train.refusals`).
Here torchrun runs in this process; when its first observed failure exited with a refusal code (`REFUSED_EXIT`,
`DIVERGED_EXIT`) and every other failed rank with that code or the agent's SIGTERM, nothing more is printed and this
process exits with that code. Anything else is torchrun's failure report, unchanged (less the SIGTERM lines:
`RefusalLines`). Under Slurm, ``srun`` adds its own status line about the task's exit code.
"""

from __future__ import annotations

import logging
import re
import signal
import sys

from nemo_muon.train.refusals import DIVERGED_EXIT, REFUSED_EXIT

REFUSAL_CODES = (REFUSED_EXIT, DIVERGED_EXIT)
AGENT_LOGGER = "torch.distributed.elastic"
"""The logger of torchrun's agent (its per-rank failure line and the SIGTERM it sends the others)."""
_REFUSAL_LINE = re.compile(rf"failed \(exitcode: ({'|'.join(map(str, REFUSAL_CODES))})\)")
_SIGTERM_LINE = re.compile(r"closing signal SIGTERM")


class RefusalLines(logging.Filter):
    """Drops the agent's line about a rank that exited with a refusal code, and its lines about the SIGTERM it sends
    the ranks still running (logged before the failure it reacts to; after a real failure, torchrun's block lists
    those ranks with exit code -15)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (_REFUSAL_LINE.search(message) or _SIGTERM_LINE.search(message))


def refusal_exit(failures: dict[int, int], first: int) -> int | None:
    """The exit code to end with when the run was refused (``failures``: rank -> exit code, ``first``: the rank
    torchrun observed first), else None."""
    code = failures[first]
    if code not in REFUSAL_CODES:
        return None
    agent_kill = -int(signal.SIGTERM)
    return code if all(c in (code, agent_kill) for c in failures.values()) else None


def _install_filter() -> None:
    """The filter on the agent's loggers and on every handler their records reach (torch's and the root's)."""
    line_filter = RefusalLines()
    names = [n for n in logging.root.manager.loggerDict if n == AGENT_LOGGER or n.startswith(AGENT_LOGGER + ".")]
    for name in {AGENT_LOGGER, *names}:
        logging.getLogger(name).addFilter(line_filter)
    for logger in (*map(logging.getLogger, {AGENT_LOGGER, *names, "torch", "torch.distributed"}), logging.root):
        for handler in logger.handlers:
            handler.addFilter(line_filter)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` in this process; 0, a refusal's exit code, or torchrun's own failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    _install_filter()
    try:
        run(args)
    except ChildFailedError as failed:
        first, _ = failed.get_first_failure()
        code = refusal_exit({rank: f.exitcode for rank, f in failed.failures.items()}, first)
        if code is None:
            raise
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
