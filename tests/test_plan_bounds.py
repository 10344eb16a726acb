"""What a plan enumerates is bounded before it is enumerated: a model too large to plan and a pipeline layout that
expands past its bound are refused in one line, alike by ``nemo-muon plan`` and ``launch --dry-run`` (the one
validation of a run, `nemo_muon.run_checks.check_run` -> `accounting.layout.validate_layout`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main

from nemo_muon.accounting.layout import MAX_LAYER_SLOTS, MAX_LAYOUT_SYMBOLS, LayoutError, parse_pipeline_layout

REFUSED = f"model.num_layers x (1 + model.num_experts) must be at most {MAX_LAYER_SLOTS}"


def test_plan_refuses_a_model_too_large_to_plan_in_one_line_without_growing() -> None:
    """In a child with a 3 GiB address-space cap: the old planner enumerated a million layers' tensors past 3 GB."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from nemo_muon.launchers.cli import main; "
            "main(['plan', '--recipe', 'tiny_kimi_k2_muon', '--set', 'model.num_layers=1000000'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and REFUSED in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("override", ["model.num_layers=1000000", "model.num_experts=100000"])
def test_launch_dry_run_refuses_what_plan_refuses(override: str) -> None:
    result = CliRunner().invoke(main, ["launch", "--recipe", "tiny_kimi_k2_muon", "--dry-run", override])
    assert result.exit_code == 2 and REFUSED in " ".join(result.output.split()), result.output


def test_a_repeated_layout_group_is_refused_before_it_expands() -> None:
    """Forty ``(t)*900000`` groups: each under the bound, together 36,000,000 symbols (the old check was per group)."""
    with pytest.raises(LayoutError, match=f"must expand to at most {MAX_LAYOUT_SYMBOLS} symbols"):
        parse_pipeline_layout("(t)*900000" * 40)
    with pytest.raises(LayoutError, match=f"must expand to at most {MAX_LAYOUT_SYMBOLS} symbols"):
        parse_pipeline_layout("((t)*1000)*1001")
    assert parse_pipeline_layout("Et|(tt|)*30L") == (1, *([2] * 30), 0)


def test_plan_refuses_an_exploding_layout_in_one_short_line() -> None:
    result = CliRunner().invoke(main, ["plan", "--recipe", "tiny_kimi_k2_muon", "--pipeline-layout",
                                       "(t)*900000" * 40])
    assert result.exit_code == 2 and "must expand to at most" in result.output and len(result.output) < 1500


@pytest.mark.parametrize("layout", ["t*١٢", "(t)*٣", "t*99999999", "(t" * 6000])
def test_layout_repeat_counts_are_short_ascii_numbers(layout: str) -> None:
    with pytest.raises(LayoutError, match="parallelism.pipeline_layout must"):
        parse_pipeline_layout(layout)
