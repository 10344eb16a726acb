"""Run the torch backend on N local gloo ranks from Python (the demo, tests, benchmarks): `launch_local`.

Each rank is a fresh spawned process with OMP_NUM_THREADS=1 (one core each on small machines); ranks meet
through a file in a temporary folder (no port); a rank that fails or a run that exceeds ``timeout_s`` raises
here with the rank's traceback, instead of hanging. torchrun (`python -m nemo_muon.train.pretrain`) is the
equivalent for command lines and NeMo-Run.
"""

from __future__ import annotations

import os
import queue as queue_mod
import tempfile
import time
import traceback
from typing import Any

from nemo_muon.config.recipe import TrainingRecipe


def _rank_main(rank: int, world: int, init_file: str, recipe: TrainingRecipe, kwargs: dict[str, Any],
               results: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import torch
        import torch.distributed as dist

        from nemo_muon.train.loop import train

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        try:
            summary = train(recipe, group=dist.group.WORLD, **kwargs)
        finally:
            dist.destroy_process_group()
        results.put((rank, "ok", summary))
    except BaseException:  # report every failure to the parent
        results.put((rank, "error", traceback.format_exc()))


def launch_local(recipe: TrainingRecipe, nprocs: int | None = None, *, timeout_s: float = 3600.0,
                 **kwargs: Any) -> dict[str, Any]:
    """Train ``recipe`` on ``nprocs`` (default: recipe.world_size) local gloo ranks; rank 0's summary."""
    import torch.multiprocessing as mp

    world = nprocs if nprocs is not None else recipe.world_size
    if world == 1:
        from nemo_muon.train.loop import train

        return train(recipe, group=None, **kwargs)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, world, init_file, recipe, kwargs, results), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        done: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(done) < world:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"training did not finish within {timeout_s} s ({len(done)}/{world} ranks)")
                try:
                    rank, status, payload = results.get(timeout=1.0)
                except queue_mod.Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"a training rank died with exit code {dead[0]}") from None
                    continue
                if status != "ok":
                    raise RuntimeError(f"training rank {rank} failed:\n{payload}")
                done[rank] = payload
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return done[0]
