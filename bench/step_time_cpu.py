"""The step-time model against this machine: the whole-tensor optimizer's step (reduce, Newton–Schulz, update,
share) predicted from rates measured here, next to the step measured in the same run, at DP=2 and DP=4 (gloo).

Every rank measures, at the same time as the others (so oversubscribed cores count): an fp32 GEMM rate on the
model's typical matrix, a copy rate (read + write), the time of one tiny eager operator (the floor), and the gloo
all-reduce bandwidth and per-hop latency. Those become a ``Hardware`` (one NVLink domain = the whole group) and the
model of ``nemo_muon.accounting.step_time`` prices the optimizer's own plan: its owned matrices (``ns_seconds`` with
nemo-muon's operator counts), its element-wise bytes, and the bytes it sends (``comm_bytes_per_step``). The step
timed is ``optimizer.step()`` with ``overlap_param_gather=False`` (the gather inside the step), max over ranks.

    .venv/bin/python bench/step_time_cpu.py [--worlds 2 4] [--steps 6]

Prints one row per DP size: predicted, measured, predicted/measured, and the parts.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from nemo_muon.accounting.hardware import Hardware
from nemo_muon.accounting.step_time import (
    ADAMW_BYTES_PER_ELEMENT,
    IMPLEMENTATIONS,
    MUON_BYTES_PER_ELEMENT,
    MatrixWork,
    ns_seconds,
)
from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer

HIDDEN, FFN, LAYERS, VOCAB = 512, 1536, 3, 2048
NS_STEPS = 5


class _Net(nn.Module):
    """Embedding, LAYERS blocks of (attention-like square, up, down) matrices, head: Muon's shapes, AdamW's rest."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(nn.ModuleDict({"proj": nn.Linear(HIDDEN, HIDDEN, bias=False),
                                                   "up": nn.Linear(HIDDEN, FFN, bias=False),
                                                   "down": nn.Linear(FFN, HIDDEN, bias=False),
                                                   "norm": nn.LayerNorm(HIDDEN)}) for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for b in self.blocks:
            x = x + b["proj"](b["norm"](x))
            x = x + b["down"](torch.relu(b["up"](x)))
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), tokens.flatten())


