"""`pip install nemo-muon` beside NGC 26.02's stack installs nemo-muon and changes none of the stack's distributions.

pip resolves our declared ranges (pyproject.toml) against this environment, as a container user's
``pip install nemo-muon[...]`` would (with the index, so a range the stack does not satisfy shows up as the upgrade pip
plans, not as an error), in ``--dry-run`` mode; its JSON report lists what it would install. The machine's and NGC's
pip constraint files (PIP_CONSTRAINT, global.constraint) are switched off: they pin the stack and would hide a range
that excludes it. The source is copied to a temporary folder first, so the build writes no egg-info into the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_muon.versions import normalize_name

ROOT = Path(__file__).resolve().parents[2]
# What the package build needs (the Dockerfile's builder stage copies the same).
SOURCES = ("pyproject.toml", "README.md", "nemo_muon", "recipes", "launchers")
# What a container user adds: nothing (the container has Megatron-Core and NeMo-Run), or the extras of those backends
# and of the torch backend. `gpu` pins the container's own megatron-bridge / transformer-engine, which this CPU
# environment lacks (Transformer Engine has no CPU build).
EXTRAS = ("", "megatron,nemo-run", "train,megatron,nemo-run")
OURS = "nemo-muon"

_SNAPSHOT = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps([[d.metadata['Name'], d.version] for d in m.distributions()]))"
)


def installed_distributions() -> dict[str, str]:
    """Normalized name -> version of this environment, read by a fresh interpreter (``-P``: a checkout's stale
    ``nemo_muon.egg-info`` in the working directory is not counted)."""
    out = subprocess.run([sys.executable, "-P", "-c", _SNAPSHOT], check=True, capture_output=True, text=True,
                         cwd=Path(sys.prefix), timeout=60).stdout
    return {normalize_name(name): version for name, version in json.loads(out)}


def planned_changes(report: dict, installed: dict[str, str]) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """From pip's ``--report``: (installed distributions pip would replace: name -> (installed, planned); distributions
    it would add: name -> version). nemo-muon itself is neither."""
    replaced, added = {}, {}
    for item in report["install"]:
        name, version = normalize_name(item["metadata"]["name"]), item["metadata"]["version"]
        if name == OURS:
            continue
        if name in installed:
            replaced[name] = (installed[name], version)
        else:
            added[name] = version
    return replaced, added


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("nemo-muon-src")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dst / name)
    return dst


@pytest.mark.timeout(180)
@pytest.mark.parametrize("extras", EXTRAS, ids=lambda e: e or "no-extras")
def test_pip_install_changes_no_distribution_of_the_stack(source: Path, extras: str, tmp_path: Path) -> None:
    installed = installed_distributions()
    report_path = tmp_path / "report.json"
    target = f"{source}[{extras}]" if extras else str(source)
    env = {**os.environ, "PIP_CONSTRAINT": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-cache-dir", "--report",
           str(report_path), target]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=170)
    assert r.returncode == 0, f"pip could not resolve nemo-muon[{extras}] here:\n{r.stderr[-3000:]}"

    report = json.loads(report_path.read_text())
    replaced, added = planned_changes(report, installed)
    assert replaced == {}, f"nemo-muon[{extras}] would replace the stack's (installed, planned): {replaced}"
    assert added == {}, f"nemo-muon[{extras}] would add distributions the stack lacks: {added}"
    planned = [normalize_name(item["metadata"]["name"]) for item in report["install"]]
    assert planned == [OURS], planned


def test_a_planned_upgrade_of_the_stack_is_reported() -> None:
    """The check fails on what a too-new range causes: pip planning numpy 2 over the stack's 1.26.4."""
    report = {"install": [{"metadata": {"name": "nemo_muon", "version": "0.1.0"}},
                          {"metadata": {"name": "NumPy", "version": "2.5.5"}},
                          {"metadata": {"name": "new-thing", "version": "1.0"}}]}
    replaced, added = planned_changes(report, {"numpy": "1.26.4", "torch": "2.10.0"})
    assert replaced == {"numpy": ("1.26.4", "2.5.5")}
    assert added == {"new-thing": "1.0"}
