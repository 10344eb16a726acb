"""A planted fault makes `nemo-muon preflight` fail the check it breaks (a matrix no rank updates, a gather skipped
after the resume, a corrupted shard, gradients never reduced on either path), on CPU gloo ranks through
Megatron-Core's real stack (tests/megatron_cpu/preflight_runs.py). The checks are the same code on every stack: these
run once, in .venv (Megatron-Core 0.19.2); the passing paths run on every stack (tests/megatron_cpu/test_preflight.py),
and so does an owner our plan did not choose (the plans differ by generation)."""

from __future__ import annotations

import json

import pytest

from nemo_muon.preflight.main import FAILED_EXIT
from nemo_muon.preflight.report import exit_line
from tests.megatron_cpu.preflight_runs import run_cpu_preflight


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
