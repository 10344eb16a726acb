"""A stalled rank (SIGSTOP: alive, silent) ends the job in bounded time: system.collective_timeout_s.

Two gloo ranks with a 3-5 s collective timeout: the rank still running fails its next collective after the timeout
and the job ends with an error, through `spawn_ranks` (what `launch_local` and the tests use) and through torchrun
running the job entry (what ``nemo-muon launch`` runs locally and NeMo-Run's LocalExecutor starts). Without the
timeout both would wait for the default 30 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from nemo_muon.config.limits import CPU_COLLECTIVE_TIMEOUT_S, GPU_COLLECTIVE_TIMEOUT_S
from nemo_muon.config.recipe import SystemConfig
from nemo_muon.train.spawn import spawn_ranks

TIMEOUT_S = 3.0


def test_the_timeout_is_a_validated_field_with_a_default_per_device_kind() -> None:
    assert SystemConfig(gpu="cpu", gpus_per_node=2).collective_timeout == CPU_COLLECTIVE_TIMEOUT_S == 300.0
    assert SystemConfig(gpu="gb300").collective_timeout == GPU_COLLECTIVE_TIMEOUT_S == 600.0
    assert SystemConfig(gpu="cpu", collective_timeout_s=7).collective_timeout == 7.0
    with pytest.raises(ValueError, match=r"system.collective_timeout_s must be a number in \(0.0, 86400.0\]; got -1"):
        SystemConfig(collective_timeout_s=-1)


def _stall_rank_one(rank: int, world: int, group: Any) -> int:
    import torch
    import torch.distributed as dist

    x = torch.ones(1)
    dist.all_reduce(x, group=group)  # both ranks are up
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # alive, holding its sockets, answering nothing
    for _ in range(1000):
        dist.all_reduce(x, group=group)
    return int(x.item())


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_spawned_ranks_end_within_the_collective_timeout_when_one_is_stopped() -> None:
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 0 failed") as err:
        spawn_ranks(_stall_rank_one, 2, timeout_s=90, collective_timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert "all_reduce" in str(err.value) or "Timed out" in str(err.value) or "timed out" in str(err.value)
    # startup of two spawned interpreters + the timeout + spawn_ranks' 10 s join of the stopped rank
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _rank_process(pid: int, rank: int) -> psutil.Process | None:
    for child in _children(pid):
        try:
            if "run_recipe" in " ".join(child.cmdline()) and child.environ().get("RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    return None


def _train_steps(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return sum(1 for line in metrics.read_text().splitlines() if line and json.loads(line).get("event") == "train")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_torchrun_job_ends_within_the_bound_when_a_rank_is_stopped(tmp_path: Path) -> None:
    """The job entry under torchrun: rank 0 fails its collective after 5 s, torchrun stops the job (its 30 s grace
    before SIGKILL is the rest of the bound); the rerun with ``checkpoint.resume=true`` resumes from the last
    complete checkpoint."""
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "nemo_muon.launchers.run_recipe", "--recipe", "tiny_kimi_k2_muon", "system.collective_timeout_s=5",
            "trainer.max_steps=30", "trainer.global_batch_size=4", "trainer.micro_batch_size=2",
            "trainer.seq_length=32", "trainer.eval_interval=0", "data.kind=mock", f"logging.root={runs}",
            "checkpoint.save_interval=1", "scheduler.warmup_steps=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while _train_steps(runs / "tiny_kimi_k2_muon" / "metrics.jsonl") < 2:
            assert job.poll() is None, job.stdout.read()[-3000:] if job.stdout else ""
            assert time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.5)
        rank1 = _rank_process(job.pid, 1)
        assert rank1 is not None, [c.cmdline() for c in _children(job.pid)]
        rank1.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        code = job.wait(timeout=120)
        ended = time.monotonic() - stopped
        output = job.stdout.read() if job.stdout else ""
        assert code != 0, output[-3000:]
        assert ended < 5 + 30 + 25, f"the job took {ended:.0f} s to end after the stop"
        assert "timed out" in output.lower() or "timeout" in output.lower(), output[-3000:]
        # the rerun resumes from the last complete checkpoint of the stopped job and trains on
        run_dir = runs / "tiny_kimi_k2_muon"
        saved = sorted(int(d.name.split("_")[1]) for d in run_dir.rglob("step_*") if d.is_dir())
        assert saved, sorted(str(p) for p in run_dir.rglob("*"))[:50]
        last = saved[-1]
        assert last < 30, "the stopped job must not have finished"
        rerun = subprocess.run([*argv, "checkpoint.resume=true"], env=env, capture_output=True, text=True,
                               timeout=200)
        assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
        events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        resumed_runs = [e for e in events if e.get("event") == "run" and e.get("start_step") == last]
        assert resumed_runs and str(resumed_runs[-1].get("resumed_from", "")).endswith(f"step_{last:08d}"), events[-5:]
        assert any(e.get("event") == "train" and e.get("step") == 30 for e in events), events[-5:]
    finally:
        for child in _children(job.pid):
            child.kill()
        if job.poll() is None:
            job.kill()
            job.wait(timeout=30)
