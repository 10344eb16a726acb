"""The newest-stack environment's fixtures (NGC nemo:26.08's Python stack, `make test-newest`): refuse to run
elsewhere; Bridge imported behind the TE stub; an offline HF cache (set up before collection)."""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.megatron_cpu.hf_cache import install_offline_hf_cache
from tests.megatron_cpu.te_stub import bridge_imports_without_te

NEWEST_STACK_LOCK = Path(__file__).resolve().parents[2] / "requirements" / "container-stack-26.08.txt"


def pytest_configure(config: pytest.Config) -> None:
    root = Path(tempfile.mkdtemp(prefix="nemo_muon_hf_"))
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    install_offline_hf_cache(root)
    try:
        bridge = importlib.metadata.version("megatron-bridge")
    except importlib.metadata.PackageNotFoundError:
        bridge = None
    if bridge is None or not bridge.startswith("0.6."):
        raise pytest.UsageError(f"tests/newest_stack runs in the newest-stack environment (megatron-bridge 0.6.x, "
                                f"`make test-newest`); this interpreter has megatron-bridge {bridge}")


@pytest.fixture(scope="session")
def bridge() -> None:
    """Megatron-Bridge importable (TE stub for its two peft modules)."""
    bridge_imports_without_te()
