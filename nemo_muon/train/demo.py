"""`make demo` = `python -m nemo_muon.train.demo`: tiny Kimi K2 pretraining, layer-wise Muon vs AdamW, on a CPU.

Runs the recipes ``tiny_<family>_<optimizer>`` (``--optimizer``, default Muon) and ``tiny_<family>_<baseline>`` (the
optimizer's registry entry's ``baseline``: AdamW) back to back (same model init, data order and seed, 2 gloo ranks
each), then writes ``reports/demo-<family>-<time>/`` (report.md, loss-vs-step and loss-vs-time PNGs) with
`nemo_muon.reporting.write_report` and prints the table: final train/val loss, tokens/s, model and model+NS TFLOP/s,
optimizer step share, and the step at which the optimizer reaches its baseline's final validation loss.
Every number of the runs comes from the recipes (docs/cpu_pipeline.md); ``--steps`` is the only override, and the
recipes are resolved and checked as every entry point's are (a ``--steps`` below the warmup is refused).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nemo_muon._validation import check_choice
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.registry import spec_named, specs

DEMO_FAMILIES = ("kimi_k2", "qwen3_moe")
DEMO_OPTIMIZER = "muon"
"""What ``make demo`` shows unless ``--optimizer`` says otherwise; it runs against its registry entry's baseline."""


def compared_optimizers() -> tuple[str, ...]:
    """The registered optimizers the demo can show: those with a baseline (`OptimizerSpec.baseline`)."""
    return tuple(s.name for s in specs() if s.baseline is not None)


def demo_pair(optimizer: str = DEMO_OPTIMIZER) -> tuple[str, str]:
    """(``optimizer``, its baseline): the registered names of the demo's two runs."""
    check_choice("optimizer", optimizer, compared_optimizers())
    return optimizer, spec_named(optimizer).baseline  # type: ignore[return-value]


def demo_recipes(family: str, *, steps: int | None, runs_root: str, stamp: str,
                 optimizer: str = DEMO_OPTIMIZER) -> list[TrainingRecipe]:
    """The recipes of the demo (`demo_pair`: ``tiny_<family>_<optimizer>``, then its baseline's), named
    ``<recipe>-<stamp>`` under ``runs_root``: each resolved once (`recipes.execute.build_recipe`: the registry, the
    demo's settings as overrides, the one validation of a run, `check_run`), as every other entry point resolves
    its recipe."""
    from nemo_muon.recipes.execute import build_recipe

    if family not in DEMO_FAMILIES:
        raise ValueError(f"family must be one of {DEMO_FAMILIES}; got {family!r}")
    recipes = []
    for opt in demo_pair(optimizer):
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
             reports_root: str = "reports", adjust: Callable[[TrainingRecipe], None] | None = None,
             optimizer: str = DEMO_OPTIMIZER) -> dict[str, Any]:
    """Resolve the demo's recipes (`demo_recipes`), then `train_and_report` them.

    ``adjust`` may change the recipes before they run (tests shrink them, or set ``data.corpus_root``).
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    recipes = demo_recipes(family, steps=steps, runs_root=runs_root, stamp=stamp, optimizer=optimizer)
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
    parser.add_argument("--optimizer", choices=compared_optimizers(), default=DEMO_OPTIMIZER,
                        help=f"the optimizer run against its baseline (default {DEMO_OPTIMIZER}; its family's "
                             "tiny_<family>_<optimizer> recipe)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the recipe's)")
    parser.add_argument("--runs-root", default="runs", help="where run folders go (default runs/)")
    parser.add_argument("--reports-root", default="reports", help="where the report goes (default reports/)")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be an integer >= 1; got {args.steps}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:  # a refusal of the resolved recipes (e.g. --steps below the warmup) is a usage error, before any training
        recipes = demo_recipes(args.family, steps=args.steps, runs_root=args.runs_root, stamp=stamp,
                               optimizer=args.optimizer)
    except ValueError as err:
        parser.error(f"--optimizer {args.optimizer} --steps {args.steps}: {err} (the demo takes --steps alone; for "
                     f"other overrides run the recipes with nemo-muon launch --recipe tiny_{args.family}_"
                     f"{args.optimizer} key=value ...)")
    from nemo_muon.train.refusals import run_or_refuse

    return run_or_refuse(lambda: train_and_report(recipes, family=args.family, stamp=stamp,
                                                  reports_root=args.reports_root), rank=0)


if __name__ == "__main__":
    raise SystemExit(main())
