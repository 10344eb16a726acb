"""``nemo-muon bench``: a Muon recipe and its baseline back to back on the same executor and layout, then a report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from nemo_muon.launchers.job import LaunchError, LaunchPlan, build_plan
from nemo_muon.launchers.launch import DRY_RUN_NAMES, execute, launch_options, options_from_cli, usage_error

from nemo_muon._validation import shown
from nemo_muon.registry import names as optimizer_names
from nemo_muon.registry import spec_for, spec_named
from nemo_muon.secret_policy import mask_text, secret_values


def baseline_name(recipe: str, compare: str) -> str:
    """The recipe ``recipe`` is measured against: its name with its optimizer's registry name (`spec_for` of the
    recipe's optimizer config: a whole ``_`` token of the name) swapped for ``compare`` when that recipe is registered
    ('kimi_k2_muon_bf16' + 'adamw' -> 'kimi_k2_adamw_bf16', 'tiny_kimi_k2_normuon' -> 'tiny_kimi_k2_adamw'); else
    ``recipe`` itself, whose optimizer `bench` then switches with ``optimizer=<compare>``. ``compare`` is a registered
    optimizer other than the recipe's own (inserted as text, never a template)."""
    from nemo_muon.recipes import get_recipe, list_recipes

    recipes = list_recipes()
    if recipe not in recipes:
        raise LaunchError(f"--recipe must be one of {tuple(recipes)}; got {shown(recipe)}")
    own = spec_for(get_recipe(recipe).optimizer)
    if own.matrix is None:
        matrix = tuple(n for n in optimizer_names() if spec_named(n).matrix is not None)
        raise LaunchError(f"--recipe must name a recipe of a matrix optimizer (one of {matrix}); got {shown(recipe)} "
                          f"({own.name})")
    if compare not in optimizer_names() or compare == own.name:
        others = tuple(n for n in optimizer_names() if n != own.name)
        raise LaunchError(f"--compare must be one of {others} (another optimizer than the recipe's {own.name!r}); "
                          f"got {shown(compare)}")
    tokens = recipe.split("_")
    swapped = "_".join(compare if token == own.name else token for token in tokens)
    return swapped if own.name in tokens and swapped in recipes else recipe


def bench_plans(recipe: str, compare: str, options: dict, overrides: tuple[str, ...]) -> list[LaunchPlan]:
    """The two checked launches, before either starts: ``recipe``, then its baseline (`baseline_name`; ``optimizer=
    <compare>`` when no such recipe is registered) in its own run folder: ``<run folder>-<compare>`` when both would
    write into one (``logging.run_name=b1``, or one recipe). Each folder is refused if it already holds a run."""
    baseline = baseline_name(recipe, compare)
    first = build_plan(options_from_cli(recipe, overrides=overrides, **options))
    extra = () if baseline != recipe else (f"optimizer={compare}",)
    second = build_plan(options_from_cli(baseline, overrides=(*overrides, *extra), **options))
    if second.run_dir == first.run_dir:  # the baseline never writes into the first run's folder
        extra = (*extra, f"logging.run_name={first.run_dir.name}-{compare}")
        second = build_plan(options_from_cli(baseline, overrides=(*overrides, *extra), **options))
    return [first, second]


@click.command("bench")
@launch_options
@click.option("--compare", default="adamw", show_default=True, help="Optimizer of the baseline recipe.")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Training steps of both runs [default: the recipe's].")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Report folder [default: <logging root>/bench-<recipe>].")
@click.option(*DRY_RUN_NAMES, "dry_run", is_flag=True, help="Print both launches exactly; submit nothing.")
@click.option("--wait/--no-wait", default=True, help="Wait for both runs and write the report [default: wait].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench(recipe: str, executor: str | None, cluster: str | None, profiles: str | None, nodes: int | None,
          gpus_per_node: int | None, account: str | None, partition: str | None, time_: str | None,
          image: str | None, container: bool | None, mount: tuple[str, ...], env: tuple[str, ...],
          overrides: tuple[str, ...], compare: str, steps: int | None, out: Path | None, dry_run: bool, wait: bool,
          as_json: bool) -> None:
    """Run RECIPE and its --compare baseline with the same layout and overrides, then report Muon vs baseline."""
    extra = (*overrides, f"trainer.max_steps={steps}") if steps is not None else overrides
    options = dict(executor=executor, cluster=cluster, profiles=profiles, nodes=nodes, gpus_per_node=gpus_per_node,
                   account=account, partition=partition, time=time_, image=image, container=container, mount=mount,
                   env=env)
    try:
        plans = bench_plans(recipe, compare, options, extra)
    except LaunchError as e:
        raise usage_error(e, env) from None
    first, second = plans
    out = out or first.run_dir.parent / f"bench-{recipe}"
    if dry_run:
        if as_json:
            data = {"dry_run": True, "runs": [p.as_json() for p in plans], "report": str(out)}
            click.echo(json.dumps(data, indent=2))
        else:
            click.echo(first.describe() + "\n# then (after it, on the same layout):\n" + second.describe(), nl=False)
        return
    results = []
    try:
        r1 = execute(first, wait=wait, progress=not as_json)
        results.append(r1)
        if not r1.ok and (r1.state is not None or r1.exit_code is not None):
            raise click.ClickException(
                f"{first.recipe_name} failed ({r1.state or f'exit {r1.exit_code}'}; its run folder: {first.run_dir}); "
                f"the baseline {second.recipe_name} was not started")
        if second.script is not None and r1.job_id is not None and not wait:
            opts = options_from_cli(second.recipe_name, overrides=tuple(second.overrides), **options)
            opts.dependency = f"afterany:{r1.job_id}"
            second = build_plan(opts)
        results.append(execute(second, wait=wait, progress=not as_json))
    except (LaunchError, ValueError) as e:
        raise usage_error(e, env) from None
    except (RuntimeError, TimeoutError, OSError) as e:
        raise click.ClickException(mask_text(str(e), secret_values(os.environ, env))) from None
    summary = {"runs": [{"recipe": p.recipe_name, "run_dir": str(p.run_dir), "job_id": r.job_id, "state": r.state,
                         "exit_code": r.exit_code} for p, r in zip(plans, results, strict=True)]}
    if wait and all(r.ok for r in results):
        from nemo_muon.reporting import analyze, load_run, text_table, write_report_for

        runs = [load_run(p.run_dir) for p in plans]
        try:
            md = write_report_for(runs, out)
        except (ValueError, OSError) as e:
            raise click.UsageError(str(e)) from None
        summaries, pairs = analyze(runs)
        summary["report"] = str(md)
        if not as_json:
            click.echo(text_table(summaries, pairs), nl=False)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    elif "report" in summary:
        click.echo(f"report: {summary['report']}")
    else:
        click.echo("runs: " + ", ".join(f"{r['recipe']} -> {r['run_dir']} ({r['job_id'] or r['exit_code']})"
                                        for r in summary["runs"]))
        click.echo(f"when done: nemo-muon report {plans[0].run_dir} {plans[1].run_dir} --out {out}")
    if not all(r.ok or (r.state is None and r.exit_code is None) for r in results):
        raise SystemExit(1)
