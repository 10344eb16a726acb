"""Our Muon vs Megatron-Core's own, both inside Megatron's layer-wise distributed optimizer, measured side by side.

Runs `tests.megatron_cpu.training.lockstep_engines` (2 gloo CPU ranks, DP=2, the tiny MLA / GQA MoE models): two
replicas of one model, one per engine, the same batches, reset to equal states after every step. Prints, per model:
the ratio of optimizer step times (ours / Megatron's, median over steps, both timed in the same run and process),
the NS load per rank (max / mean of the Newton–Schulz FLOPs of the matrices each rank owns: the ownership is
Megatron's for both), the bytes each rank contributes to collectives per step for each engine, and the largest
master-weight difference after a step. Needs Megatron-Core >= 0.18 (Megatron's own Muon): `.venv/bin/python
bench/megatron_engines.py`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    import importlib.metadata

    from nemo_muon.train.spawn import spawn_ranks
    from tests.megatron_cpu.training import LR, lockstep_engines

    print(f"megatron-core {importlib.metadata.version('megatron-core')}, DP=2 gloo ranks, {args.steps} steps "
          "(first step excluded from timing)")
    print("| model | step time ours / Megatron's (median) | NS load max/mean | bytes/step/rank ours | Megatron's | "
          "max master diff / lr |")
    print("|---|---|---|---|---|---|")
    for spec in ("tiny_kimi_k2", "tiny_qwen3_moe"):
        ranks = spawn_ranks(lockstep_engines, 2, (spec, args.steps), timeout_s=900)
        ratios = [statistics.median(r["step_s"]["nemo_muon"][1:]) / statistics.median(r["step_s"]["megatron"][1:])
                  for r in ranks]
        loads = [r["ns_flops_on_rank"] for r in ranks]
        ours = max(statistics.median(r["collective_bytes"]["nemo_muon"]) for r in ranks)
        theirs = max(statistics.median(r["collective_bytes"]["megatron"]) for r in ranks)
        diff = max(s["master_max_abs_diff"] for r in ranks for s in r["per_step"])
        print(f"| {spec} | {max(ratios):.2f} | {max(loads) / (sum(loads) / len(loads)):.3f} | {ours:,.0f} | "
              f"{theirs:,.0f} | {diff / LR:.1e} |", flush=True)


if __name__ == "__main__":
    main()
