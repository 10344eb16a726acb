"""The step-time model's operator floor and matrix-update price against a real GPU (issue 38 items 3 and 5).

1. The operator floor: the host time of one eager operator issued back to back (a chain of tiny in-place adds, then
   of tiny matmuls, synchronized once; the median of --reps chains). Prints the value to give
   ``nemo-muon plan --kernel-floor-us`` (the model's default, 10 us, is an assumption).
2. One optimizer step, timed, next to ``nemo_muon.accounting.step_time.ns_seconds`` with this GPU's public constants
   and the floor just measured, for Megatron's own Muon (Megatron-Core's TensorParallelMuon: Emerging-Optimizers' step
   per parameter), ours batched (the default) and ours per matrix (``batch_ns=False``), on: the busiest rank of
   ``qwen3_30b_a3b_muon`` on 8 GPUs (1,554 matrices, the plan's, bench/launches.py), Kimi K2's experts of one layer
   (large, compute-bound) and a mix. Prints predicted, measured, predicted / measured and each implementation's step
   time over Megatron's per row: the GPU counterpart of bench/launches.py's operator counts. A GPU outside the
   hardware table (H100, H200, B200, GB200, GB300) gets the measurements only.

    python bench/gpu/step_time_ns.py [--reps 3]
    python bench/gpu/step_time_ns.py --cpu --divisor 128 --reps 1 --workload qwen3_busiest_rank   # CPU check

``--cpu`` runs the same on this CPU with every dimension divided by ``--divisor`` (the model's prices then read n/a:
no CPU in the table); tests/test_bench_step_time_ns.py runs it so the script stays runnable where no GPU is lent.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
LAUNCHES = Path(__file__).resolve().parents[1] / "launches.py"
"""bench/launches.py: the busiest rank's matrices (a file of this tree, loaded by path)."""

WORKLOADS: dict[str, list[tuple[tuple[int, int], int]]] = {
    # (shape, count): Megatron's stored layout, fused gate/up as the megatron recipes run it
    "kimi_k2_experts_x1_layer": [((4096, 7168), 6), ((7168, 2048), 6)],
    "mix": [((4096, 7168), 2), ((1536, 2048), 16), ((512, 7168), 4)],
}
BUSIEST = "qwen3_busiest_rank"
"""The per-rank Qwen3-30B-A3B set: the busiest rank of qwen3_30b_a3b_muon on 8 GPUs, from the plan."""
IMPLEMENTATIONS = ("megatron", "nemo_muon", "nemo_muon_per_matrix")


@functools.cache
def _launches():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_launches", LAUNCHES)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _gpu_name(torch) -> str | None:  # noqa: ANN001
    from nemo_muon.accounting.hardware import known_hardware

    name = torch.cuda.get_device_name().lower()
    for key in sorted(known_hardware(), key=len, reverse=True):
        if key in name.replace(" ", ""):
            return key
    return None


def _sync(torch, device) -> None:  # noqa: ANN001
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def operator_floor(torch, device, reps: int, chain: int = 2000) -> dict[str, float]:  # noqa: ANN001
    """Seconds per operator of ``chain`` tiny operators issued back to back, median of ``reps`` chains."""
    out = {}
    x, a = torch.zeros(1, device=device), torch.randn(8, 8, device=device)
    for label, op in (("add_ (1 element)", lambda: x.add_(1.0)), ("mm (8x8)", lambda: a @ a)):
        op()
        _sync(torch, device)
        times = []
        for _ in range(max(reps, 3)):
            start = time.perf_counter()
            for _ in range(chain):
                op()
            _sync(torch, device)
            times.append((time.perf_counter() - start) / chain)
        out[label] = statistics.median(times)
    return out


