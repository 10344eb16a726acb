"""The job entry point every launcher runs: ``python -m nemo_muon.launchers.run_recipe --recipe NAME [key=value ...]``.

Builds the recipe, applies the overrides (nemo_muon.recipes.overrides), records how the job was launched in
``<run dir>/launch.json`` (rank 0; secret values masked) and calls the backend's ``pretrain(recipe)``:
``nemo_muon.train.pretrain`` (torch) or ``nemo_muon.megatron.bridge`` (megatron, in the NeMo container).
A small .py corpus instead of the stdlib is the override ``data.corpus_root=<dir>``.
Under ``srun`` with one task per GPU (no torchrun), RANK / WORLD_SIZE / LOCAL_RANK come from SLURM_PROCID /
SLURM_NTASKS / SLURM_LOCALID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from nemo_muon.secret_policy import MASK, is_secret

LAUNCH_ENV_VAR = "NEMO_MUON_LAUNCH_ENV"
"""Comma-separated names of the variables the launcher set for the job (recorded in launch.json)."""


def rank_env_from_slurm(env: dict[str, str]) -> None:
    """Fill RANK/WORLD_SIZE/LOCAL_RANK from Slurm's task variables when no launcher (torchrun) set them."""
    if "RANK" in env or "SLURM_PROCID" not in env or int(env.get("SLURM_NTASKS", "1")) <= 1:
        return
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env["SLURM_NTASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")


def launch_record(recipe_name: str, overrides: Sequence[str], env: dict[str, str]) -> dict[str, object]:
    """What launch.json holds: the recipe, overrides, and each launcher-set variable (secrets as '**** (set)')."""
    names = [n for n in env.get(LAUNCH_ENV_VAR, "").split(",") if n]
    shown = {}
    for name in names:
        if name not in env:
            shown[name] = None
        elif is_secret(name, env[name]):
            shown[name] = f"{MASK} (set)"
        else:
            shown[name] = env[name]
    return {"recipe": recipe_name, "overrides": list(overrides), "env": shown,
            "world_size": env.get("WORLD_SIZE"), "slurm_job_id": env.get("SLURM_JOB_ID")}


def main(argv: Sequence[str] | None = None) -> int:
    """Build and run the recipe; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m nemo_muon.launchers.run_recipe",
                                     description="Run one nemo-muon recipe (the command launchers submit).")
    parser.add_argument("--recipe", required=True, help="recipe name (nemo-muon launch --help lists them)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.max_steps=10")
    args = parser.parse_args(argv)

    from nemo_muon.recipes.execute import build_recipe, pretrain_recipe

    rank_env_from_slurm(os.environ)  # type: ignore[arg-type]
    try:
        recipe = build_recipe(args.recipe, args.overrides)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") == "0":
        run_dir = Path(recipe.logging.root) / (recipe.logging.run_name or recipe.name)
        run_dir.mkdir(parents=True, exist_ok=True)
        record = launch_record(args.recipe, args.overrides, dict(os.environ))
        (run_dir / "launch.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    from nemo_muon.train.refusals import run_or_refuse  # a refusal: one line from rank 0, exit code 2 (3: diverged)

    return run_or_refuse(lambda: pretrain_recipe(recipe), rank=int(os.environ.get("RANK", "0")))


if __name__ == "__main__":
    raise SystemExit(main())
