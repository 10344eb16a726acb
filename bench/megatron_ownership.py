"""Who owns which matrix inside Megatron-Core 0.16's layer-wise optimizer: update cost (ours) vs numel (Megatron's).

Runs `tests.megatron_cpu.training.ownership_loads` (2 gloo CPU ranks, DP=2, the tiny MLA / GQA MoE models) for
Muon and SOAP under engine nemo_muon: the same model built twice, with `NsBalancedLayerWiseOptimizer` (LPT on the
Newton–Schulz / SOAP cost of each matrix) and with Megatron's `LayerWiseDistributedOptimizer` (numel ping-pong).
Prints the per-rank update-cost imbalance (max / mean of the cost of the matrices each rank owns) of both, side by
side. Needs Megatron-Core 0.16 (the NGC 26.02 stack): `.venv-ngc/bin/python bench/megatron_ownership.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import importlib.metadata

    from nemo_muon.train.spawn import spawn_ranks
    from tests.megatron_cpu.training import ownership_loads

    print(f"megatron-core {importlib.metadata.version('megatron-core')}, DP=2 gloo ranks")
    print("| model | optimizer | cost max/mean: by update cost (ours) | by numel (Megatron's) | ratio ours / Megatron's |")
    print("|---|---|---|---|---|")
    for spec in ("tiny_kimi_k2", "tiny_qwen3_moe"):
        for optimizer in ("muon", "soap"):
            ranks = spawn_ranks(ownership_loads, 2, (spec, optimizer), timeout_s=600)
            figures = {}
            for ownership in ("ns_cost", "megatron"):
                loads = [r[ownership]["load"] for r in ranks]
                figures[ownership] = max(loads) / (sum(loads) / len(loads))
            print(f"| {spec} | {optimizer} | {figures['ns_cost']:.4f} | {figures['megatron']:.4f} | "
                  f"{figures['ns_cost'] / figures['megatron']:.3f} |")


if __name__ == "__main__":
    main()
