"""Operators one optimizer step issues on the busiest rank of a recipe, counted (not timed): the launches a GPU sees.

For each recipe, the rank with the most Newton–Schulz work in the recipe's own plan
(`nemo_muon.accounting.rank_matrices.busiest_rank`: ``kimi_k2_muon`` on 256 GB300, ``qwen3_30b_a3b_muon`` on 8) and
every matrix it owns, as stand-ins small enough for this machine: each dimension divided by one common factor (the
greatest common divisor of the rank's dimensions and the attention head size), so the number of matrices, the classes
of equal shapes and every aspect ratio are the rank's. One step (after one that builds the state) is counted by a
torch dispatch mode (`nemo_muon.optim.op_count`: every ATen operator that runs a kernel or a copy; views and bare
allocations left out; a ``_foreach_*`` operator counts one) for:

- ours: ``nemo_muon.Muon`` as the megatron backend builds it from the recipe's config (`engine_kwargs`: fused QKV
  split, gate/up fused, bf16 NS, spectral scale), batched (the default; ``stack_bytes`` divided by the factor squared
  so a stack holds as many matrices as at full size) and per matrix (``batch_ns=False``);
- Megatron's: Megatron-Core's ``TensorParallelMuon`` (Emerging-Optimizers' Muon step, once per parameter) with the
  arguments Megatron builds it with (Nesterov, QKV split by ``qkv_split_shapes``, "medium" fp32 matmul precision);
- ``torch.optim.Muon`` (2-D parameters, no fused-weight split).

Newton–Schulz's algorithm is chosen as on a GPU (bf16: the standard iteration), not as on this CPU (bf16 Gram NS
with restarts); the rest of every path is the same on both. Prints one table, the ratio ours / Megatron's last.

    OMP_NUM_THREADS=1 .venv/bin/python bench/launches.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/launches.py --recipe qwen3_30b_a3b_muon
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECIPES = {"kimi_k2_muon": 256, "qwen3_30b_a3b_muon": 8}
"""Recipe -> GPUs: NVIDIA's published points (docs/step_time.md)."""
IMPLEMENTATIONS = ("ours", "ours_per_matrix", "megatron", "torch")


@dataclass
class StandIns:
    """The busiest rank's matrices, scaled (module doc)."""

    recipe: Any
    rank: Any
    divisor: int
    layouts: dict[str, Any]
    qkv_split_shapes: list[int] | None


