"""Run a function on N gloo ranks in fresh processes, bounded in time, and collect each rank's return value.

The tests use the library's own launcher (`nemo_muon.train.spawn.spawn_ranks`: file rendezvous in a temp dir, no
fixed port, OMP_NUM_THREADS=1 per rank, failures and hangs raised instead of stalling). The ranks are forked from a
server that has imported the heavy libraries once (`tests.rank_preload`; `spawn.preloaded_context`): each test's
ranks are still new processes, with no state of an earlier test, without paying seconds of imports each.
Usage in a test:

    def _body(rank: int, world_size: int, group, x):   # module-level function (picklable)
        ...
        return some_plain_result                        # numbers, lists, numpy arrays - not torch tensors

    results = run_distributed(_body, world_size=2, args=(x,), timeout_s=120)   # list indexed by rank
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from typing import Any

from nemo_muon.train.spawn import preloaded_context, spawn_ranks


@functools.cache
def rank_context() -> BaseContext:
    """The tests' one forkserver context (started at the first run, kept for the session)."""
    return preloaded_context(["tests.rank_preload"])


def run_distributed(fn: Callable, world_size: int, args: Sequence[Any] = (), timeout_s: float = 180.0,
                    daemon: bool = True, collective_timeout_s: float | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, group, *args)`` on ``world_size`` gloo ranks; return the results by rank.
    ``collective_timeout_s``: how long a collective waits for a stalled or dead rank (default: spawn's)."""
    extra = {} if collective_timeout_s is None else {"collective_timeout_s": collective_timeout_s}
    return spawn_ranks(fn, world_size, args, timeout_s=timeout_s, daemon=daemon, context=rank_context(), **extra)
