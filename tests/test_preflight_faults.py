"""A planted fault makes `nemo-muon preflight` fail the check it breaks (a matrix no rank updates, a gather skipped
after the resume, a corrupted shard, gradients never reduced on either path, experts' gradients not reduced over
expert data parallelism, experts loaded under another index at another layout), on CPU gloo ranks through
Megatron-Core's real stack (tests/megatron_cpu/preflight_runs.py). The checks are the same code on every stack: these
run once, in .venv (Megatron-Core 0.19.2); the passing paths run on every stack (tests/megatron_cpu/test_preflight.py),
and so does an owner our plan did not choose (the plans differ by generation). One failure is no plant but what the
preflight found: Megatron's own engine applies a NaN that reached a reduced gradient."""

from __future__ import annotations

import json

import pytest

from nemo_muon.preflight.checks import CHECK_NAMES
from nemo_muon.preflight.main import FAILED_EXIT
from nemo_muon.preflight.report import exit_line
from tests.megatron_cpu.preflight_runs import run_cpu_preflight

EXPERT = "mlp.experts.local_experts."


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


def test_expert_gradients_left_unreduced_fail_the_single_process_check_at_expert_parallelism(tmp_path):
    """At EP=2 on 4 ranks (two expert data-parallel replicas of each expert), experts whose gradients are not reduced
    over expert data parallelism pass the checks before the single-process one (the owners, the replicas, through each
    owner's broadcast, and the losses and masters, both paths agreeing); the single-process reference, the experts of
    both EP ranks gathered into one model, fails naming an expert."""
    result, _ = run_cpu_preflight(tmp_path, "kimi_k2_muon", world_size=4, ep=2, plant="unreduced_expert_gradients")
    assert result["code"] == FAILED_EXIT
    before = result["checks"][:CHECK_NAMES.index("single_process")]
    assert [v.split(":")[0] for v in before] == [f"PASS {name}" for name in ("owners", "replicas", "losses", "masters")]
    failure = result["first_failure"]
    assert failure.startswith("FAIL single_process:") and EXPERT in failure, result["checks"]


def test_experts_loaded_under_another_index_at_another_expert_parallel_size_fail_the_reshard_check(tmp_path):
    """Saved at PP=2 EP=2 on 4 ranks, loaded at PP=1 EP=4 with each rank's first two experts traded: the resume at the
    saved layout passes, the resharded one fails naming an expert's weight."""
    result, _ = run_cpu_preflight(tmp_path, "kimi_k2_muon", world_size=4, pp=2, ep=2, plant="misplaced_experts")
    assert result["code"] == FAILED_EXIT
    resume = result["checks"][CHECK_NAMES.index("resume")]
    assert resume.startswith("PASS resume:"), resume
    failure = result["first_failure"]
    assert failure.startswith("FAIL reshard: saved at PP=2 EP=2 (DP 2, expert DP 1), resumed at PP=1 EP=4 (DP 4, "
                              "expert DP 1): "), failure
    assert "weights differ from the saved ones after the load, first " in failure and EXPERT in failure, failure


def test_megatrons_own_engine_lets_a_nan_in_a_reduced_gradient_into_the_weights(tmp_path):
    """``optimizer.engine=megatron`` with ``nonfinite='raise'``: Megatron's policy is DDP's local NaN check before the
    reduction; a NaN in a reduced gradient (injected after it, as an overflow in the reduction would put it there) is
    applied on every rank. The preflight says so (the single-process reference does not run for that engine)."""
    result, _ = run_cpu_preflight(tmp_path, "kimi_k2_muon", overrides=("optimizer.engine=megatron",))
    assert result["code"] == FAILED_EXIT
    assert result["first_failure"].startswith("FAIL nonfinite: a NaN gradient on the last data-parallel rank: every "
                                              "rank applied (state changed) on ranks [0, 1]"), result["checks"]
    single = result["checks"][CHECK_NAMES.index("single_process")]
    assert single.startswith("NOT RUN single_process: optimizer.engine='megatron'"), single
