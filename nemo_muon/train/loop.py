"""The torch-backend training loop: one function, `train(recipe, group=...)`, run by every data-parallel rank.

Per optimizer step: the global batch (``trainer.global_batch_size`` windows, chosen by `TokenData` from the seed
and the step) is split evenly over the DP ranks and, within a rank, into micro-batches of
``trainer.micro_batch_size`` (gradient accumulation). The loss is the mean token cross-entropy of the whole
global batch, so the update does not depend on the DP size; the loss is summed on the device and read once per
step. The training optimizer reduces, clips and steps at the rate on its param groups, which one torch LR scheduler
(`nemo_muon.train.schedule.build_lr_scheduler`, positioned at the first step of this run) owns and advances after
each step. Rank 0 logs metrics (JSONL schema in docs/ARCHITECTURE.md) with the rate read back from the param groups,
prints a progress line, validates every ``trainer.eval_interval`` steps and at the end, and checkpoints.

Checkpoints are `nemo_muon.layerwise.checkpoint`'s (atomic, never overwritten, loadable at any DP size, verified
by checksums agreed across ranks, data only), for every optimizer; the training state rides in their ``extra``
(`nemo_muon.train.state`): step, data position, scheduler, optimizer settings, RNG. A resume that cannot be
honoured raises `RunRefused` or `CheckpointError` on every rank; a diverged run (``trainer.max_consecutive_skips``
skipped steps in a row, `nemo_muon.train.divergence`) raises `TrainingDiverged` after warning at each skipped step.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.layerwise import checkpoint as lw_ckpt
from nemo_muon.models.hf import build_model, count_parameters
from nemo_muon.train.data import TokenData, build_token_data, default_cache_dir
from nemo_muon.train.divergence import DivergenceWatch
from nemo_muon.train.flops import StepFlops, step_flops
from nemo_muon.train.metrics import METRICS_FILE, MetricsWriter, Stopwatch, load_average, machine_info, progress_line
from nemo_muon.train.optimizers import StepResult, TrainingOptimizer, build_training_optimizer
from nemo_muon.train.recipe_rules import check_torch_backend
from nemo_muon.train.refusals import RunRefused, TrainingDiverged
from nemo_muon.train.schedule import build_lr_scheduler
from nemo_muon.train.state import ResumePoint, restore_training_state, training_state


def _rank_world(group: Any) -> tuple[int, int]:
    return (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)


def _barrier(group: Any) -> None:
    if group is not None:
        dist.barrier(group=group)


def check_torch_recipe(recipe: TrainingRecipe, world_size: int) -> int:
    """Validate what the torch backend supports; returns the gradient-accumulation steps per rank."""
    try:
        recipe.validate()
        check_torch_backend(recipe)  # the same rules `run_checks.check_run` applies when the recipe is built
    except ValueError as e:
        raise RunRefused(str(e)) from None
    if recipe.world_size != world_size:
        raise RunRefused(f"system.num_nodes*gpus_per_node must equal the number of running ranks {world_size}; "
                         f"got {recipe.world_size}")
    t = recipe.trainer
    per_step = t.micro_batch_size * world_size
    if t.global_batch_size % per_step:
        raise RunRefused(f"trainer.global_batch_size must be a multiple of micro_batch_size * DP = {per_step}; "
                         f"got {t.global_batch_size}")
    if t.seq_length > recipe.model.max_position_embeddings:
        raise RunRefused(f"trainer.seq_length must be <= model max_position_embeddings "
                         f"{recipe.model.max_position_embeddings}; got {t.seq_length}")
    return t.global_batch_size // per_step


def training_device(recipe: TrainingRecipe) -> torch.device:
    """Where this rank trains: the CPU for ``system.gpu == 'cpu'``, else CUDA device LOCAL_RANK (torchrun/srun)."""
    if recipe.system.gpu == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"system.gpu must be 'cpu' for backend 'torch' on a machine without CUDA devices; "
                         f"got {recipe.system.gpu!r}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def check_eval_windows(recipe: TrainingRecipe, data: TokenData) -> None:
    """Validation uses eval_iters * global_batch_size windows (all for eval_iters=0): refuse more than the data holds."""
    t = recipe.trainer
    if t.eval_iters * t.global_batch_size > data.num_val:
        raise RunRefused(f"trainer.eval_iters * global_batch_size must be <= the {data.num_val} validation windows "
                         f"(raise data.val_fraction, or eval_iters=0 for all of them); got {t.eval_iters} * "
                         f"{t.global_batch_size} = {t.eval_iters * t.global_batch_size}")


def autocast_context(kind: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` for precision 'bf16' (raises on a CPU without bf16 kernels), else nothing."""
    if kind != "bf16":
        return contextlib.nullcontext()
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError("precision.kind must be 'fp32' on this CPU (no bf16 support); got 'bf16'")
    return torch.autocast(device.type, dtype=torch.bfloat16)


