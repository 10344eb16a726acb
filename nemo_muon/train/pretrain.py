"""`pretrain(recipe)`: the torch backend's entry point, single-process or under torchrun (one rank per process).

Under torchrun (NeMo-Run's LocalExecutor runs it) the environment carries RANK / WORLD_SIZE / MASTER_ADDR, and
the default process group is created here with gloo on CPUs (``system.gpu == 'cpu'``) or NCCL on GPUs, then
handed to the loop explicitly. Without that environment it trains in this process (world size 1). An already
initialized default group (tests, `spawn.launch_local`) is used as it is.
"""

from __future__ import annotations

import os
from typing import Any

from nemo_muon.config.recipe import TrainerConfig, TrainingRecipe

SKIP_LIMIT_DEFAULT: int = TrainerConfig.__dataclass_fields__["max_consecutive_skips"].default
"""`--max-consecutive-skips` defaults to the recipe's value; the config's default is this one (one source)."""


def _init_from_env(recipe: TrainingRecipe) -> tuple[Any, bool]:
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.group.WORLD, False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from datetime import timedelta

        backend = "gloo" if recipe.system.gpu == "cpu" else "nccl"
        # a stalled rank fails every collective after system.collective_timeout s, so the job ends (torchrun exits)
        dist.init_process_group(backend, init_method="env://",
                                timeout=timedelta(seconds=recipe.system.collective_timeout))
        return dist.group.WORLD, True
    return None, False


def pretrain(recipe: TrainingRecipe, **kwargs: Any) -> dict[str, Any]:
    """Train ``recipe`` with the torch backend on this process's rank; returns the run summary (see loop.train).

    ``kwargs`` go to `nemo_muon.train.loop.train` (``stop_after_steps``).
    """
    recipe.validate()
    if recipe.backend != "torch":
        raise ValueError(f"recipe.backend must be 'torch' for nemo_muon.train.pretrain; got {recipe.backend!r} "
                         "(the 'megatron' backend runs in the NeMo container)")
    import torch

    from nemo_muon.train.loop import train

    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    group, owned = _init_from_env(recipe)
    try:
        return train(recipe, group=group, **kwargs)
    finally:
        if owned:
            import torch.distributed as dist

            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """`python -m nemo_muon.train.pretrain <recipe> [--resume [--allow-optimizer-change]]`: a torch-backend run by
    hand (torchrun runs it on each rank). The name and flags are resolved once (`recipes.execute.build_recipe`, the
    one validation), then run on this rank (`recipes.execute.run_resolved`). Returns the exit code: a refusal or
    divergence stop prints one line (rank 0)."""
    import argparse

    from nemo_muon.recipes.execute import build_recipe, run_resolved

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("recipe", help="recipe name (nemo-muon recipes lists them)")
    parser.add_argument("--resume", action="store_true", help="resume from the newest verified checkpoint")
    parser.add_argument("--allow-optimizer-change", action="store_true",
                        help="let the resume change optimizer hyper-parameters (= checkpoint.allow_optimizer_change)")
    parser.add_argument("--max-consecutive-skips", type=int, default=None, metavar="N",
                        help="stop after N consecutive skipped steps, 0 = never (= trainer.max_consecutive_skips; "
                             f"default: the recipe's, {SKIP_LIMIT_DEFAULT} unless the recipe sets it)")
    args = parser.parse_args(argv)
    overrides = [*(["checkpoint.resume=true"] if args.resume else []),
                 *(["checkpoint.allow_optimizer_change=true"] if args.allow_optimizer_change else []),
                 *([f"trainer.max_consecutive_skips={args.max_consecutive_skips}"]
                   if args.max_consecutive_skips is not None else [])]
    try:
        recipe = build_recipe(args.recipe, overrides)
    except ValueError as e:
        parser.error(str(e))
    if recipe.backend != "torch":
        parser.error(f"recipe.backend must be 'torch' for nemo_muon.train.pretrain; got {recipe.backend!r} (run "
                     "megatron recipes with python -m nemo_muon.launchers.run_recipe)")
    return run_resolved(recipe)


if __name__ == "__main__":
    raise SystemExit(main())