def stand_ins(recipe_name: str, gpus: int | None = None) -> StandIns:
    """The busiest rank of ``recipe_name`` on ``gpus`` (default: its published point) and the common divisor."""
    from nemo_muon.recipes.execute import build_recipe

    from nemo_muon.accounting.rank_matrices import busiest_rank
    from nemo_muon.optim.routing import QKVLayout

    recipe = build_recipe(recipe_name, [])
    rank = busiest_rank(recipe, gpus or RECIPES.get(recipe_name))
    spec = recipe.model
    head = spec.head_dim or spec.hidden_size // spec.num_attention_heads  # Megatron's kv_channels
    dims = [d for m in rank.matrices for s in (m.shape, *m.parts) for d in s] + [head]
    divisor = math.gcd(*dims)
    layouts = {}
    qkv = None
    if any(".linear_qkv." in m.name for m in rank.matrices):
        groups = spec.num_query_groups or spec.num_attention_heads
        layouts["linear_qkv"] = QKVLayout(spec.num_attention_heads, groups, head // divisor)
        qkv = [x // divisor for x in (spec.num_attention_heads // groups * head, head, head)]
    return StandIns(recipe, rank, divisor, layouts, qkv)


def _params(s: StandIns, seed: int = 0) -> list[tuple[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    named = []
    for m in s.rank.matrices:
        p = torch.nn.Parameter(torch.randn(*(d // s.divisor for d in m.shape), generator=g) * 0.02)
        p.grad = torch.randn(p.shape, generator=g)
        p.is_qkv = ".linear_qkv." in m.name  # what Megatron's is_qkv_fn reads
        named.append((m.name, p))
    return named


def make(implementation: str, s: StandIns, named: list[tuple[str, Any]]) -> Any:
    """The optimizer ``implementation`` over ``named`` with the recipe's hyperparameters (module doc)."""
    import torch

    import nemo_muon
    from nemo_muon.optim.ns_stacks import STACK_BYTES

    cfg = s.recipe.optimizer
    params = [p for _, p in named]
    if implementation in ("ours", "ours_per_matrix"):
        kwargs = {**cfg.optimizer_kwargs(), "nonfinite": "raise", "fused_layouts": s.layouts}
        kwargs.pop("tp_mode", None)
        return nemo_muon.Muon(named, **kwargs, batch_ns=implementation == "ours",
                              stack_bytes=max(1, STACK_BYTES // s.divisor ** 2))
    if implementation == "megatron":
        from megatron.core.optimizer.emerging_optimizers import TensorParallelMuon

        return TensorParallelMuon(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                                  weight_decay=cfg.weight_decay, split_qkv=cfg.split_qkv,
                                  is_qkv_fn=lambda p: getattr(p, "is_qkv", False), qkv_split_shapes=s.qkv_split_shapes,
                                  coefficient_type=cfg.coefficients, num_ns_steps=cfg.ns_steps,
                                  scale_mode=cfg.scale_mode, fp32_matmul_prec="medium")
    if implementation == "torch":
        return torch.optim.Muon(params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                                nesterov=cfg.nesterov, ns_steps=cfg.ns_steps)
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")


@contextlib.contextmanager
def gpu_algorithm_choice() -> Iterator[None]:
    """Newton–Schulz's algorithm chosen as on a GPU (module doc)."""
    import nemo_muon.optim.ns_iteration as ns_iteration

    choose = ns_iteration.choose_algorithm
    ns_iteration.choose_algorithm = lambda m, n, device, dtype, coefficients="quintic": choose(
        m, n, "cuda", dtype, coefficients)
    try:
        yield
    finally:
        ns_iteration.choose_algorithm = choose


def count(implementation: str, s: StandIns) -> int:
    """Operators of one step of ``implementation`` on the stand-ins (after a first step that builds the state)."""
    from nemo_muon.optim.op_count import count_step

    opt = make(implementation, s, _params(s))
    with gpu_algorithm_choice(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.step()
        return count_step(opt.step).count


def row(recipe_name: str, implementations: tuple[str, ...] = IMPLEMENTATIONS,
        counter: Callable[[str, StandIns], int] = count) -> dict[str, Any]:
    """The counts of one recipe's busiest rank, with what the rank holds."""
    s = stand_ins(recipe_name)
    classes = Counter(m.shape for m in s.rank.matrices)
    out = {"recipe": recipe_name, "gpus": s.rank.world_size, "rank": (s.rank.pp_rank, s.rank.stage_rank),
           "matrices": len(s.rank.matrices), "classes": len(classes), "divisor": s.divisor}
    out.update({impl: counter(impl, s) for impl in implementations})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", action="append", choices=sorted(RECIPES),
                        help="recipe to count (repeatable; default: both published points)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print("| recipe (GPUs, busiest rank pp/index) | matrices (shape classes) | ours, batched (default) | ours, per "
          "matrix | Megatron's TensorParallelMuon | torch.optim.Muon | ours / Megatron's |")
    print("|---|---|---|---|---|---|---|")
    for name in args.recipe or sorted(RECIPES):
        r = row(name)
        print(f"| {name} ({r['gpus']}, {r['rank'][0]}/{r['rank'][1]}) | {r['matrices']:,} ({r['classes']}) | "
              f"{r['ours']:,} | {r['ours_per_matrix']:,} | {r['megatron']:,} | {r['torch']:,} | "
              f"{r['ours'] / r['megatron']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
