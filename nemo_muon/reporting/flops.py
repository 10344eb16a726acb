"""Fill model and Newton-Schulz TFLOP/s per GPU from a recipe's FLOPs per step (nemo_muon.accounting), torch-free.

Megatron logs carry model TFLOP/s/GPU but not the optimizer's NS work; our JSONL may lack both on old runs.
Given the recipe that produced a run, each step with a step time gets the missing numbers:
``flops_per_step / step_time_s / world_size / 1e12``. NS FLOPs are those of one optimizer step of every hidden
matrix counted once (``plan_recipe``'s ``ns_flops_per_step``); optimizers whose registry entry runs no
Newton–Schulz (``spec.matrix.newton_schulz``) do no NS work (0).
"""

from __future__ import annotations

from typing import Any

from nemo_muon.reporting.records import RunLog


def recipe_flops_per_step(recipe: Any, world_size: int | None = None) -> tuple[float, float]:
    """(model FLOPs, NS FLOPs) of one step of ``recipe`` on ``world_size`` GPUs (default: the recipe's)."""
    from nemo_muon.accounting.planner import plan_recipe
    from nemo_muon.registry import spec_for

    plan = plan_recipe(recipe, world_size)
    matrix = spec_for(recipe.optimizer).matrix
    ns = float(plan["ns_flops_per_step"]) if matrix is not None and matrix.newton_schulz else 0.0
    return float(plan["model_flops_per_step"]), ns


def fill_tflops(run: RunLog, recipe: Any) -> RunLog:
    """Fill missing model_tflops / ns_tflops of timed steps in place (and return the run); sets recipe/optimizer
    and world size from the recipe where the log had none."""
    world = run.world_size or recipe.world_size
    model_fps, ns_fps = recipe_flops_per_step(recipe, world)
    for p in run.train:
        if not p.step_time_s:
            continue
        if p.model_tflops is None:
            p.model_tflops = model_fps / p.step_time_s / world / 1e12
        if p.ns_tflops is None:
            p.ns_tflops = ns_fps / p.step_time_s / world / 1e12
    run.world_size = world
    run.recipe = run.recipe or recipe.name
    run.optimizer = run.optimizer or recipe.optimizer.name
    return run
