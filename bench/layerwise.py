"""Benchmark of the layer-wise distributed optimizer on 2 gloo ranks (CPU), every figure a ratio measured in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/layerwise.py [--steps 6] [--out bench/results/layerwise.md]
    OMP_NUM_THREADS=1 .venv/bin/python bench/layerwise.py --split-only   # section 6 alone

1. Optimizer step time (grad reduction + update + param sharing) of layer-wise Muon vs replicated Muon (DDP-style
   all-reduce, then every rank runs every Newton–Schulz), same model and batch, interleaved step by step; median.
2. Optimizer-state bytes on the busiest rank vs replicated Muon.
3. Bytes sent per rank per step (ring model: reduce-scatter + all-gather of the padded buckets, or all-reduce +
   owner broadcasts on gloo) vs ZeRO-1 AdamW (reduce-scatter + all-gather of unpadded element shards).
4. Overlap: time blocked waiting for the param sharing during step + next forward, overlapped vs not.
5. From the plan alone (``--plan-only`` prints just this): NS max/mean for Kimi K2 on 256 GPUs (PP4 VP4 EP64,
   16/16/16/13 layers) and Qwen3-30B-A3B on 8 (EP8), gate/up fused (megatron recipes) and split: LPT, LPT with large
   matrices split at the default ``ns_split_target`` (what the engines execute with it), round-robin
   (KellerJordan/Muon), ping-pong (Megatron legacy).
6. Split ownership (``MuonConfig.ns_split_target``) on 4 gloo ranks: the same model (block 0's up projection made
   ``--split-wide`` x dim wide, too costly for whole-tensor LPT) stepped with whole-tensor ownership and with the
   split, interleaved step by step: bytes sent per rank per step counted at the torch.distributed call level (ring
   model, `CommCounter`) vs the plan's modelled extra bytes, NS load max/mean, step time, and the updates' agreement.
"""

from __future__ import annotations

import argparse
import functools
import inspect
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
SPLIT_WORLD = 4
NS_STEPS = 5  # MuonConfig's default ns_steps, used by both runs of the split section
LAYERS, TOKENS = 4, 64


class Block(nn.Module):
    """Attention-like and MLP matrices of a transformer block (FFN = 4 x dim). ``up_mult`` > 4 widens the up
    projection alone; its activations are averaged in groups of 4 x dim before ``down`` (a matrix too costly for
    whole-tensor ownership, section 6)."""

    def __init__(self, dim: int, up_mult: int = 4) -> None:
        super().__init__()
        if up_mult % 4:
            raise ValueError(f"up_mult must be a multiple of 4, got {up_mult}")
        self.dim = dim
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, up_mult * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        h = h + self.o_proj(torch.softmax(q @ k.T / self.dim**0.5, dim=-1) @ v)
        a = torch.relu(self.up(h))
        if a.shape[-1] != 4 * self.dim:
            a = a.unflatten(-1, (-1, 4 * self.dim)).mean(-2)
        return h + self.down(a)


def make_model(dim: int, wide: int = 4) -> nn.Module:
    """``LAYERS`` blocks; block 0's up projection is ``wide`` x dim wide (4: every block alike)."""
    torch.manual_seed(0)
    return nn.Sequential(*[Block(dim, wide if i == 0 else 4) for i in range(LAYERS)])


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


RING_RULES: dict[str, tuple[str, str]] = {
    # collective: (the argument whose payload is counted, factor of its bytes for a group of W ranks)
    "all_reduce": ("tensor", "2(W-1)/W"),
    "broadcast": ("tensor", "(W-1)/W"),
    "all_gather": ("tensor", "W-1"),  # this rank's input: (W-1)/W of the W gathered inputs
    "all_gather_into_tensor": ("output_tensor", "(W-1)/W"),
    "all_gather_single": ("output_tensor", "(W-1)/W"),
    "reduce_scatter_tensor": ("input", "(W-1)/W"),
    "reduce_scatter_single": ("input", "(W-1)/W"),
    "reduce_scatter": ("input_list", "(W-1)/W"),
    "all_to_all_single": ("input", "(W-1)/W"),
    "all_to_all": ("input_tensor_list", "(W-1)/W"),
}
"""Ring-model bytes one rank sends per call, the factors of ``nemo_muon.layerwise.buckets.Bucket.comm_bytes``."""
UNCOUNTED = ("reduce", "gather", "scatter", "all_gather_object", "broadcast_object_list", "send", "recv",
             "isend", "irecv")
"""Collectives with no ring rule here: their calls are listed (none is expected in an optimizer step)."""


