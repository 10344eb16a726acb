"""A tiny model trained on real text through Megatron-Core's real stack on CPU gloo ranks, with validation.

The harness of `training.py` (GPTModel with the local spec, Float16Module, DDP, the optimizer our mapping builds,
Megatron's schedule and `finalize_model_grads`) fed with the token windows of the torch backend's data
(`nemo_muon.train.data.TokenData`: the same corpus, tokenizer, train / validation split and per-step batches as
`make demo`), Megatron's `OptimizerParamScheduler` for warm-up and cosine decay, and the validation loss on fixed
held-out windows every ``eval_interval`` steps. `bench/megatron_quality.py` runs it for Muon and AdamW.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextRun:
    """The data and schedule of a `train_on_text` run (plain data: it crosses into the rank processes)."""

    tokens_path: str
    """An .npy of the token stream (`TokenData.tokens`); windows of ``seq + 1`` tokens."""
    num_train: int
    num_val: int
    steps: int
    seq: int
    global_batch: int
    micro_batch: int
    warmup: int
    min_lr_ratio: float
    grad_clip: float
    seed: int
    eval_interval: int
    eval_windows: int

    def token_data(self):
        import numpy as np

        from nemo_muon.train.data import TokenData

        return TokenData(tokens=np.load(self.tokens_path), seq_length=self.seq, num_train=self.num_train,
                         num_val=self.num_val)


def train_on_text(rank: int, world_size: int, group: Any, spec_name: str, opt: Any, run: TextRun) -> dict[str, Any]:
    """Train ``spec_name`` with the optimizer config ``opt`` as ``run`` says; returns the per-step train losses and
    the (step, validation loss) points."""
    import torch
    import torch.distributed as dist

    from tests.megatron_cpu.training import megatron_parallel, replica

    with megatron_parallel() as parallel_state:
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
        from megatron.core.pipeline_parallel import get_forward_backward_func

        data = run.token_data()
        steps, seq, micro_batch, global_batch = run.steps, run.seq, run.micro_batch, run.global_batch
        built = replica(spec_name, opt.name, opt=opt, seq=seq,
                        build_kwargs={"grad_clip": run.grad_clip, "min_lr": opt.lr * run.min_lr_ratio})
        ddp_model, optimizer = built.ddp_model, built.optimizer
        scheduler = OptimizerParamScheduler(
            optimizer, init_lr=0.0, max_lr=opt.lr, min_lr=opt.lr * run.min_lr_ratio, lr_warmup_steps=run.warmup,
            lr_decay_steps=steps, lr_decay_style="cosine", start_wd=opt.weight_decay, end_wd=opt.weight_decay,
            wd_incr_steps=steps, wd_incr_style="constant")
        dp_rank, dp = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
        per_rank = global_batch // dp
        for field, windows in (("global_batch", global_batch), ("eval_windows", run.eval_windows)):
            if windows % (dp * micro_batch):
                raise ValueError(f"TextRun.{field}={windows} must be a multiple of DP x micro_batch = {dp * micro_batch}")
        if run.eval_windows > data.num_val:
            raise ValueError(f"TextRun.eval_windows={run.eval_windows} must be <= the {data.num_val} validation windows")
        position_ids = torch.arange(seq).unsqueeze(0).expand(micro_batch, -1).contiguous()
        mask = torch.tril(torch.ones(1, 1, seq, seq)) < 0.5

        def micro_batches(ids):
            windows = torch.from_numpy(data.batch(ids))
            return [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows.split(micro_batch)]

        def forward_step(data_iterator, model):
            input_ids, labels = next(data_iterator)
            out = model(input_ids, position_ids, mask, labels=labels)

            def loss_func(output_tensor):
                loss = output_tensor.float().mean()
                return loss, {"lm loss": loss.detach().clone()}

            return out, loss_func

        def loss_of(ids, forward_only: bool) -> float:
            batches = micro_batches(ids)
            out = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(batches),
                                              model=[ddp_model], num_microbatches=len(batches), seq_length=seq,
                                              micro_batch_size=micro_batch, forward_only=forward_only)
            loss = torch.stack([o["lm loss"] for o in out]).mean().reshape(1)
            dist.all_reduce(loss, group=group)
            return float(loss) / world_size

        def validate() -> float:
            ddp_model.eval()
            with torch.no_grad():
                ids = data.val_ids(run.eval_windows)
                loss = loss_of(ids[dp_rank::dp], forward_only=True)
            ddp_model.train()
            return loss

        losses, val = [], []
        for step in range(steps):
            ids = data.train_batch_ids(step, global_batch, run.seed)[dp_rank * per_rank:(dp_rank + 1) * per_rank]
            ddp_model.zero_grad_buffer()
            optimizer.zero_grad()
            losses.append(loss_of(ids, forward_only=False))
            ok, _, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"optimizer step {step} was skipped")
            scheduler.step(increment=1)
            if (step + 1) % run.eval_interval == 0 or step + 1 == steps:
                val.append((step + 1, validate()))
        return {"losses": losses, "val": val}
