"""GPU check (run where a GPU is lent): SYRK vs GEMM Newton–Schulz, and Gram NS, at real Kimi K2 / Qwen3 shapes.

For each shape, bf16: emerging-optimizers' NS with plain GEMMs, the same with its Triton SYRK (use_syrk), ours
standard (SYRK picked automatically on validated GPUs), ours Gram NS; fp32: emerging vs ours. Prints the time of each
(CUDA events, best of --reps), the speed-up over the fastest peer, the max difference of the SYRK path from the GEMM
path, and the singular-value band of each result (first matrix). Also checks tsyrk_ex against a matmul reference.

    python bench/gpu/ns_syrk.py [--reps 10]
"""

from __future__ import annotations

import argparse

import torch
from emerging_optimizers import triton_kernels
from emerging_optimizers.orthogonalized_optimizers.muon_utils import newton_schulz as eo_newton_schulz

from nemo_muon.optim.ns_iteration import newton_schulz
from nemo_muon.optim.ns_kernels import syrk_kernel

SHAPES = {
    "kimi experts gate/up (E, 2048, 7168)": (2048, 7168),
    "kimi experts down (E, 7168, 2048)": (7168, 2048),
    "kimi o_proj (7168, 8192)": (7168, 8192),
    "kimi q_b_proj (12288, 1536)": (12288, 1536),
    "kimi dense gate/up (18432, 7168)": (18432, 7168),
    "qwen experts gate/up (E, 768, 2048)": (768, 2048),
    "qwen q_proj (4096, 2048)": (4096, 2048),
}


def timed(fn, x: torch.Tensor, reps: int) -> tuple[float, torch.Tensor]:
    y = fn(x)
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best, y


def band(y: torch.Tensor) -> str:
    s = torch.linalg.svdvals((y[0] if y.ndim == 3 else y).double())
    return f"{s.min().item():.3f}-{s.max().item():.3f}"


def eo(precision: str, use_syrk: bool):
    def run(x: torch.Tensor) -> torch.Tensor:
        torch.set_float32_matmul_precision("medium" if precision == "bf16" else "highest")
        try:
            return eo_newton_schulz(x, 5, "quintic", use_syrk=use_syrk)
        finally:
            torch.set_float32_matmul_precision("highest")

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu/ns_syrk.py needs a CUDA GPU")
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}, capability {torch.cuda.get_device_capability(dev)}")
    a = torch.randn(1024, 4096, device=dev, dtype=torch.bfloat16)
    ok = syrk_kernel(a) is not None
    print(f"SYRK kernel available: {ok}")
    if ok:
        ref = (a.float() @ a.float().T)
        err = (triton_kernels.tsyrk_ex(a).float() - ref).abs().max() / ref.abs().max()
        print(f"tsyrk_ex vs fp32 matmul: max rel error {err.item():.2e}")
    print("\n| shape | prec | " + " | ".join(["eo gemm ms", "eo syrk ms", "ours std ms", "ours gram ms"])
          + " | best peer / ours | syrk-gemm max diff | bands (eo gemm, eo syrk, ours std, ours gram) |")
    print("|---" * 8 + "|")
    for label, shape in SHAPES.items():
        x = torch.randn(*shape, device=dev)
        for precision in ("bf16", "fp32"):
            runs = {"eo gemm": eo(precision, False), "eo syrk": eo(precision, ok and precision == "bf16"),
                    "ours std": lambda x, p=precision: newton_schulz(x, precision=p, algorithm="standard"),
                    "ours gram": lambda x, p=precision: newton_schulz(x, precision=p, algorithm="gram")}
            res = {k: timed(f, x, args.reps) for k, f in runs.items()}
            ours = min(res["ours std"][0], res["ours gram"][0])
            peer = min(res["eo gemm"][0], res["eo syrk"][0])
            diff = (res["ours std"][1] - res["eo gemm"][1]).abs().max().item()
            print(f"| {label} | {precision} | " + " | ".join(f"{res[k][0]:.2f}" for k in runs)
                  + f" | {peer / ours:.2f}x | {diff:.2e} | " + ", ".join(band(res[k][1]) for k in runs) + " |")


if __name__ == "__main__":
    main()