def ring_factor(rule: str, w: int) -> float:
    """The factor named in ``RING_RULES`` for a group of ``w`` ranks (0 for a group of one)."""
    return {"2(W-1)/W": 2 * (w - 1) / w, "(W-1)/W": (w - 1) / w, "W-1": float(w - 1)}[rule]


def _payload_bytes(x: Any) -> int:
    if torch.is_tensor(x):
        return x.numel() * x.element_size()
    return sum(_payload_bytes(t) for t in x)


class CommCounter:
    """Counts the bytes this process sends, at the ``torch.distributed`` call level: `install` wraps the module's
    collectives (in this process only); every call adds its payload times the ring factor of ``RING_RULES`` for
    its group's size W to ``sent``, and one to ``calls["<name>(W=<W>)"]``. `reset` starts a new count."""

    def __init__(self) -> None:
        self.sent = 0.0
        self.calls: dict[str, int] = {}

    def reset(self) -> None:
        self.sent, self.calls = 0.0, {}

    def install(self) -> None:
        for name in (*RING_RULES, *UNCOUNTED):
            fn = getattr(dist, name, None)
            if fn is not None:
                setattr(dist, name, self._wrap(name, fn))

    def _wrap(self, name: str, fn: Any) -> Any:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            w = dist.get_world_size(bound.arguments.get("group"))
            key = f"{name}(W={w})" if name in RING_RULES else f"{name}(W={w}, uncounted)"
            self.calls[key] = self.calls.get(key, 0) + 1
            if name in RING_RULES:
                arg, rule = RING_RULES[name]
                self.sent += _payload_bytes(bound.arguments[arg]) * ring_factor(rule, w)
            return fn(*args, **kwargs)

        return counted


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
    from nemo_muon.layerwise.optimizer import WholeTensorOptimizer as LW

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


def _split_worker(rank: int, init: str, steps: int, dim: int, wide: int, target: float, queue: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=SPLIT_WORLD)
    group = dist.group.WORLD
    from nemo_muon.config.optimizer import MuonConfig
    from nemo_muon.layerwise.optimizer import WholeTensorOptimizer as LW

    counter = CommCounter()
    counter.install()
    cfgs = {"whole": MuonConfig(lr=1e-3, weight_decay=0.0),
            "split": MuonConfig(lr=1e-3, weight_decay=0.0, ns_split_target=target)}
    models = {k: make_model(dim, wide) for k in cfgs}
    init_params = {n: p.detach().clone() for n, p in models["whole"].named_parameters()}
    opts = {k: LW(models[k], cfg, dp_group=group) for k, cfg in cfgs.items()}
    times: dict[str, list[float]] = {k: [] for k in cfgs}
    sent: dict[str, list[float]] = {k: [] for k in cfgs}
    calls: dict[str, dict[str, int]] = {}
    for s in range(steps + 1):  # step 0 warms up (state allocation) and is dropped
        for k in (("whole", "split") if s % 2 else ("split", "whole")):  # alternate which runs first
            counter.reset()
            t = _timed_step(opts[k], models[k], rank, s, group)  # counts from zero_grad to the params shared
            if s:
                times[k].append(t)
                sent[k].append(counter.sent)
                calls[k] = dict(counter.calls)
    whole = dict(models["whole"].named_parameters())
    shapes = {n: list(p.shape) for n, p in whole.items()}
    diff, diff_update = 0.0, 0.0
    for n, p in models["split"].named_parameters():
        d = (p.detach().double() - whole[n].detach().double()).norm().item()
        diff = max(diff, d / whole[n].detach().double().norm().item())
        moved = (whole[n].detach().double() - init_params[n].double()).norm().item()
        diff_update = max(diff_update, d / moved if moved else 0.0)
    result = {
        "times": times, "sent": sent, "calls": calls,
        "plans": {k: {"imbalance": o.plans[0].imbalance, "split_bytes": o.plans[0].split_bytes,
                      "splits": {n: (list(sp.ranks), sp.option.ways, sp.option.dim, shapes[n])
                                 for n, sp in o.plans[0].splits.items()}}
                  for k, o in opts.items()},
        "buckets": {k: o.comm_bytes_per_step() for k, o in opts.items()},
        "rel_diff": diff, "rel_diff_update": diff_update,
        "params": sum(p.numel() for p in models["whole"].parameters()),
    }
    queue.put((rank, result))
    dist.barrier(group=group)
    dist.destroy_process_group()


def run_ranks(steps: int, dim: int) -> list[dict[str, Any]]:
    return _spawn(_worker, WORLD, (steps, dim))


