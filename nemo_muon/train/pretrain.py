"""`pretrain(recipe)`: the torch backend's entry point, single-process or under torchrun (one rank per process).

Under torchrun (NeMo-Run's LocalExecutor runs it) the environment carries RANK / WORLD_SIZE / MASTER_ADDR, and
the default process group is created here with gloo on CPUs (``system.gpu == 'cpu'``) or NCCL on GPUs, then
handed to the loop explicitly. Without that environment it trains in this process (world size 1). An already
initialized default group (tests, `spawn.launch_local`) is used as it is.
"""

from __future__ import annotations

import os
from typing import Any

from nemo_muon.config.recipe import TrainingRecipe


def _init_from_env(recipe: TrainingRecipe) -> tuple[Any, bool]:
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.group.WORLD, False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        backend = "gloo" if recipe.system.gpu == "cpu" else "nccl"
        dist.init_process_group(backend, init_method="env://")
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


def main() -> None:
    """`python -m nemo_muon.train.pretrain <recipe> [--resume]`: what torchrun runs for the torch backend."""
    import argparse

    from nemo_muon.recipes import get_recipe

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("recipe", help="recipe name (nemo-muon plan --list shows them)")
    parser.add_argument("--resume", action="store_true", help="resume from the newest verified checkpoint")
    args = parser.parse_args()
    recipe = get_recipe(args.recipe)
    if args.resume:
        recipe.checkpoint.resume = True
    pretrain(recipe)


if __name__ == "__main__":
    main()
