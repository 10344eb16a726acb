"""Tiny Kimi-K2-family and Qwen3-MoE models trained through Megatron-Core on 2 gloo CPU ranks: the loss curves.

Runs the harness of tests/megatron_cpu (real GPTModel + DDP + optimizer + schedules) with the Megatron-Core of the
interpreter: `.venv/bin/python bench/megatron_cpu.py` (0.19.2), `.venv-ngc/bin/python bench/megatron_cpu.py`
(0.16.0, NGC 26.02's stack). Prints, per model and optimizer, the loss of the first and last step, the mean of the
last 4 over the first 4, and the largest parameter difference between the two DP replicas; an optimizer the stack
cannot build is reported as refused with the rule that refuses it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    from nemo_muon.megatron.shared.stack import installed_versions, problems_for_optimizer
    from nemo_muon.train.spawn import spawn_ranks
    from tests.megatron_cpu.training import train_tiny

    mcore = importlib.metadata.version("megatron-core")
    print(f"megatron-core {mcore}, {args.steps} steps, 2 gloo ranks")
    print("| model | optimizer | loss step 1 -> last | mean last 4 / first 4 | replica max diff |")
    print("|---|---|---|---|---|")
    for spec in ("tiny_kimi_k2", "tiny_qwen3_moe"):
        for optimizer in ("muon", "soap", "adamw"):
            problems = problems_for_optimizer(optimizer, installed_versions())
            if problems:
                print(f"| {spec} | {optimizer} | refused: {', '.join(p.rule for p in problems)} | | |")
                continue
            r = spawn_ranks(train_tiny, 2, (spec, optimizer, args.steps), timeout_s=600)[0]
            losses = r["losses"]
            ratio = (sum(losses[-4:]) / 4) / (sum(losses[:4]) / 4)
            print(f"| {spec} | {optimizer} | {losses[0]:.3f} -> {losses[-1]:.3f} | {ratio:.3f} | "
                  f"{r['replica_max_diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
