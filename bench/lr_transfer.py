"""Does AdamW's learning rate carry over to Muon? A learning-rate sweep of AdamW and of Muon under each scale mode.

Two models, each trained from the same initialization on the same batches for every (optimizer, lr): the demo's model
family (HF DeepseekV3 = tiny Kimi K2, shrunk: 2 layers, hidden 64, 4 experts) and a plain ``torch.nn`` transformer LM
(``nn.Embedding`` ``emb`` and ``pos``, two ``nn.TransformerEncoderLayer`` = nn.MultiheadAttention + Linear, an untied ``head``).
Data: the demo's corpus (the Python stdlib source), byte-level (vocabulary 256), 64-token windows, batch 16; the last
10% held out. Schedule: 10% linear warmup, cosine to 10% of the peak; gradient clipping 1.0; weight decay 0.1 for
every optimizer (decoupled, p -= lr * wd * p, as torch.optim.AdamW). AdamW is ``torch.optim.AdamW`` (betas 0.9, 0.95);
Muon is ``nemo_muon.Muon(model, lr=lr, weight_decay=0.1, scale_mode=mode)``: the drop-in, one lr for its matrices and
its AdamW part. A run whose loss is not finite, or above its first loss + 1, stops and counts as diverged. The metric
is the validation loss at the end (8 held-out batches).

Printed per model: the final validation loss for every lr and optimizer, then for each optimizer its best lr, that
lr over AdamW's best (the ratio the "AdamW's lr carries over" promise needs to be 1), and its loss at AdamW's best lr
against its own best (what taking AdamW's lr unchanged costs). Last, the verdict by a rule fixed before the run: the
scale mode whose loss at AdamW's best lr is closest to its own best, summed over the models (ties: the smaller
|log2 ratio| of best lrs, summed).

    OMP_NUM_THREADS=1 .venv/bin/python bench/lr_transfer.py [--steps 100] [--workers 2]
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn

SCALE_MODES = ("spectral", "shape_scaling", "unit_rms_norm", "match_rms_adamw")
OPTIMIZERS = ("adamw", *(f"muon:{m}" for m in SCALE_MODES))
LRS = tuple(1e-3 * 2.0**k for k in range(-2, 8))
"""2.5e-4 .. 0.128, a factor 2 apart (chosen: covers spectral's ~AdamW/5 to shape_scaling's larger rates)."""
MODELS = ("deepseek_v3", "torch_nn")
VOCAB, SEQ, BATCH, VAL_BATCHES, WEIGHT_DECAY, CLIP, SEED = 256, 64, 16, 8, 0.1, 1.0, 0
CORPUS_BYTES = 2_000_000


@functools.cache
def _tokens() -> np.ndarray:
    """The demo's corpus (the stdlib source files), byte-level, first ``CORPUS_BYTES`` bytes."""
    from nemo_muon.train.data import stdlib_source_files

    out, size = [], 0
    for path in stdlib_source_files():
        data = Path(path).read_bytes()
        out.append(data)
        size += len(data)
        if size >= CORPUS_BYTES:
            break
    return np.frombuffer(b"".join(out)[:CORPUS_BYTES], dtype=np.uint8).astype(np.int64)


