"""Shared test configuration: tests run on CPU, single-threaded per process, deterministic; the container-stack and
Megatron CPU tests never skip (`tests/never_skip.py`); whole folders get their tier's marker here (docs/testing.md)."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bit-for-bit tests (a resume continues the loss curve exactly) compare two runs of the same computation on one machine.
# MKL's AVX2 kernels (AMD EPYC, older Intel) may round differently with the memory alignment of their inputs, so the
# same LAPACK call (SOAP's eigendecomposition) on equal data gave different last bits in the straight and the resumed
# run; STRICT conditional numerical reproducibility makes MKL's results independent of alignment on every CPU. Seen with
# MKL_ENABLE_INSTRUCTIONS=AVX2 on an AVX-512 machine (docs/testing.md, "Other CPUs"); AVX-512 paths were unaffected.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# Megatron-Core wraps its fused kernels in torch.compile (megatron.core.jit.jit_fuser). On CPU, inductor generates C++,
# builds it with gcc, and every rank process traces the functions again: with torch 2.10 that made a Megatron CPU
# resume test 36 s instead of 11 s. The tests (and the ranks they start, which inherit this environment) run those
# functions eagerly: the same Python code without the compiler. nemo_muon itself compiles nothing.
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

FOLDER_MARKERS: dict[str, str] = {"container_stack": "system", "newest_stack": "system", "megatron_cpu": "megatron"}
"""tests/<folder> -> the marker every test in it gets (markers are registered in pyproject.toml)."""
_TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Register the never-skip guard for tests/container_stack and tests/megatron_cpu."""
    from tests.never_skip import PLUGIN_NAME, NeverSkip

    config.pluginmanager.register(NeverSkip(config.rootpath), PLUGIN_NAME)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of a folder in `FOLDER_MARKERS` with its tier (selection only: nothing is deselected)."""
    for item in items:
        path = Path(item.path).resolve()
        if path.is_relative_to(_TESTS) and (parts := path.relative_to(_TESTS).parts)[0] in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[parts[0]])
