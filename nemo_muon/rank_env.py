"""A rank's place in the job from Slurm's task variables, where ``srun`` starts one task per GPU without torchrun."""

from __future__ import annotations

from collections.abc import MutableMapping


def rank_env_from_slurm(env: MutableMapping[str, str]) -> None:
    """Fill RANK/WORLD_SIZE/LOCAL_RANK from Slurm's task variables when no launcher (torchrun) set them."""
    if "RANK" in env or "SLURM_PROCID" not in env or int(env.get("SLURM_NTASKS", "1")) <= 1:
        return
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env["SLURM_NTASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
