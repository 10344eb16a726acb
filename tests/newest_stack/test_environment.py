"""A Bridge >= 0.4 environment holds exactly what its lock pins, shares torch with .venv on disk, and is its NGC
release's stack where the table says so (`nemo_muon.versions`)."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import torch

from nemo_muon.versions import normalize_name, release_numbers
from tests.newest_stack.conftest import stack_lock, stack_release


def _pins() -> dict[str, str]:
    pins = {}
    for line in stack_lock().read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[normalize_name(name)] = version
    return pins


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_installed_distributions_equal_the_lock():
    differ = {name: (want, _installed(name)) for name, want in _pins().items() if _installed(name) != want}
    assert not differ, f"lock vs installed: {differ}"
    assert _installed("transformer-engine") is None and _installed("nemo-toolkit") is None


def test_the_lock_is_the_release_stack_on_the_lines_it_names():
    """Bridge, Megatron-Core and NeMo-Run are the release's lines (PyPI's newest patch of each); no NeMo toolkit."""
    release, pins = stack_release(), _pins()
    for dist, version in (("megatron-bridge", release.megatron_bridge), ("megatron-core", release.megatron_core)):
        assert release_numbers(pins[dist])[:2] == release_numbers(version)[:2], (dist, pins[dist], version)
    assert pins["nemo-run"] == release.nemo_run
    assert release.nemo is None and "nemo-toolkit" not in pins


def test_torch_is_shared_with_the_dev_environment_on_disk():
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    dev = Path(__file__).resolve().parents[2] / ".venv" / lib.relative_to(sys.prefix)
    assert os.path.samefile(lib, dev), f"{lib} and {dev} are two files: make venv and newest-venv share a uv cache"


def test_doctor_names_this_stacks_release_and_asks_only_for_what_it_ships():
    """On 26.08's stack doctor said 'container release 26.02' and told the user to switch containers; with
    NEMO_MUON_RELEASE=26.08 it asked for the NeMo toolkit 26.08 does not ship."""
    import json

    from click.testing import CliRunner
    from nemo_muon.launchers.cli import main

    tag = stack_release().tag
    for variable in ("", tag):
        data = json.loads(CliRunner(env={"NEMO_MUON_RELEASE": variable}).invoke(main, ["doctor", "--json"]).stdout)
        checks = {c["name"]: c for c in data["checks"]}
        assert data["release"] == tag and checks["release"]["status"] == "ok", (variable, checks["release"])
        assert checks["nemo-toolkit"]["status"] == "ok" and checks["nemo-toolkit"]["fix"] == ""
        assert all(f"nemo:{tag}" in c["fix"] for c in data["checks"] if "nvcr.io/nvidia/nemo:" in c["fix"]), checks
