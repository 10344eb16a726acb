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
