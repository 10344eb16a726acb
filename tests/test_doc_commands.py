"""Every command in README.md and docs/*.md runs as printed (issue 37 item 3).

Each line of a ```bash / ```sh / ```shell / ```console block (``$ `` lines of a console block; ``\\`` continues a
line; ``export NAME=VALUE`` holds for the rest of its block) is run here, as printed: `nemo-muon` in-process through
click's CliRunner, `nemo` in-process through NeMo-Run's own typer app, so the whole file takes seconds. A command that
fails as printed fails this test. A command that cannot run here carries a trailing ``# needs: ...`` (docs/testing.md):

* ``needs: gpu`` (Megatron-Bridge, the NeMo container) and ``needs: nemo`` (NeMo 2, NGC 26.02): run as printed, and
  it must refuse in one line (``Error: ...``), exit non-zero, no traceback;
* ``needs: minutes`` (trains, or runs a suite): its dry run runs instead and must succeed (``nemo ... --dryrun``,
  ``nemo-muon launch|bench ... --dry-run``, ``make -n``, the demo's recipes resolved without training).

Commands run in a folder that holds what ``make demo`` leaves (``runs/`` with a Muon and an AdamW run folder and the
tokenizer cache ``runs/_cache``), so ``nemo-muon report runs/*`` reads real run folders.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL_BLOCKS = ("bash", "sh", "shell", "console", "zsh")
NEEDS = ("gpu", "nemo", "minutes")
PROGRAMS = ("nemo-muon", "nemo", "make", "python", "python3", "export", "pip", "torchrun", "docker", "sbatch", "srun")
"""First words of a command: an unlabelled block starting with one is a command block this test would not see."""
CHECKERS = {("nemo-muon", "doctor"): (0, 1)}
"""Commands whose documented exit code reports what they checked (docs/operators.md#doctor: 1 when an item fails on
this machine): they pass with either, when they printed their checks and no traceback."""
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.M | re.S)
_NEEDS = re.compile(r"needs:\s*([a-z]+(?:\s*,\s*[a-z]+)*)", re.ASCII)


@dataclasses.dataclass(frozen=True)
class Command:
    doc: str
    line: int
    block: int
    argv: tuple[str, ...]
    needs: frozenset[str]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.argv)}"


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: the comment starts at a '#' outside quotes at the start or after a space."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _blocks(path: Path) -> Iterator[tuple[str, int, str]]:
    text = path.read_text()
    for match in _FENCE.finditer(text):
        yield match.group(1).strip().lower(), text[:match.start()].count("\n") + 2, match.group(2)


def doc_commands(path: Path) -> list[Command]:
    """The commands of ``path``'s shell blocks, continuation lines joined, comment-only lines left out."""
    commands = []
    for number, (lang, first, body) in enumerate(_blocks(path)):
        if lang not in SHELL_BLOCKS:
            continue
        pending, start = "", first
        for offset, raw in enumerate(body.splitlines()):
            if lang == "console":
                if not raw.startswith("$ ") and not pending:
                    continue  # output
                raw = raw[2:] if raw.startswith("$ ") else raw
            code, comment = _split_comment(raw)
            if not pending:
                start = first + offset
            if code.endswith("\\"):
                pending += code[:-1] + " "
                continue
            code, pending = pending + code, ""
            if not code.strip():
                continue
            found = _NEEDS.search(comment)
            needs = frozenset(n.strip() for n in found.group(1).split(",")) if found else frozenset()
            commands.append(Command(str(path.relative_to(ROOT)), start, number, tuple(shlex.split(code)), needs))
    return commands


ALL = [c for doc in DOCS for c in doc_commands(doc)]


def test_every_command_block_is_labelled_so_this_test_sees_it() -> None:
    unlabelled = []
    for doc in DOCS:
        for lang, line, body in _blocks(doc):
            first = next((ln.split()[0] for ln in body.splitlines() if ln.strip()), "")
            if not lang and first.removeprefix("$") in PROGRAMS:
                unlabelled.append(f"{doc.relative_to(ROOT)}:{line}")
    assert unlabelled == [], "label these command blocks ```bash (or ```text when they are not commands)"
    assert {c.doc for c in ALL} >= {"README.md", "docs/operators.md", "docs/recipes.md", "docs/flops.md",
                                     "docs/cpu_pipeline.md"}
    assert all(c.needs <= set(NEEDS) for c in ALL), [str(c) for c in ALL if not c.needs <= set(NEEDS)]


# ---- running them ------------------------------------------------------------------------------------------------

def _jsonl(folder: Path, optimizer: str, losses: list[float]) -> None:
    folder.mkdir(parents=True)
    rows = [{"event": "run", "recipe": f"tiny_kimi_k2_{optimizer}", "optimizer": optimizer, "world_size": 2}]
    rows += [{"event": "train", "step": i, "loss": v, "step_time_s": 0.5, "optimizer_time_s": 0.1,
              "tokens_per_s": 1000.0, "elapsed_s": 0.5 * i} for i, v in enumerate(losses, start=1)]
    rows.append({"event": "val", "step": len(losses), "val_loss": losses[-1]})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory) -> Path:
    """What `make demo` leaves: two run folders and the tokenizer cache under runs/."""
    root = tmp_path_factory.mktemp("docs")
    _jsonl(root / "runs" / "tiny_kimi_k2_muon-20260101-000000", "muon", [6.0, 5.0, 4.0, 3.5])
    _jsonl(root / "runs" / "tiny_kimi_k2_adamw-20260101-000000", "adamw", [6.0, 5.5, 5.0, 4.5])
    (root / "runs" / "_cache" / "tokenizer").mkdir(parents=True)
    return root


