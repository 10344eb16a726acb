"""The ``nemo-muon`` command: launch, bench, report, plan, doctor, preflight, recipes, profiles, cancel. Torch-free at import."""

from __future__ import annotations

import json

import click
from nemo_muon.launchers.bench import bench
from nemo_muon.launchers.doctor import doctor
from nemo_muon.launchers.launch import launch
from nemo_muon.launchers.plan import plan
from nemo_muon.launchers.preflight import preflight
from nemo_muon.launchers.report import report


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nemo-muon", prog_name="nemo-muon")
def main() -> None:
    """Operator tools for Muon/SOAP pretraining with NeMo / Megatron: launch, bench, report, plan, doctor."""


@main.command("recipes")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def recipes_cmd(as_json: bool) -> None:
    """List the recipe names."""
    from nemo_muon.recipes import list_recipes

    names = list_recipes()
    click.echo(json.dumps(names) if as_json else "\n".join(names))


@main.command("profiles")
@click.option("--profiles", default=None, metavar="FILE", help="Profiles YAML [default: $NEMO_MUON_PROFILES or "
              "~/.config/nemo-muon/clusters.yaml].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def profiles_cmd(profiles: str | None, as_json: bool) -> None:
    """Check the cluster profiles file and list its profiles."""
    import dataclasses

    from nemo_muon.launchers.profiles import load_profiles, profiles_path

    from nemo_muon.secret_policy import mask_env

    try:
        found = load_profiles(profiles)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    rows = {}
    for name, prof in found.items():
        d = dataclasses.asdict(prof)
        d["source"] = str(prof.source)
        d["env"] = mask_env(prof.env)
        rows[name] = d
    if as_json:
        click.echo(json.dumps({"file": str(profiles_path(profiles)), "profiles": rows}, indent=2))
        return
    click.echo(f"{profiles_path(profiles)}: {len(rows)} profile(s)")
    for name, d in rows.items():
        shown = ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("name", "source") and v not in (None, [], {}))
        click.echo(f"  {name}: {shown}")


@main.command("cancel")
@click.argument("job_id")
def cancel_cmd(job_id: str) -> None:
    """Cancel a Slurm job (scancel JOB_ID)."""
    from nemo_muon.launchers import slurm

    try:
        slurm.cancel(job_id)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except (RuntimeError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"cancelled slurm job {job_id}")


for _command in (launch, bench, report, plan, doctor, preflight):  # plan: engineer 3's planner (launchers/plan.py)
    main.add_command(_command)
