"""The preflight's verdicts from its figures (no ranks): the single-process and the resharded-resume checks pass, fail
or say why they did not run, the report and the exit line say the same; the single-process reference's clip
coefficient is the trainer's, an expert-parallel rank's experts take their places in its whole model, the layouts a
job's preflight runs are the recipe's scaled to its ranks, and the resume at another layout picks one the ranks, the
layers and the experts host."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nemo_muon.preflight.checks import CHECK_NAMES, evaluate, first_failure
from nemo_muon.preflight.report import document, exit_line, markdown
from nemo_muon.preflight.request import MASTER_RTOL, ParallelLayout, PreflightRequest, allocation_ep, allocation_pp
from nemo_muon.preflight.reshard import Resharded, other_layout
from nemo_muon.preflight.run import Figures, _against_single
from nemo_muon.preflight.single_process import CLIP_EPS, clip_coefficient, not_run_reason, world_key_to_name

REQUEST = PreflightRequest(recipe="kimi_k2_muon", world_size=2, steps=6)
AT_EP2 = PreflightRequest(recipe="kimi_k2_muon", world_size=4, pp=2, ep=2, steps=6)
ONE_RANK_REASON = other_layout(ParallelLayout(1), 4, 8)[1]


def _figures(single: tuple[str, float] | None, not_run: str | None = None) -> Figures:
    return Figures(paths={"ours": "o", "reference": "r"}, losses={"ours": [2.0, 1.0] * 3, "reference": [2.0, 1.0] * 3},
                   step_s={"ours": [1.0] * 6, "reference": [1.0] * 6}, skipped={"ours": [], "reference": []},
                   master_worst=("w", 0.0), single_process=single, single_process_not_run=not_run,
                   reshard_not_run=ONE_RANK_REASON,
                   nonfinite={"policy": "raise", "ranks": [{"outcome": "raised"}] * 2}, devices=["cpu", "cpu"])


@pytest.mark.parametrize(("single", "passed"), [(("m", 0.0), True), (("m", MASTER_RTOL), True),
                                                (("m", MASTER_RTOL * 1.01), False), (("m", math.inf), False)])
def test_the_single_process_check_holds_within_its_tolerance(single, passed):
    checks = evaluate(_figures(single), REQUEST)
    assert [c.name for c in checks] == list(CHECK_NAMES)
    check = checks[CHECK_NAMES.index("single_process")]
    assert check.ran and check.passed == passed and "(m)" in check.figure
    assert (first_failure(checks) is None) == passed


def test_the_reference_paths_distance_to_the_single_process_is_reported_not_checked():
    figures = _figures(("m", 0.0))
    figures.single_process_reference = ("r", 2.0)
    check = evaluate(figures, REQUEST)[CHECK_NAMES.index("single_process")]
    assert check.passed and check.figure.endswith("; the reference path, not checked: 2 (r)")
    figures.single_process, figures.single_process_reference = ("m", 2.0), ("r", 0.0)
    assert not evaluate(figures, REQUEST)[CHECK_NAMES.index("single_process")].passed


def test_a_single_process_reference_that_could_not_run_says_why_and_does_not_fail():
    megatrons_engine = PreflightRequest(recipe="kimi_k2_muon", world_size=2, steps=6,
                                        overrides=("optimizer.engine=megatron",))
    reason = not_run_reason(megatrons_engine.training_recipe())
    assert reason is not None and reason.startswith("optimizer.engine='megatron': the drop-in is nemo-muon's")
    assert not_run_reason(REQUEST.training_recipe()) is None
    checks = evaluate(_figures(None, reason), REQUEST)
    check = checks[CHECK_NAMES.index("single_process")]
    assert not check.ran and check.passed and check.verdict().startswith(f"NOT RUN single_process: {reason}")
    doc = document(REQUEST, _figures(None, reason), checks, {"torch": torch.__version__})
    assert doc["passed"] and f"| single_process | not run | {reason} |" in markdown(doc)
    assert exit_line(doc) == (f"preflight passed: {len(CHECK_NAMES) - 2} checks of kimi_k2_muon (not run: "
                              "single_process, reshard)")


@pytest.mark.parametrize(("saved", "expected"), [
    ((2, 1, 1), (2, 2, 1)),  # 2 ranks at EP=1: two stages, DP 2 -> 1
    ((4, 1, 1), (4, 2, 1)),
    ((4, 1, 2), (4, 2, 2)),  # DP 4 -> 2, the experts' 2 -> 1
    ((4, 2, 2), (4, 1, 4)),  # DP 2 -> 4, EP 2 -> 4
    ((8, 2, 2), (8, 1, 4)),
    ((8, 4, 2), (8, 2, 4)),
    ((8, 1, 8), (8, 2, 4)),
    ((2, 1, 2), None),  # two stages leave one rank each: no EP above 1
    ((1, 1, 1), None),
])
def test_the_resharded_resume_loads_at_another_pipeline_size_and_another_expert_parallel_size_above_one(saved,
                                                                                                       expected):
    chosen, reason = other_layout(ParallelLayout(*saved), layers=4, experts=8)
    assert chosen == (ParallelLayout(*expected) if expected else None) and (reason is None) == (expected is not None)
    if expected is not None:
        assert chosen.pp != saved[1] and (chosen.ep > 1) == (saved[2] > 1)  # the data-parallel size changes
    else:
        assert reason.startswith(f"world_size={saved[0]} with the tiny model's 4 layers and 8 experts hosts no other "
                                 f"layout than {ParallelLayout(*saved).describe()}")
        assert ("a checkpoint does not load across EP=1 and EP > 1" in reason) == (saved[2] > 1)


@pytest.mark.parametrize(("recipe", "world_size", "expected"), [
    ("kimi_k2_muon", 256, (4, 8)),  # the recipe's PP=4, EP=64 on its 256 GPUs: 4 stages of 64 ranks, 8 experts
    ("kimi_k2_muon", 8, (4, 2)),
    ("kimi_k2_muon", 4, (2, 2)),  # stages of 2 data-parallel ranks, not 4 of 1
    ("kimi_k2_muon", 2, (1, 2)),
    ("kimi_k2_muon", 1, (1, 1)),
    ("qwen3_30b_a3b_muon", 8, (1, 8)),  # the recipe's PP=1, EP=8
])
def test_a_jobs_preflight_runs_the_recipes_layout_scaled_to_its_ranks(recipe, world_size, expected):
    built = REQUEST.training_recipe() if recipe == "kimi_k2_muon" else \
        PreflightRequest(recipe=recipe, world_size=2, steps=6).training_recipe()
    pp = allocation_pp(built, world_size)
    assert (pp, allocation_ep(built, world_size, pp)) == expected
    scaled = PreflightRequest(recipe=recipe, world_size=world_size, pp=None, ep=None, steps=6)  # the CLI's default
    assert (scaled.pp, scaled.ep) == expected


@pytest.mark.parametrize(("pp", "ep", "expected"), [
    (None, 4, (1, 4)),  # the pipeline size that leaves a stage the ranks EP=4 needs
    (None, 1, (2, 1)),
    (1, None, (1, 4)),
    (4, None, (4, 1)),
])
def test_a_size_left_out_is_the_recipes_scaled_around_the_one_given(pp, ep, expected):
    request = PreflightRequest(recipe="kimi_k2_muon", world_size=4, pp=pp, ep=ep, steps=6)
    assert (request.pp, request.ep) == expected


def test_an_ep_no_stage_hosts_is_refused_naming_the_sizes_of_one_stage():
    with pytest.raises(ValueError, match=r"preflight.ep must be one of \(1, 2, 4\) \(divides world_size / pp = 4 "):
        PreflightRequest(recipe="kimi_k2_muon", world_size=4, pp=None, ep=8, steps=6)


@pytest.mark.parametrize(("outcome", "passed"), [
    (Resharded([], 0.0, ("m", 0.0)), True), (Resharded([], 1e-2, ("m", MASTER_RTOL)), True),
    (Resharded(["step 4 at PP=1 EP=4: m's master is 0.6 x the step's movement"], 0.0, ("m", 0.6)), False),
    (Resharded(["the checkpoint saved at PP=2 EP=2 does not load at PP=1 EP=4: ValueError: x"]), False),
])
def test_the_reshard_check_names_both_layouts_and_passes_only_without_problems(outcome, passed):
    figures = _figures(("m", 0.0))
    figures.reshard, figures.resharded, figures.reshard_not_run = (AT_EP2.layout, ParallelLayout(4, 1, 4)), outcome, None
    check = evaluate(figures, AT_EP2)[CHECK_NAMES.index("reshard")]
    assert check.ran and check.passed is passed
    assert check.figure.startswith("saved at PP=2 EP=2 (DP 2, expert DP 1), resumed at PP=1 EP=4 (DP 4, expert DP 1): ")
    if passed:
        assert check.figure.endswith(f"masters largest {outcome.master_worst[1]:.3g} (m)")
    else:
        assert check.figure.endswith(outcome.problems[0]) and first_failure(evaluate(figures, AT_EP2)) == check


def test_a_matrix_no_rank_of_ours_updates_is_infinitely_far_from_the_single_process_reference():
    initial = {"a": np.zeros(2), "b": np.zeros(2)}
    single = {"a": np.ones(2), "b": np.ones(2)}
    assert _against_single({"a": np.ones(2), "b": np.ones(2)}, single, initial) == ("a", 0.0)
    assert _against_single({"a": np.ones(2)}, single, initial) == ("b", math.inf)
    assert _against_single({"a": np.ones(2), "b": np.array([1.0, 1.5])}, single, initial) == ("b", 0.5)


def test_the_clip_coefficient_is_the_trainers_total_norm_clip():
    grads = {"a": torch.tensor([3.0, 0.0], dtype=torch.bfloat16), "b": torch.tensor([[4.0]], dtype=torch.bfloat16)}
    assert clip_coefficient(grads, 1.0) == pytest.approx(1.0 / (5.0 + CLIP_EPS), rel=1e-12)
    assert clip_coefficient(grads, 10.0) == 1.0
    assert clip_coefficient(grads, 0.0) == 1.0  # grad_clip 0: no clipping


@pytest.mark.parametrize("bridge_setup", [True, False])
def test_ours_is_built_by_bridges_setup_where_the_jobs_bridge_builds_it_and_the_reference_never(bridge_setup):
    from nemo_muon.preflight.request import PreflightPath, preflight_plan

    ours, reference = preflight_plan(REQUEST.training_recipe(), parameter_layout=True, bridge_setup=bridge_setup)
    assert ours.setup == ("bridge" if bridge_setup else "megatron-core") and reference.setup == "megatron-core"
    assert f"setup={ours.setup} layout=legacy" in ours.describe()
    with pytest.raises(ValueError, match=r"preflight path setup must be one of \('bridge', 'megatron-core'\); got 'x'"):
        PreflightPath("ours", ours.opt, "legacy", "x")


@pytest.mark.parametrize(("key", "name"), [
    ("ep0/module.decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight",
     "module.decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"),
    ("ep1/module.decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight",
     "module.decoder.layers.1.mlp.experts.local_experts.4.linear_fc1.weight"),
    ("ep1/module.decoder.layers.12.mlp.experts.local_experts.3.linear_fc1.weight",
     "module.decoder.layers.12.mlp.experts.local_experts.7.linear_fc1.weight"),
    ("module.decoder.layers.1.mlp.shared_experts.linear_fc1.weight",
     "module.decoder.layers.1.mlp.shared_experts.linear_fc1.weight"),
])
def test_an_expert_parallel_ranks_experts_take_their_places_in_the_whole_model(key, name):
    """EP rank r's ``local_experts.i`` is expert ``r * local + i`` of the single-process model (4 local experts)."""
    assert world_key_to_name(key, local_experts=4) == name


def test_an_expert_named_without_its_local_index_is_refused_not_mapped_onto_another():
    with pytest.raises(ValueError, match=r"expert parameter 'ep1/module.decoder.layers.1.mlp.experts.weight1' has no "
                                         r"'.local_experts.<i>.' in its name"):
        world_key_to_name("ep1/module.decoder.layers.1.mlp.experts.weight1", local_experts=4)
