"""The job entry point every launcher runs on each rank: ``python -m nemo_muon.launchers.run_recipe --recipe-file PATH``.

Loads the resolved recipe document ``nemo-muon launch`` wrote (`nemo_muon.recipes.resolved`: checked by the one
validation, nothing re-parsed); by hand, ``--recipe NAME [key=value ...]`` resolves the name and overrides once, in
this process. Records how the job was launched in ``<run dir>/launch.json`` (rank 0; secret values masked) and runs
the recipe on this rank with `nemo_muon.recipes.execute.run_resolved`: the backend's ``pretrain(recipe)``,
``nemo_muon.train.pretrain`` (torch) or ``nemo_muon.megatron.bridge.container`` (megatron, in the NeMo container).
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

from nemo_muon.config.files import make_folder, write_file
from nemo_muon.rank_env import rank_env_from_slurm
from nemo_muon.secret_policy import MASK, is_secret, shown_redacted

LAUNCH_ENV_VAR = "NEMO_MUON_LAUNCH_ENV"
"""Comma-separated names of the variables the launcher set for the job (recorded in launch.json)."""


def launch_record(recipe_name: str | None, overrides: Sequence[str], env: dict[str, str],
                  recipe_file: str | None = None) -> dict[str, object]:
    """What launch.json holds: the recipe, overrides, the resolved document's path (None when the job resolved the
    name itself), and each launcher-set variable (secrets as '**** (set)')."""
    names = [n for n in env.get(LAUNCH_ENV_VAR, "").split(",") if n]
    shown = {}
    for name in names:
        if name not in env:
            shown[name] = None
        elif is_secret(name, env[name]):
            shown[name] = f"{MASK} (set)"
        else:
            shown[name] = env[name]
    return {"recipe": recipe_name, "overrides": list(overrides), "recipe_file": recipe_file, "env": shown,
            "world_size": env.get("WORLD_SIZE"), "slurm_job_id": env.get("SLURM_JOB_ID")}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nemo_muon.launchers.run_recipe",
                                     description="Run one nemo-muon recipe on this rank (the command launchers "
                                                 "submit: --recipe-file; by hand: --recipe NAME [key=value ...]).")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--recipe-file", metavar="PATH",
                       help="a resolved recipe document (what nemo-muon launch writes into the run folder)")
    which.add_argument("--recipe", help="recipe name (nemo-muon launch --help lists them), resolved here once")
    parser.add_argument("overrides", nargs="*", help="key=value overrides with --recipe, e.g. trainer.max_steps=10")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Load (``--recipe-file``) or build (``--recipe NAME overrides``) the recipe and run it on this rank
    (`nemo_muon.recipes.execute.run_resolved`); returns the process exit code."""
    args = _parser().parse_args(argv)

    from nemo_muon.recipes.execute import build_recipe, run_resolved
    from nemo_muon.recipes.resolved import from_document, read_document

    rank_env_from_slurm(os.environ)  # type: ignore[arg-type]
    try:
        if args.recipe_file is not None:
            if args.overrides:
                raise ValueError(f"overrides must be empty with --recipe-file (the document is already resolved: "
                                 f"launch again with them); got {shown_redacted(args.overrides)}")
            document = read_document(args.recipe_file)
            recipe = from_document(document)
            name, overrides = document["source"]["recipe"], document["source"]["overrides"]
        else:
            recipe = build_recipe(args.recipe, args.overrides)
            name, overrides = args.recipe, args.overrides
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") == "0":
        run_dir = Path(recipe.logging.root) / (recipe.logging.run_name or recipe.name)
        record = launch_record(name, overrides, dict(os.environ), args.recipe_file)
        try:  # inside the run folder, atomically, never through a planted link (nemo_muon.config.files)
            make_folder(run_dir, what="the run folder")
            write_file(run_dir / "launch.json", json.dumps(record, indent=2) + "\n", what="launch.json")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return run_resolved(recipe)  # a refusal: one line from rank 0, exit code 2 (3: diverged)


if __name__ == "__main__":
    raise SystemExit(main())
