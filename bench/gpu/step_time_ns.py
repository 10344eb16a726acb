"""The step-time model's Newton–Schulz price against a real GPU: Muon optimizer steps timed on the lent GPU next to
``nemo_muon.accounting.step_time.ns_seconds`` with that GPU's public constants (``accounting/hardware.py``).

Three workloads, each a list of matrices one rank orthogonalizes in the published runs: Qwen3-30B-A3B's experts
(many small matrices: the operator floor), Kimi K2's experts (large, compute-bound) and a mix. Each runs through
Emerging-Optimizers' Muon (what Megatron-Core's own Muon runs; implementation 'megatron') and nemo-muon's Muon
(bf16 NS; implementation 'nemo_muon'). Prints predicted, measured and their ratio per row; the GPU must be in the
hardware table (H100, H200, B200, GB200, GB300), otherwise it says so and exits 0 with the measurements only.

    python bench/gpu/step_time_ns.py [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WORKLOADS: dict[str, list[tuple[tuple[int, int], int]]] = {
    # (shape, count): Megatron's stored layout, fused gate/up as the megatron recipes run it
    "qwen3_experts_x2_layers": [((1536, 2048), 32), ((2048, 768), 32)],
    "kimi_k2_experts_x1_layer": [((4096, 7168), 6), ((7168, 2048), 6)],
    "mix": [((4096, 7168), 2), ((1536, 2048), 16), ((512, 7168), 4)],
}


def _gpu_name() -> str | None:
    import torch

    from nemo_muon.accounting.hardware import known_hardware

    name = torch.cuda.get_device_name().lower()
    for key in sorted(known_hardware(), key=len, reverse=True):
        if key in name.replace(" ", ""):
            return key
    return None


def _time_steps(make, shapes: list[tuple[tuple[int, int], int]], reps: int) -> float:  # noqa: ANN001
    import torch

    params = [torch.nn.Parameter(torch.randn(*s, device="cuda")) for s, n in shapes for _ in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make(params)
    opt.step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    import torch
    from emerging_optimizers.orthogonalized_optimizers import Muon as EoMuon

    import nemo_muon
    from nemo_muon.accounting.hardware import hardware
    from nemo_muon.accounting.step_time import IMPLEMENTATIONS, MatrixWork, ns_seconds

    if not torch.cuda.is_available():
        raise SystemExit("step_time_ns.py needs a CUDA GPU (none found): run it through bench/gpu/run_all.sh on a lent one")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("medium")  # Megatron's muon_fp32_matmul_prec default: bf16 tensor cores
    gpu = _gpu_name()
    hw = hardware(gpu) if gpu else None
    print(f"gpu: {torch.cuda.get_device_name()} -> hardware table entry {gpu!r}")
    print("| workload | implementation | predicted | measured | predicted / measured |")
    print("|---|---|---|---|---|")
    makers = {
        "megatron": lambda ps: EoMuon(ps, lr=0.01),
        "nemo_muon": lambda ps: nemo_muon.Muon([(f"w{i}", p) for i, p in enumerate(ps)], lr=0.01,
                                               ns_precision="bf16"),
    }
    for name, shapes in WORKLOADS.items():
        work = [MatrixWork((s,), 5 * (4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3), n) for s, n in shapes]
        for impl, make in makers.items():
            measured = _time_steps(make, shapes, args.reps)
            if hw is None:
                print(f"| {name} | {impl} | n/a | {measured * 1e3:.2f} ms | n/a |", flush=True)
                continue
            precision = "bf16"
            predicted = ns_seconds(work, hw, IMPLEMENTATIONS[impl], 5, precision)
            print(f"| {name} | {impl} | {predicted * 1e3:.2f} ms | {measured * 1e3:.2f} ms | "
                  f"{predicted / measured:.3f} |", flush=True)


if __name__ == "__main__":
    main()