def param_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters live: inputs and the scalars all-reduced go there (NCCL reduces no CPU tensors)."""
    return next(model.parameters()).device


def _loss_sum(model: torch.nn.Module, windows: np.ndarray, precision: str) -> tuple[torch.Tensor, int]:
    x = torch.from_numpy(windows).to(param_device(model))
    with autocast_context(precision, x.device):
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
    return loss, x[:, 1:].numel()


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: TokenData, recipe: TrainingRecipe, group: Any) -> float:
    """Mean validation token loss over the first eval_iters * global_batch_size validation windows (all of them
    when eval_iters == 0); the windows are split over ranks and the sums reduced, so the value is DP-independent."""
    rank, world = _rank_world(group)
    t = recipe.trainer
    ids = data.val_ids(t.eval_iters * t.global_batch_size if t.eval_iters else None)
    mine = np.array_split(ids, world)[rank]
    was_training = model.training
    model.eval()
    device = param_device(model)
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for start in range(0, len(mine), t.micro_batch_size):
        loss, n = _loss_sum(model, data.batch(mine[start: start + t.micro_batch_size]), recipe.precision.kind)
        total[0] += loss.double()  # summed on the device: one host read at the end, not one per micro-batch
        total[1] += n
    if group is not None:
        dist.all_reduce(total, group=group)
    model.train(was_training)
    return float(total[0] / total[1])


def run_dir_of(recipe: TrainingRecipe) -> Path:
    return Path(recipe.logging.root) / (recipe.logging.run_name or recipe.name)


def resume_or_check_fresh(recipe: TrainingRecipe, ckpt_root: Path, model: torch.nn.Module, opt: TrainingOptimizer,
                          data: TokenData, group: Any) -> ResumePoint | None:
    """With ``checkpoint.resume``: load the newest checkpoint under ``ckpt_root`` (refusing a damaged one, never
    skipping it) and check it against this run; else refuse a checkpoint root that is already in use."""
    latest = lw_ckpt.latest_checkpoint(ckpt_root)
    if not recipe.checkpoint.resume:
        if recipe.checkpoint.save_interval and latest is not None:
            raise RunRefused(f"checkpoint.dir {str(ckpt_root)!r} already holds checkpoints; set "
                             "checkpoint.resume=True or choose a new checkpoint.dir / logging.run_name (checkpoints "
                             "are never overwritten)")
        return None
    if latest is None:
        raise RunRefused(f"checkpoint.resume=True needs a verified checkpoint under {str(ckpt_root)!r}; found none")
    try:
        extra = lw_ckpt.load_checkpoint(latest, model, opt.whole_tensor, group)
    except lw_ckpt.CheckpointError as err:
        fix = "" if "aside" in str(err) else ". Move that folder aside to resume from an earlier checkpoint"
        raise lw_ckpt.CheckpointError(f"checkpoint.resume=True cannot resume from {str(latest)!r}: {err}{fix}") from err
    return restore_training_state(extra, recipe, data, latest)


def _stop(metrics: MetricsWriter, step: int, err: TrainingDiverged) -> NoReturn:
    """End a diverged run: record a ``stop`` event, close the metrics, raise ``err`` (the entry point prints it)."""
    metrics.write("stop", step=step, reason="diverged", message=str(err))
    metrics.close()
    raise err


def _watch_step(watch: DivergenceWatch, metrics: MetricsWriter, step: int, loss: float, result: StepResult) -> None:
    """Warn about a non-finite loss or a skipped step; stop the run after too many consecutive skips."""
    try:
        warning = watch.observe(step, loss, result.grad_norm, result.skipped)
    except TrainingDiverged as err:
        _stop(metrics, step, err)
    if warning is not None:
        metrics.warn(warning)


def train(recipe: TrainingRecipe, *, group: Any = None, stop_after_steps: int | None = None) -> dict[str, Any]:
    """Train ``recipe`` on this rank of ``group`` (None = one process); returns a summary (same on every rank).

    ``stop_after_steps`` ends the run early after that many steps (the schedule still spans max_steps): used to
    simulate an interruption before ``checkpoint.resume``.
    """
    rank, world = _rank_world(group)
    accum = check_torch_recipe(recipe, world)
    device = training_device(recipe)
    t = recipe.trainer
    run_dir = run_dir_of(recipe)
    ckpt_root = Path(recipe.checkpoint.dir) if recipe.checkpoint.dir else run_dir / "checkpoints"

    cache_dir = default_cache_dir(recipe.data, recipe.logging.root)
    build = lambda: build_token_data(recipe.data, vocab_size=recipe.model.vocab_size,  # noqa: E731
                                     seq_length=t.seq_length, seed=t.seed, cache_dir=cache_dir)
    if rank == 0:  # one rank fills the tokenizer / token caches, the others then read them
        data = build()
    _barrier(group)
    if rank != 0:
        data = build()
    check_eval_windows(recipe, data)

    torch.manual_seed(t.seed)
    model = build_model(recipe.model, seed=t.seed).to(device)
    model.train()
    opt: TrainingOptimizer = build_training_optimizer(recipe, model, group=group)

    resume = resume_or_check_fresh(recipe, ckpt_root, model, opt, data, group)
    start_step = resume.step if resume else 0
    # the one owner of the rate: absolute rates on the param groups, from the schedule at this run's first step (a
    # checkpoint saved after step k holds the rate of step k, so on a resume this agrees with the restored groups)
    scheduler = build_lr_scheduler(opt.whole_tensor, recipe.scheduler, t.max_steps, peak_lr=recipe.optimizer.lr,
                                   start_step=start_step)
    elapsed_before = resume.elapsed_s if resume else 0.0  # metrics time continues over the resume
    resumed_from = resume.source if resume else None
    if start_step == 0 and (run_dir / METRICS_FILE).exists():
        raise RunRefused(f"logging.run_name must name a new run folder (or set checkpoint.resume=True); "
                         f"{str(run_dir)!r} already holds {METRICS_FILE}")
    _barrier(group)  # every rank has checked the folder before rank 0 creates files in it
    flops: StepFlops = step_flops(recipe, tokens_per_step=t.global_batch_size * t.seq_length, world_size=world)
    metrics = MetricsWriter(run_dir, enabled=rank == 0, tensorboard=recipe.logging.tensorboard)
    metrics.write("run", recipe=recipe.name, optimizer=recipe.optimizer.name, world_size=world,
                  model_params=count_parameters(model), model_family=recipe.model.family,
                  optimizer_engine="layerwise", max_steps=t.max_steps,
                  global_batch_size=t.global_batch_size, micro_batch_size=t.micro_batch_size,
                  grad_accumulation=accum, seq_length=t.seq_length, seed=t.seed, precision=recipe.precision.kind,
                  lr=recipe.optimizer.lr, scheduler=recipe.scheduler.kind, data=data.info,
                  model_flops_per_step=flops.model_flops, ns_flops_per_step=flops.ns_flops,
                  tensorboard=metrics.tensorboard, resumed_from=resumed_from, start_step=start_step,
                  max_consecutive_skips=t.max_consecutive_skips,
                  optimizer_changes=resume.optimizer_changes if resume else None,
                  device=device.type, **machine_info())

    watch = DivergenceWatch(limit=t.max_consecutive_skips)
    clock = Stopwatch()
    per_rank = t.global_batch_size // world
    end_step = t.max_steps if stop_after_steps is None else min(t.max_steps, start_step + stop_after_steps)
    losses: dict[int, float] = {}
    val_losses: dict[int, float] = {}
    steady_time = 0.0
    for step in range(start_step, end_step):
        t0 = time.perf_counter()
        ids = data.train_batch_ids(step, t.global_batch_size, t.seed)[rank * per_rank:(rank + 1) * per_rank]
        opt.zero_grad()
        loss_acc = torch.zeros(1, dtype=torch.float64, device=param_device(model))
        for micro in range(accum):
            chunk = ids[micro * t.micro_batch_size:(micro + 1) * t.micro_batch_size]
            loss, n = _loss_sum(model, data.batch(chunk), recipe.precision.kind)
            (loss / (n * accum * world)).backward()
            loss_acc += loss.detach().double() / n  # on the device: no host sync per micro-batch
        applied_lr = float(opt.param_groups[0]["lr"])  # the rate this step's update applies
        try:
            result = opt.step()
        except FloatingPointError as err:  # optimizer.nonfinite='raise': raised on every rank together
            _stop(metrics, step + 1, DivergenceWatch.nonfinite_raised(step + 1, err))
        scheduler.step()
        if group is not None:
            dist.all_reduce(loss_acc, group=group)
        loss_value = float(loss_acc) / (accum * world)  # the step's one host read of the loss
        step_time = time.perf_counter() - t0
        done = step + 1
        tokens = t.global_batch_size * t.seq_length
        if done > start_step + 1:
            steady_time += step_time
        losses[done] = loss_value
        tps = tokens / step_time
        if done % t.log_interval == 0 or done == end_step or result.skipped:  # every skipped step is logged
            metrics.write("train", step=done, loss=loss_value, lr=applied_lr,
                          grad_norm=result.grad_norm, skipped=result.skipped, skipped_steps=opt.whole_tensor.skipped_steps,
                          tokens=done * tokens, step_time_s=step_time, optimizer_time_s=result.optimizer_time_s,
                          tokens_per_s=tps, model_tflops=flops.model_flops / world / step_time / 1e12,
                          ns_tflops=flops.ns_flops / world / step_time / 1e12, elapsed_s=elapsed_before + clock.elapsed(),
                          load_1m=load_average())
        _watch_step(watch, metrics, done, loss_value, result)
        val_loss = None
        if (t.eval_interval and done % t.eval_interval == 0) or done == t.max_steps:
            opt.wait_params()
            val_loss = evaluate(model, data, recipe, group)
            val_losses[done] = val_loss
            metrics.write("val", step=done, val_loss=val_loss, elapsed_s=elapsed_before + clock.elapsed())
        eta = (end_step - done) * (clock.elapsed() / (done - start_step))
        metrics.progress(progress_line(done, t.max_steps, loss_value, tps, eta, val_loss))
        if recipe.checkpoint.save_interval and (done % recipe.checkpoint.save_interval == 0 or done == end_step):
            opt.wait_params()
            lw_ckpt.save_checkpoint(ckpt_root, done, model, opt.whole_tensor,
                                    training_state(recipe, done, world, data, elapsed_before + clock.elapsed()), group)
    metrics.close()
    steady_steps = max(0, end_step - start_step - 1)
    return {
        "run_dir": str(run_dir), "rank": rank, "world_size": world, "start_step": start_step,
        "end_step": end_step, "resumed_from": resumed_from, "losses": losses, "val_losses": val_losses,
        "tokens_per_s": (steady_steps * t.global_batch_size * t.seq_length / steady_time) if steady_time else None,
        "wall_s": clock.elapsed(), "data": data.info,
    }
