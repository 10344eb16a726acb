"""The tiny megatron training of tests/megatron_cpu on one GPU, with no shims: NCCL, world size 1.

Run on a GPU machine with the project's .venv (Megatron-Core 0.19.2):
    .venv/bin/python bench/gpu/megatron_tiny.py [--spec tiny_kimi_k2|tiny_qwen3_moe] [--optimizer adamw|muon]
Prints the loss curve and the median step time after 3 warm-up steps. For Muon it trains once per engine in the same
process (nemo-muon's Muon and Megatron-Core's own, both inside Megatron's layer-wise optimizer, same seed and data)
and prints the ratio of their median step and optimizer-step times. Only the engines the installed stack can build
run (`nemo_muon.megatron.shared.stack`): on the NGC 26.02 stack (Megatron-Core 0.16 + emerging-optimizers 0.3) Megatron's
own Muon cannot be built, so it is left out, with the rule that says why, and no ratio is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


MUON_ENGINES: tuple[str, ...] = ("nemo_muon", "megatron")
"""The Muon engines compared, in the order they train (the ratio is the first over the second)."""


def runnable_engines(optimizer: str, versions: dict[str, str | None]) -> tuple[list[str | None], dict[str, str]]:
    """(engines to train, {engine left out: why}) for ``optimizer`` on the stack ``versions`` (AdamW: ``[None]``)."""
    from nemo_muon.megatron.shared.stack import problems_for_optimizer

    if optimizer == "adamw":
        return [None], {}
    engines: list[str | None] = []
    left_out: dict[str, str] = {}
    for engine in MUON_ENGINES:
        problems = problems_for_optimizer(optimizer, versions, engine=engine)
        if problems:
            left_out[engine] = "; ".join(f"[{p.rule}] {p.message}" for p in problems)
        else:
            engines.append(engine)
    return engines, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="tiny_kimi_k2", choices=["tiny_kimi_k2", "tiny_qwen3_moe"])
    parser.add_argument("--optimizer", default="muon", choices=["adamw", "muon"])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    from nemo_muon.megatron.shared.stack import installed_versions

    engines, left_out = runnable_engines(args.optimizer, installed_versions())
    for engine, why in left_out.items():
        print(f"left out: {args.optimizer} with engine {engine!r}, which the installed stack cannot build: {why}")
    if not engines:
        raise SystemExit(f"--optimizer {args.optimizer}: no engine of {MUON_ENGINES} can be built on the installed "
                         f"stack (above)")

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu/megatron_tiny.py needs a CUDA GPU (tests/megatron_cpu runs the CPU version)")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from megatron.core import parallel_state
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from nemo_muon.megatron.shared.build import build_megatron_optimizer
    from tests.megatron_cpu import training as t

    parallel_state.initialize_model_parallel()
    medians = {}
    for engine in engines:
        model_parallel_cuda_manual_seed(t.SEED)
        torch.manual_seed(t.SEED)
        model, config, spec = t._model(args.spec)
        model.cuda()
        opt = t.optimizer_config(args.optimizer, engine or "nemo_muon")
        layer_wise = args.optimizer != "adamw"
        ddp_model = t._ddp(model, config, opt, layer_wise)
        optimizer, _ = build_megatron_optimizer(opt, [ddp_model],
                                                pg_collection=t._pg_collection() if layer_wise else None)
        config.finalize_model_grads_func = finalize_model_grads
        fwd_bwd = get_forward_backward_func()
        pos = torch.arange(t.SEQ, device="cuda").unsqueeze(0).expand(t.MICRO_BATCH, -1).contiguous()
        mask = (torch.tril(torch.ones(1, 1, t.SEQ, t.SEQ, device="cuda")) < 0.5)
        times, opt_times, losses = [], [], []
        for step in range(args.steps):
            ids, labels = (x.cuda() for x in t._batch(step, 0, spec.vocab_size))

            def forward_step(_it, m, ids=ids, labels=labels, pos=pos, mask=mask):
                out = m(ids, pos, mask, labels=labels)
                return out, lambda o: (o.float().mean(), {"lm loss": o.float().mean().detach()})

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ddp_model.zero_grad_buffer()
            optimizer.zero_grad()
            out = fwd_bwd(forward_step_func=forward_step, data_iterator=iter([None]), model=[ddp_model],
                          num_microbatches=1, seq_length=t.SEQ, micro_batch_size=t.MICRO_BATCH, forward_only=False)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            optimizer.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            opt_times.append(time.perf_counter() - t1)
            losses.append(float(out[0]["lm loss"]))
        label = f"{args.optimizer}" + (f" (engine {engine})" if engine else "")
        print(f"{args.spec} {label} on {torch.cuda.get_device_name(0)}: losses {[round(x, 3) for x in losses]}")
        medians[engine] = (statistics.median(times[3:]), statistics.median(opt_times[3:]))
        print(f"median step / optimizer-step time after 3 warm-up steps: {medians[engine][0] * 1e3:.1f} / "
              f"{medians[engine][1] * 1e3:.1f} ms")
    if len(medians) == 2:
        (ours, ours_opt), (theirs, theirs_opt) = medians["nemo_muon"], medians["megatron"]
        print(f"ours / Megatron's: step {ours / theirs:.2f}, optimizer step {ours_opt / theirs_opt:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
