"""Muon's ``batch_ns``: one stacked Newton–Schulz call per shape vs one call per matrix, same run, same inputs.

The matrices are a few decoder layers' worth of same-shape projections (default: 8 layers x {q, k, v, o} of
HxH and {gate, up} of FxH, {down} of HxF, with H = --hidden, F = 3H), so every shape repeats once per layer. The
two paths run round-robin in one process (best of --reps: on a shared machine the minimum is the time the work takes),
single-threaded by default; the result is the ratio per-matrix / batched (> 1: batching is faster) and the largest
difference between the two results (fp32 rounding only).

    OMP_NUM_THREADS=1 .venv/bin/python bench/ns_batched.py            # default mix
    OMP_NUM_THREADS=1 .venv/bin/python bench/ns_batched.py --hidden 64 --layers 16

``--small-bf16``: the small bf16 shapes of bench/ns.py's full mix (MLA and GQA projections, shared experts; simple
coefficients, 8 matrices of each shape), where our per-call lead over the peers is smallest (bf16 Gram NS restarts,
more operators per call than the peers' iteration): ours per call, ours stacked (as Muon's default step runs them)
and torch.optim.Muon's NS, and torch's time over our stacked one.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ns_batched.py --small-bf16
"""

from __future__ import annotations

import argparse
import time

import torch

from nemo_muon.optim.muon import newton_schulz_stacked
from nemo_muon.optim.ns_iteration import newton_schulz_many


def shapes(hidden: int, layers: int) -> list[tuple[int, int]]:
    """Every matrix of ``layers`` dense decoder layers (q, k, v, o, gate, up, down)."""
    f = 3 * hidden
    return [s for _ in range(layers) for s in [(hidden, hidden)] * 4 + [(f, hidden)] * 2 + [(hidden, f)]]


def best_of(fn, reps: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


SMALL_BF16 = [(72, 896), (128, 512), (192, 896), (896, 256)]
"""bench/ns.py's scaled kimi kv_a_proj_with_mqa, qwen k/v_proj, kimi q_a_proj and kimi shared down."""


def small_bf16(reps: int) -> None:
    from torch.optim._muon import _zeropower_via_newtonschulz

    simple = (3.4445, -4.7750, 2.0315)
    g = torch.Generator().manual_seed(0)
    print("| shape (x8) | ours per call | ours stacked | torch.optim.Muon | torch.optim.Muon / ours stacked |")
    print("|---|---|---|---|---|")
    for shape in SMALL_BF16:
        xs = [torch.randn(*shape, generator=g) for _ in range(8)]
        runs = {"per_call": lambda: [newton_schulz_many([x], 5, "simple", precision="bf16") for x in xs],  # noqa: B023
                "stacked": lambda: newton_schulz_stacked(xs, 5, "simple", precision="bf16"),  # noqa: B023
                "torch": lambda: [_zeropower_via_newtonschulz(x, simple, 5, 1e-7) for x in xs]}  # noqa: B023
        best = dict.fromkeys(runs, float("inf"))
        for fn in runs.values():
            fn()
        for _ in range(reps):  # round-robin: all see the same machine load
            for k, fn in runs.items():
                best[k] = min(best[k], best_of(fn, 1))
        print(f"| {shape} | {best['per_call'] * 1e3:.2f} ms | {best['stacked'] * 1e3:.2f} ms | "
              f"{best['torch'] * 1e3:.2f} ms | {best['torch'] / best['stacked']:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small-bf16", action="store_true", help="the bf16 comparison with torch.optim.Muon (doc)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.small_bf16:
        small_bf16(args.reps)
        return
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(*s, generator=g) for s in shapes(args.hidden, args.layers)]
    per_matrix = lambda: [newton_schulz_many([x], 5, "quintic")[0] for x in xs]  # noqa: E731  (Muon's default)
    batched = lambda: newton_schulz_stacked(xs, 5, "quintic", precision="fp32")  # noqa: E731
    diff = max((a - b).abs().max().item() for a, b in zip(per_matrix(), batched(), strict=True))
    t_plain = t_batch = float("inf")
    for _ in range(args.reps):  # round-robin: both see the same machine load
        t_plain = min(t_plain, best_of(per_matrix, 1))
        t_batch = min(t_batch, best_of(batched, 1))
    print(f"{len(xs)} matrices, {len(set(map(tuple, (x.shape for x in xs))))} shapes, hidden {args.hidden}, "
          f"{args.layers} layers, {args.threads} thread(s)")
    print(f"per-matrix {t_plain * 1e3:.1f} ms | batched {t_batch * 1e3:.1f} ms | ratio per-matrix/batched "
          f"{t_plain / t_batch:.2f} | max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
