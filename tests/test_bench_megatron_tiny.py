"""bench/gpu/megatron_tiny.py trains only the Muon engines the stack can build: on the NGC 26.02 stack Megatron's own
Muon is left out, naming the `nemo_muon.megatron.shared.stack` rule; on a stack that builds both, both run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from nemo_muon.megatron.shared.stack import installed_versions, release_versions

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu" / "megatron_tiny.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("megatron_tiny", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_muon_on_the_2602_stack_leaves_megatrons_own_engine_out_with_the_rule() -> None:
    engines, left_out = _script().runnable_engines("muon", release_versions("26.02"))
    assert engines == ["nemo_muon"]
    assert list(left_out) == ["megatron"]
    assert left_out["megatron"].startswith("[mcore016-muon-emerging-optimizers] megatron-core 0.16.0 cannot build")


def test_muon_on_a_stack_that_builds_both_runs_both_engines_and_adamw_runs_once() -> None:
    script = _script()
    assert script.runnable_engines("muon", release_versions("26.06")) == (["nemo_muon", "megatron"], {})
    assert script.runnable_engines("adamw", release_versions("26.02")) == ([None], {})


def test_script_without_a_gpu_stops_after_reporting_the_engines_it_leaves_out() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--optimizer", "muon"], capture_output=True, text=True,
                         timeout=120)
    _, left_out = _script().runnable_engines("muon", installed_versions())
    assert run.returncode == 1
    assert "needs a CUDA GPU" in run.stderr
    assert run.stdout.count("left out: muon with engine") == len(left_out)
