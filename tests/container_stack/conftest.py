"""The container-stack environment's fixtures: Bridge imported behind the TE stub, an offline HF cache (set up
before collection)."""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.megatron_cpu.hf_cache import install_offline_hf_cache
from tests.megatron_cpu.te_stub import bridge_imports_without_te


def pytest_configure(config: pytest.Config) -> None:
    # before any test module is collected: NeMo, transformers and huggingface_hub read HF_HOME / HF_HUB_OFFLINE when
    # first imported, and NeMo's test modules import them at collection time
    root = Path(tempfile.mkdtemp(prefix="nemo_muon_hf_"))
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    install_offline_hf_cache(root)
    try:
        mcore = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        mcore = None
    if mcore is None or not mcore.startswith("0.16."):
        raise pytest.UsageError(f"tests/container_stack runs in the container-stack environment (megatron-core 0.16.x, "
                                f"`make test-stack`); this interpreter has megatron-core {mcore}")


@pytest.fixture(scope="session")
def bridge() -> None:
    """Megatron-Bridge importable (TE stub for its two peft modules); the offline HF cache is set up at configure."""
    bridge_imports_without_te()