def _batches(steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Training batches (random windows of the first 90%) and validation batches (the last 10%), seeded."""
    tokens = _tokens()
    split = int(len(tokens) * 0.9)
    rng = np.random.default_rng(SEED)
    starts = rng.integers(0, split - SEQ - 1, size=(steps, BATCH))
    train = [torch.from_numpy(np.stack([tokens[s:s + SEQ + 1] for s in row])) for row in starts]
    val_starts = np.linspace(split, len(tokens) - SEQ - 2, VAL_BATCHES * BATCH).astype(np.int64).reshape(VAL_BATCHES,
                                                                                                          BATCH)
    val = [torch.from_numpy(np.stack([tokens[s:s + SEQ + 1] for s in row])) for row in val_starts]
    return train, val


class TorchLM(nn.Module):
    """A plain torch.nn causal LM: ``emb``, two pre-norm TransformerEncoderLayers, a final norm, an untied ``head``."""

    def __init__(self, dim: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(SEQ, dim)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(dim, 4, 3 * dim, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        h = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


def _model(kind: str) -> nn.Module:
    torch.manual_seed(SEED)
    if kind == "torch_nn":
        return TorchLM()
    from nemo_muon.models.hf import build_model
    from nemo_muon.models.specs import TINY_KIMI_K2

    spec = TINY_KIMI_K2.replace(name="lr_transfer", vocab_size=VOCAB, num_layers=2, hidden_size=64, q_lora_rank=32,
                                kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                ffn_hidden_size=192, num_experts=4, moe_ffn_hidden_size=48)
    return build_model(spec, seed=SEED)


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    inputs, targets = batch[:, :-1], batch[:, 1:]
    out = model(inputs)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _optimizer(name: str, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=WEIGHT_DECAY)
    from nemo_muon import Muon

    return Muon(model, lr=lr, weight_decay=WEIGHT_DECAY, scale_mode=name.split(":")[1])


def run(job: tuple[str, str, float, int]) -> tuple[str, str, float, float]:
    """Train one (model, optimizer, lr) for ``steps``; the final validation loss (inf when it diverged)."""
    kind, opt_name, lr, steps = job
    torch.set_num_threads(1)
    train, val = _batches(steps)
    model = _model(kind)
    opt = _optimizer(opt_name, model, lr)
    warmup = max(1, steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    first = None
    for batch in train:
        opt.zero_grad()
        loss = _loss(model, batch)
        first = loss.item() if first is None else first
        if not math.isfinite(loss.item()) or loss.item() > first + 1.0:
            return kind, opt_name, lr, math.inf
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
    with torch.no_grad():
        val_loss = sum(_loss(model, b).item() for b in val) / len(val)
    return kind, opt_name, lr, val_loss if math.isfinite(val_loss) else math.inf


def _table(kind: str, results: dict[tuple[str, float], float]) -> str:
    cols = [o.replace("muon:", "Muon ") if o != "adamw" else "AdamW" for o in OPTIMIZERS]
    lines = [f"| lr | {' | '.join(cols)} |", "|---" * (len(cols) + 1) + "|"]
    best = {o: min(LRS, key=lambda lr, o=o: results[o, lr]) for o in OPTIMIZERS}
    for lr in LRS:
        cells = []
        for o in OPTIMIZERS:
            v = results[o, lr]
            text = "diverged" if math.isinf(v) else f"{v:.4f}"
            cells.append(f"**{text}**" if lr == best[o] else text)
        lines.append(f"| {lr:.3g} | {' | '.join(cells)} |")
    ref = best["adamw"]
    lines.append(f"| best lr | {' | '.join(f'{best[o]:.3g}' for o in OPTIMIZERS)} |")
    lines.append(f"| best lr / AdamW's | {' | '.join(f'{best[o] / ref:.3g}' for o in OPTIMIZERS)} |")
    lines.append(f"| loss at AdamW's best lr ({ref:.3g}) - own best | "
                 + " | ".join("diverged" if math.isinf(results[o, ref]) else f"{results[o, ref] - results[o, best[o]]:+.4f}"
                              for o in OPTIMIZERS) + " |")
    edge = [o for o in OPTIMIZERS if best[o] in (LRS[0], LRS[-1])]
    note = f"\nbest at the edge of the grid (true best may lie beyond): {', '.join(edge)}" if edge else ""
    return f"### {kind}\n\n" + "\n".join(lines) + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    args = parser.parse_args()
    jobs = [(kind, o, lr, args.steps) for kind in args.models for o in OPTIMIZERS for lr in LRS]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        out = list(pool.map(run, jobs))
    elapsed = time.perf_counter() - start
    print(f"{len(jobs)} runs of {args.steps} steps ({BATCH} x {SEQ} tokens) in {elapsed:.0f} s, {args.workers} workers\n")
    by_model = {kind: {(o, lr): v for k, o, lr, v in out if k == kind} for kind in args.models}
    for kind, results in by_model.items():
        print(_table(kind, results) + "\n")
    print(_verdict(by_model))


def _verdict(by_model: dict[str, dict[tuple[str, float], float]]) -> str:
    """The rule of the module docstring: the mode that loses least at AdamW's best lr, then the closest best lr."""
    def score(mode: str) -> tuple[float, float]:
        gap, dist = 0.0, 0.0
        for results in by_model.values():
            best = {o: min(LRS, key=lambda lr, o=o: results[o, lr]) for o in ("adamw", mode)}
            gap += results[mode, best["adamw"]] - results[mode, best[mode]]
            dist += abs(math.log2(best[mode] / best["adamw"]))
        return gap, dist

    scores = {m: score(f"muon:{m}") for m in SCALE_MODES}
    chosen = min(SCALE_MODES, key=lambda m: scores[m])
    lines = ", ".join(f"{m}: {g:+.4f} / {d:.0f}" for m, (g, d) in scores.items())
    return (f"verdict: {chosen} (loss at AdamW's best lr - own best, summed over models / |log2 best-lr ratio| "
            f"summed: {lines})")


if __name__ == "__main__":
    main()
