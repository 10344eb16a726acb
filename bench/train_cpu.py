"""CPU benchmark of the torch backend: layer-wise Muon vs AdamW on the same tiny model, data and seed, 2 gloo ranks.

Two measurements, both side by side in one invocation:

1. Throughput (``--rounds R --steps S``): one pair of rank processes runs R rounds; each round trains Muon and
   AdamW for S steps (first step excluded as warm-up), in alternating order, and gives one paired tokens/s ratio
   Muon / AdamW. The median of the paired ratios is reported (with min/max), and Muon's model+NS TFLOP/s against
   AdamW's model TFLOP/s (FLOPs from nemo_muon.accounting). Pairing short back-to-back runs in the same processes
   cancels most of the noise of a shared machine, whose load changes over minutes.
2. Convergence (``--full``, or ``--runs MUON_DIR ADAMW_DIR`` of a finished `make demo`): the steps Muon needs to
   reach AdamW's final validation loss, divided by AdamW's steps (target <= 0.7), from the recipes' full runs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/train_cpu.py --rounds 8 --steps 4 --runs runs/A runs/B
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from nemo_muon.recipes import get_recipe

from nemo_muon.train.demo import run_demo
from nemo_muon.train.flops import step_flops
from nemo_muon.train.spawn import spawn_ranks


def _alternate(rank: int, world: int, group: Any, names: list[str], rounds: int, steps: int, root: str) -> list:
    from nemo_muon.train.loop import train

    out = []
    for i in range(rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            r = get_recipe(name)
            r.trainer.max_steps, r.trainer.eval_interval, r.trainer.eval_iters = steps, 0, 1
            r.logging.root, r.logging.run_name = root, f"{name}-round{i}"
            r.data.tokenizer_dir = str(Path("runs") / "_cache")
            s = train(r, group=group)
            out.append((i, name, s["tokens_per_s"]))
    return out


def throughput(family: str, rounds: int, steps: int) -> dict[str, float]:
    names = [f"tiny_{family}_muon", f"tiny_{family}_adamw"]
    root = f"runs/bench-train-cpu-{time.strftime('%Y%m%d-%H%M%S')}"
    results = spawn_ranks(_alternate, 2, (names, rounds, steps, root))[0]
    by_round = {(i, n): v for i, n, v in results}
    ratios = [by_round[(i, names[0])] / by_round[(i, names[1])] for i in range(rounds)]
    tps = {n: statistics.median(v for _, m, v in results if m == n) for n in names}
    ratio = statistics.median(ratios)
    muon, adamw = (get_recipe(n) for n in names)
    tokens = muon.trainer.global_batch_size * muon.trainer.seq_length
    fm, fa = step_flops(muon, tokens_per_step=tokens, world_size=2), step_flops(adamw, tokens_per_step=tokens,
                                                                                   world_size=2)
    steps_per_s = {names[0]: ratio * tps[names[1]] / tokens, names[1]: tps[names[1]] / tokens}
    return {
        "muon_tokens_per_s": tps[names[0]], "adamw_tokens_per_s": tps[names[1]],
        "tokens_per_s_ratio": ratio, "ratio_min": min(ratios), "ratio_max": max(ratios),
        "muon_model_tflops": fm.model_flops * steps_per_s[names[0]] / 2 / 1e12,
        "muon_model_ns_tflops": (fm.model_flops + fm.ns_flops) * steps_per_s[names[0]] / 2 / 1e12,
        "adamw_model_tflops": fa.model_flops * steps_per_s[names[1]] / 2 / 1e12,
        "ns_flops_share": fm.ns_flops / fm.model_flops,
    }


def convergence(run_dirs: list[Path]) -> dict[str, Any]:
    from nemo_muon.reporting.loader import load_run
    from nemo_muon.reporting.summary import compare_pair

    muon, adamw = (load_run(p) for p in run_dirs)
    c = compare_pair(muon, adamw)
    if c is None:
        raise ValueError(f"runs must both have loss curves; got {run_dirs}")
    return {"target_val_loss": c.target_loss, "adamw_steps": c.adamw_steps, "muon_steps": c.muon_steps,
            "steps_ratio": (c.muon_steps / c.adamw_steps) if c.muon_steps else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=("kimi_k2", "qwen3_moe"), default="kimi_k2")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--runs", nargs=2, type=Path, metavar=("MUON_DIR", "ADAMW_DIR"), help="finished demo runs")
    p.add_argument("--full", action="store_true", help="train both recipes in full (the demo) for convergence")
    a = p.parse_args()
    t = throughput(a.family, a.rounds, a.steps)
    print(f"tokens/s  muon {t['muon_tokens_per_s']:.0f}  adamw {t['adamw_tokens_per_s']:.0f}  "
          f"paired ratio muon/adamw median {t['tokens_per_s_ratio']:.3f} (min {t['ratio_min']:.3f}, "
          f"max {t['ratio_max']:.3f}; target >= 0.98)")
    print(f"TFLOP/s per rank  muon model {t['muon_model_tflops']:.4f}  muon model+NS {t['muon_model_ns_tflops']:.4f}  "
          f"adamw model {t['adamw_model_tflops']:.4f}  (NS FLOPs = {100 * t['ns_flops_share']:.1f}% of model FLOPs)")
    run_dirs = a.runs
    if a.full:
        out = run_demo(a.family)
        run_dirs = [Path(s["run_dir"]) for s in out["runs"]]
    if run_dirs:
        c = convergence(run_dirs)
        ratio = "never" if c["steps_ratio"] is None else f"{c['steps_ratio']:.2f}"
        print(f"steps to AdamW's final val loss {c['target_val_loss']:.4f}: muon {c['muon_steps']} / adamw "
              f"{c['adamw_steps']} = {ratio} (target <= 0.7)")


if __name__ == "__main__":
    main()
