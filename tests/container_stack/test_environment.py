"""The container-stack environment holds exactly what its lock file pins (so the docs' table is what ran)."""

from __future__ import annotations

import importlib.metadata

from tests.test_versions import _lock_pins


def test_installed_distributions_equal_the_lock():
    from nemo_muon.versions import normalize_name

    installed = {normalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    differ = {name: (want, installed.get(name)) for name, want in _lock_pins().items() if installed.get(name) != want}
    assert not differ, f"lock vs installed: {differ}"
    assert "transformer-engine" not in installed
