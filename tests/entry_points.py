"""The four entry points that build a recipe from a name and ``key=value`` overrides, run in this process:

* ``nemo nemo_muon pretrain --factory NAME ... --dryrun --yes`` (NeMo-Run's real CLI app);
* ``nemo-muon plan --recipe NAME --set ... --json``;
* ``nemo-muon launch --recipe NAME --executor slurm --no-container --dry-run ...`` (Slurm: the executor that checks
  the most: mounts, #SBATCH paths);
* the job every launcher starts, ``python -m nemo_muon.launchers.run_recipe --recipe NAME ...`` (`run_recipe.main`),
  called only where the recipe is refused (an accepted one would train: callers train it themselves).

Each is reduced to an `Outcome`: accepted or not, the error line, the whole output, and whether it crashed (a
traceback, or an exception other than a clean exit).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from dataclasses import dataclass
from typing import Any

from click.testing import CliRunner
from nemo_muon.launchers.cli import main as nemo_muon_cli
from typer.testing import CliRunner as TyperRunner

ENTRY_POINTS: tuple[str, ...] = ("dryrun", "plan", "launch", "job")
REFUSED_EXIT: dict[str, int] = {"dryrun": 1, "plan": 2, "launch": 2, "job": 2}
"""Exit code of a refused recipe at each entry point (NeMo-Run exits 1 on its RunContextError)."""


@dataclass
class Outcome:
    """What one entry point did with one recipe and override list."""

    entry: str
    exit_code: int
    output: str
    crashed: bool
    """A traceback in the output, or an exception other than SystemExit escaped the command."""

    @property
    def accepted(self) -> bool:
        return self.exit_code == 0

    @property
    def error(self) -> str:
        """The last 'Error: ...' / 'error: ...' line, whitespace-normalized ('' when there is none)."""
        lines = [ln for ln in self.output.splitlines() if re.match(r"^(Error|error): ", ln)]
        return " ".join(lines[-1].split(" ", 1)[1].split()) if lines else ""


def _crashed(output: str, exception: BaseException | None) -> bool:
    return "Traceback" in output or (exception is not None and not isinstance(exception, SystemExit))


class EntryPoints:
    """Runs a recipe name + overrides through each entry point. Needs ``NEMORUN_HOME`` set to a temp folder."""

    def __init__(self) -> None:
        from nemo_run.cli.api import create_cli

        argv, sys.argv = sys.argv, ["nemo", "nemo_muon"]  # NeMo-Run builds the sub-commands of argv[1]
        try:
            self._nemo_run = create_cli()
        finally:
            sys.argv = argv
        self._runner = CliRunner()
        self._typer_runner = TyperRunner()

    def dryrun(self, recipe: str, overrides: list[str]) -> Outcome:
        r = self._typer_runner.invoke(self._nemo_run, ["nemo_muon", "pretrain", "--factory", recipe, *overrides,
                                                 "--dryrun", "--yes"])
        return Outcome("dryrun", r.exit_code, r.output, _crashed(r.output, r.exception))

    def plan(self, recipe: str, overrides: list[str]) -> Outcome:
        sets = [a for o in overrides for a in ("--set", o)]
        r = self._runner.invoke(nemo_muon_cli, ["plan", "--recipe", recipe, *sets, "--json"])
        return Outcome("plan", r.exit_code, r.output, _crashed(r.output, r.exception))

    def launch(self, recipe: str, overrides: list[str]) -> Outcome:
        r = self._runner.invoke(nemo_muon_cli, ["launch", "--recipe", recipe, "--executor", "slurm", "--no-container",
                                                "--dry-run", *overrides])
        return Outcome("launch", r.exit_code, r.output, _crashed(r.output, r.exception))

    def job(self, recipe: str, overrides: list[str]) -> Outcome:
        """The job entry on a recipe the other entry points refuse (it returns before training)."""
        from nemo_muon.launchers.run_recipe import main as job_main

        out, err = io.StringIO(), io.StringIO()
        exception: BaseException | None = None
        code = -1
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = job_main(["--recipe", recipe, *overrides])
            except BaseException as e:  # noqa: BLE001 - a crash is what the caller checks for
                exception = e
        text = out.getvalue() + err.getvalue() + (repr(exception) if exception is not None else "")
        return Outcome("job", code, text, _crashed(text, exception))

    def all(self, recipe: str, overrides: list[str], *, job: bool) -> dict[str, Outcome]:
        """The outcomes of the three CLIs, and of the job entry when ``job`` (only for refused recipes)."""
        out = {"dryrun": self.dryrun(recipe, overrides), "plan": self.plan(recipe, overrides),
               "launch": self.launch(recipe, overrides)}
        if job:
            out["job"] = self.job(recipe, overrides)
        return out


def describe(outcomes: dict[str, Any]) -> str:
    """One line per entry point, for assertion messages."""
    return "\n".join(f"  {k}: exit {o.exit_code} {o.error or o.output[-300:]!r}" for k, o in outcomes.items())
