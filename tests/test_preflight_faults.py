"""A planted fault makes `nemo-muon preflight` fail the check it breaks (a matrix no rank updates, a gather skipped
after the resume, a corrupted shard, gradients never reduced on either path, an owner the cost layout's plan did not
choose), on CPU gloo ranks through
Megatron-Core's real stack (tests/megatron_cpu/preflight_runs.py). The checks are the same code on every stack: these
run once, in .venv (Megatron-Core 0.19.2); the passing paths run on every stack (tests/megatron_cpu/test_preflight.py)."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from nemo_muon.preflight.main import FAILED_EXIT
from nemo_muon.preflight.report import exit_line
from tests.megatron_cpu.preflight_runs import run_cpu_preflight

ASSEMBLY = importlib.metadata.version("megatron-core").startswith(("0.16.", "0.17."))
"""Megatron-Core 0.16 / 0.17: no parameter layout (no cost layout plan to compare with)."""


@pytest.mark.parametrize(("plant", "check", "recipe"), [
    ("wrong_owner", "owners", "kimi_k2_muon"),
    ("skipped_gather", "resume", "kimi_k2_muon_split"),
    ("corrupted_shard", "resume", "kimi_k2_muon"),
    ("unreduced_gradients", "single_process", "kimi_k2_muon"),
])
def test_a_planted_fault_fails_the_check_it_breaks(tmp_path, plant, check, recipe):
    result, out = run_cpu_preflight(tmp_path, recipe, plant=plant)
    assert result["code"] == FAILED_EXIT
    assert result["first_failure"].startswith(f"FAIL {check}:"), result["checks"]
    doc = json.loads((out / "preflight.json").read_text())
    assert not doc["passed"] and doc["first_failure"] == result["first_failure"]
    assert exit_line(doc) == f"preflight failed: {result['first_failure']}"


def test_owners_that_are_not_the_cost_layouts_plan_fail_the_owners_check(tmp_path):
    """Megatron-Core >= 0.18, ``collectives='reduce_scatter'``: each rank's layer-wise matrices are compared with the
    plan DDP's layout was built from; one planned owner moved makes the owners check fail naming the matrix. (0.16 /
    0.17 have no parameter layout: Megatron's layer-wise optimizer and our collectives decide the owners there, and
    the check is exactly one owner per matrix.)"""
    if ASSEMBLY:
        from nemo_muon.preflight.wiring import has_layouts

        assert not has_layouts()
        return
    result, _ = run_cpu_preflight(tmp_path, "kimi_k2_muon", plant="unplanned_owner",
                           overrides=("optimizer.collectives=reduce_scatter",))
    assert result["code"] == FAILED_EXIT
    failure = result["first_failure"]
    assert failure.startswith("FAIL owners: ours: rank ") and "which the cost layout's plan gives" in failure, failure
