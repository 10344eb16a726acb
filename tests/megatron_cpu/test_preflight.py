"""`nemo-muon preflight` on CPU gloo ranks through Megatron-Core's real stack, the harness's shims added
(tests/megatron_cpu/shims.py): every check passes on the recipe's path, on every stack this folder runs on; bad input
is refused naming the field. The planted faults (the checks' own code, the same on every stack) are in
tests/test_preflight_faults.py."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from nemo_muon.megatron.shared.stack import MBRIDGE, installed_versions
from nemo_muon.preflight.checks import CHECK_NAMES
from nemo_muon.preflight.request import ParallelLayout, PreflightRequest
from nemo_muon.preflight.reshard import other_layout
from tests.megatron_cpu.preflight_runs import STEPS, run_cpu_preflight

ASSEMBLY = importlib.metadata.version("megatron-core").startswith(("0.16.", "0.17."))
"""Megatron-Core 0.16 / 0.17: the layer-wise path our assembly wires (no parameter layout)."""


BRIDGE_SETUP = installed_versions((MBRIDGE,))[MBRIDGE] is not None
"""Megatron-Bridge installed (NGC 26.02-26.08's stacks): its own model and optimizer setup builds ours, as the job's
(0.3 through the hook the job installs, >= 0.4 through ``provide``)."""


@pytest.mark.parametrize(("recipe", "world_size", "pp", "ep", "overrides"), [
    pytest.param("kimi_k2_muon", 2, 1, 1, (), id="kimi_k2_muon-2ranks"),
    pytest.param("kimi_k2_muon", 2, 1, 1, ("optimizer.collectives=reduce_scatter",), id="reduce_scatter-2ranks"),
    pytest.param("kimi_k2_muon_split", 2, 1, 1, (), id="split-2ranks"),
    pytest.param("qwen3_30b_a3b_muon", 2, 1, 1, (), id="qwen3-2ranks"),
    # the Kimi K2 recipe's layout (PP=4, EP=64) scaled to 4 ranks: what `launch --preflight` runs there
    pytest.param("kimi_k2_muon", 4, 2, 2, ("optimizer.collectives=reduce_scatter",), id="reduce_scatter-pp2-ep2-4ranks"),
    pytest.param("kimi_k2_muon_split", 4, 1, 1, (), id="split-4ranks"),
])
def test_the_recipes_path_passes_every_check_and_writes_its_report(tmp_path, recipe, world_size, pp, ep, overrides):
    result, out = run_cpu_preflight(tmp_path, recipe, world_size, pp=pp, ep=ep, overrides=overrides)
    assert result["code"] == 0, result["first_failure"]
    doc = json.loads((out / "preflight.json").read_text())
    assert doc["passed"] and [c["name"] for c in doc["checks"]] == list(CHECK_NAMES)
    saved = ParallelLayout(world_size, pp, ep)
    assert doc["topology"] == {**saved.topology(), "devices": ["cpu"] * world_size}
    assert len(doc["figures"]["losses"]["ours"]) == STEPS and doc["figures"]["losses"]["ours"][-1] < \
        doc["figures"]["losses"]["ours"][0]
    assert "PASSED" in (out / "preflight.md").read_text()
    single = next(c for c in doc["checks"] if c["name"] == "single_process")
    assert single["ran"], single  # the whole model in one process, the experts of every EP rank gathered
    reshard = next(c for c in doc["checks"] if c["name"] == "reshard")
    assert reshard["ran"], reshard  # at another pipeline size: another data-parallel size (and at EP > 1 another EP)
    loaded = other_layout(saved, layers=4, experts=8)[0]
    assert loaded.pp != pp and (loaded.ep > 1) == (ep > 1)
    assert doc["figures"]["reshard_layouts"] == [saved.topology(), loaded.topology()]
    assert not list(out.glob("checkpoint-*")), "the preflight's checkpoint is removed"
    assert ("setup=bridge" in doc["paths"]["ours"]) == BRIDGE_SETUP
    assert "setup=megatron-core" in doc["paths"]["reference"]
    on_cost_layout = doc["paths"]["ours"].endswith("layout=cost")  # 0.18+ with collectives=reduce_scatter
    assert on_cost_layout == (not ASSEMBLY and (bool(overrides) or recipe == "kimi_k2_muon_split"))
    owners = doc["checks"][0]["figure"]
    assert ("the owners of ours are the cost layout's plan" in owners) == on_cost_layout
    # 0.16 / 0.17: both paths run our layer-wise optimizer, whose owners come from the NS-cost plan
    assert ("the owners of ours are the NS-cost ownership plan" in owners) == ASSEMBLY
    assert ("the owners of reference are the NS-cost ownership plan" in owners) == ASSEMBLY


def test_owners_that_are_not_our_plan_fail_the_owners_check(tmp_path):
    """Where a plan of ours decides the owners (DDP's cost layout on Megatron-Core >= 0.18 with
    ``collectives='reduce_scatter'``; our layer-wise optimizer's NS-cost ownership on 0.16 / 0.17), each rank's
    layer-wise matrices are compared with it; one planned owner moved makes the owners check fail naming the matrix
    and the plan."""
    from nemo_muon.preflight.main import FAILED_EXIT

    result, _ = run_cpu_preflight(tmp_path, "kimi_k2_muon", plant="unplanned_owner",
                                  overrides=("optimizer.collectives=reduce_scatter",))
    assert result["code"] == FAILED_EXIT
    failure = result["first_failure"]
    plan = "the NS-cost ownership plan" if ASSEMBLY else "the cost layout's plan"
    assert failure.startswith("FAIL owners: ours: rank ") and f"which {plan} gives" in failure, failure


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"recipe": "no_such_recipe"}, "preflight.recipe must be one of ("),
    ({"recipe": "kimi_k2_adamw"}, "optimizer.kind must be a layer-wise matrix optimizer"),
    ({"recipe": "tiny_kimi_k2_muon"}, "backend must be 'megatron' for preflight"),
    ({"ep": 3}, "preflight.ep must be one of (1, 2)"),
    ({"pp": 3}, "preflight.pp must be one of (1, 2) (divides world_size=2 and the tiny model's 4 layers)"),
    ({"pp": 2, "ep": 2}, "preflight.ep must be one of (1,) (divides world_size / pp = 1"),
    ({"steps": 2}, "preflight.steps"),
    ({"save_at": 10}, "preflight.save_at"),
    ({"overrides": ("optimizer.collectives=ring",)}, "optimizer.collectives"),
])
def test_bad_input_is_refused_in_one_line_naming_the_field(kwargs, message):
    with pytest.raises(ValueError) as refused:
        PreflightRequest(**{"recipe": "kimi_k2_muon", "world_size": 2, **kwargs})
    assert message in str(refused.value) and "\n" not in str(refused.value)
