"""``nemo-muon report``: tables and plots from run folders (metrics.jsonl) and Megatron/Bridge log files."""

from __future__ import annotations

import json
from pathlib import Path

import click

from nemo_muon._validation import shown


@click.command("report")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"), show_default=True,
              help="Folder for report.md and the PNG plots.")
@click.option("--recipe", default=None,
              help="Recipe of the runs, to compute model and NS TFLOP/s/GPU their logs lack [default: from the run].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (runs, pairs, report path).")
def report(paths: tuple[Path, ...], out: Path, recipe: str | None, as_json: bool) -> None:
    """Summarize runs: final losses, tokens/s, TFLOP/s/GPU (model and model+NS), optimizer share, Muon vs AdamW.

    PATHS may be a glob of run folders (runs/*): a folder that is no run (runs/_cache) is skipped, with a note."""
    from nemo_muon.reporting import NotARun, analyze, load_run, text_table, write_report_for
    from nemo_muon.reporting.flops import fill_tflops

    runs, skipped = [], []
    try:
        for path in paths:
            try:
                runs.append(load_run(path))
            except NotARun:  # `report runs/*`: a folder beside the runs (runs/_cache) is no run
                skipped.append(path)
    except (ValueError, OSError) as e:
        raise click.UsageError(str(e)) from None
    if not runs:
        raise click.UsageError(f"PATHS must name at least one run folder (with metrics.jsonl) or Megatron/Bridge log; "
                               f"got none among {shown([str(p) for p in paths])}: each has no metrics.jsonl and no log "
                               "with iteration lines")
    for path in skipped:
        click.echo(f"skipped {shown(str(path))}: not a run (no metrics.jsonl, no Megatron/Bridge log with iteration "
                   "lines)", err=True)
    recipe_obj = None
    if recipe is not None:
        from nemo_muon.recipes import get_recipe, list_recipes

        if recipe not in list_recipes():
            raise click.UsageError(f"--recipe must be one of {tuple(list_recipes())}; got {shown(recipe)}")
        recipe_obj = get_recipe(recipe)
    for run in runs:
        chosen = recipe_obj or _recipe_of(run.recipe)
        if chosen is not None:
            try:
                fill_tflops(run, chosen)
            except ValueError as e:
                raise click.UsageError(f"cannot compute TFLOP/s of {run.name} with recipe {chosen.name}: {e}") from None
            # runs logged before the metrics said their device: the recipe's (the throughput plot's unit)
            run.header.setdefault("device", "cpu" if chosen.system.gpu == "cpu" else "cuda")
    try:  # inside --out only, never through a planted link (nemo_muon.config.files)
        md = write_report_for(runs, out)
    except (ValueError, OSError) as e:
        raise click.UsageError(str(e)) from None
    summaries, pairs = analyze(runs)
    if as_json:
        click.echo(json.dumps({"report": str(md), "runs": [s.as_dict() for s in summaries],
                               "pairs": [p.as_dict() for p in pairs], "skipped": [str(p) for p in skipped]},
                              indent=2))
    else:
        from nemo_muon.reporting.machine_load import load_caveat

        click.echo(text_table(summaries, pairs), nl=False)
        caveat = load_caveat(runs)
        if caveat:
            click.echo(caveat.replace("**", ""))
        click.echo(f"report: {md}")


def _recipe_of(name: str | None):  # noqa: ANN202 - TrainingRecipe | None, imported lazily
    """The named recipe when it exists (JSONL headers name theirs), else None."""
    if not name:
        return None
    from nemo_muon.recipes import get_recipe, list_recipes

    return get_recipe(name) if name in list_recipes() else None
