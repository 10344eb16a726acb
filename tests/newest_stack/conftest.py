"""The fixtures of the Bridge >= 0.4 environments (`make test-newest`): NGC 26.08's stack (`.venv-ngc-26.08`, every
test here but Bridge 0.4 / 0.5's recipes) and NGC 26.04's and 26.06's (`.venv-ngc-26.04`, `.venv-ngc-26.06`: the
optimizer tests and their recipes, the Makefile's MID_TESTS). Refuse to run elsewhere; Bridge imported behind the TE
stub; an offline HF cache (set up before collection)."""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from pathlib import Path

import pytest

from nemo_muon.versions import get_release, release_numbers
from tests.megatron_cpu.hf_cache import install_offline_hf_cache
from tests.megatron_cpu.te_stub import bridge_imports_without_te

ROOT = Path(__file__).resolve().parents[2]
STACK_RELEASES: dict[tuple[int, int], str] = {(0, 4): "26.04", (0, 5): "26.06", (0, 6): "26.08"}
"""Installed Bridge minor -> the NGC release whose stack this environment mirrors."""


def _installed_bridge() -> str | None:
    try:
        return importlib.metadata.version("megatron-bridge")
    except importlib.metadata.PackageNotFoundError:
        return None


def stack_release():
    """The `ContainerRelease` this environment mirrors (by its Bridge)."""
    return get_release(STACK_RELEASES[release_numbers(_installed_bridge())[:2]])


def stack_lock() -> Path:
    """The lock file this environment was installed from."""
    return ROOT / "requirements" / f"container-stack-{stack_release().tag}.txt"


def pytest_configure(config: pytest.Config) -> None:
    root = Path(tempfile.mkdtemp(prefix="nemo_muon_hf_"))
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    install_offline_hf_cache(root)
    bridge = _installed_bridge()
    if bridge is None or release_numbers(bridge)[:2] not in STACK_RELEASES:
        raise pytest.UsageError(f"tests/newest_stack runs in the Bridge >= 0.4 environments (megatron-bridge 0.4.x, "
                                f"0.5.x or 0.6.x, `make test-newest`); this interpreter has megatron-bridge {bridge}")


@pytest.fixture(scope="session")
def bridge() -> None:
    """Megatron-Bridge importable (TE stub for its two peft modules)."""
    bridge_imports_without_te()
