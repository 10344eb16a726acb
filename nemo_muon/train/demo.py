"""`make demo` = `python -m nemo_muon.train.demo`: tiny Kimi K2 pretraining, layer-wise Muon vs AdamW, on a CPU.

Runs the recipes ``tiny_<family>_muon`` and ``tiny_<family>_adamw`` back to back (same model init, data order and
seed, 2 gloo ranks each), then writes ``reports/demo-<family>-<time>/`` (report.md, loss-vs-step and loss-vs-time
PNGs) with `nemo_muon.reporting.write_report` and prints the table: final train/val loss, tokens/s, model and
model+NS TFLOP/s, optimizer step share, and the step at which Muon reaches AdamW's final validation loss.
Every number of the runs comes from the recipes (docs/cpu_pipeline.md); ``--steps`` is the only override, and the
recipes are resolved and checked as every entry point's are (a ``--steps`` below the warmup is refused).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nemo_muon.config.recipe import TrainingRecipe

DEMO_FAMILIES = ("kimi_k2", "qwen3_moe")


def demo_recipes(family: str, *, steps: int | None, runs_root: str, stamp: str) -> list[TrainingRecipe]:
    """The Muon and AdamW recipes of the demo, named ``<recipe>-<stamp>`` under ``runs_root``: each resolved once
    (`recipes.execute.build_recipe`: the registry, the demo's settings as overrides, the one validation of a run,
    `check_run`), as every other entry point resolves its recipe."""
    from nemo_muon.recipes.execute import build_recipe

    if family not in DEMO_FAMILIES:
        raise ValueError(f"family must be one of {DEMO_FAMILIES}; got {family!r}")
    recipes = []
    for opt in ("muon", "adamw"):
        name = f"tiny_{family}_{opt}"
        overrides = [f"logging.root={runs_root}", f"logging.run_name={name}-{stamp}"]
        if steps is not None:
            overrides.append(f"trainer.max_steps={steps}")
        recipe = build_recipe(name, overrides)
        if recipe.data.tokenizer_dir is None:  # one tokenizer cache for all demos, not one per run
            recipe = build_recipe(name, [*overrides, f"data.tokenizer_dir={Path(runs_root) / '_cache'}"])
        recipes.append(recipe)
    return recipes


def run_demo(family: str = "kimi_k2", *, steps: int | None = None, runs_root: str = "runs",
             reports_root: str = "reports", adjust: Callable[[TrainingRecipe], None] | None = None
             ) -> dict[str, Any]:
    """Resolve the demo's recipes (`demo_recipes`), then `train_and_report` them.

    ``adjust`` may change the recipes before they run (tests shrink them, or set ``data.corpus_root``).
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    recipes = demo_recipes(family, steps=steps, runs_root=runs_root, stamp=stamp)
    return train_and_report(recipes, family=family, stamp=stamp, reports_root=reports_root, adjust=adjust)


def train_and_report(recipes: list[TrainingRecipe], *, family: str, stamp: str, reports_root: str,
                     adjust: Callable[[TrainingRecipe], None] | None = None) -> dict[str, Any]:
    """Train the resolved runs on local gloo ranks and write the report ``<reports_root>/demo-<family>-<stamp>``;
    returns {'report': path, 'table': text, 'runs': [summaries]}."""
    from nemo_muon.reporting import render_table, write_report
    from nemo_muon.train.loop import run_dir_of
    from nemo_muon.train.spawn import launch_local

    summaries = []
    for r in recipes:
        if adjust is not None:
            adjust(r)
            r.validate()
        t = r.trainer
        print(f"== {r.name}: {r.optimizer.name} (lr {r.optimizer.lr:g}), {r.world_size} gloo ranks, {t.max_steps} "
              f"steps x {t.global_batch_size} x {t.seq_length} tokens -> {run_dir_of(r)}", flush=True)
        summaries.append(launch_local(r))
    run_dirs = [run_dir_of(r) for r in recipes]
    out = Path(reports_root) / f"demo-{family}-{stamp}"
    md = write_report(run_dirs, out)
    table = render_table(run_dirs)
    print("\n" + table)
    print(f"report: {md}\nplots:  {out / 'loss_vs_step.png'}, {out / 'loss_vs_time.png'}")
    return {"report": md, "table": table, "runs": summaries}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemo_muon.train.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=DEMO_FAMILIES, default="kimi_k2", help="model family (default kimi_k2)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the recipe's)")
    parser.add_argument("--runs-root", default="runs", help="where run folders go (default runs/)")
    parser.add_argument("--reports-root", default="reports", help="where the report goes (default reports/)")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be an integer >= 1; got {args.steps}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:  # a refusal of the resolved recipes (e.g. --steps below the warmup) is a usage error, before any training
        recipes = demo_recipes(args.family, steps=args.steps, runs_root=args.runs_root, stamp=stamp)
    except ValueError as err:
        parser.error(f"--steps {args.steps}: {err} (the demo takes --steps alone; for other overrides run the "
                     f"recipes with nemo-muon launch --recipe tiny_{args.family}_muon key=value ...)")
    from nemo_muon.train.refusals import run_or_refuse

    return run_or_refuse(lambda: train_and_report(recipes, family=args.family, stamp=stamp,
                                                  reports_root=args.reports_root), rank=0)


if __name__ == "__main__":
    raise SystemExit(main())
