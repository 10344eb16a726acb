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
    """Summarize runs: final losses, tokens/s, TFLOP/s/GPU (model and model+NS), optimizer share, Muon vs AdamW."""
    from nemo_muon.reporting import analyze, load_run, text_table, write_report_for
    from nemo_muon.reporting.flops import fill_tflops

    try:
        runs = [load_run(p) for p in paths]
    except (ValueError, OSError) as e:
        raise click.UsageError(str(e)) from None
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
    try:  # inside --out only, never through a planted link (nemo_muon.config.files)
        md = write_report_for(runs, out)
    except (ValueError, OSError) as e:
        raise click.UsageError(str(e)) from None
    summaries, pairs = analyze(runs)
    if as_json:
        click.echo(json.dumps({"report": str(md), "runs": [s.as_dict() for s in summaries],
                               "pairs": [p.as_dict() for p in pairs]}, indent=2))
    else:
        click.echo(text_table(summaries, pairs), nl=False)
        click.echo(f"report: {md}")


def _recipe_of(name: str | None):  # noqa: ANN202 - TrainingRecipe | None, imported lazily
    """The named recipe when it exists (JSONL headers name theirs), else None."""
    if not name:
        return None
    from nemo_muon.recipes import get_recipe, list_recipes

    return get_recipe(name) if name in list_recipes() else None
