"""The step-time model's table for docs/step_time.md: Kimi K2 (the kimi_k2_muon recipe's layout, batch fixed) on 256,
1,024 and 4,096 GPUs, TP 1 and TP 2 in each Newton–Schulz TP mode, on GB300, B200 and H100, and the two published
GB300 points beside their prediction for Megatron's own Muon, ours (batched, as shipped) and ours per matrix, and
those points' sensitivity to the operator floor. Torch-free; prints markdown. Every figure is `nemo-muon plan`'s
``step_time``.

    .venv/bin/python bench/step_time_table.py
    .venv/bin/python bench/step_time_table.py --skip-scaling --kernel-floor-us 5

The scaling table prices the model's compute at the model's default (40% of each GPU's dense bf16 peak; the published
GB300 AdamW run reached 42%), so the GPUs differ in their optimizer side and their links, not in an invented rate.
"""

from __future__ import annotations

import argparse

from nemo_muon.recipes.execute import build_recipe

from nemo_muon.accounting.planner import plan_recipe

PUBLISHED = {"kimi_k2_muon": (1051.0, 1029.0), "qwen3_30b_a3b_muon": (713.0, 686.0)}
"""NVIDIA's blog, GB300 MXFP8, model TFLOP/s/GPU: (AdamW, Muon)."""


def _row(recipe_name: str, gpus: int | None, gpu: str, overrides: list[str], model_tflops: float | None,
         **plan_kwargs: object) -> dict:
    plan = plan_recipe(build_recipe(recipe_name, overrides), gpus, gpu=gpu, model_tflops=model_tflops, **plan_kwargs)
    st = plan["step_time"]
    return {"plan": plan, "st": st, "ar": st["paths"]["muon_all_reduce"], "rs": st["paths"]["muon_reduce_scatter"],
            "adamw": st["paths"]["adamw"]}


ENGINES = {"megatron": ["optimizer.engine=megatron", "optimizer.ns_split_target=none"],
           "nemo_muon": ["optimizer.ns_split_target=none"],
           "nemo_muon_per_matrix": ["optimizer.ns_split_target=none"]}
"""Implementation priced -> overrides of the recipe: Megatron's own Muon (NVIDIA's 26.02 runs), ours as shipped
(batched) and ours one matrix at a time; whole tensors for all."""


def published(floor_us: float | None = None) -> list[str]:
    lines = ["| recipe | implementation | AdamW given | published Muon/AdamW | predicted (all-reduce, the 26.02 path) "
             "| predicted (reduce-scatter) | extra step over AdamW's: predicted (all-reduce) / published | NS and "
             "update, busiest rank | most operators on a rank | gather exposed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, (adamw, muon) in PUBLISHED.items():
        for impl, overrides in ENGINES.items():
            r = _row(name, None, "gb300", overrides, adamw, implementation=impl, kernel_floor_us=floor_us)
            ratio, extra = r["st"]["throughput_ratio"], r["st"]["extra_step_s"]["muon_all_reduce"]
            implied = (adamw / muon - 1.0) * r["adamw"]["step_s"]
            lines.append(f"| {name} | {impl} | {adamw:.0f} TFLOP/s | {muon / adamw:.3f} | "
                         f"{ratio['muon_all_reduce']:.3f} | {ratio['muon_reduce_scatter']:.3f} | "
                         f"{extra * 1e3:.0f} ms / {implied * 1e3:.0f} ms ({extra / implied:.2f}x) | "
                         f"{r['ar']['ns_busiest_rank_s'] * 1e3:.0f} ms | {r['st']['launches_per_step_max']:,} | "
                         f"{r['ar']['param_gather_exposed_s'] * 1e3:.0f} ms |")
    return lines


FLOORS_US = (3.8, 5.0, 10.0, 15.0, 25.0)
"""Operator floors the sensitivity table prices: the CUDA launch alone (3.8 us), the range usually quoted for eager
PyTorch (5-25 us) and the assumed default (10 us)."""


def floor_sensitivity() -> list[str]:
    head = " | ".join(f"{f:g} us" for f in FLOORS_US)
    lines = [f"| recipe | implementation | published | {head} |", "|---|---|---|" + "---|" * len(FLOORS_US)]
    for name, (adamw, muon) in PUBLISHED.items():
        for impl in ("megatron", "nemo_muon"):
            cells = []
            for floor in FLOORS_US:
                r = _row(name, None, "gb300", ENGINES[impl], adamw, implementation=impl, kernel_floor_us=floor)
                cells.append(f"{r['st']['throughput_ratio']['muon_all_reduce']:.3f} "
                             f"(+{r['st']['extra_step_s']['muon_all_reduce'] * 1e3:.0f} ms)")
            lines.append(f"| {name} | {impl} | {muon / adamw:.3f} | " + " | ".join(cells) + " |")
    return lines


def scaling() -> list[str]:
    lines = ["| GPU | GPUs | TP, NS TP mode | DP | AdamW step | Muon all-reduce: step, ratio | Muon reduce-scatter: "
             "step, ratio | NS busiest rank | grads exposed (all-reduce) | gather exposed (all-reduce) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for gpu in ("gb300", "b200", "h100"):
        for gpus in (256, 1024, 4096):
            for tp, mode in ((1, "duplicated"), (2, "duplicated"), (2, "distributed"), (2, "blockwise")):
                sets = ["optimizer.engine=megatron", "optimizer.ns_split_target=none", f"parallelism.tp={tp}", f"optimizer.tp_mode={mode}"]
                r = _row("kimi_k2_muon", gpus, gpu, sets, None)
                ratio = r["st"]["throughput_ratio"]
                lines.append(
                    f"| {gpu} | {gpus:,} | {tp}, {mode if tp > 1 else '-'} | {r['plan']['parallelism']['dp']} | "
                    f"{r['adamw']['step_s']:.3f} s | {r['ar']['step_s']:.3f} s, {ratio['muon_all_reduce']:.3f} | "
                    f"{r['rs']['step_s']:.3f} s, {ratio['muon_reduce_scatter']:.3f} | "
                    f"{r['ar']['ns_busiest_rank_s'] * 1e3:.0f} ms | {r['ar']['grad_reduction_exposed_s'] * 1e3:.0f} ms"
                    f" | {r['ar']['param_gather_exposed_s'] * 1e3:.0f} ms |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel-floor-us", type=float, default=None, help="operator floor (default: the model's)")
    parser.add_argument("--skip-scaling", action="store_true", help="only the published points and the floor table")
    args = parser.parse_args()
    print("\n".join(published(args.kernel_floor_us)))
    print()
    print("\n".join(floor_sensitivity()))
    if not args.skip_scaling:
        print()
        print("\n".join(scaling()))


if __name__ == "__main__":
    main()
