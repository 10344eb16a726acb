"""Ownership inside Megatron-Core >= 0.18's reduce-scatter layout: Megatron's numel layout, ours by update cost, and
ours with split ownership (`nemo_muon.megatron.core_018_plus.cost_layout`, `split_plan`, `split_shares`), side by side.

Runs `tests.megatron_cpu.layout_training.train_with_layout` (one step of the tiny Kimi K2 model, our Muon, bf16
gradient reduction) on 2 and 4 gloo ranks for each layout and prints, per layout: the update cost each rank runs as
Megatron derived it from the layout (a split matrix at its member cost on each rank of its block), as max / mean;
the most bytes one rank sent in the step (ring model, every collective: DDP's reduce-scatter and all-gather, the
split's scatter, Gram all-reduces and gather); both relative to Megatron's layout in the same run; and how many
matrices were split. Needs Megatron-Core >= 0.18 (``.venv``):

    OMP_NUM_THREADS=1 .venv/bin/python bench/cost_layout_split.py [--worlds 2 4] [--targets 1.02 1.0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _imbalance(loads: list[float]) -> float:
    return max(loads) / (sum(loads) / len(loads))


def main() -> None:
    import importlib.metadata

    from nemo_muon.train.spawn import spawn_ranks
    from tests.megatron_cpu.layout_training import train_with_layout

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--targets", type=float, nargs="+", default=[1.02, 1.0])
    args = parser.parse_args()
    print(f"megatron-core {importlib.metadata.version('megatron-core')}, tiny_kimi_k2, one step, gloo ranks")
    print("| DP | layout | cost max/mean | / Megatron's | most bytes sent by a rank | / Megatron's | matrices split |")
    print("|---|---|---|---|---|---|---|")
    for world in args.worlds:
        runs = [("Megatron's (numel)", "megatron", None), ("ours (update cost)", "cost", None)]
        runs += [(f"ours, ns_split_target={t}", "cost", t) for t in args.targets]
        base = None
        for label, layout, target in runs:
            ranks = spawn_ranks(train_with_layout, world, ("tiny_kimi_k2", layout, 1, "muon", False, 1.0, target),
                                timeout_s=600)
            imbalance = _imbalance(ranks[0]["owned_costs"])
            sent = max(r["sent_last_step"] for r in ranks)
            base = base or (imbalance, sent)
            print(f"| {world} | {label} | {imbalance:.4f} | {imbalance / base[0]:.3f} | {sent / 2**20:.2f} MiB | "
                  f"{sent / base[1]:.2f} | {len(ranks[0]['splits'] or {})} |", flush=True)


if __name__ == "__main__":
    main()
