"""The step-time model's table for docs/step_time.md: Kimi K2 (the kimi_k2_muon recipe's layout, batch fixed) on 256,
1,024 and 4,096 GPUs, TP 1 and TP 2 in each Newton–Schulz TP mode, on GB300, B200 and H100, and the two published
GB300 points beside their prediction. Torch-free; prints markdown. Every figure is `nemo-muon plan`'s ``step_time``.

    .venv/bin/python bench/step_time_table.py

The scaling table prices the model's compute at the model's default (40% of each GPU's dense bf16 peak; the published
GB300 AdamW run reached 42%), so the GPUs differ in their optimizer side and their links, not in an invented rate.
"""

from __future__ import annotations

import argparse

from nemo_muon.recipes.execute import build_recipe

from nemo_muon.accounting.planner import plan_recipe

PUBLISHED = {"kimi_k2_muon": (1051.0, 1029.0), "qwen3_30b_a3b_muon": (713.0, 686.0)}
"""NVIDIA's blog, GB300 MXFP8, model TFLOP/s/GPU: (AdamW, Muon)."""


def _row(recipe_name: str, gpus: int | None, gpu: str, overrides: list[str], model_tflops: float | None) -> dict:
    plan = plan_recipe(build_recipe(recipe_name, overrides), gpus, gpu=gpu, model_tflops=model_tflops)
    st = plan["step_time"]
    return {"plan": plan, "st": st, "ar": st["paths"]["muon_all_reduce"], "rs": st["paths"]["muon_reduce_scatter"],
            "adamw": st["paths"]["adamw"]}


def published() -> list[str]:
    lines = ["| recipe (Megatron's own Muon, 26.02) | AdamW given | published Muon/AdamW | predicted (all-reduce, the "
             "26.02 path) | predicted (reduce-scatter) | NS busiest rank | gather exposed |",
             "|---|---|---|---|---|---|---|"]
    for name, (adamw, muon) in PUBLISHED.items():
        r = _row(name, None, "gb300", ["optimizer.engine=megatron", "optimizer.ns_split_target=none"], adamw)
        ratio = r["st"]["throughput_ratio"]
        lines.append(f"| {name} | {adamw:.0f} TFLOP/s | {muon / adamw:.3f} | {ratio['muon_all_reduce']:.3f} | "
                     f"{ratio['muon_reduce_scatter']:.3f} | {r['ar']['ns_busiest_rank_s'] * 1e3:.0f} ms | "
                     f"{r['ar']['param_gather_exposed_s'] * 1e3:.0f} ms |")
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
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print("\n".join(published()))
    print()
    print("\n".join(scaling()))


if __name__ == "__main__":
    main()
