"""`nemo-muon plan`: what a recipe will cost before it launches (layout, FLOPs, NS work per rank, memory, gathers).

Torch-free: runs on a laptop or a login node. The counting rules are in docs/flops.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from nemo_muon.launchers.bounded_yaml import MAX_MESSAGE, cut, load_yaml_file
from nemo_muon.launchers.cli_types import FINITE_POSITIVE
from nemo_muon.launchers.launch import merged_overrides

from nemo_muon._validation import shown
from nemo_muon.config.limits import MAX_WORLD_SIZE
from nemo_muon.registry import spec_named


def _fmt_flops(x: float) -> str:
    return f"{x:.3e}"


def _count(x: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f}{unit}"
    return f"{x:.0f}"


def _bytes(x: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:.0f} B"


def _human(plan: dict[str, Any]) -> str:
    par = plan["parallelism"]
    lines = [
        f"recipe {plan['recipe']} ({plan['model']}, {plan['optimizer']}"
        f"{', layer-wise' if plan['layerwise'] else ''}) on {plan['world_size']} x {plan['gpu']}",
        "layout      " + " ".join(f"{k.upper()}{v}" for k, v in par.items())
        + f"  layers/PP rank {plan['layers_per_pp_rank']}{' (uneven)' if plan['uneven_pipeline'] else ''}"
        + f"  micro-batches {plan['num_microbatches']}",
        f"params      total {_count(plan['model_params'])}, active {_count(plan['model_active_params'])}, "
        f"per rank (max) {_count(plan['params_per_rank_max'])}",
        f"model FLOPs {_fmt_flops(plan['model_flops_per_step'])} per step "
        f"({_fmt_flops(plan['model_flops_per_token'])} per token x {plan['tokens_per_step']} tokens)",
        f"NS FLOPs    {_fmt_flops(plan['ns_flops_per_step'])} per step ({plan['ns_to_model_flops']:.2%} of model), "
        f"executed {_fmt_flops(plan['ns_flops_executed_per_step'])} (TP mode {plan['tp_mode']}, "
        f"{'SYRK' if plan['syrk'] else 'GEMM'})",
        f"NS per rank max {_fmt_flops(plan['ns_flops_per_rank_max'])}, mean {_fmt_flops(plan['ns_flops_per_rank_mean'])}"
        f", imbalance {plan['ns_imbalance']:.3f} (within a stage {plan['ns_imbalance_within_stage_max']:.3f})",
    ]
    split = plan.get("ns_split")
    if split is not None:
        how = "executed" if split["executed"] else "not executed (optimizer.ns_split_target unset), would give"
        lines.append(f"            split over DP ranks (target {split['target']}), {how}: "
                     f"{split['ns_imbalance']:.3f} (within a stage {split['ns_imbalance_within_stage_max']:.3f}, "
                     f"layout bound {split['ns_imbalance_layout_bound']:.3f}), {split['split_matrices']} matrices "
                     f"split, +{split['extra_bytes_per_rank_max'] / 2**20:.1f} MiB sent per rank per step")
    t = plan["ns_time_per_step_s_at_peak"]
    matrix = spec_named(plan["optimizer"]).matrix
    if matrix is None or not matrix.newton_schulz:
        lines[-3 if split is not None else -2:] = [f"NS          none ({plan['optimizer']} runs no Newton–Schulz)"]
    elif t is None:
        lines.append(f"NS time     n/a (no peak for gpu {plan['gpu']!r})")
    else:
        lines.append(f"NS time     {t * 1e3:.1f} ms per step at the {plan['gpu']} dense bf16 peak (slowest rank)")
    by = plan["optimizer_state_bytes_per_rank_by_optimizer"]
    compared = ", ".join(f"{'layer-wise' if spec_named(name).matrix else 'distributed'} {spec_named(name).label} "
                         f"{_bytes(value)}" for name, value in by.items())
    lines.append(f"opt. state  {_bytes(plan['optimizer_state_bytes_per_rank'])} per rank (max; compare: {compared}; "
                 "fp32 master + optimizer state)")
    lines.append(f"param gather {_bytes(plan['param_gather_bytes_per_step'])} received per rank per step "
                 f"(max; all ranks {_bytes(plan['param_gather_bytes_per_step_all_ranks'])})")
    if "step_time_s" in plan:
        mfu = "" if plan["mfu_model"] is None else \
            f", MFU {plan['mfu_model']:.1%} / {plan['mfu_model_plus_ns']:.1%} of {plan['mfu_peak']}"
        lines.append(f"measured    {plan['step_time_s']} s/step: {plan['model_tflops_per_gpu']:.0f} model + "
                     f"{plan['ns_tflops_per_gpu']:.0f} NS = {plan['model_plus_ns_tflops_per_gpu']:.0f} TFLOP/s/GPU{mfu}")
    lines += _step_time_lines(plan.get("step_time"), plan["gpu"])
    lines.append(f"counting    {plan['counting_rule']}")
    return "\n".join(lines)


def _step_time_lines(st: dict[str, Any] | None, gpu: str) -> list[str]:
    if st is None:
        return [f"step time   n/a (no hardware constants for gpu {gpu!r}; docs/step_time.md)"]
    paths = st["paths"]
    adamw = paths["adamw"]
    lines = [f"step time   predicted on {gpu} ({st['model_tflops_per_gpu']:.0f} model TFLOP/s/GPU, "
             f"{st['model_tflops_source']}; operator floor {st['kernel_floor_us']:g} us, "
             f"{st['kernel_floor_source'].split(':')[0]}; {st['implementation']}'s Muon): AdamW {adamw['step_s']:.3f} s"]
    for name, label in (("muon_all_reduce", "all-reduce layout"), ("muon_reduce_scatter", "reduce-scatter layout")):
        p = paths[name]
        lines.append(f"            Muon, {label}: {p['step_s']:.3f} s (+{st['extra_step_s'][name] * 1e3:.0f} ms), "
                     f"{st['throughput_ratio'][name]:.3f} of AdamW's throughput (NS busiest rank {p['ns_busiest_rank_s'] * 1e3:.0f} ms, optimizer "
                     f"{p['optimizer_s'] * 1e3:.0f} ms, exposed: grads {p['grad_reduction_exposed_s'] * 1e3:.0f} ms, "
                     f"gather {p['param_gather_exposed_s'] * 1e3:.0f} ms)")
    return lines


def _load_gpu_peaks_file(path: Path) -> None:
    """Register every GPU of a --gpu-peaks file, read as bounded YAML (`bounded_yaml.load_yaml_file`), all or none
    (`gpu_peaks.register_gpu_peaks`): each ValueError one line naming the file."""
    from nemo_muon.accounting.gpu_peaks import register_gpu_peaks

    try:
        register_gpu_peaks(load_yaml_file(path), where=str(path))
    except ValueError as e:
        raise ValueError(cut(str(e), MAX_MESSAGE)) from None


@click.command("plan")
@click.option("--recipe", "recipe_name", required=True, help="Recipe name (list them with `nemo-muon recipes`).")
@click.option("--gpus", type=click.IntRange(min=1, max=MAX_WORLD_SIZE), default=None,
              help="World size to plan for (default: the recipe's); layout and batch stay the recipe's.")
@click.option("--gpu", default=None, help="GPU whose peak prices NS time and MFU (default: the recipe's).")
@click.option("--gpu-peaks", type=click.Path(exists=True, dir_okay=False), default=None,
              help="YAML file adding GPUs to the peak table: {name: {bf16: TFLOP/s, fp8: TFLOP/s, source: text}}.")
@click.option("--syrk", is_flag=True, help="Count NS with SYRK for X·Xᵀ and A·A (15m²n + 5m³ for 5 steps).")
@click.option("--pipeline-layout", default=None,
              help="Explicit Megatron pipeline layout string, e.g. 'Et|(tt|)*30L' (default: derived from PP·VP).")
@click.option("--step-time", type=FINITE_POSITIVE, default=None,
              help="A measured step time in seconds: adds TFLOP/s/GPU and MFU, model-only and model + NS.")
@click.option("--model-tflops", type=FINITE_POSITIVE, default=None, metavar="TFLOP/s",
              help="Achieved model TFLOP/s/GPU of the AdamW baseline: the step-time model's compute (default: an "
              "assumed 40% of the GPU's dense bf16 peak).")
@click.option("--kernel-floor-us", type=FINITE_POSITIVE, default=None, metavar="MICROSECONDS",
              help="Host time of one eager operator, the step-time model's floor (default: an assumed 10 us; "
              "bench/gpu/step_time_ns.py measures it).")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@merged_overrides
def plan(recipe_name: str, gpus: int | None, gpu: str | None, gpu_peaks: str | None, syrk: bool,
         pipeline_layout: str | None, step_time: float | None, model_tflops: float | None,
         kernel_floor_us: float | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Validate a recipe's layout and print what Muon will cost on each rank, before launching it; overrides are
    key=value (trainer.global_batch_size=8192), checked as launch and --dryrun check them."""
    from nemo_muon.recipes.execute import build_recipe

    from nemo_muon.accounting.gpu_peaks import known_gpus
    from nemo_muon.accounting.planner import plan_recipe

    try:
        if gpu_peaks:
            _load_gpu_peaks_file(Path(gpu_peaks))
        if gpu is not None and gpu.lower() not in known_gpus():
            raise ValueError(f"--gpu must be one of {tuple(known_gpus())} (or add it with --gpu-peaks); got {shown(gpu)}")
        recipe = build_recipe(recipe_name, list(overrides))  # the one validation launch and --dryrun run
        result = plan_recipe(recipe, gpus, gpu=gpu.lower() if gpu else None, syrk=syrk, step_time_s=step_time,
                             stage_layers=pipeline_layout, model_tflops=model_tflops, kernel_floor_us=kernel_floor_us)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    click.echo(json.dumps(result, sort_keys=False) if as_json else _human(result))
