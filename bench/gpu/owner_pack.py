"""GPU check: the device work of Megatron-Core 0.16 / 0.17's gradients reduced to their owners
(`nemo_muon.megatron.core_016_017.owner_reduce`) on CUDA tensors and NCCL: one rank packs a gradient bucket in owner order, issues
the owners' reduces and the shared all-reduce, and unpacks its own segment, as every rank of a DP group does.

    torchrun --nproc-per-node 1 bench/gpu/owner_pack.py [--dp 8] [--hidden 7168] [--reps 20]
    torchrun --nproc-per-node 1 bench/gpu/owner_pack.py --cpu --hidden 256     # the same on gloo / CPU

One lent GPU cannot host two NCCL ranks, so the collectives run on a one-rank group here (the multi-rank path is the
CPU harness's, tests/megatron_cpu/test_owner_collectives.py); the route is planned for ``--dp`` owners, as a rank of
a DP group of that size sees it. The bucket holds one Kimi K2-shaped layer's matrices (MLA projections, a dense MLP)
at ``--hidden``, owned round-robin, plus a shared tensor. Checks: the owned and shared ranges come back as reduced (a
one-rank reduce leaves them equal) and the other ranges untouched. Prints the time of pack + reduces + unpack over
the time of one plain copy of the bucket, measured side by side (the pack is one extra pass over the bucket).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nemo_muon.megatron.core_016_017.owner_reduce import PendingReduce, route_bucket, start_reduce  # noqa: E402


def layer_shapes(hidden: int) -> list[tuple[int, int]]:
    """One Kimi K2-like layer's matrices at ``hidden`` (ratios of the real model: q/kv low-rank MLA, dense MLP)."""
    q_rank, kv_rank, heads_dim = hidden * 3 // 14, hidden // 14, hidden * 2
    return [(q_rank, hidden), (heads_dim, q_rank), (kv_rank, hidden), (heads_dim, kv_rank), (hidden, heads_dim),
            (hidden * 2, hidden), (hidden * 2, hidden), (hidden, hidden * 2)]


def _timed(fn, reps: int, device: torch.device) -> float:  # noqa: ANN001 - a callable
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=8, help="owners the route is planned for")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="gloo and CPU tensors")
    args = parser.parse_args()
    if args.dp < 2 or args.hidden < 28 or args.reps < 1:
        raise SystemExit(f"--dp must be >= 2, --hidden >= 28, --reps >= 1; got {args.dp}, {args.hidden}, {args.reps}")
    device = torch.device("cpu") if args.cpu else torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if args.cpu else "nccl")
    group = dist.new_group([dist.get_rank()])  # a one-rank group: the collectives of one DP member
    shapes = layer_shapes(args.hidden)
    sizes = [m * n for m, n in shapes] + [args.hidden]  # the matrices, then a shared vector (e.g. a router bias)
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    params = [torch.empty(0) for _ in sizes]
    ranges = {p: (bounds[i], bounds[i + 1]) for i, p in enumerate(params)}
    holders = {id(p): (i % args.dp,) for i, p in enumerate(params[:-1])} | {id(params[-1]): tuple(range(args.dp))}
    route = route_bucket(ranges, lambda p: holders[id(p)], args.dp)
    grads = torch.randn(bounds[-1], device=device).to(torch.bfloat16)
    before = grads.clone()

    # One rank of a group of one is every owner's only member: reduce the owners' segments to group rank 0 and keep
    # rank 0's unpack (its own ranges and the shared ones); pretend to be owner ``me`` for the check.
    me = 0
    mine = [*route.owned[me], *route.shared]
    to_me = [dist.get_rank()] * args.dp  # every owner's segment reduced to this rank, as its owner would receive it
    pending = PendingReduce([start_reduce(grads, route, group, me, dist.ReduceOp.SUM, True, to_me)])
    pending.wait()
    touched = torch.zeros(bounds[-1], dtype=torch.bool, device=device)
    for s, e in mine:
        touched[s:e] = True
    same = bool(torch.equal(grads, before))
    print(f"check: ranges of owner {me} and the shared ones reduced (one rank: unchanged) and the rest untouched: "
          f"{'ok' if same else 'MISMATCH'}; {len(route.owned[me])} owned + {len(route.shared)} shared ranges of "
          f"{sum(len(r) for r in route.owned)} in a {bounds[-1] * 2 / 2**20:.1f} MiB bf16 bucket over {args.dp} owners")

    def owner_reduce() -> None:
        PendingReduce([start_reduce(grads, route, group, me, dist.ReduceOp.SUM, True, to_me)]).wait()

    copy_target = torch.empty_like(grads)
    owner_s = _timed(owner_reduce, args.reps, device)
    copy_s = _timed(lambda: copy_target.copy_(grads), args.reps, device)
    print(f"pack + reduces + unpack / one copy of the bucket: {owner_s / copy_s:.2f} "
          f"({owner_s * 1e6:.0f} us vs {copy_s * 1e6:.0f} us, median of {args.reps}, {device.type})")
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
