"""How long starting the tests' gloo ranks takes: plain spawn vs the preloaded forkserver (`tests.distributed`).

Each launch starts 2 ranks (`nemo_muon.train.spawn.spawn_ranks`) that build Megatron-Core's tiny Qwen3-MoE GPT model
and all-reduce once: the imports a Megatron harness test pays, and a little of its work. Launches alternate between the
two contexts (spawn, preloaded, spawn, ...) after one warm-up each (the preloaded server starts there), and the
median launch time of each is printed with the ratio spawn / preloaded (> 1: the preloaded server is faster).

    OMP_NUM_THREADS=1 .venv/bin/python bench/rank_start.py [--launches 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _tiny_megatron_rank(rank: int, world: int, group, spec: str) -> float:
    import torch
    import torch.distributed as dist

    from tests.megatron_cpu import shims
    from tests.megatron_cpu.training import _model

    shims.install()
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    try:
        model, _, _ = _model(spec)
        total = torch.tensor([float(sum(p.numel() for p in model.parameters()))])
        dist.all_reduce(total, group=group)
        return float(total)
    finally:
        parallel_state.destroy_model_parallel()


def main() -> None:
    import torch.multiprocessing as mp

    from nemo_muon.train.spawn import spawn_ranks
    from tests.distributed import rank_context

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5, help="timed launches per context (after one warm-up)")
    args = parser.parse_args()
    contexts = {"spawn": mp.get_context("spawn"), "preloaded": rank_context()}
    times: dict[str, list[float]] = {k: [] for k in contexts}
    results = set()
    for i in range(args.launches + 1):
        for name, ctx in contexts.items():
            start = time.perf_counter()
            out = spawn_ranks(_tiny_megatron_rank, 2, ("tiny_qwen3_moe",), timeout_s=300, context=ctx)
            if i:  # the first launch of each is the warm-up
                times[name].append(time.perf_counter() - start)
            results.update(out)
    assert len(results) == 1, f"the contexts built different models: {results}"
    spawn, pre = (statistics.median(times[k]) for k in ("spawn", "preloaded"))
    print("| launch of 2 ranks (tiny Qwen3-MoE GPT build + all-reduce) | spawn s | preloaded s | spawn / preloaded |")
    print("|---|---|---|---|")
    print(f"| median of {args.launches} | {spawn:.2f} | {pre:.2f} | **{spawn / pre:.2f}x** |")


if __name__ == "__main__":
    main()
