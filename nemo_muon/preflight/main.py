"""The command every rank of a preflight runs: ``python -m nemo_muon.preflight.main --recipe R [options] [a.b=v ...]``
(or ``--recipe-file F``: the resolved recipe a `nemo-muon launch` job trains, `nemo_muon.recipes.resolved`).

Started by torchrun, or by srun with one task per GPU (RANK / WORLD_SIZE / LOCAL_RANK from Slurm's task variables),
one process per GPU: NCCL on CUDA. Rank 0 writes the reports under ``--out``
and prints one line; the exit code is 0 when every check passed, `FAILED_EXIT` when one failed, and
`nemo_muon.train.refusals.REFUSED_EXIT` (one line naming the field, nothing started) for bad input. The whole run is
bounded by ``--time-limit-s``: a collective that never completes, or a step that never ends, fails the preflight.
Megatron-Core calls CUDA throughout, so on a machine without CUDA this command refuses, unless ``--device cpu``
asks for gloo on CPU ranks *and* something answers Megatron's CUDA calls there: only the test harness's shims do
(tests/megatron_cpu/shims.py, which the CPU Slurm test installs in the job's ranks); without them ``--device cpu`` is
refused as well. `preflight_on_rank` is what the in-process CPU tests run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from datetime import timedelta
from typing import Any

from nemo_muon.preflight.request import DEFAULT_STEPS, DEFAULT_TIME_LIMIT_S, DEVICES, PreflightRequest

FAILED_EXIT = 1
"""Exit code of a preflight whose checks did not all pass."""


def preflight_on_rank(request: PreflightRequest, plant: Any = None) -> tuple[dict, int]:
    """Run the preflight on this rank of the initialized default group; (the report, the exit code). Rank 0 writes
    the reports; the checkpoint lives in a new folder under ``out_dir``, removed afterwards."""
    import torch.distributed as dist

    from nemo_muon.megatron.shared.stack import CHECKED_DISTRIBUTIONS, MBRIDGE, installed_versions
    from nemo_muon.preflight.checks import evaluate, first_failure
    from nemo_muon.preflight.report import document, write_reports
    from nemo_muon.preflight.run import run_preflight

    rank = dist.get_rank()
    holder: list[Any] = [None]
    if rank == 0:
        os.makedirs(request.out_dir, exist_ok=True)
        holder[0] = tempfile.mkdtemp(prefix="checkpoint-", dir=request.out_dir)
    dist.broadcast_object_list(holder, src=0)
    try:
        figures = run_preflight(request, holder[0], plant)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(holder[0], ignore_errors=True)
    checks = evaluate(figures, request)
    import torch

    versions = installed_versions((*CHECKED_DISTRIBUTIONS, MBRIDGE))
    doc = document(request, figures, checks, {"torch": torch.__version__, **versions})
    if rank == 0:
        write_reports(request.out_dir, doc)
    return doc, 0 if first_failure(checks) is None else FAILED_EXIT


def parse_request(argv: list[str], world_size: int) -> PreflightRequest:
    """The request of the command line (ValueError / SystemExit naming the field for bad input)."""
    parser = argparse.ArgumentParser(prog="python -m nemo_muon.preflight.main")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--recipe")
    which.add_argument("--recipe-file", metavar="PATH", help="a resolved recipe document (a launch's run folder)")
    parser.add_argument("--out", default="preflight")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--save-at", type=int, default=None)
    parser.add_argument("--pp", type=int, default=None, help="default: the recipe's, scaled to the ranks")
    parser.add_argument("--ep", type=int, default=None, help="default: the recipe's, scaled to a stage's ranks")
    parser.add_argument("--time-limit-s", type=float, default=DEFAULT_TIME_LIMIT_S)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--device", choices=DEVICES, default="cuda")
    args = parser.parse_args(argv)
    name, overrides, resolved = args.recipe, tuple(args.overrides), None
    if args.recipe_file is not None:
        from nemo_muon.recipes.resolved import from_document, read_document

        if overrides:
            raise ValueError(f"overrides must be empty with --recipe-file (the document is already resolved); got "
                             f"{list(overrides)!r}")
        document = read_document(args.recipe_file)
        resolved = from_document(document)
        name, overrides = document["source"]["recipe"] or resolved.name, tuple(document["source"]["overrides"])
    return PreflightRequest(recipe=name, world_size=world_size, overrides=overrides, resolved=resolved, device=args.device,
                            steps=args.steps, save_at=args.save_at, pp=args.pp, ep=args.ep, out_dir=args.out,
                            time_limit_s=args.time_limit_s)


def _watchdog(limit_s: float) -> None:
    def expire() -> None:
        print(f"preflight failed: not finished within preflight.time_limit_s={limit_s:g} s (a hung collective or "
              "step)", file=sys.stderr, flush=True)
        os._exit(FAILED_EXIT)

    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()


def device_refusal(device: str) -> str | None:
    """Why this machine cannot run a preflight on ``device``, or None: ``cuda`` needs a CUDA device; ``cpu`` needs
    Megatron's CUDA calls answered on CPU (``torch.cuda.current_device()`` answers: the test harness's shims)."""
    import torch

    if device == "cuda":
        if torch.cuda.is_available():
            return None
        return ("preflight.device='cuda' needs a CUDA device; got none on this machine (preflight proves the GPU path; "
                "on CPU it runs in the test harness, tests/megatron_cpu/test_preflight.py)")
    try:
        torch.cuda.current_device()
    except (AssertionError, RuntimeError):  # torch without a driver, or a CPU-only build
        return ("preflight.device='cpu' needs Megatron-Core's CUDA calls answered on CPU (only the test harness's shims "
                "do: tests/megatron_cpu/shims.py); got torch.cuda.current_device() failing here: run it on GPUs "
                "(--device cuda)")
    return None


def main(argv: list[str] | None = None) -> int:
    """One rank of the preflight (torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK; or srun's task variables)."""
    from nemo_muon.rank_env import rank_env_from_slurm
    from nemo_muon.train.refusals import REFUSED_EXIT

    rank_env_from_slurm(os.environ)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    try:
        request = parse_request(sys.argv[1:] if argv is None else argv, world)
    except ValueError as exc:
        if rank == 0:
            print(f"preflight refused: {exc}", file=sys.stderr, flush=True)
        return REFUSED_EXIT
    import torch
    import torch.distributed as dist

    refusal = device_refusal(request.device)
    if refusal is not None:
        if rank == 0:
            print(f"preflight refused: {refusal}", file=sys.stderr, flush=True)
        return REFUSED_EXIT
    _watchdog(request.time_limit_s)
    if request.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if request.device == "cuda" else "gloo",
                            timeout=timedelta(seconds=request.time_limit_s))
    try:
        doc, code = preflight_on_rank(request)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        from nemo_muon.preflight.report import exit_line

        print(exit_line(doc), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
