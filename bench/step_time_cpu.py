"""The step-time model against this machine: the whole-tensor optimizer's step (reduce, non-finite check,
Newton–Schulz, update, share) predicted from rates measured here, next to the step measured in the same run, at DP=2
and DP=4 (gloo).

Every rank measures, at the same time as the others (so oversubscribed cores count: DP=4 runs 4 ranks on 2 cores),
over windows of at least 0.2 s (``_timed``), on the sizes the step itself uses (the optimizer is built first; its plan
gives them):
- the fp32 GEMM rate of every GEMM shape Newton–Schulz runs on the plan's matrices (X·Xᵀ, the m×m products, B·X or
  Q·X), each matrix priced at the FLOP-weighted rate of its own GEMMs;
- a copy rate (read + write) and the time of one tiny eager operator (the floor);
- gloo's all-reduce bandwidth on the buckets' own padded flat buffers (all in flight at once, as the reduction
  issues them) and its per-hop latency (a 16-byte all-reduce);
- gloo's broadcast rate on the owners' own segments (every broadcast of the sharing in flight at once) and the
  latency of one broadcast;
- the rate of the non-finite check (``isfinite(...).all()``) on the buckets' buffers;
- the first-touch rate of fresh pages (a 64 MiB buffer allocated and written, less the same write to a warm one).
The model of ``nemo_muon.accounting.step_time`` prices the optimizer's own plan from them: each bucket's all-reduce of
its padded buffer (ring: 2(W-1)/W of its bytes, 2(W-1) hops), the check of every reduced buffer, this rank's owned
matrices (``ns_seconds`` with nemo-muon's operator counts), its element-wise bytes and the buckets' copies, each
owner's broadcast of its used segment, and the fresh pages the step's two large temporaries take every step (the
clone of this rank's reduced segments; the float |x| inside ``isfinite``, the size of every buffer). The step timed is
``reduce_gradients()`` + ``step()`` with ``overlap_param_gather=False`` (the sharing inside the step), max over ranks;
the pages it faulted in and the CPU other processes took meanwhile are printed beside it.

    .venv/bin/python bench/step_time_cpu.py [--worlds 2 4] [--steps 6]

Prints one row per DP size: predicted, measured, predicted/measured, and the parts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import resource
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from nemo_muon.accounting.hardware import Hardware
from nemo_muon.accounting.ns_choice import choose_algorithm
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
WINDOW_S = 0.2
"""Seconds of calls per timing window (``_timed``)."""
FRESH_BYTES = 64 * 2**20
"""Buffer of the first-touch probe: above glibc's largest mmap threshold, so always fresh pages."""


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


