"""The container-stack environment holds exactly what its lock file pins (so the docs' table is what ran)."""

from __future__ import annotations

import importlib.metadata

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
