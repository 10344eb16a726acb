"""Training quality through Megatron's model code: tiny Kimi K2 trained through the Megatron CPU harness on the demo's
real text, Muon vs AdamW, same data, seeds and schedule.

What runs is Megatron-Core's (GPTModel, DDP, our Muon inside its layer-wise optimizer, its distributed Adam, its
schedule and LR scheduler) on 2 gloo ranks (`tests/megatron_cpu/text_training.py`), fed the windows of the torch
backend's data: the Python standard library's sources, the demo's byte-level BPE tokenizer, the demo recipe's
train / validation split and per-step batches. Hyperparameters are the demo recipes' (`tiny_kimi_k2_muon`,
`tiny_kimi_k2_adamw`: lr, weight decay, warm-up, cosine to 0.1, clip, batch, sequence), in bf16 with fp32 masters
(the Megatron harness's precision; the torch demo trains in fp32). Prints the validation curves and the ratio the
demo reports: steps Muon needs to reach AdamW's final validation loss over AdamW's steps (target <= 0.7).

    .venv/bin/python bench/megatron_quality.py [--steps 150] [--family kimi_k2]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default: the demo recipe's max_steps (150)")
    parser.add_argument("--family", choices=("kimi_k2", "qwen3_moe"), default="kimi_k2")
    parser.add_argument("--cache", default="runs/_cache", help="the demo's tokenizer / token cache folder")
    args = parser.parse_args()

    import numpy as np
    from nemo_muon.recipes import get_recipe

    from nemo_muon.megatron.shared.optimizer_config import MEGATRON_MUON_DEFAULTS
    from nemo_muon.train.data import build_token_data
    from nemo_muon.train.spawn import spawn_ranks
    from tests.megatron_cpu.text_training import TextRun, train_on_text

    muon_recipe, adamw_recipe = (get_recipe(f"tiny_{args.family}_{o}") for o in ("muon", "adamw"))
    tr, sch = muon_recipe.trainer, muon_recipe.scheduler
    steps = args.steps or tr.max_steps
    data = build_token_data(muon_recipe.data, vocab_size=muon_recipe.model.vocab_size, seq_length=tr.seq_length,
                            seed=tr.seed, cache_dir=args.cache)
    # Megatron fuses gate/up; raise; the tiny recipe's own scale mode (match_rms_adamw), not the perf recipes'
    muon = dataclasses.replace(muon_recipe.optimizer,
                               **{**MEGATRON_MUON_DEFAULTS, "scale_mode": muon_recipe.optimizer.scale_mode})
    runs = {"muon": muon, "adamw": adamw_recipe.optimizer}
    print(f"megatron-core {importlib.metadata.version('megatron-core')}, {muon_recipe.model.name}, {steps} steps, "
          f"2 gloo ranks, GBS {tr.global_batch_size} x seq {tr.seq_length}, {data.num_train} train / {data.num_val} "
          f"val windows of {data.info.get('source')}")
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens.npy"
        np.save(tokens, data.tokens)
        run = TextRun(tokens_path=str(tokens), num_train=data.num_train, num_val=data.num_val, steps=steps,
                      seq=tr.seq_length, global_batch=tr.global_batch_size, micro_batch=tr.micro_batch_size,
                      warmup=sch.warmup_steps, min_lr_ratio=sch.min_lr_ratio, grad_clip=tr.grad_clip, seed=tr.seed,
                      eval_interval=tr.eval_interval, eval_windows=tr.global_batch_size)
        results = {}
        for name, opt in runs.items():
            start = time.perf_counter()
            results[name] = spawn_ranks(train_on_text, 2, (muon_recipe.model.name, opt, run), timeout_s=3600)[0]
            print(f"{name}: {time.perf_counter() - start:.0f} s, train loss {results[name]['losses'][0]:.3f} -> "
                  f"{results[name]['losses'][-1]:.3f}", flush=True)
    print("| step | Muon val loss | AdamW val loss |\n|---|---|---|")
    for (step, m), (_, a) in zip(results["muon"]["val"], results["adamw"]["val"], strict=True):
        print(f"| {step} | {m:.4f} | {a:.4f} |")
    adamw_steps, target = results["adamw"]["val"][-1]
    reached = next((step for step, loss in results["muon"]["val"] if loss <= target), None)  # the demo's rule
    ratio = "not reached" if reached is None else f"{reached / adamw_steps:.2f}"
    print(f"Muon reaches AdamW's final val loss {target:.4f} (step {adamw_steps}) at step {reached}: "
          f"steps ratio Muon / AdamW = {ratio} (target <= 0.7)")


if __name__ == "__main__":
    main()