def _timed(fn, window_s: float = WINDOW_S, trials: int = 5) -> float:  # noqa: ANN001
    """Seconds per call of ``fn``, every rank calling it at once: the median over ``trials`` of windows of at least
    ``window_s`` (the same number of calls on every rank, all starting together). Windows, not short trials: with
    more ranks than cores a trial shorter than a scheduler time slice is often run by a rank alone at full speed,
    and the median of such trials reports the rate of an idle machine (measured: 89-95 GFLOP/s on two of four ranks
    of DP=4 for a 512x2048x512 product that runs at 45 over any window of 0.2 s); the step's phases last longer
    than a slice and share the cores all the way through."""
    fn()
    calls, elapsed = 1, 0.0
    while True:  # calibrate: double the calls until a tenth of the window (every rank decides alike: collectives)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = _max(time.perf_counter() - start)
        if elapsed >= window_s / 10:
            break
        calls *= 2
    calls = math.ceil(calls * window_s / elapsed)
    means = []
    for _ in range(trials):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - start) / calls)
    return sorted(means)[trials // 2]


def _mean(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _max(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


@dataclass(frozen=True)
class Rates:
    """What this machine does per second, measured by every rank at once on the step's own sizes (module doc)."""

    hw: Hardware
    """Copy rate, op floor, all-reduce bandwidth and hop latency; its fp32 peak is the plan's overall NS GEMM rate
    (the shapes weighted by their FLOPs), shown in the table; each matrix is priced at its own (``gemm``)."""
    gemm: dict[tuple[int, int, int], float]
    """FLOP/s of an (m x k) @ (k x n) fp32 product, per shape (m, k, n) Newton–Schulz runs."""
    broadcast_bytes_per_s: float
    broadcast_latency_s: float
    finite_bytes_per_s: float
    first_touch_bytes_per_s: float
    """Bytes per second of fresh pages written for the first time (the kernel's page faults and zeroing, less the
    write itself): what a new large temporary costs before it holds anything."""


def ns_gemms(m: int, n: int, steps: int) -> list[tuple[tuple[int, int, int], int]]:
    """The GEMMs (shape (m, k, n), count) of one fp32 NS run on an m x n matrix, m <= n, as
    ``nemo_muon.optim.ns_kernels.ns_program`` issues them (and ``step_time.ns_operators`` counts their FLOPs):
    standard: per step X·Xᵀ, the m×m product A·A, B·X; gram: X·Xᵀ and Q·X once, 4·steps - 3 m×m products."""
    if choose_algorithm(m, n, "cpu", "float32") == "gram":
        return [((m, n, m), 1), ((m, m, n), 1), ((m, m, m), 4 * steps - 3)]
    return [((m, n, m), steps), ((m, m, m), steps), ((m, m, n), steps)]


def _matrix_shapes(opt: WholeTensorOptimizer) -> list[tuple[int, int]]:
    """(m, n), m <= n, of every matrix of the plan (every owner's: all ranks time the same GEMMs at once)."""
    return sorted({tuple(sorted(item.shape[-2:])) for item in opt.plans[0].items if item.cost > 0})


def _gemm_rate(shape: tuple[int, int, int]) -> float:
    m, k, n = shape
    flops = 2.0 * m * k * n
    if n == m and k != m:  # X·Xᵀ: the second operand is the transposed view of the first
        x = torch.randn(m, k)
        a, b = x, x.mT
    else:
        a, b = torch.randn(m, k), torch.randn(k, n)
    dist.barrier()
    return flops / _timed(lambda: a @ b)


def _buckets_reduce(flats: list[torch.Tensor]) -> None:
    """The gradient reduction's collectives: every bucket's all-reduce in flight at once, then waited for."""
    for work in [dist.all_reduce(f, async_op=True) for f in flats]:
        work.wait()


def _broadcasts(opt: WholeTensorOptimizer, flats: list[torch.Tensor]) -> int:
    """The sharing's collectives (``Bucket.start_gather``): each owner broadcasts its used segment, buckets in
    reverse; all in flight, then waited for. Returns how many broadcasts."""
    works = []
    for b, f in zip(reversed(opt.buckets), reversed(flats), strict=True):
        for r in range(b.world):
            n = b.used(r)
            if n:
                works.append(dist.broadcast(f.narrow(0, r * b.seg_numel, n), group_src=r, async_op=True))
    for w in works:
        w.wait()
    return len(works)


def measure_rates(opt: WholeTensorOptimizer, world: int) -> Rates:
    """This machine's rates on the sizes of ``opt``'s plan, every rank measuring at once (module doc)."""
    gemm = {}
    for m, n in _matrix_shapes(opt):
        for shape, _ in ns_gemms(m, n, NS_STEPS):
            if shape not in gemm:
                gemm[shape] = _mean(_gemm_rate(shape))
    x, y = torch.randn(4 * 2**20), torch.empty(4 * 2**20)
    dist.barrier()
    copy = 2 * x.numel() * 4 / _timed(lambda: y.copy_(x))
    tiny = torch.randn(8)
    dist.barrier()
    floor = _timed(lambda: tiny.add_(1.0))
    # the buckets' buffers as the step holds them (zeros: sums of zeros stay finite and normal over the repeats)
    flats = [torch.zeros_like(b.flat) for b in opt.buckets]
    one = torch.zeros(4)
    hops = 2 * (world - 1)
    dist.barrier()
    t_small = _timed(lambda: dist.all_reduce(one))
    dist.barrier()
    t_reduce = _timed(lambda: _buckets_reduce(flats))
    ring_bytes = sum(hops / world * f.numel() * f.element_size() for f in flats)
    bandwidth = ring_bytes / max(t_reduce - len(flats) * t_small, 1e-9)
    dist.barrier()
    t_bcast_small = _timed(lambda: dist.broadcast(one, group_src=0))
    count = _broadcasts(opt, flats)
    dist.barrier()
    t_bcast = _timed(lambda: _broadcasts(opt, flats))
    used_bytes = sum(b.used(r) * b.flat.element_size() for b in opt.buckets for r in range(world))
    broadcast = used_bytes / max(t_bcast - count * t_bcast_small, 1e-9)
    dist.barrier()
    t_finite = _timed(lambda: bool(torch.stack([torch.isfinite(f).all() for f in flats]).all()))
    finite = sum(f.numel() * f.element_size() for f in flats) / t_finite
    # first touch: above glibc's largest mmap threshold (32 MiB) every allocation is fresh pages from the kernel
    warm = torch.zeros(FRESH_BYTES // 4)
    t_warm = _timed(lambda: warm.fill_(1.0))
    t_fresh = _timed(lambda: torch.empty(FRESH_BYTES // 4).fill_(1.0))
    first_touch = FRESH_BYTES / max(t_fresh - t_warm, 1e-9)
    bandwidth = _mean(bandwidth)
    hw = Hardware(name="this-cpu", peak_flops={"fp32": _plan_gemm_rate(opt, gemm)}, hbm_bytes_per_s=_mean(copy),
                  nvlink_bytes_per_s=bandwidth, nvlink_domain=world, scale_out_bytes_per_s=bandwidth,
                  kernel_floor_s=_mean(floor), collective_latency_s=_mean(t_small / hops),
                  sources=("measured by bench/step_time_cpu.py",), kind="cpu")
    return Rates(hw=hw, gemm=gemm, broadcast_bytes_per_s=_mean(broadcast),
                 broadcast_latency_s=_mean(t_bcast_small), finite_bytes_per_s=_mean(finite),
                 first_touch_bytes_per_s=_mean(first_touch))


def _averaged(a: Rates, b: Rates) -> Rates:
    """The rates measured before and after the timed steps, averaged."""

    def mean(x: float, y: float) -> float:
        return (x + y) / 2

    hw = dataclasses.replace(
        a.hw, peak_flops={"fp32": mean(a.hw.peak("fp32"), b.hw.peak("fp32"))},
        hbm_bytes_per_s=mean(a.hw.hbm_bytes_per_s, b.hw.hbm_bytes_per_s),
        nvlink_bytes_per_s=mean(a.hw.nvlink_bytes_per_s, b.hw.nvlink_bytes_per_s),
        scale_out_bytes_per_s=mean(a.hw.scale_out_bytes_per_s, b.hw.scale_out_bytes_per_s),
        kernel_floor_s=mean(a.hw.kernel_floor_s, b.hw.kernel_floor_s),
        collective_latency_s=mean(a.hw.collective_latency_s, b.hw.collective_latency_s))
    return Rates(hw=hw, gemm={k: mean(v, b.gemm[k]) for k, v in a.gemm.items()},
                 broadcast_bytes_per_s=mean(a.broadcast_bytes_per_s, b.broadcast_bytes_per_s),
                 broadcast_latency_s=mean(a.broadcast_latency_s, b.broadcast_latency_s),
                 finite_bytes_per_s=mean(a.finite_bytes_per_s, b.finite_bytes_per_s),
                 first_touch_bytes_per_s=mean(a.first_touch_bytes_per_s, b.first_touch_bytes_per_s))


def _matrix_rate(m: int, n: int, gemm: dict[tuple[int, int, int], float]) -> float:
    """The FLOP-weighted GEMM rate of one NS run on an m x n matrix (its FLOPs / the time of its GEMMs)."""
    work = ns_gemms(m, n, NS_STEPS)
    flops = [c * 2.0 * a * k * b for (a, k, b), c in work]
    return sum(flops) / sum(f / gemm[shape] for f, (shape, _) in zip(flops, work, strict=True))


def _plan_gemm_rate(opt: WholeTensorOptimizer, gemm: dict[tuple[int, int, int], float]) -> float:
    """The whole plan's NS GEMM rate (shown in the table): every matrix's FLOPs / the time of its GEMMs."""
    shapes = [tuple(sorted(item.shape[-2:])) for item in opt.plans[0].items if item.cost > 0]
    flops = [sum(c * 2.0 * a * k * b for (a, k, b), c in ns_gemms(m, n, NS_STEPS)) for m, n in shapes]
    return sum(flops) / sum(f / _matrix_rate(m, n, gemm) for f, (m, n) in zip(flops, shapes, strict=True))


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


def predict(opt: WholeTensorOptimizer, rates: Rates, rank: int, world: int) -> dict[str, float]:
    """This rank's step, part by part, from ``rates`` and the optimizer's own plan (module doc)."""
    hw = rates.hw
    work, matrix_el, adam_el = _owned_work(opt, rank)
    ns = sum(ns_seconds([w], dataclasses.replace(hw, peak_flops={"fp32": _matrix_rate(
        *sorted(w.shapes[0][-2:]), rates.gemm)}), IMPLEMENTATIONS["nemo_muon"], NS_STEPS, "fp32") for w in work)
    elem = opt.buckets[0].flat.element_size()
    total = sum(b.used(r) for b in opt.buckets for r in range(world))
    owned = sum(b.used(rank) for b in opt.buckets)
    segments = sum(b.seg_numel for b in opt.buckets)
    # the buckets' copies (read + write): every grad into its buffer, this rank's segment cloned and its mean taken
    # (the reduction's); the updated params into the buffers, the others' params out of them (the update's, sharing's)
    copies_in = elem * 2 * (total + segments + owned) / hw.hbm_bytes_per_s
    copies_out = elem * 2 * (owned + total - owned) / hw.hbm_bytes_per_s
    elementwise = (MUON_BYTES_PER_ELEMENT * matrix_el + ADAMW_BYTES_PER_ELEMENT * adam_el) / hw.hbm_bytes_per_s
    hops = 2 * (world - 1)
    # fresh pages every step: the reduction's clone of this rank's segments, the check's |x| of every buffer
    # (``isfinite`` is (x == x) & (|x| != inf): one float temporary the size of the buffer)
    fresh_reduce = sum(b.seg_numel for b in opt.buckets) * elem
    fresh_check = sum(b.nbytes for b in opt.buckets)
    reduce = copies_in + fresh_reduce / rates.first_touch_bytes_per_s + sum(
        hops / world * b.nbytes / hw.nvlink_bytes_per_s + hops * hw.collective_latency_s for b in opt.buckets)
    assert opt.gradients.global_flats  # the check reads every reduced buffer (all-reduce mode, one group)
    finite = (sum(b.nbytes for b in opt.buckets) / rates.finite_bytes_per_s
              + fresh_check / rates.first_touch_bytes_per_s)
    share = sum(b.used(r) * elem / rates.broadcast_bytes_per_s + rates.broadcast_latency_s
                for b in opt.buckets for r in range(world) if b.used(r))
    return {"reduce_s": reduce, "finite_s": finite, "ns_s": ns, "elementwise_s": elementwise + copies_out,
            "share_s": share, "local_s": finite + ns + elementwise + copies_out,
            "fresh_bytes": float(fresh_reduce + fresh_check)}


def _rank(rank: int, world: int, steps: int, results: dict) -> None:  # noqa: ANN001
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29611 + world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = _Net()
        opt = WholeTensorOptimizer(model, MuonConfig(lr=0.02, weight_decay=0.1, adamw_lr=3e-3, ns_steps=NS_STEPS),
                                   dp_group=dist.group.WORLD, overlap_param_gather=False)
        before = measure_rates(opt, world)
        gen = torch.Generator().manual_seed(rank)
        times, fresh = [], []
        for i in range(steps + 2):
            tokens = torch.randint(0, VOCAB, (4, 64), generator=gen)
            model(tokens).backward()
            dist.barrier()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            opt.reduce_gradients()  # step() would run it first; timed apart to show the parts
            reduced = time.perf_counter()
            opt.step()
            end = time.perf_counter()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            elapsed, reduce_s, faults = _max(end - start), _max(reduced - start), _max(faults)
            opt.zero_grad()
            if i >= 2:  # two warm-up steps (state allocated, allocator warm)
                times.append((elapsed, reduce_s))
                fresh.append(faults * resource.getpagesize())
        rates = _averaged(before, measure_rates(opt, world))  # the rates before and after the timed steps
        part = predict(opt, rates, rank, world)
        # the collectives wait for every rank: the busiest rank's local work sits between the reduce and the share
        part = {k: _max(v) for k, v in part.items()}
        if rank == 0:
            median = sorted(times)[len(times) // 2]
            results[world] = {"predicted_s": part["reduce_s"] + part["local_s"] + part["share_s"],
                              "measured_s": median[0], "measured_reduce_s": median[1], **part,
                              "faulted_bytes": sorted(fresh)[len(fresh) // 2],
                              "first_touch_GB_per_s": rates.first_touch_bytes_per_s / 1e9,
                              "hw": rates.hw.describe(), "broadcast_GB_per_s": rates.broadcast_bytes_per_s / 1e9,
                              "finite_GB_per_s": rates.finite_bytes_per_s / 1e9,
                              "gemm": {k: v / 1e9 for k, v in rates.gemm.items()}, "buckets": len(opt.buckets)}
    finally:
        dist.destroy_process_group()


def _busy_cpu_s() -> float | None:
    """CPU-seconds this machine has spent busy since boot (Linux /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def _spawn(world: int, steps: int) -> dict:
    """One DP size in fresh processes; also the CPU that other processes took meanwhile (a noisy run shows)."""
    import torch.multiprocessing as mp

    manager = mp.Manager()
    results = manager.dict()
    busy, wall, cpu = _busy_cpu_s(), time.perf_counter(), time.process_time()
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    mp.spawn(_rank, args=(world, steps, results), nprocs=world, join=True)
    end = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = dict(results)[world]
    if busy is not None:
        mine = end.ru_utime + end.ru_stime - own.ru_utime - own.ru_stime + time.process_time() - cpu
        out["others_cores"] = max(0.0, _busy_cpu_s() - busy - mine) / (time.perf_counter() - wall)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    print("| DP | predicted step | measured step (median) | predicted / measured | gradient reduction: predicted, "
          "measured | non-finite check | NS busiest rank | element-wise and copies | sharing (broadcasts) | "
          "fresh pages per step: priced, faulted in the timed steps (median) | measured here: NS GEMM GFLOP/s, copy GB/s, "
          "op floor us, gloo all-reduce GB/s, hop latency us, broadcast GB/s, non-finite check GB/s, first touch GB/s "
          "| other processes' CPU meanwhile (cores) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for world in args.worlds:
        r = _spawn(world, args.steps)
        rows.append(r)
        hw = r["hw"]
        print(f"| {world} | {r['predicted_s'] * 1e3:.1f} ms | {r['measured_s'] * 1e3:.1f} ms | "
              f"{r['predicted_s'] / r['measured_s']:.3f} | {r['reduce_s'] * 1e3:.1f} ms, "
              f"{r['measured_reduce_s'] * 1e3:.1f} ms | {r['finite_s'] * 1e3:.1f} ms | {r['ns_s'] * 1e3:.1f} ms | "
              f"{r['elementwise_s'] * 1e3:.1f} ms | {r['share_s'] * 1e3:.1f} ms | "
              f"{r['fresh_bytes'] / 2**20:.1f} MiB, {r['faulted_bytes'] / 2**20:.1f} MiB | "
              f"{hw['peak_tflops']['fp32'] * 1e3:.1f}, {hw['hbm_GB_per_s']:.1f}, {hw['kernel_floor_us']:.1f}, "
              f"{hw['nvlink_GB_per_s']:.2f}, {hw['collective_latency_us']:.0f}, {r['broadcast_GB_per_s']:.2f}, "
              f"{r['finite_GB_per_s']:.2f}, {r['first_touch_GB_per_s']:.2f} | {r.get('others_cores', math.nan):.2f} |",
              flush=True)
    for world, r in zip(args.worlds, rows, strict=True):
        shapes = ", ".join(f"{m}x{k}x{n} {v:.1f}" for (m, k, n), v in sorted(r["gemm"].items()))
        print(f"\nDP={world}: NS GEMM GFLOP/s per shape (m x k x n): {shapes}; {r['buckets']} buckets")
    assert all(math.isfinite(r["predicted_s"]) for r in rows)


if __name__ == "__main__":
    main()
