"""`nemo-muon preflight` on the lent GPU: a recipe's optimizer path against its reference path on NCCL and CUDA.

Run on a GPU machine: ``python bench/gpu/preflight_gpu.py [--recipe kimi_k2_muon] [--steps 6]``. It runs the
preflight's entry point under torchrun on every visible GPU (one on a lent machine: world size 1, so the owners and
replicas checks are trivial there and the losses, masters, single-process reference (CUDA against the same math in
one process on the same GPU), checkpoint resume, non-finite policy and the optimizer-step ratio are the figures; the
resume at another layout does not run on one GPU), with the same command `nemo-muon launch --preflight`
puts first in a job; prints its
preflight.md and exits with its code (0 passed, 1 a check failed, 2 refused). The reports go to a temporary folder (the
device tool returns few files; the markdown is in this script's log). The CPU counterpart is
tests/megatron_cpu/test_preflight.py and bench/preflight_cpu.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

TIME_LIMIT_S = 45.0
"""The preflight's own bound, inside run_all.sh's timeout for this step (chosen: its watchdog speaks first)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="kimi_k2_muon")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--time-limit-s", type=float, default=TIME_LIMIT_S)
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print("preflight_gpu: no CUDA device here (run it on the lent GPU: bench/gpu/README.md)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="preflight-gpu-") as out:
        argv_ = [sys.executable, "-m", "nemo_muon.launchers.torchrun", "--standalone", "--nproc-per-node", str(gpus),
                 "-m", "nemo_muon.preflight.main", "--recipe", args.recipe, "--steps", str(args.steps), "--out", out,
                 "--time-limit-s", f"{args.time_limit_s:g}"]
        print("$ " + " ".join(argv_), flush=True)
        code = subprocess.run(argv_, check=False).returncode
        report = Path(out) / "preflight.md"
        if report.exists():
            print(report.read_text(), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
