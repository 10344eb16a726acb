"""The container-stack environment's fixtures: Bridge imported behind the TE stub, an offline HF cache."""

from __future__ import annotations

import importlib.metadata

import pytest

from tests.megatron_cpu.hf_cache import install_offline_hf_cache
from tests.megatron_cpu.te_stub import bridge_imports_without_te


def pytest_configure(config: pytest.Config) -> None:
    try:
        mcore = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        mcore = None
    if mcore is None or not mcore.startswith("0.16."):
        raise pytest.UsageError(f"tests/container_stack runs in the container-stack environment (megatron-core 0.16.x, "
                                f"`make test-stack`); this interpreter has megatron-core {mcore}")


@pytest.fixture(scope="session")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Megatron-Bridge importable (TE stub for its two peft modules) with an offline HF cache."""
    install_offline_hf_cache(tmp_path_factory.mktemp("hf"))
    bridge_imports_without_te()
