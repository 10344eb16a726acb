"""NorMuon vs Muon on the demo's model and data: steps each needs to reach AdamW's final validation loss.

Trains ``tiny_<family>_muon``, ``tiny_<family>_normuon`` and ``tiny_<family>_adamw`` (same model init, data order,
seed, schedule and learning rate; NorMuon differs from Muon by its update only) on 2 gloo ranks of this CPU, each as
the demo trains its runs, then prints for Muon and NorMuon the step at which their validation loss first reaches
AdamW's final one, over AdamW's steps (the demo's ratio; target <= 0.7), and NorMuon's steps over Muon's.

    .venv/bin/python bench/normuon.py [--family kimi_k2] [--steps 150]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from nemo_muon.recipes.execute import build_recipe

from nemo_muon.reporting.loader import load_run
from nemo_muon.reporting.summary import compare_pair
from nemo_muon.train.loop import run_dir_of
from nemo_muon.train.spawn import launch_local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("kimi_k2",), default="kimi_k2")
    parser.add_argument("--steps", type=int, default=None, help="default: the recipes' max_steps (150)")
    parser.add_argument("--runs-root", default="runs")
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dirs: dict[str, Path] = {}
    for opt in ("muon", "normuon", "adamw"):
        name = f"tiny_{args.family}_{opt}"
        overrides = [f"logging.root={args.runs_root}", f"logging.run_name={name}-bench-{stamp}",
                     f"data.tokenizer_dir={Path(args.runs_root) / '_cache'}"]
        if args.steps is not None:
            overrides.append(f"trainer.max_steps={args.steps}")
        recipe = build_recipe(name, overrides)
        print(f"== {name}: {recipe.optimizer.name}, {recipe.trainer.max_steps} steps", flush=True)
        launch_local(recipe)
        dirs[opt] = run_dir_of(recipe)
    adamw = load_run(dirs["adamw"])
    steps = {}
    for opt in ("muon", "normuon"):
        c = compare_pair(load_run(dirs[opt]), adamw)
        if c is None:
            raise SystemExit(f"{dirs[opt]} and {dirs['adamw']} must both have validation curves")
        steps[opt] = c.muon_steps
        ratio = "never" if c.muon_steps is None else f"{c.muon_steps / c.adamw_steps:.2f}"
        final = load_run(dirs[opt]).val[-1].val_loss
        print(f"{opt:8s} reaches AdamW's final {c.metric} {c.target_loss:.4f} at step {c.muon_steps} of "
              f"{c.adamw_steps}: ratio {ratio} (target <= 0.7); its final val loss {final:.4f}")
    if steps["muon"] and steps["normuon"]:
        print(f"NorMuon / Muon steps to AdamW's final val loss: {steps['normuon'] / steps['muon']:.2f}")


if __name__ == "__main__":
    main()