def _timed(fn, repeats: int, trials: int = 5) -> float:  # noqa: ANN001
    """Median over ``trials`` of the mean time of ``repeats`` calls (a brief stall of this shared machine moves a
    mean, not a median)."""
    fn()
    means = []
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        means.append((time.perf_counter() - start) / repeats)
    return sorted(means)[trials // 2]


def _mean(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _max(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def measure_hardware(world: int) -> Hardware:
    """This machine's rates, every rank measuring at once (module doc)."""
    a, b = torch.randn(HIDDEN, FFN), torch.randn(FFN, HIDDEN)
    dist.barrier()
    gemm = 2 * HIDDEN * FFN * HIDDEN / _timed(lambda: a @ b, 10)
    x, y = torch.randn(4 * 2**20), torch.empty(4 * 2**20)
    dist.barrier()
    copy = 2 * x.numel() * 4 / _timed(lambda: y.copy_(x), 10)
    tiny = torch.randn(8)
    dist.barrier()
    floor = _timed(lambda: tiny.add_(1.0), 400)
    buf, one = torch.randn(2 * 2**20), torch.randn(4)
    dist.barrier()
    t_big = _timed(lambda: dist.all_reduce(buf), 2)
    dist.barrier()
    t_small = _timed(lambda: dist.all_reduce(one), 10)
    hops = 2 * (world - 1)
    latency = t_small / hops
    bandwidth = hops / world * buf.numel() * 4 / max(t_big - t_small, 1e-9)
    return Hardware(name="this-cpu", peak_flops={"fp32": _mean(gemm)}, hbm_bytes_per_s=_mean(copy),
                    nvlink_bytes_per_s=_mean(bandwidth), nvlink_domain=world, scale_out_bytes_per_s=_mean(bandwidth),
                    kernel_floor_s=_mean(floor), collective_latency_s=_mean(latency),
                    sources=("measured by bench/step_time_cpu.py",), kind="cpu")


def _averaged(a: Hardware, b: Hardware) -> Hardware:
    import dataclasses

    def mean(x: float, y: float) -> float:
        return (x + y) / 2

    return dataclasses.replace(
        a, peak_flops={"fp32": mean(a.peak("fp32"), b.peak("fp32"))},
        hbm_bytes_per_s=mean(a.hbm_bytes_per_s, b.hbm_bytes_per_s),
        nvlink_bytes_per_s=mean(a.nvlink_bytes_per_s, b.nvlink_bytes_per_s),
        scale_out_bytes_per_s=mean(a.scale_out_bytes_per_s, b.scale_out_bytes_per_s),
        kernel_floor_s=mean(a.kernel_floor_s, b.kernel_floor_s),
        collective_latency_s=mean(a.collective_latency_s, b.collective_latency_s))


def _owned_work(opt: WholeTensorOptimizer, rank: int) -> tuple[list[MatrixWork], float, float]:
    """This rank's matrices (the optimizer's own plan) and its element-wise matrix / Adam elements."""
    plan = opt.plans[0]
    work, matrix_el, adam_el = [], 0.0, 0.0
    for item in plan.items:
        if plan.owners.get(item.name) != rank:
            continue
        if item.cost > 0:
            work.append(MatrixWork((tuple(item.shape),), item.cost))
            matrix_el += item.numel
        else:
            adam_el += item.numel
    return work, matrix_el, adam_el


def _rank(rank: int, world: int, steps: int, results: dict) -> None:  # noqa: ANN001
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29611 + world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        before = measure_hardware(world)
        torch.manual_seed(0)
        model = _Net()
        opt = WholeTensorOptimizer(model, MuonConfig(lr=0.02, weight_decay=0.1, adamw_lr=3e-3, ns_steps=NS_STEPS),
                                   dp_group=dist.group.WORLD, overlap_param_gather=False)
        gen = torch.Generator().manual_seed(rank)
        times = []
        for i in range(steps + 2):
            tokens = torch.randint(0, VOCAB, (4, 64), generator=gen)
            model(tokens).backward()
            dist.barrier()
            start = time.perf_counter()
            opt.reduce_gradients()  # step() would run it first; timed apart to show the parts
            reduced = time.perf_counter()
            opt.step()
            end = time.perf_counter()
            elapsed, reduce_s = _max(end - start), _max(reduced - start)
            opt.zero_grad()
            if i >= 2:  # two warm-up steps (state allocated, allocator warm)
                times.append((elapsed, reduce_s))
        hw = _averaged(before, measure_hardware(world))  # the rates before and after the timed steps
        work, matrix_el, adam_el = _owned_work(opt, rank)
        ns = _max(ns_seconds(work, hw, IMPLEMENTATIONS["nemo_muon"], NS_STEPS, "fp32"))
        elementwise = _max((MUON_BYTES_PER_ELEMENT * matrix_el + ADAMW_BYTES_PER_ELEMENT * adam_el)
                           / hw.hbm_bytes_per_s)
        collectives = 2 * len(opt.buckets)  # each bucket: its reduction and its sharing
        comm = _max(opt.comm_bytes_per_step() / hw.nvlink_bytes_per_s
                    + collectives * 2 * (world - 1) * hw.collective_latency_s)
        if rank == 0:
            median = sorted(times)[len(times) // 2]
            results[world] = {"predicted_s": ns + elementwise + comm, "measured_s": median[0],
                              "measured_reduce_s": median[1],
                              "ns_s": ns, "elementwise_s": elementwise, "comm_s": comm, "hw": hw.describe(),
                              "matrices": len(work), "buckets": len(opt.buckets)}
    finally:
        dist.destroy_process_group()


def _spawn(world: int, steps: int) -> dict:
    import torch.multiprocessing as mp

    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank, args=(world, steps, results), nprocs=world, join=True)
    return dict(results)[world]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    print("| DP | predicted step | measured step (median) | predicted / measured | NS busiest rank | element-wise | "
          "collectives | of which measured: the gradient reduction | measured here: GEMM GFLOP/s, copy GB/s, op floor "
          "us, gloo GB/s, hop latency us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for world in args.worlds:
        r = _spawn(world, args.steps)
        hw = r["hw"]
        print(f"| {world} | {r['predicted_s'] * 1e3:.1f} ms | {r['measured_s'] * 1e3:.1f} ms | "
              f"{r['predicted_s'] / r['measured_s']:.3f} | {r['ns_s'] * 1e3:.1f} ms | {r['elementwise_s'] * 1e3:.1f} ms"
              f" | {r['comm_s'] * 1e3:.1f} ms | {r['measured_reduce_s'] * 1e3:.1f} ms | "
              f"{hw['peak_tflops']['fp32'] * 1e3:.1f}, {hw['hbm_GB_per_s']:.1f}, "
              f"{hw['kernel_floor_us']:.1f}, {hw['nvlink_GB_per_s']:.2f}, {hw['collective_latency_us']:.0f} |",
              flush=True)
    assert math.isfinite(r["predicted_s"])


if __name__ == "__main__":
    main()
