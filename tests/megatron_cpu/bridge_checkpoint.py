"""Megatron-Bridge's own checkpoint functions (``megatron.bridge.training.checkpointing.save_checkpoint`` /
``load_checkpoint``) on the tiny model that Bridge's own model and optimizer setup built (`bridge_setup`: the
product's cost layout on Bridge 0.5 / 0.6, Megatron's legacy layer-wise path on 0.4), on gloo CPU ranks.

Beyond the harness's shims, Bridge's save needs one test-only answer, `cpu_rng_state`: its ``get_rng_state``
(``training/checkpointing.py``) reads ``torch.cuda.get_rng_state()`` at every save, which raises without a driver;
here it returns the CPU generator's state. The load runs with ``load_rng=False``: the harness seeds with
``model_parallel_cuda_manual_seed(..., inference_rng_tracker=True)``, whose tracker saves no states, and the tiny
models have no dropout, so no random number reaches the loss.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import Any

from tests.megatron_cpu.bridge_layout_training import BridgeSetup, bridge_setup
from tests.megatron_cpu.training import GLOBAL_MICRO_BATCHES, MICRO_BATCH, _forward_backward, megatron_parallel

SPEC = "tiny_kimi_k2"
TRAIN_ITERS = 100
RNG_READS: list[int] = []
"""How often `cpu_rng_state` answered (the test checks it was reached)."""


@contextlib.contextmanager
def cpu_rng_state() -> Iterator[None]:
    """``torch.cuda.get_rng_state`` -> the CPU generator's state, while Bridge saves."""
    import torch

    original = torch.cuda.get_rng_state

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        RNG_READS.append(1)
        return torch.get_rng_state()

    torch.cuda.get_rng_state = get_rng_state
    try:
        yield
    finally:
        torch.cuda.get_rng_state = original


def _global_state(setup: BridgeSetup, world_size: int, root: str, *, load: bool) -> Any:
    """Bridge's GlobalState around a real ConfigContainer (the save writes it as run_config.yaml, the load reads
    the parallel sizes back from it) with Megatron's micro-batch calculator the load updates."""
    from megatron.bridge.training.config import CheckpointConfig, ConfigContainer, LoggerConfig, TrainingConfig
    from megatron.bridge.training.state import GlobalState
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.core.num_microbatches_calculator import (
        init_num_microbatches_calculator,
        unset_num_microbatches_calculator,
    )

    checkpoint = CheckpointConfig(save=root, load=root if load else None, ckpt_format="torch_dist", async_save=False,
                                  save_optim=True, load_optim=True, load_rng=False, fully_parallel_save=True,
                                  most_recent_k=-1)
    train = TrainingConfig(micro_batch_size=MICRO_BATCH, global_batch_size=MICRO_BATCH * GLOBAL_MICRO_BATCHES,
                           train_iters=TRAIN_ITERS)
    state = GlobalState()
    state.cfg = ConfigContainer(train=train, model=setup.model_config, optimizer=setup.optim_config,
                                scheduler=setup.scheduler_config, dataset=None, logger=LoggerConfig(),
                                tokenizer=TokenizerConfig(), checkpoint=checkpoint, ddp=setup.ddp_config)
    unset_num_microbatches_calculator()
    init_num_microbatches_calculator(0, None, MICRO_BATCH * GLOBAL_MICRO_BATCHES, MICRO_BATCH, world_size)
    return state


