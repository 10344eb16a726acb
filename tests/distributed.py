"""Run a function on N gloo ranks in fresh processes, bounded in time, and collect each rank's return value.

Rendezvous goes through a file in a temp dir (no fixed port). Each rank sets OMP_NUM_THREADS=1 (2-core CI).
Usage in a test:

    def _body(rank: int, world_size: int, group, x):   # module-level function (picklable)
        ...
        return some_picklable_result

    results = run_distributed(_body, world_size=2, args=(x,), timeout_s=120)   # list indexed by rank

Return plain data (numbers, lists, dicts, numpy arrays via ``t.numpy()``), not torch tensors: a tensor travels
through shared memory that disappears when the rank exits, so the harness refuses it with a clear error.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _contains_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_contains_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_contains_tensor(v) for v in obj)
    return False


def _worker(rank: int, world_size: int, init_file: str, fn: Callable, args: Sequence[Any], queue: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        try:
            result = fn(rank, world_size, dist.group.WORLD, *args)
            if _contains_tensor(result):
                raise TypeError(f"{getattr(fn, '__name__', fn)} returned a torch.Tensor; return plain data "
                                "(numbers, lists, numpy arrays via t.numpy()) from a rank")
            queue.put((rank, "ok", result))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report every failure to the parent, never hang it
        queue.put((rank, "error", traceback.format_exc()))


def run_distributed(fn: Callable, world_size: int, args: Sequence[Any] = (), timeout_s: float = 180.0) -> list[Any]:
    """Run ``fn(rank, world_size, group, *args)`` on ``world_size`` gloo ranks; return the results by rank.

    Raises RuntimeError with the rank's traceback if any rank fails, or TimeoutError if ranks hang.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, init_file, fn, tuple(args), queue), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: list[str] = []
        import queue as queue_mod
        import time

        deadline = time.monotonic() + timeout_s
        try:
            while len(results) + len(errors) < world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"distributed test did not finish within {timeout_s} s "
                                       f"({len(results)} of {world_size} ranks done)")
                try:
                    rank, status, payload = queue.get(timeout=min(remaining, 1.0))
                except queue_mod.Empty:
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead and queue.empty():
                        raise RuntimeError(f"rank process died with exit code {dead[0].exitcode}") from None
                    continue
                if status == "ok":
                    results[rank] = payload
                else:
                    errors.append(f"rank {rank}:\n{payload}")
                    break
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
        if errors:
            raise RuntimeError("distributed test failed on " + "\n".join(errors))
        return [results[r] for r in range(world_size)]
