"""bench/gpu/step_time_ns.py, the GPU counterpart of bench/launches.py and the operator floor's measurement, run on
this CPU (``--cpu``, dimensions divided by 128, the per-rank Qwen3 set only): it measures a floor and prints the
option to pass, and times one optimizer step of each implementation, ours batched below Megatron's (1,554 small
matrices: the step is its operators here as on a GPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu" / "step_time_ns.py"


def test_step_time_ns_runs_on_cpu_and_prints_the_floor_and_each_implementations_step() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--divisor", "128", "--reps", "1", "--workload",
                          "qwen3_busiest_rank"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    floor = re.search(r"use: nemo-muon plan --kernel-floor-us ([0-9.]+)", run.stdout)
    assert floor and 0.0 < float(floor.group(1)) < 1000.0, run.stdout
    rows = dict(re.findall(r"^\| qwen3_busiest_rank \(1,554\) \| (\w+) \| n/a \| [0-9.]+ ms \| n/a \| ([0-9.]+) \|$",
                           run.stdout, re.M))
    assert set(rows) == {"megatron", "nemo_muon", "nemo_muon_per_matrix"}, run.stdout
    assert float(rows["megatron"]) == 1.0 and float(rows["nemo_muon"]) < 1.0  # a ratio in the same run


def test_step_time_ns_without_a_gpu_says_what_to_do() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--reps", "1"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "needs a CUDA GPU" in run.stderr and "--cpu" in run.stderr
