"""Newton–Schulz speed and orthogonality on the recipe shape mix: ours vs torch.optim.Muon's vs emerging-optimizers'.

Shapes: one MoE layer of Kimi K2 (MLA projections, routed-expert stacks with gate/up split, shared expert) plus its
dense-layer MLP, and one MoE layer of Qwen3-30B-A3B, every dimension divided by --scale (experts per stack:
--experts; Qwen3-30B-A3B's dims by --scale/2, as it is ~4x narrower) so the mix fits this CPU; each model's total weights every shape by how often a full optimizer step of
that model orthogonalizes it (so Kimi K2's total is ~all routed experts, as in the real model). All three run Keller Jordan's "simple" coefficients for 5 steps (the only set
torch.optim.Muon has), measured side by side in the same process (round-robin, best of --reps: on a shared machine
the minimum is the time the work itself takes; single-threaded by default so other load does not skew the ratios). torch.optim.Muon's
NS is bf16-only and 2-D only (expert stacks loop over experts; it has no fp32 row); emerging-optimizers runs fp32 at "highest" and bf16 at
"medium" matmul precision, batched over experts. Orthogonality: singular-value band of each result on the shape's
first matrix. "limit": time the standard NS FLOPs (5·(4m²n + 2m³) per matrix) take at this machine's GEMM rate,
measured in the same run; "frac" = limit / time (Gram NS does fewer FLOPs, so it can exceed 1). The first line says
whether this CPU's bf16 GEMM is fast or slow against its fp32 one (the ratio of the two rates, measured in the run).

    python bench/ns.py            # full mix (a few minutes on 2 cores)
    python bench/ns.py --quick    # smaller mix, < ~60 s
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from emerging_optimizers.orthogonalized_optimizers.muon_utils import newton_schulz as eo_newton_schulz
from torch.optim._muon import _zeropower_via_newtonschulz

from nemo_muon.accounting.ns_choice import choose_algorithm
from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B
from nemo_muon.optim.ns_iteration import newton_schulz
from nemo_muon.registry.cost import ns_cost

SIMPLE = (3.4445, -4.7750, 2.0315)
STEPS = 5


def shape_mix(scale: int, experts: int) -> list[tuple[str, str, tuple[int, ...], float]]:
    """(model, label, shape, weight) for one MoE layer of each model (+ Kimi K2's dense MLP), dims divided by
    ``scale``; ``weight`` = how many such NS calls one optimizer step of the full model makes (layers x matrices,
    experts per layer / experts per benchmarked stack), so weighted totals are the model's NS time mix."""
    k, q = KIMI_K2, QWEN3_30B_A3B

    def d(x: int) -> int:
        return max(8, x // scale)

    h = d(k.hidden_size)
    qk = d(k.qk_nope_head_dim) + d(k.qk_rope_head_dim)
    heads = k.num_attention_heads
    layers, moe, dense = k.num_layers, k.num_moe_layers, k.num_dense_layers
    stacks = moe * k.num_experts / experts
    kimi = [
        ("kimi q_a_proj", (d(k.q_lora_rank), h), layers),
        ("kimi q_b_proj", (heads * qk, d(k.q_lora_rank)), layers),
        ("kimi kv_a_proj_with_mqa", (d(k.kv_lora_rank) + d(k.qk_rope_head_dim), h), layers),
        ("kimi kv_b_proj", (heads * (d(k.qk_nope_head_dim) + d(k.v_head_dim)), d(k.kv_lora_rank)), layers),
        ("kimi o_proj", (h, heads * d(k.v_head_dim)), layers),
        ("kimi experts gate/up", (experts, d(k.moe_ffn_hidden_size), h), 2 * stacks),
        ("kimi experts down", (experts, h, d(k.moe_ffn_hidden_size)), stacks),
        ("kimi shared gate/up", (d(k.moe_ffn_hidden_size), h), 2 * moe * k.num_shared_experts),
        ("kimi shared down", (h, d(k.moe_ffn_hidden_size)), moe * k.num_shared_experts),
        ("kimi dense gate/up", (d(k.ffn_hidden_size), h), 2 * dense),
        ("kimi dense down", (h, d(k.ffn_hidden_size)), dense),
    ]
    def d(x: int) -> int:  # Qwen3-30B-A3B is ~4x narrower than Kimi K2: scale it half as much
        return max(8, x * 2 // scale)

    qh = d(q.hidden_size)
    q_stacks = q.num_moe_layers * q.num_experts / experts
    qwen = [
        ("qwen q_proj", (q.num_attention_heads * d(q.head_dim), qh), q.num_layers),
        ("qwen k_proj / v_proj", (q.num_query_groups * d(q.head_dim), qh), 2 * q.num_layers),
        ("qwen o_proj", (qh, q.num_attention_heads * d(q.head_dim)), q.num_layers),
        ("qwen experts gate/up", (experts, d(q.moe_ffn_hidden_size), qh), 2 * q_stacks),
        ("qwen experts down", (experts, qh, d(q.moe_ffn_hidden_size)), q_stacks),
    ]
    return [("Kimi K2", *row) for row in kimi] + [("Qwen3-30B-A3B", *row) for row in qwen]


def _ours(precision: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: newton_schulz(x, STEPS, "simple", precision=precision)


def _emerging(precision: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def run_eo(x: torch.Tensor) -> torch.Tensor:
        prev = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest" if precision == "fp32" else "medium")
        try:
            return eo_newton_schulz(x, STEPS, "simple")
        finally:
            torch.set_float32_matmul_precision(prev)

    return run_eo


def _torch_muon(x: torch.Tensor) -> torch.Tensor:
    if x.ndim == 3:
        return torch.stack([_zeropower_via_newtonschulz(m, SIMPLE, STEPS, 1e-7) for m in x])
    return _zeropower_via_newtonschulz(x, SIMPLE, STEPS, 1e-7)


def gemm_rate(dtype: torch.dtype, n: int = 1024, reps: int = 5) -> float:
    """FLOP/s of an n×n×n matmul in ``dtype`` on this machine, now (best of ``reps``)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / min(times)


def band(y: torch.Tensor) -> tuple[float, float]:
    s = torch.linalg.svdvals((y[0] if y.ndim == 3 else y).double())
    return s.min().item(), s.max().item()


def standard_flops(shape: tuple[int, ...]) -> float:
    return ns_cost(shape, STEPS)  # a 3-D stack costs its batch times one matrix


def run(scale: int, experts: int, reps: int) -> str:
    torch.manual_seed(0)
    mix = shape_mix(scale, experts)
    lines = [f"threads={torch.get_num_threads()} scale=1/{scale} experts/stack={experts} reps={reps} "
             f"coefficients=simple steps={STEPS}", ""]
    rates = {dtype: gemm_rate(dtype) for dtype in (torch.float32, torch.bfloat16)}
    ratio = rates[torch.bfloat16] / rates[torch.float32]
    lines += [f"bf16 GEMM / fp32 GEMM on this CPU: {ratio:.2f}x ({'fast' if ratio > 1.2 else 'slow'} bf16: "
              f"{'an all-bf16 iteration gains on it' if ratio > 1.2 else 'bf16 work costs as much as fp32 or more'})",
              ""]
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rate = rates[dtype]
        impls: dict[str, Callable] = {"ours": _ours(precision), "emerging": _emerging(precision)}
        if precision == "bf16":
            impls["torch.optim.Muon"] = _torch_muon
        totals: dict[str, dict[str, float]] = {}
        limits: dict[str, float] = {}
        lines += [f"### {precision} (GEMM rate {rate / 1e9:.1f} GFLOP/s)", "",
                  "| shape | weight | algo (ours) | " + " | ".join(f"{k} ms" for k in impls)
                  + " | best peer / ours | frac | " + " | ".join(f"{k} σ band" for k in impls) + " |",
                  "|---" * (4 + 2 * len(impls) + 1) + "|"]
        for model, label, shape, weight in mix:
            x = torch.randn(*shape)
            bands = {k: band(f(x)) for k, f in impls.items()}  # also the warm-up
            times: dict[str, list[float]] = {k: [] for k in impls}
            names = list(impls)
            for r in range(reps):
                for k in names[r % len(names):] + names[: r % len(names)]:
                    t = time.perf_counter()
                    impls[k](x)
                    times[k].append(time.perf_counter() - t)
            best = {k: min(v) for k, v in times.items()}
            model_totals = totals.setdefault(model, dict.fromkeys(impls, 0.0))
            for k in impls:
                model_totals[k] += weight * best[k]
            limit = standard_flops(shape) / rate
            limits[model] = limits.get(model, 0.0) + weight * limit
            best_peer = min(v for k, v in best.items() if k != "ours")
            algo = choose_algorithm(shape[-2], shape[-1], "cpu", dtype)
            lines.append(f"| {label} {tuple(shape)} | {weight:g} | {algo} | "
                         + " | ".join(f"{best[k] * 1e3:.2f}" for k in impls)
                         + f" | {best_peer / best['ours']:.2f}x | {limit / best['ours']:.2f} | "
                         + " | ".join(f"{lo:.3f}-{hi:.3f}" for lo, hi in bands.values()) + " |")
        lines.append("")
        for model, tot in totals.items():
            peer = min((k for k in impls if k != "ours"), key=tot.get)
            lines.append(f"**{precision} {model} mix** (weighted by the model's matrix counts): "
                         + ", ".join(f"{k} {v:.1f} s" for k, v in tot.items())
                         + f"; speed-up over the fastest peer ({peer}): **{tot[peer] / tot['ours']:.2f}x**; "
                         f"fraction of the GEMM limit: ours {limits[model] / tot['ours']:.2f}, {peer} "
                         f"{limits[model] / tot[peer]:.2f}  ")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes and fewer repetitions (< ~60 s)")
    ap.add_argument("--scale", type=int, help="divide every model dimension by this (default 8, quick 16)")
    ap.add_argument("--experts", type=int, help="experts per stack (default 8, quick 4)")
    ap.add_argument("--reps", type=int, help="timed repetitions per implementation (default 7, quick 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    scale = args.scale or (16 if args.quick else 8)
    experts = args.experts or (4 if args.quick else 8)
    reps = args.reps or (3 if args.quick else 7)
    print(run(scale, experts, reps))


if __name__ == "__main__":
    main()
