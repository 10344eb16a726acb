"""The container-stack environment holds exactly what its lock file pins (so the docs' table is what ran)."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import torch

from tests.test_versions import _lock_pins


def test_installed_distributions_equal_the_lock():
    from nemo_muon.versions import normalize_name

    def installed(name: str) -> str | None:  # what an import resolves (setuptools' vendored copies come later)
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    differ = {name: (want, installed(name)) for name, want in _lock_pins().items() if installed(name) != want}
    assert not differ, f"lock vs installed: {differ}"
    assert installed("transformer-engine") is None
    assert normalize_name("Transformer_Engine") == "transformer-engine"


def test_torch_is_shared_with_the_dev_environment_on_disk():
    """The Makefile installs both environments hard-linked from one uv cache: torch's largest library here is the same
    file (inode) as in .venv, not a second copy on CI's small disk."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    dev = Path(__file__).resolve().parents[2] / ".venv" / lib.relative_to(sys.prefix)
    assert lib.stat().st_nlink > 1, f"{lib} has one link: installed as a copy (make stack-venv installs with uv)"
    assert os.path.samefile(lib, dev), f"{lib} and {dev} are two files: make venv and stack-venv share a uv cache"
