"""The multi-process harness itself: results come back by rank, failures and hangs surface as errors."""

import pytest
import torch
import torch.distributed as dist

from tests.distributed import run_distributed


def _sum_ranks(rank, world_size, group):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    return t.item()


def _fail_on_rank_one(rank, world_size, group):
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def _return_tensor(rank, world_size, group):
    return {"x": torch.ones(2)}


def test_tensor_results_are_refused_with_a_clear_error():
    with pytest.raises(RuntimeError, match="returned a torch.Tensor; return plain data"):
        run_distributed(_return_tensor, world_size=2, timeout_s=60)


def test_all_reduce_reaches_every_rank():
    assert run_distributed(_sum_ranks, world_size=2, timeout_s=60) == [3.0, 3.0]


def test_rank_failure_is_reported_with_traceback():
    with pytest.raises(RuntimeError, match="boom on rank 1"):
        run_distributed(_fail_on_rank_one, world_size=2, timeout_s=60)


_STATE = {"runs": 0}
"""A module-level value a rank changes: a rank forked from the preloaded server must never see an earlier rank's."""


def _count_and_read_env(rank, world_size, group, name):
    import os
    import sys

    _STATE["runs"] += 1
    return {"runs": _STATE["runs"], "env": os.environ.get(name), "pid": os.getpid(),
            "torch_preloaded": "torch" in sys.modules, "threads": torch.get_num_threads()}


def test_preloaded_ranks_are_new_processes_with_the_callers_environment(monkeypatch):
    """Ranks forked from the tests' preloaded server (`tests.distributed.rank_context`) start as spawned ranks
    would: new processes (no state of an earlier run), the caller's environment at the call (not the server's at
    its start), one thread; the same function run under plain spawn returns the same."""
    from nemo_muon.train.spawn import spawn_ranks

    first = run_distributed(_count_and_read_env, world_size=2, args=("NEMO_MUON_HARNESS_PROBE",), timeout_s=60)
    monkeypatch.setenv("NEMO_MUON_HARNESS_PROBE", "set after the server started")
    second = run_distributed(_count_and_read_env, world_size=2, args=("NEMO_MUON_HARNESS_PROBE",), timeout_s=60)
    spawned = spawn_ranks(_count_and_read_env, 2, ("NEMO_MUON_HARNESS_PROBE",), timeout_s=120)
    assert [r["runs"] for r in first + second + spawned] == [1] * 6
    assert [r["env"] for r in first] == [None, None]
    assert [r["env"] for r in second] == [r["env"] for r in spawned] == ["set after the server started"] * 2
    assert len({r["pid"] for r in first + second}) == 4
    assert all(r["threads"] == 1 for r in first + second + spawned)


def _megatron_fused_kernel_runs_eagerly(rank, world_size, group):
    from megatron.core.fusions.fused_bias_swiglu import swiglu

    x = torch.randn(4, 8)
    counts = torch._dynamo.utils.counters["stats"]
    before = counts["calls_captured"] + counts["unique_graphs"]
    got = swiglu(x)
    traced = counts["calls_captured"] + counts["unique_graphs"] - before
    a, b = x.chunk(2, dim=-1)
    return {"traced": traced, "max_err": (got - torch.nn.functional.silu(a) * b).abs().max().item()}


def test_ranks_run_megatrons_compiled_kernels_eagerly():
    """tests/conftest.py sets TORCH_COMPILE_DISABLE for the test ranks: Megatron's torch.compile'd fused kernels run as
    plain eager code there (inductor's CPU compile tripled the Megatron CPU tests' time), with the same result."""
    out = run_distributed(_megatron_fused_kernel_runs_eagerly, world_size=2, timeout_s=120)
    assert [r["traced"] for r in out] == [0, 0]
    assert max(r["max_err"] for r in out) < 1e-6
