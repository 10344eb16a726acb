"""The tiny model's synthetic data and one optimizer step's forward and backward through Megatron's schedule.

Each (step, micro-batch of the world) has its own deterministic tokens (`batch`): every run, every path, every resume
and every layout sees the same batches for the same step, so two paths can be compared step by step. Data-parallel
rank d of m micro-batches per rank takes the world's micro-batches d m ... d m + m - 1.
"""

from __future__ import annotations

from typing import Any

from nemo_muon.preflight.tiny_model import SEQ

MICRO_BATCH, SEED = 4, 1234
"""Sequences per micro-batch; the seed of the weights and of the batches."""


def batch(step: int, index: int, vocab: int) -> tuple[Any, Any]:
    """(input ids, labels) of one (step, micro-batch ``index`` of the world): a fixed pool of 4 per micro-batch,
    cycled (so the loss can fall)."""
    import torch

    g = torch.Generator().manual_seed(SEED + 97 * index + step % 4)
    tokens = torch.randint(0, vocab, (MICRO_BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def through_schedule(chunks: list[Any], batches: list[tuple[Any, Any]], loss_factor: float = 1.0) -> list[dict]:
    """``batches`` (one per micro-batch) forward and backward through Megatron's schedule on ``chunks`` (one model, or
    a rank's virtual-pipeline chunks), gradients accumulated into them; the schedule's per-micro-batch outputs
    (``{"lm loss": ...}``; empty on a pipeline stage before the last). ``loss_factor`` multiplies the loss."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = batches[0][0].device
    position_ids = torch.arange(SEQ, device=device).unsqueeze(0).expand(MICRO_BATCH, -1).contiguous()
    mask = torch.tril(torch.ones(1, 1, SEQ, SEQ, device=device)) < 0.5

    def forward_step(data_iterator, m):
        input_ids, labels = next(data_iterator)
        out = m(input_ids, position_ids, mask, labels=labels)

        def loss_func(output_tensor):
            loss = output_tensor.float().mean() * loss_factor
            return loss, {"lm loss": loss.detach().clone()}  # the schedule divides the loss in place

        return out, loss_func

    data = iter(batches) if len(chunks) == 1 else [iter(batches) for _ in chunks]
    return get_forward_backward_func()(forward_step_func=forward_step, data_iterator=data, model=chunks,
                                       num_microbatches=len(batches), seq_length=SEQ, micro_batch_size=MICRO_BATCH,
                                       forward_only=False)


def forward_backward(ddp_model: Any, optimizer: Any, step: int, dp_rank: int, vocab: int, micro_batches: int = 1,
                     loss_factor: float = 1.0) -> Any:
    """Zero the grads, then ``micro_batches`` micro-batches of step ``step`` forward and backward through Megatron's
    schedule (`through_schedule`; grads accumulated, then reduced by DDP's finalize); returns the loss tensor (mean
    logit-level loss of this rank's micro-batches; zero on a pipeline stage before the last). ``loss_factor``
    multiplies the loss (NaN: a fault in this rank's backward). ``ddp_model``: one DDP chunk, or a rank's list of
    virtual-pipeline chunks."""
    import torch

    chunks = ddp_model if isinstance(ddp_model, list) else [ddp_model]
    device = next(chunks[0].parameters()).device  # the model's: CPU here, the rank's GPU under CUDA
    batches = [tuple(t.to(device) for t in batch(step, dp_rank * micro_batches + i, vocab))
               for i in range(micro_batches)]
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    out = through_schedule(chunks, batches, loss_factor)
    if not out:  # a pipeline stage before the last: no loss here
        return torch.zeros(())
    return torch.stack([o["lm loss"] for o in out]).mean()