_NEMO_APPS: dict[str, object] = {}


def _nemo_app(namespace: str) -> object:
    """NeMo-Run's `nemo` app as `.venv/bin/nemo <namespace> ...` builds it (once per namespace)."""
    if namespace not in _NEMO_APPS:
        from nemo_run.cli.api import create_cli

        _NEMO_APPS[namespace] = create_cli()
    return _NEMO_APPS[namespace]


@dataclasses.dataclass
class Outcome:
    code: int
    output: str


def _said(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip() and line != "Configuring global options"]


def _run_nemo(argv: list[str], monkeypatch) -> Outcome:
    from typer.testing import CliRunner as TyperRunner

    monkeypatch.setattr(sys, "argv", ["nemo", *argv[:1]])  # NeMo-Run builds the sub-commands of argv[1]
    result = TyperRunner().invoke(_nemo_app(argv[0]), argv)
    return Outcome(result.exit_code, result.output)


def _run_nemo_muon(argv: list[str]) -> Outcome:
    from nemo_muon.launchers.cli import main

    result = CliRunner().invoke(main, argv)
    return Outcome(result.exit_code, result.output)


def _run_demo(argv: list[str], monkeypatch) -> Outcome:
    """The demo's dry run: its arguments parsed and its recipes resolved and checked, as `main` does, no training."""
    from nemo_muon.train import demo

    monkeypatch.setattr(demo, "train_and_report", lambda recipes, **_: {"runs": recipes})
    try:
        code = demo.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    return Outcome(code, "")


def run_command(command: Command, monkeypatch) -> Outcome:
    """Run ``command`` here: as printed, or its dry run where it needs minutes."""
    program, *args = command.argv
    dry = "minutes" in command.needs
    if program == "export":
        for assignment in args:
            name, _, value = assignment.partition("=")
            monkeypatch.setenv(name, value)
        return Outcome(0, "")
    if program == "nemo":
        return _run_nemo(args + (["--dryrun"] if dry and "--dryrun" not in args else []), monkeypatch)
    if program == "nemo-muon":
        if dry and args[:1] in (["launch"], ["bench"]) and "--dry-run" not in args:
            args.append("--dry-run")
        # the shell's globbing (runs/*): sorted matches, or the pattern itself when nothing matches
        return _run_nemo_muon([m for a in args for m in (sorted(glob.glob(a)) or [a] if set(a) & set("*?[") else [a])])
    if program == "make" and dry:
        out = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        return Outcome(out.returncode, out.stdout + out.stderr)
    if program in ("python", "python3") and args[:2] == ["-m", "nemo_muon.train.demo"] and dry:
        return _run_demo(args[2:], monkeypatch)
    pytest.fail(f"{command}: this test cannot run {program!r} commands{' as printed' if not dry else ''}: teach "
                "run_command, or mark the line (docs/testing.md)")


def _check(command: Command, outcome: Outcome) -> None:
    assert "Traceback" not in outcome.output, f"{command}\n{outcome.output[-3000:]}"
    if command.needs & {"gpu", "nemo"}:
        said = _said(outcome.output)
        assert outcome.code != 0 and len(said) == 1 and said[0].startswith("Error: "), (
            f"{command} must refuse here in one line ({', '.join(sorted(command.needs))}); got exit {outcome.code}:"
            f"\n{outcome.output[-3000:]}")
    elif tuple(command.argv[:2]) in CHECKERS:
        assert outcome.code in CHECKERS[tuple(command.argv[:2])] and re.search(r"\[ *(ok|warn|fail)\]", outcome.output), (
            f"{command} printed no checks (exit {outcome.code}):\n{outcome.output[-3000:]}")
    else:
        assert outcome.code == 0, f"{command} failed as printed (exit {outcome.code}):\n{outcome.output[-3000:]}"


@pytest.mark.parametrize("doc", sorted({c.doc for c in ALL}))
def test_every_command_of_the_doc_runs_as_printed(doc: str, demo_folder: Path, monkeypatch, tmp_path) -> None:
    import nemo_run.config

    monkeypatch.chdir(demo_folder)
    monkeypatch.setattr(nemo_run.config, "_NEMORUN_HOME", str(tmp_path / "nemo_run"))
    monkeypatch.setenv("NEMO_MUON_PROFILES", str(tmp_path / "no-profiles.yaml"))  # no operator's own profiles
    commands = [c for c in ALL if c.doc == doc]
    for block in sorted({c.block for c in commands}):
        with monkeypatch.context() as session:  # a block's exports hold for that block only
            for command in (c for c in commands if c.block == block):
                _check(command, run_command(command, session))
    assert os.getcwd() == str(demo_folder)
