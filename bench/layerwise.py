"""Benchmark of the layer-wise distributed optimizer on 2 gloo ranks (CPU), every figure a ratio measured in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/layerwise.py [--steps 6] [--out bench/results/layerwise.md]

1. Optimizer step time (grad reduction + update + param sharing) of layer-wise Muon vs replicated Muon (DDP-style
   all-reduce, then every rank runs every Newton–Schulz), same model and batch, interleaved step by step; median.
2. Optimizer-state bytes on the busiest rank vs replicated Muon.
3. Bytes sent per rank per step (ring model: reduce-scatter + all-gather of the padded buckets, or all-reduce +
   owner broadcasts on gloo) vs ZeRO-1 AdamW (reduce-scatter + all-gather of unpadded element shards).
4. Overlap: time blocked waiting for the param sharing during step + next forward, overlapped vs not.
5. From the plan alone (``--plan-only`` prints just this): NS max/mean for Kimi K2 on 256 GPUs (PP4 VP4 EP64,
   16/16/16/13 layers) and Qwen3-30B-A3B on 8 (EP8), gate/up fused (megatron recipes) and split: LPT, LPT with large
   matrices split (modelled), round-robin (KellerJordan/Muon), ping-pong (Megatron legacy).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
LAYERS, TOKENS = 4, 64


class Block(nn.Module):
    """Attention-like and MLP matrices of a transformer block (FFN = 4 x dim)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        h = h + self.o_proj(torch.softmax(q @ k.T / self.dim**0.5, dim=-1) @ v)
        return h + self.down(torch.relu(self.up(h)))


def make_model(dim: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[Block(dim) for _ in range(LAYERS)])


def _input(model: nn.Module, seed: int) -> torch.Tensor:
    return torch.randn(TOKENS, model[0].dim, generator=torch.Generator().manual_seed(seed))


