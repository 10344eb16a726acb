"""The bounds config fields share: node shapes, world size, loop lengths, seeds, timeouts, folder names and paths.

Written once, read by the config dataclasses (so every entry point refuses the same values) and by the launchers
and the planner (``--gpus``). Torch-free.
"""

from __future__ import annotations

import re

from nemo_muon._validation import shown

ENV_NAME: re.Pattern[str] = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}\Z", re.ASCII)
r"""An environment variable name (recipe ``env`` keys, ``--env``, cluster profiles, Slurm and docker exports): ASCII,
at most 255 characters, ending at the end of the text (``\Z``: a trailing newline, which ``$`` lets through, would
split an ``export`` line), so ``.match`` and ``.fullmatch`` agree."""
GPUS_PER_NODE: dict[str, int] = {"gb300": 4, "gb200": 4, "b200": 8, "h200": 8, "h100": 8}
"""GPUs per node (GB200/GB300: 4 per compute tray of an NVL72 rack; HGX boxes: 8): a node has no more."""
MAX_CPU_PROCESSES_PER_NODE = 256
"""``system.gpu='cpu'``: training processes per node (gpus_per_node counts processes there)."""
MAX_WORLD_SIZE = 2**19
"""Ranks of one run (524,288): above the largest clusters, and what `nemo-muon plan` still prices in seconds."""
MAX_STEPS = 10**9
"""Optimizer steps of one run (trainer.max_steps, scheduler.warmup_steps)."""
MAX_SEED = 2**31 - 1
"""trainer.seed: NumPy's legacy seeding (Megatron's) takes < 2**32, after Megatron adds its per-rank offsets."""
CPU_COLLECTIVE_TIMEOUT_S = 300.0
"""Default collective timeout on ``system.gpu='cpu'`` (gloo): 20x the slowest wait measured on a 2-core machine
(rank 0 building the stdlib token cache, ~15 s, while the other ranks wait in a barrier)."""
GPU_COLLECTIVE_TIMEOUT_S = 600.0
"""Default collective timeout on GPUs: NCCL's default in torch and Megatron-Bridge's distributed_timeout_minutes=10."""
MAX_COLLECTIVE_TIMEOUT_S = 86400.0
"""One day: any longer and a stalled rank holds its allocation for nothing."""
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}", re.ASCII)
"""A run folder name (recipe.name, logging.run_name): one path component, no '..', no spaces or shell syntax."""
RUN_NAME_TEXT = "[A-Za-z0-9][A-Za-z0-9_.-]* (one folder name, at most 200 characters)"
MOUNT_SAFE_PATH = re.compile(r"[A-Za-z0-9_.@+%~/-]+", re.ASCII)
"""A path that can be a bind mount (docker -v SRC:DST, pyxis --container-mounts=SRC:DST,...) and an unquoted
#SBATCH path: no ':' or ',' (mount separators), whitespace, quotes or shell syntax."""
MOUNT_SAFE_PATH_TEXT = "a path of [A-Za-z0-9_.@+%~/-] (no ':', ',', spaces or quotes: it is bind-mounted as SRC:DST)"


def check_run_name(field: str, value: object) -> None:
    """Raise unless ``value`` is a single folder name (`RUN_NAME`)."""
    if not isinstance(value, str) or not RUN_NAME.fullmatch(value):
        raise ValueError(f"{field} must match {RUN_NAME_TEXT}; got {shown(value)}")


def check_mount_safe_path(field: str, value: object) -> None:
    """Raise unless ``value`` is a non-empty `MOUNT_SAFE_PATH` that does not start with '-' (an option)."""
    if not isinstance(value, str) or not MOUNT_SAFE_PATH.fullmatch(value) or value.startswith("-"):
        raise ValueError(f"{field} must be {MOUNT_SAFE_PATH_TEXT}; got {shown(value)}")