def _shapes(name: str, divisor: int) -> list[tuple[tuple[int, ...], tuple[tuple[int, ...], ...], str]]:
    """(stored shape, NS parts, name) of every matrix of workload ``name``, dims divided by ``divisor``."""
    if name == BUSIEST:
        rank = _launches().stand_ins("qwen3_30b_a3b_muon").rank
        return [(tuple(d // divisor for d in m.shape), tuple(tuple(d // divisor for d in p) for p in m.parts), m.name)
                for m in rank.matrices]
    return [(tuple(d // divisor for d in s), (tuple(d // divisor for d in s),), f"layers.{i}.mlp.linear_fc2.weight")
            for s, n in WORKLOADS[name] for i in range(n)]


def _optimizer(impl: str, named, divisor: int):  # noqa: ANN001, ANN202
    import nemo_muon

    s = _launches().stand_ins("qwen3_30b_a3b_muon")
    cfg = s.recipe.optimizer
    if impl == "megatron":
        from megatron.core.optimizer.emerging_optimizers import TensorParallelMuon

        shapes = [x * s.divisor // divisor for x in s.qkv_split_shapes]
        return TensorParallelMuon([p for _, p in named], lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                                  weight_decay=cfg.weight_decay, split_qkv=cfg.split_qkv,
                                  is_qkv_fn=lambda p: getattr(p, "is_qkv", False), qkv_split_shapes=shapes,
                                  coefficient_type=cfg.coefficients, num_ns_steps=cfg.ns_steps,
                                  scale_mode=cfg.scale_mode, fp32_matmul_prec="medium")
    from nemo_muon.optim.routing import QKVLayout

    spec = s.recipe.model
    layouts = {"linear_qkv": QKVLayout(spec.num_attention_heads, spec.num_query_groups, spec.head_dim // divisor)}
    kwargs = {**cfg.optimizer_kwargs(), "nonfinite": "raise", "fused_layouts": layouts}
    kwargs.pop("tp_mode", None)
    from nemo_muon.optim.ns_stacks import STACK_BYTES

    return nemo_muon.Muon(named, **kwargs, batch_ns=impl == "nemo_muon",
                          stack_bytes=max(1, STACK_BYTES // divisor ** 2))


def time_step(torch, device, impl: str, shapes, divisor: int, reps: int) -> float:  # noqa: ANN001
    """Median seconds of one optimizer step of ``impl`` over fresh fp32 matrices of ``shapes`` (after one step)."""
    named = []
    for shape, _, name in shapes:
        p = torch.nn.Parameter(torch.randn(*shape, device=device) * 0.02)
        p.grad = torch.randn_like(p)
        p.is_qkv = ".linear_qkv." in name
        named.append((f"{name}#{len(named)}" if name in dict(named) else name, p))
    opt = _optimizer(impl, named, divisor)
    opt.step()
    _sync(torch, device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        opt.step()
        _sync(torch, device)
        times.append(time.perf_counter() - start)
    del opt, named
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="run on this CPU (with --divisor)")
    parser.add_argument("--divisor", type=int, default=1, help="divide every dimension by this")
    parser.add_argument("--workload", action="append", choices=[BUSIEST, *WORKLOADS],
                        help="workload to time (repeatable; default: all)")
    args = parser.parse_args()
    import torch

    from nemo_muon.accounting.hardware import hardware
    from nemo_muon.accounting.step_time import IMPLEMENTATIONS as PRICES
    from nemo_muon.accounting.step_time import MatrixWork, ns_seconds
    from nemo_muon.registry.cost import ns_cost

    if args.reps < 1 or args.divisor < 1:
        raise SystemExit(f"--reps and --divisor must be >= 1; got {args.reps}, {args.divisor}")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("step_time_ns.py needs a CUDA GPU (none found): run it through bench/gpu/run_all.sh on a lent "
                         "one, or --cpu here")
    device = torch.device("cpu") if args.cpu else torch.device("cuda")
    torch.set_float32_matmul_precision("medium")  # Megatron's muon_fp32_matmul_prec default: bf16 tensor cores
    gpu = None if args.cpu else _gpu_name(torch)
    floors = operator_floor(torch, device, args.reps)
    floor = floors["add_ (1 element)"]
    where = "cpu" if args.cpu else f"{torch.cuda.get_device_name()} -> hardware table entry {gpu!r}"
    print(f"device: {where}")
    print("operator floor, one eager operator issued back to back: "
          + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in floors.items()))
    print(f"use: nemo-muon plan --kernel-floor-us {floor * 1e6:.1f}   (the model's default, 10 us, is assumed)")
    hw = None
    if gpu is not None:
        import dataclasses

        hw = dataclasses.replace(hardware(gpu), kernel_floor_s=floor)
    print("| workload (matrices) | implementation | predicted | measured | predicted / measured | step / Megatron's |")
    print("|---|---|---|---|---|---|")
    for name in args.workload or [BUSIEST, *WORKLOADS]:
        shapes = _shapes(name, args.divisor)
        classes = Counter(parts for _, parts, _ in shapes)
        work = [MatrixWork(parts, sum(ns_cost(p) for p in parts), n) for parts, n in classes.items()]
        measured = {impl: time_step(torch, device, impl, shapes, args.divisor, args.reps) for impl in IMPLEMENTATIONS}
        for impl in IMPLEMENTATIONS:
            vs = measured[impl] / measured["megatron"]
            if hw is None:
                print(f"| {name} ({len(shapes):,}) | {impl} | n/a | {measured[impl] * 1e3:.2f} ms | n/a | {vs:.3f} |",
                      flush=True)
                continue
            predicted = ns_seconds(work, hw, PRICES[impl], 5, "bf16")
            print(f"| {name} ({len(shapes):,}) | {impl} | {predicted * 1e3:.2f} ms | {measured[impl] * 1e3:.2f} ms | "
                  f"{predicted / measured[impl]:.3f} | {vs:.3f} |", flush=True)


if __name__ == "__main__":
    main()