def _loss(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    return model(_input(model, 100 * step + rank)).pow(2).mean()


class Replicated:
    """DDP + Muon: one all-reduce of all grads, then every rank runs the full optimizer."""

    def __init__(self, model: nn.Module, cfg: Any, group: dist.ProcessGroup) -> None:
        from nemo_muon.optim import build_optimizer

        self.params = list(model.parameters())
        self.opt = build_optimizer(cfg, list(model.named_parameters()))
        self.group = group

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def step(self) -> None:
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat /= dist.get_world_size(self.group)
        off = 0
        for g in grads:
            g.copy_(flat[off: off + g.numel()].view_as(g))
            off += g.numel()
        self.opt.step()

    def state_bytes(self) -> int:
        return sum(v.numel() * v.element_size() for st in self.opt.state.values() for v in st.values()
                   if torch.is_tensor(v))


def _timed_step(opt: Any, model: nn.Module, rank: int, step: int, group: dist.ProcessGroup) -> float:
    opt.zero_grad()
    _loss(model, rank, step).backward()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    opt.step()
    if hasattr(opt, "finish_param_gather"):
        opt.finish_param_gather()
    return time.perf_counter() - t0


def _step_then_forward(opt: Any, model: nn.Module, rank: int, step: int,
                       group: dist.ProcessGroup) -> tuple[float, float, float, int]:
    """Seconds of (step alone, step + next forward, blocked on the param sharing), buckets that needed no wait."""
    opt.zero_grad()
    _loss(model, rank, step).backward()
    dist.barrier(group=group)
    waits0 = [b.wait_s for b in opt.buckets]
    t0 = time.perf_counter()
    opt.step()
    t_step = time.perf_counter() - t0
    with torch.no_grad():
        model(_input(model, step))  # the next forward: waits for its params in the pre-hooks
    opt.finish_param_gather()
    wall = time.perf_counter() - t0
    waits = [b.wait_s - w for b, w in zip(opt.buckets, waits0, strict=True)]
    return t_step, wall, sum(waits), sum(w < 1e-4 for w in waits)


def _worker(rank: int, init: str, steps: int, dim: int, queue: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    group = dist.group.WORLD
    from nemo_muon.config.optimizer import AdamWConfig, MuonConfig
    from nemo_muon.layerwise.optimizer import LayerWiseDistributedOptimizer as LW

    cfg = MuonConfig(lr=1e-3, weight_decay=0.0)
    models = {k: make_model(dim) for k in ("layerwise", "layerwise_rs", "replicated", "no_overlap", "overlap", "adamw")}
    opts = {"layerwise": LW(models["layerwise"], cfg, dp_group=group),
            "layerwise_rs": LW(models["layerwise_rs"], cfg, dp_group=group, collectives="reduce_scatter"),
            "replicated": Replicated(models["replicated"], cfg, group),
            # 1 MiB buckets (13 of them) so the first block's params can arrive while later ones are in flight
            "no_overlap": LW(models["no_overlap"], cfg, dp_group=group, bucket_size_mb=1.0),
            "overlap": LW(models["overlap"], cfg, dp_group=group, overlap_param_gather=True, bucket_size_mb=1.0),
            "adamw": LW(models["adamw"], AdamWConfig(lr=1e-3, weight_decay=0.0), dp_group=group,
                        collectives="reduce_scatter")}
    times: dict[str, list[float]] = {k: [] for k in ("layerwise", "layerwise_rs", "replicated", "sf_off", "sf_on",
                                                     "blocked_off", "blocked_on", "no_wait_on", "overlap_step")}
    for s in range(steps + 1):  # step 0 warms up (state allocation) and is dropped
        t = {"layerwise": _timed_step(opts["layerwise"], models["layerwise"], rank, s, group),
             "replicated": _timed_step(opts["replicated"], models["replicated"], rank, s, group),
             "layerwise_rs": _timed_step(opts["layerwise_rs"], models["layerwise_rs"], rank, s, group),
             }
        _, t["sf_off"], t["blocked_off"], _ = _step_then_forward(opts["no_overlap"], models["no_overlap"], rank, s,
                                                                 group)
        t["overlap_step"], t["sf_on"], t["blocked_on"], t["no_wait_on"] = _step_then_forward(
            opts["overlap"], models["overlap"], rank, s, group)
        _timed_step(opts["adamw"], models["adamw"], rank, s, group)
        if s:
            for k, v in t.items():
                times[k].append(v)
    lw = opts["layerwise"]
    numel = sum(p.numel() for p in models["layerwise"].parameters())
    elem = 4
    result = {
        "times": times,
        "state_bytes": lw.state_bytes(),
        "replicated_state_bytes": opts["replicated"].state_bytes(),
        "comm_bytes": lw.comm_bytes_per_step(),
        "rs_comm_bytes": opts["layerwise_rs"].comm_bytes_per_step(),
        "adamw_comm_bytes": opts["adamw"].comm_bytes_per_step(),
        "zero1_comm_bytes": 2 * (WORLD - 1) * -(-numel // WORLD) * elem,
        "plan": lw.plans[0].to_dict(),
        "overlap_buckets": len(opts["overlap"].buckets),
        "params": numel,
    }
    queue.put((rank, result))
    dist.barrier(group=group)
    dist.destroy_process_group()


def run_ranks(steps: int, dim: int) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_worker, args=(r, init, steps, dim, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        out = dict(queue.get(timeout=900) for _ in range(WORLD))
        for p in procs:
            p.join(timeout=60)
    return [out[r] for r in range(WORLD)]


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def plan_table() -> list[str]:
    """NS max/mean per method from ``nemo_muon.accounting.model_ownership`` (the computation `nemo-muon plan` uses):
    gate/up fused as Megatron's Muon orthogonalizes it (the megatron recipes) and split (nemo_muon's Muon)."""
    from nemo_muon.accounting.model_ownership import KIMI_K2_BRIDGE_LAYERS, compare_methods
    from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B

    rows = ["| model, layout | gate/up NS | method | within-stage max/mean | global max/mean | busiest GPU NS FLOP/step |",
            "|---|---|---|---|---|---|"]
    for label, spec, layout in (
        ("Kimi K2, 256 GPUs (PP4 DP64 EP64, 16/16/16/13)", KIMI_K2,
         {"dp": 64, "pp": 4, "ep": 64, "layers_per_stage": KIMI_K2_BRIDGE_LAYERS}),
        ("Qwen3-30B-A3B, 8 GPUs (DP8 EP8)", QWEN3_30B_A3B, {"dp": 8, "ep": 8}),
    ):
        for split, how in ((False, "fused (megatron recipes)"), (True, "split (nemo_muon Muon)")):
            for method, plan in compare_methods(spec, split_gate_up=split, **layout).items():
                name = f"{method} (modelled)" if method.endswith("+split") else method
                rows.append(f"| {label} | {how} | {name} | {plan.within_stage_imbalance:.4f} | "
                            f"{plan.global_imbalance:.4f} | {plan.max_rank_flops:.3e} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dim", type=int, default=384, help="hidden size of the benchmark model (FFN = 4 x dim)")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    ap.add_argument("--plan-only", action="store_true", help="print only the computed NS plan table (no ranks run)")
    args = ap.parse_args(argv)
    if args.plan_only:
        print("\n".join(plan_table()))
        return 0
    res = run_ranks(args.steps, args.dim)
    # per-step time of the slower rank (the step ends when the last rank is done)
    per = {k: [max(r["times"][k][i] for r in res) for i in range(args.steps)] for k in res[0]["times"]}
    med = {k: _median(v) for k, v in per.items()}
    # ratios paired step by step (both measured back to back), then the median: robust to load from other jobs
    paired = {k: _median([a / b for a, b in zip(per[k], per["replicated"], strict=True)])
              for k in ("layerwise", "layerwise_rs", "overlap_step")}
    sf_ratio = _median([a / b for a, b in zip(per["sf_on"], per["sf_off"], strict=True)])
    no_wait = _median([min(r["times"]["no_wait_on"][i] for r in res) for i in range(args.steps)])
    state = max(r["state_bytes"] for r in res) / res[0]["replicated_state_bytes"]
    r0 = res[0]
    d = args.dim
    lines = [
        f"Model: {LAYERS} blocks (qkv {3 * d}x{d}, o {d}x{d}, up {4 * d}x{d}, down {d}x{4 * d}), "
        f"{r0['params']:,} params, fp32; {WORLD} gloo ranks, 1 thread each; median of {args.steps} steps (time ratios paired step by step).",
        "",
        "| measure | ratio | target |",
        "|---|---|---|",
        f"| optimizer step time, layer-wise (gloo auto: all-reduce + broadcasts) / replicated Muon | "
        f"{paired['layerwise']:.3f} ({med['layerwise'] * 1e3:.0f} / {med['replicated'] * 1e3:.0f} ms)"
        " | <= 0.55 |",
        f"| optimizer step time, layer-wise with overlap_param_gather (sharing deferred into the next forward) / "
        f"replicated Muon | {paired['overlap_step']:.3f} ({med['overlap_step'] * 1e3:.0f} ms) | |",
        f"| optimizer step time, layer-wise (reduce-scatter + all-gather) / replicated Muon | "
        f"{paired['layerwise_rs']:.3f} ({med['layerwise_rs'] * 1e3:.0f} ms) | |",
        f"| optimizer-state bytes, busiest rank / replicated Muon | {state:.3f} | <= 0.55 |",
        f"| bytes sent per rank per step, layer-wise Muon (reduce-scatter mode) / ZeRO-1 AdamW | "
        f"{r0['rs_comm_bytes'] / r0['zero1_comm_bytes']:.4f} | ~1 (padding only) |",
        f"| bytes sent per rank per step, layer-wise AdamW (reduce-scatter mode) / ZeRO-1 AdamW | "
        f"{r0['adamw_comm_bytes'] / r0['zero1_comm_bytes']:.4f} | |",
        f"| bytes sent per rank per step, layer-wise Muon (gloo auto mode) / ZeRO-1 AdamW | "
        f"{r0['comm_bytes'] / r0['zero1_comm_bytes']:.4f} | (all-reduce: more bytes, less time on gloo) |",
        f"| step + next forward, overlapped / not overlapped param sharing | {sf_ratio:.3f} "
        f"({med['sf_on'] * 1e3:.0f} / {med['sf_off'] * 1e3:.0f} ms) | |",
        f"| time blocked on param sharing per step, overlapped / not | {med['blocked_on'] * 1e3:.1f} / "
        f"{med['blocked_off'] * 1e3:.1f} ms; {no_wait:.0f} of {r0['overlap_buckets']} buckets arrived before "
        "their module needed them | |",
        f"| NS FLOPs plan imbalance on these 2 ranks (max/mean) | {r0['plan']['imbalance']:.4f} | |",
        "",
        "NS load from the plan alone (computed, not run):",
        "",
        *plan_table(),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        cmd = "OMP_NUM_THREADS=1 .venv/bin/python bench/layerwise.py " + " ".join(argv or sys.argv[1:])
        args.out.write_text(f"# Layer-wise distributed optimizer: benchmark\n\nCommand: `{cmd.strip()}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