def _files(root: str) -> dict[str, str]:
    """Path under ``root`` -> SHA-256 of every file."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return dict(sorted(out.items()))


def _train_step(setup: BridgeSetup, state: Any, step: int, group: Any, world_size: int) -> float:
    import torch.distributed as dist
    from megatron.core import parallel_state

    micro = GLOBAL_MICRO_BATCHES // parallel_state.get_data_parallel_world_size()
    loss = _forward_backward(setup.ddp_model, setup.optimizer, step, parallel_state.get_data_parallel_rank(),
                             setup.spec.vocab_size, micro)
    ok, _, _ = setup.optimizer.step()
    if not ok:
        raise RuntimeError(f"optimizer step {step} was skipped")
    setup.scheduler.step(increment=1)
    state.train_state.step = step + 1
    state.train_state.consumed_train_samples = (step + 1) * MICRO_BATCH * GLOBAL_MICRO_BATCHES
    loss = loss.reshape(1).float()
    dist.all_reduce(loss, group=group)
    return float(loss) / world_size


def bridge_save(setup: BridgeSetup, state: Any) -> None:
    """Bridge's save as its training loop makes it (``train.save_checkpoint_and_time``): with the distributed
    optimizer and the param gather overlapped with the next forward (the cost layout), the gather of the last update
    is forced first, so that every rank writes current weights; then ``save_checkpoint``."""
    import inspect

    from megatron.bridge.training import train as bridge_train
    from megatron.bridge.training.checkpointing import save_checkpoint

    cfg = state.cfg
    if bridge_train.should_disable_forward_pre_hook(False, cfg.optimizer.use_distributed_optimizer,
                                                    cfg.ddp.overlap_param_gather):
        takes_optimizer = "optimizer" in inspect.signature(bridge_train.force_param_sync).parameters
        bridge_train.force_param_sync([setup.ddp_model], **({"optimizer": setup.optimizer} if takes_optimizer else {}))
    save_checkpoint(state, [setup.ddp_model], setup.optimizer, setup.scheduler, 0, checkpointing_context={})


def train_and_save(rank: int, world_size: int, group: Any, optimizer_name: str, root: str, steps: int,
                   save_at: tuple[int, ...], cost_layout: bool) -> dict[str, Any]:
    """Train ``steps`` steps from the seed through Bridge's setup, calling Bridge's save_checkpoint after each step
    in ``save_at``; rank 0 reports the files under ``root`` after each save."""
    import torch.distributed as dist

    with megatron_parallel(), cpu_rng_state():
        setup = bridge_setup(SPEC, TRAIN_ITERS, cost_layout, optimizer_name)
        state = _global_state(setup, world_size, root, load=False)
        losses, files = [], {}
        for step in range(steps):
            losses.append(_train_step(setup, state, step, group, world_size))
            if step + 1 in save_at:
                bridge_save(setup, state)
                dist.barrier(group=group)
                files[step + 1] = _files(root) if rank == 0 else {}
        return {"losses": losses, "files": files, "rng_reads": len(RNG_READS),
                "optimizer": type(setup.optimizer).__name__}


def resume_and_die_in_save(rank: int, world_size: int, group: Any, optimizer_name: str, root: str,
                           cost_layout: bool, dying_rank: int) -> dict[str, Any]:
    """Bridge's load_checkpoint from ``root`` (its tracker), one step (its loss is reported to a file, since this
    job does not return), one more, then Bridge's save of the next iteration, during which rank ``dying_rank`` exits
    like ``kill -9`` (``os._exit``, after killing its writer's result-queue manager, which holds no data) right after
    its torch_dist writer wrote its data file: the save never reaches its index or the tracker. Run it with a short
    collective timeout, so that the other ranks fail their next collective and exit by themselves."""
    import json
    import multiprocessing

    import torch.distributed as dist
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    with megatron_parallel(), cpu_rng_state():
        setup = bridge_setup(SPEC, TRAIN_ITERS, cost_layout, optimizer_name)
        from megatron.bridge.training.checkpointing import load_checkpoint

        state = _global_state(setup, world_size, root, load=True)
        iteration, _ = load_checkpoint(state, [setup.ddp_model], setup.optimizer, setup.scheduler,
                                       checkpointing_context={})
        loss = _train_step(setup, state, iteration, group, world_size)
        if rank == 0:
            with open(os.path.join(os.path.dirname(root), "resumed.json"), "w") as f:
                json.dump({"iteration": iteration, "loss": loss}, f)
        _train_step(setup, state, iteration + 1, group, world_size)
        writer = filesystem_async.FileSystemWriterAsync
        original = writer.write_preloaded_data

        def write_then_die(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if dist.get_rank() == dying_rank:
                for helper in multiprocessing.active_children():  # the writer's result-queue manager: no data
                    helper.kill()
                os._exit(9)
            return out

        writer.write_preloaded_data = staticmethod(write_then_die)
        bridge_save(setup, state)
        return {"unexpected": "the save finished"}
