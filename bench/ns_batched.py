"""Muon's ``batch_ns``: one stacked Newton–Schulz call per shape vs one call per matrix, same run, same inputs.

The matrices are a few decoder layers' worth of same-shape projections (default: 8 layers x {q, k, v, o} of
HxH and {gate, up} of FxH, {down} of HxF, with H = --hidden, F = 3H), so every shape repeats once per layer. The
two paths run round-robin in one process (best of --reps: on a shared machine the minimum is the time the work takes),
single-threaded by default; the result is the ratio per-matrix / batched (> 1: batching is faster) and the largest
difference between the two results (fp32 rounding only).

    OMP_NUM_THREADS=1 .venv/bin/python bench/ns_batched.py            # default mix
    OMP_NUM_THREADS=1 .venv/bin/python bench/ns_batched.py --hidden 64 --layers 16
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
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