def _spawn(target: Any, world: int, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=target, args=(r, init, *args, queue)) for r in range(world)]
        for p in procs:
            p.start()
        out = dict(queue.get(timeout=900) for _ in range(world))
        for p in procs:
            p.join(timeout=60)
    return [out[r] for r in range(world)]


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def split_section(steps: int, dim: int, wide: int, target: float) -> list[str]:
    """Section 6: whole-tensor vs split ownership on ``SPLIT_WORLD`` gloo ranks, measured in one run."""
    from nemo_muon.accounting.ns_choice import choose_algorithm

    res = _spawn(_split_worker, SPLIT_WORLD, (steps, dim, wide, target))
    r0 = res[0]
    pw, ps = r0["plans"]["whole"], r0["plans"]["split"]
    # bytes: the median over steps per rank (they repeat exactly step to step; the spread is printed)
    sent = {k: [_median(r["sent"][k]) for r in res] for k in ("whole", "split")}
    spread = max(max(r["sent"][k]) - min(r["sent"][k]) for r in res for k in sent)
    per = {k: [max(r["times"][k][i] for r in res) for i in range(steps)] for k in ("whole", "split")}
    t_ratio = _median([a / b for a, b in zip(per["split"], per["whole"], strict=True)])
    splits = "; ".join(f"{n} ({shape[0]}x{shape[1]}) over ranks {tuple(rk)} ({ways} ways along dim {d})"
                       for n, (rk, ways, d, shape) in ps["splits"].items()) or "none"
    ranks = range(SPLIT_WORLD)
    fmt = " / ".join
    beyond = {k: [b - r0["buckets"][k] for b in sent[k]] for k in sent}  # the buckets are alike on every rank
    modelled = ps["split_bytes"]

    def calls(k: str) -> str:
        return ", ".join(f"{n} x{c}" for n, c in sorted(r0["calls"][k].items()))

    notes = []
    for name, (rk, ways, d, shape) in ps["splits"].items():
        shape = list(shape)
        shape[d] //= ways
        got = res[rk[0]]["calls"]["split"].get(f"all_reduce(W={ways})", 0)
        notes.append(f"{name}: {got} all-reduces per step within its block of {ways} (the norm and the Gram "
                     f"matrices), where the plan models {NS_STEPS + 1} (the norm and one Gram matrix per step, the "
                     f"standard iteration); nemo_muon's NS runs the '{choose_algorithm(*shape)}' algorithm on the "
                     f"{shape[0]}x{shape[1]} fp32 slice on CPU ('gram': one Gram matrix in all).")

    return [
        f"Model: {LAYERS} blocks as above at dim {dim}, block 0's up projection {wide * dim}x{dim} "
        f"({r0['params']:,} params, fp32); {SPLIT_WORLD} gloo ranks (collectives auto: all-reduce + owner broadcasts), "
        f"1 thread each; whole-tensor ownership vs `MuonConfig(ns_split_target={target})`, same model, batches and "
        f"processes, interleaved step by step; median of {steps} steps.",
        f"Split planned and executed: {splits}.",
        "",
        "Bytes are counted at the torch.distributed call level in the bench's ranks (all collectives issued between "
        "zero_grad and the params shared), per call: payload bytes x the ring factor of the call's group size W "
        "(the factors of `Bucket.comm_bytes`): all-reduce 2(W-1)/W, broadcast / reduce-scatter / all-gather "
        "(W-1)/W of the full buffer.",
        "",
        "| measure | whole-tensor | split | split / whole |",
        "|---|---|---|---|",
        "| bytes sent per step, per rank " + fmt(str(r) for r in ranks) + " (measured) | "
        f"{fmt(f'{b:,.0f}' for b in sent['whole'])} | {fmt(f'{b:,.0f}' for b in sent['split'])} | "
        f"{fmt(f'{s / w:.4f}' for s, w in zip(sent['split'], sent['whole'], strict=True))} |",
        f"| bytes sent per step, busiest rank (measured) | {max(sent['whole']):,.0f} | {max(sent['split']):,.0f} | "
        f"{max(sent['split']) / max(sent['whole']):.4f} |",
        "| measured difference per rank (split - whole) | | "
        f"{fmt(f'{s - w:+,.0f}' for s, w in zip(sent['split'], sent['whole'], strict=True))} | |",
        f"| of which the buckets (grads + params; the whole-tensor optimizer's `comm_bytes_per_step`, every rank) | "
        f"{r0['buckets']['whole']:,} | {r0['buckets']['split']:,} | "
        f"{r0['buckets']['split'] / r0['buckets']['whole']:.4f} |",
        "| beyond the buckets, per rank (measured - `comm_bytes_per_step`: the split's Gram all-reduces) | "
        f"{fmt(f'{b:,.0f}' for b in beyond['whole'])} | {fmt(f'{b:,.0f}' for b in beyond['split'])} | |",
        "| the plan's modelled extra bytes per rank (`plans[0].split_bytes`); measured beyond the buckets / modelled | "
        f"{fmt(f'{b:,.0f}' for b in pw['split_bytes'])} | {fmt(f'{b:,.0f}' for b in modelled)} | "
        f"{fmt(f'{m / b:.3f}' if b else '-' for m, b in zip(beyond['split'], modelled, strict=True))} |",
        f"| NS load max/mean (`plans[0].imbalance`) | {pw['imbalance']:.4f} | {ps['imbalance']:.4f} | "
        f"{ps['imbalance'] / pw['imbalance']:.4f} |",
        f"| optimizer step time (slower rank; ratio paired step by step) | {_median(per['whole']) * 1e3:.0f} ms | "
        f"{_median(per['split']) * 1e3:.0f} ms | {t_ratio:.3f} |",
        "",
        f"Calls per step on rank 0: whole: {calls('whole')}; split: {calls('split')}. Bytes spread over steps: "
        f"{spread:,.0f}.",
        *notes,
        f"Agreement after {steps + 1} steps (all ranks): max over tensors of ||split - whole|| / ||whole|| = "
        f"{max(r['rel_diff'] for r in res):.2e}; / ||whole - initial|| (the total update) = "
        f"{max(r['rel_diff_update'] for r in res):.2e}.",
    ]


