"""bench/gpu/owner_pack.py, the GPU check of 0.16 / 0.17's gradients reduced to their owners, on CPU (gloo): the
script packs a bucket in owner order, reduces on a one-rank group, unpacks its ranges and checks them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu" / "owner_pack.py"


def test_owner_pack_runs_on_cpu_and_its_check_passes() -> None:
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                          str(SCRIPT), "--cpu", "--hidden", "56", "--dp", "4", "--reps", "2"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "and the rest untouched: ok; 2 owned + 1 shared ranges of 8" in run.stdout, run.stdout
    assert "pack + reduces + unpack / one copy of the bucket:" in run.stdout


def test_owner_pack_refuses_a_group_of_one_owner() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--dp", "1"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "--dp must be >= 2" in run.stderr
