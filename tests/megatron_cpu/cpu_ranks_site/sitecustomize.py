"""Test-only: Megatron's CUDA calls answered on CPU (tests/megatron_cpu/shims.py) in a preflight rank a job starts.

A job's process imports this at startup where the job's PYTHONPATH names this folder (and the repository root, for
``tests``): the CPU Slurm test (tests/test_slurm_e2e.py) runs ``python -m nemo_muon.preflight.main --device cpu`` as
a real job's first step. Only a process whose ``-m`` module is the preflight entry point installs the shims; the
launcher around it and the training step start as they would anywhere.
"""

import sys

_argv = list(getattr(sys, "orig_argv", []))
if "-m" in _argv and _argv[_argv.index("-m") + 1:][:1] == ["nemo_muon.preflight.main"]:
    from tests.megatron_cpu import shims

    shims.install()