def plan_table() -> list[str]:
    """NS max/mean per method from ``nemo_muon.accounting.model_ownership`` (the computation `nemo-muon plan` uses):
    gate/up fused as Megatron's Muon orthogonalizes it (the megatron recipes) and split (nemo_muon's Muon)."""
    from nemo_muon.accounting.model_ownership import KIMI_K2_BRIDGE_LAYERS, compare_methods
    from nemo_muon.accounting.ns_split import DEFAULT_BALANCE_TARGET
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
                name = f"{method} (ns_split_target {DEFAULT_BALANCE_TARGET})" if method.endswith("+split") else method
                rows.append(f"| {label} | {how} | {name} | {plan.within_stage_imbalance:.4f} | "
                            f"{plan.global_imbalance:.4f} | {plan.max_rank_flops:.3e} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dim", type=int, default=384, help="hidden size of the benchmark model (FFN = 4 x dim)")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    ap.add_argument("--plan-only", action="store_true", help="print only the computed NS plan table (no ranks run)")
    ap.add_argument("--split-only", action="store_true", help="run only section 6 (split ownership, 4 ranks)")
    ap.add_argument("--split-steps", type=int, default=8)
    ap.add_argument("--split-dim", type=int, default=256, help="hidden size of the split section's model")
    ap.add_argument("--split-wide", type=int, default=32,
                    help="block 0's up projection is this many x dim wide in the split section (multiple of 4)")
    ap.add_argument("--split-target", type=float, default=1.1, help="MuonConfig.ns_split_target of the split run")
    args = ap.parse_args(argv)
    if args.plan_only:
        print("\n".join(plan_table()))
        return 0
    split_lines = ["Split ownership (issue 15):", "",
                   *split_section(args.split_steps, args.split_dim, args.split_wide, args.split_target)]
    if args.split_only:
        _emit("\n".join(split_lines), args.out, argv)
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
        "",
        *split_lines,
    ]
    _emit("\n".join(lines), args.out, argv)
    return 0


NOTES_HEADING = "## Reading these numbers"
"""Where the hand-written reading of a results file starts: `_emit` keeps it when it rewrites the figures above."""


def _emit(text: str, out: Path | None, argv: list[str] | None) -> None:
    print(text)
    if out:
        cmd = "OMP_NUM_THREADS=1 .venv/bin/python bench/layerwise.py " + " ".join(argv or sys.argv[1:])
        old = out.read_text() if out.exists() else ""
        notes = old[old.index(NOTES_HEADING):] if NOTES_HEADING in old else ""
        out.write_text(f"# Layer-wise distributed optimizer: benchmark\n\nCommand: `{cmd.strip()}`\n\n{text}\n"
                       + (f"\n{notes}" if notes else ""))


if __name__ == "__main__":
    raise SystemExit(main())
