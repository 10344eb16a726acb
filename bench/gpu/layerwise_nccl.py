"""GPU check (run where GPUs are lent): the layer-wise optimizer on NCCL, against single-process Muon on the GPU.

The CPU test suite proves the whole-tensor optimizer on gloo (tests/test_layerwise_*.py); this script runs the same comparison with
the NCCL backend and CUDA tensors, where collectives refuse CPU tensors, in bf16 with fp32 master weights and with
the param gather overlapped, then saves and reloads a checkpoint and checks the weights survive bit for bit.

    torchrun --nproc-per-node <GPUs> bench/gpu/layerwise_nccl.py [--steps 5] [--dim 1024]
    torchrun --nproc-per-node 2 bench/gpu/layerwise_nccl.py --cpu --dim 128   # the same script on gloo/CPU

With one GPU it runs at DP=1 (still NCCL, still the whole-tensor optimizer's collectives). Prints the relative L2 difference of all
parameters from single-process Muon in the same dtype (expect 0 at DP=1-2: the reference accumulates the ranks'
shares in the DP reduction's order; ~1e-6 beyond, from the collective's summation order), the optimizer-step time ratio layer-wise / replicated Muon (CUDA events), and the checkpoint check.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist

from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.layerwise.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer
from nemo_muon.optim.factory import build_optimizer


def _model(dim: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
              for _ in range(4)]
    return torch.nn.Sequential(*blocks, torch.nn.LayerNorm(dim)).to(device=device, dtype=dtype)


def _batches(steps: int, world: int, dim: int, device: torch.device) -> list[torch.Tensor]:
    # 8*dim rows per rank: more rows than the widest matrix (4*dim), so the gradients have full rank and NS does not
    # orthogonalize rounding noise in a null space (which would make bf16 vs fp32 comparisons meaningless)
    g = torch.Generator(device="cpu").manual_seed(1)
    return [torch.randn(8 * dim * world, dim, generator=g).to(device) for _ in range(steps)]


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[torch.Tensor], rank: int, world: int,
           layerwise: bool) -> float:
    """Train on the global batches; return the mean optimizer-step time in ms.

    Layer-wise: each rank its share. Reference: the shares one after another as accumulated micro-batches, so the
    gradient is summed in the same order as the DP reduction and the comparison isolates the whole-tensor optimizer.
    """
    times = []
    dtype = next(model.parameters()).dtype
    for x in batches:
        opt.zero_grad()
        if layerwise:
            model(x.chunk(world)[rank].to(dtype)).float().pow(2).mean().backward()
        else:
            for share in x.chunk(world):
                (model(share.to(dtype)).float().pow(2).mean() / world).backward()
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            opt.step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            opt.step()
            times.append(1e3 * (time.perf_counter() - t0))
    return sum(times[1:]) / max(1, len(times) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU instead of NCCL on GPUs (a smoke check)")
    args = parser.parse_args()
    dist.init_process_group("gloo" if args.cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.cpu:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    cfg = MuonConfig(lr=1e-2, weight_decay=0.1)
    batches = _batches(args.steps, world, args.dim, device)

    for dtype, overlap in ((torch.float32, False), (torch.bfloat16, True)):
        reference = _model(args.dim, device, dtype)
        low_precision = {"master_weights": True} if dtype != torch.float32 else {}
        ref_opt = build_optimizer(cfg, list(reference.named_parameters()), **low_precision)
        ref_ms = _train(reference, ref_opt, batches, 0, world, False)
        model = _model(args.dim, device, dtype)
        opt = WholeTensorOptimizer(model, cfg, dp_group=dist.group.WORLD, overlap_param_gather=overlap)
        lw_ms = _train(model, opt, batches, rank, world, True)
        opt.finish_param_gather()
        pairs = list(zip(model.parameters(), reference.parameters(), strict=True))
        diff = (sum((p.float() - r.float()).pow(2).sum() for p, r in pairs)
                / sum(r.float().pow(2).sum() for _, r in pairs)).sqrt().item()
        if rank == 0:
            print(f"DP={world} {str(dtype).removeprefix('torch.')} overlap={overlap}: relative L2 diff of all "
                  f"params vs single-process Muon (same dtype) {diff:.2e}; optimizer step layer-wise / replicated = {lw_ms / ref_ms:.3f}")

    root = tempfile.mkdtemp() if rank == 0 else None
    holder = [root]
    dist.broadcast_object_list(holder, src=0)
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    save_checkpoint(holder[0], args.steps, model, opt, {"step": args.steps}, dist.group.WORLD)
    fresh = _model(args.dim, device, torch.bfloat16)
    fresh_opt = WholeTensorOptimizer(fresh, cfg, dp_group=dist.group.WORLD)
    load_checkpoint(latest_checkpoint(holder[0]), fresh, fresh_opt, dist.group.WORLD)
    same = all(torch.equal(saved[n], p) for n, p in fresh.named_parameters())
    if rank == 0:
        print(f"checkpoint round trip on {dist.get_backend()}: {'bitwise identical' if same else 'MISMATCH'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
