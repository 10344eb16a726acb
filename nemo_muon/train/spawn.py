"""Run the torch backend on N local gloo ranks from Python (demo, tests, benchmarks): `launch_local`, `spawn_ranks`.

Each rank is a fresh spawned process with OMP_NUM_THREADS=1 (one core each on small machines); ranks meet
through a file in a temporary folder (no port); a rank that fails or a run that exceeds ``timeout_s`` raises
here with the rank's traceback, instead of hanging. ``context=preloaded_context(modules)`` forks the ranks from a
server that has imported ``modules`` once (torch, Megatron-Core: seconds per rank otherwise), with the caller's
environment as it is at the call, as a spawned rank would have it. A refusal or divergence stop (`nemo_muon.train.refusals`,
raised by every rank together) is re-raised here as the same error with its one-line message and no traceback.
torchrun (`python -m nemo_muon.train.pretrain`) is the equivalent for command lines and NeMo-Run.
"""

from __future__ import annotations

import os
import queue as queue_mod
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from typing import Any

from nemo_muon.config.limits import CPU_COLLECTIVE_TIMEOUT_S
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.train.refusals import one_line, rebuild, refusal_kind


def _contains_tensor(obj: Any) -> bool:
    import torch

    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_contains_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_contains_tensor(v) for v in obj)
    return False


def preloaded_context(preload: Sequence[str]) -> BaseContext:
    """A forkserver context whose server imports the modules ``preload`` names before it forks any rank.

    The server starts at the first `spawn_ranks` call with this context and serves every later one of this
    process; it holds the imports only (no process group, no state of a run), so a rank forked from it starts as
    a spawned one would, without paying the imports. Each rank takes the caller's environment at the call, but a
    preloaded module that reads the environment when imported has read the server's, at its start: preload only
    modules whose import-time settings the caller does not change later. A module that fails to import is skipped
    by the server (the rank imports it, and fails, itself). The preload list is the process's: set it once.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    return ctx


def _rank_main(rank: int, world: int, init_file: str, fn: Callable, args: Sequence[Any], results: Any,
               collective_timeout_s: float, environ: dict[str, str]) -> None:
    if os.environ != environ:  # a forked rank has the server's environment: take the caller's, as spawn does
        os.environ.clear()
        os.environ.update(environ)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=collective_timeout_s))
        try:
            out = fn(rank, world, dist.group.WORLD, *args)
            if _contains_tensor(out):
                # a tensor travels through shared memory that disappears when this process exits
                raise TypeError(f"{getattr(fn, '__name__', fn)} returned a torch.Tensor; return plain data "
                                "(numbers, lists, numpy arrays via t.numpy()) from a rank")
        finally:
            dist.destroy_process_group()
        results.put((rank, "ok", out))
    except BaseException as err:  # report every failure to the parent
        kind = refusal_kind(err)
        if kind is not None:  # an expected, user-fixable end: its message is all the parent needs
            results.put((rank, "refused", (kind, one_line(err))))
        else:
            results.put((rank, "error", traceback.format_exc()))


def spawn_ranks(fn: Callable, world: int, args: Sequence[Any] = (), *, timeout_s: float = 3600.0,
                daemon: bool = True, collective_timeout_s: float = CPU_COLLECTIVE_TIMEOUT_S,
                context: BaseContext | None = None) -> list[Any]:
    """Run ``fn(rank, world, group, *args)`` (a module-level function) on ``world`` gloo ranks; results by rank.

    Results must be plain data (no torch tensors). Raises RuntimeError with the rank's traceback when a rank fails
    (a refusal: the rank's `RunRefused` / `CheckpointError` / `TrainingDiverged`, one line, no traceback),
    TimeoutError when the ranks do not finish within ``timeout_s``. ``daemon=False`` lets a rank start processes
    of its own (Megatron's dist_checkpointing writer does); ranks still alive at the end are killed either way.
    A collective that waits ``collective_timeout_s`` for a stalled rank fails on the ranks still running.
    ``context``: the multiprocessing context that starts the ranks (default: spawn; `preloaded_context`).
    """
    import torch.multiprocessing as mp

    ctx = context if context is not None else mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, daemon=daemon,
                             args=(r, world, init_file, fn, tuple(args), results, collective_timeout_s,
                                   dict(os.environ)))
                 for r in range(world)]
        for p in procs:
            p.start()
        done: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(done) < world:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks did not finish within {timeout_s} s ({len(done)}/{world} done)")
                try:
                    rank, status, payload = results.get(timeout=1.0)
                except queue_mod.Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"a rank died with exit code {dead[0]}") from None
                    continue
                if status == "refused":
                    raise rebuild(*payload) from None
                if status != "ok":
                    raise RuntimeError(f"rank {rank} failed:\n{payload}")
                done[rank] = payload
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return [done[r] for r in range(world)]


def _train_rank(rank: int, world: int, group: Any, recipe: TrainingRecipe, kwargs: dict[str, Any]) -> dict:
    from nemo_muon.train.loop import train

    return train(recipe, group=group, **kwargs)


def launch_local(recipe: TrainingRecipe, nprocs: int | None = None, *, timeout_s: float = 3600.0,
                 **kwargs: Any) -> dict[str, Any]:
    """Train ``recipe`` on ``nprocs`` (default: recipe.world_size) local gloo ranks; rank 0's summary.

    ``kwargs`` go to `nemo_muon.train.loop.train` (``stop_after_steps``).
    """
    if recipe.system.gpu != "cpu":
        raise ValueError(f"system.gpu must be 'cpu' for launch_local (gloo ranks on this machine's CPU); got "
                         f"{recipe.system.gpu!r}: run GPU recipes with torchrun (python -m nemo_muon.train.pretrain) "
                         "or nemo-muon launch")
    world = nprocs if nprocs is not None else recipe.world_size
    if world == 1:
        from nemo_muon.train.loop import train

        return train(recipe, group=None, **kwargs)
    return spawn_ranks(_train_rank, world, (recipe, kwargs), timeout_s=timeout_s,
                       collective_timeout_s=recipe.system.collective_timeout)[0]
