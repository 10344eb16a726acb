"""`nemo-muon preflight` on the command line: bad input is one line naming the field and nothing starts; the command
it runs is torchrun over `nemo_muon.preflight.main`, which refuses a machine without CUDA in one line (the CPU
preflight itself runs in tests/megatron_cpu/test_preflight.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main

from nemo_muon.train.refusals import REFUSED_EXIT


@pytest.mark.parametrize(("args", "message"), [
    (["--recipe", "kimi_k2_mun"], "preflight.recipe must be one of ("),
    (["--recipe", "tiny_kimi_k2_muon"], "backend must be 'megatron' for preflight"),
    (["--recipe", "qwen3_30b_a3b_adamw"], "optimizer.kind must be a layer-wise matrix optimizer"),
    (["--recipe", "kimi_k2_muon", "--nproc-per-node", "2", "--ep", "4"], "preflight.ep must be one of (1, 2)"),
    (["--recipe", "kimi_k2_muon", "--nproc-per-node", "4", "--pp", "3"], "preflight.pp must be one of (1, 2, 4)"),
    (["--recipe", "kimi_k2_muon", "--nproc-per-node", "4", "--pp", "2", "--ep", "4"],
     "preflight.ep must be one of (1, 2) (divides world_size / pp = 2"),
    (["--recipe", "kimi_k2_muon", "optimizer.collectives=ring"], "optimizer.collectives"),
    (["--recipe", "kimi_k2_muon", "--executor", "slurm"], "--image must be set (or --no-container)"),
    (["--recipe", "kimi_k2_muon", "--executor", "slurm", "--no-container", "--nodes", "2", "--nproc-per-node", "2",
      "--ep", "8"], "preflight.ep must be one of (1, 2, 4)"),
    (["--recipe", "kimi_k2_muon", "--executor", "slurm", "--no-container", "--partition", "a b"],
     "slurm partition must match"),
    (["--recipe", "kimi_k2_muon", "--executor", "slurm", "--no-container", "--env", "1X=2"], "--env must be NAME=value"),
])
def test_bad_input_is_one_line_naming_the_field_and_nothing_starts(args, message, tmp_path):
    out = tmp_path / "pf"
    result = CliRunner().invoke(main, ["preflight", *args, "--out", str(out)])
    assert result.exit_code == REFUSED_EXIT, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("preflight refused: ") and message in lines[0], result.output
    assert not out.exists()


def test_the_dry_run_prints_torchrun_over_the_preflight_entry_point():
    result = CliRunner().invoke(main, ["preflight", "--recipe", "kimi_k2_muon_split", "--nproc-per-node", "4",
                                       "--ep", "2", "--dry-run", "trainer.grad_clip=0.5"])
    assert result.exit_code == 0, result.output
    argv = result.output.split()
    assert argv[1:8] == ["-m", "nemo_muon.launchers.torchrun", "--standalone", "--nproc-per-node", "4", "-m",
                         "nemo_muon.preflight.main"]
    assert argv[argv.index("--ep") + 1] == "2" and argv[-1] == "trainer.grad_clip=0.5"


def test_slurm_options_with_the_local_executor_are_refused_naming_them():
    result = CliRunner().invoke(main, ["preflight", "--recipe", "kimi_k2_muon", "--image", "x", "--wait"])
    assert result.exit_code == 2
    assert "--image, --wait/--no-wait: only with --executor slurm; got --executor local" in result.output


def test_the_slurm_dry_run_is_one_srun_task_per_gpu_of_the_entry_point_with_the_recipes_environment(tmp_path):
    from nemo_muon.recipes import get_recipe

    out = tmp_path / "pf"
    result = CliRunner().invoke(main, [
        "preflight", "--recipe", "kimi_k2_muon", "--executor", "slurm", "--nodes", "2", "--nproc-per-node", "4",
        "--ep", "2", "--image", "nvcr.io/nvidia/nemo:26.02", "--account", "acct", "--out", str(out), "--dry-run",
        "trainer.grad_clip=0.5"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --account=acct", "#SBATCH --time=00:30:00", f"#SBATCH --output={out}/slurm-%j.out"):
        assert line in lines, line
    for name, value in get_recipe("kimi_k2_muon").env.items():  # the NCCL / CUDA variables its job runs with
        assert f"export {name}={value}" in lines
    srun = [line for line in lines if line.startswith("srun ")]
    assert srun[0].startswith("srun --kill-on-bad-exit=0 --wait=60 ")  # every rank ends with the preflight's code
    # no --pp given: the recipe's PP=4 scaled to 8 ranks (4 stages of 2 data-parallel ranks, as launch runs it)
    assert len(srun) == 1 and srun[0].endswith(
        f"python -m nemo_muon.preflight.main --recipe kimi_k2_muon --out {out} --steps 10 --pp 4 --ep 2 "
        "--time-limit-s 900 trainer.grad_clip=0.5")
    assert f"--container-mounts={out}:{out}" in srun[0]
    assert lines[-1] == f"sbatch --parsable --export=ALL {out}/preflight.sbatch" and not out.exists()


def test_the_entry_point_refuses_a_machine_without_cuda_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the entry point runs the preflight here instead of refusing")
    argv = [sys.executable, "-m", "nemo_muon.preflight.main", "--recipe", "kimi_k2_muon", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == REFUSED_EXIT, done.stderr
    assert done.stderr.strip().splitlines() == [
        "preflight refused: preflight.device='cuda' needs a CUDA device; got none on this machine (preflight proves "
        "the GPU path; on CPU it runs in the test harness, tests/megatron_cpu/test_preflight.py)"]
    on_cpu = subprocess.run([*argv, "--device", "cpu"], capture_output=True, text=True, timeout=120, check=False)
    assert on_cpu.returncode == REFUSED_EXIT, on_cpu.stderr
    assert on_cpu.stderr.strip().splitlines() == [
        "preflight refused: preflight.device='cpu' needs Megatron-Core's CUDA calls answered on CPU (only the test "
        "harness's shims do: tests/megatron_cpu/shims.py); got torch.cuda.current_device() failing here: run it on "
        "GPUs (--device cuda)"]
