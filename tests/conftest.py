"""Shared test configuration: tests run on CPU, single-threaded per process, deterministic; the container-stack and
Megatron CPU tests never skip (`tests/never_skip.py`)."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    """Register the never-skip guard for tests/container_stack and tests/megatron_cpu."""
    from tests.never_skip import PLUGIN_NAME, NeverSkip

    config.pluginmanager.register(NeverSkip(config.rootpath), PLUGIN_NAME)
