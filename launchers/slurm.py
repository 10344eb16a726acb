"""Slurm: render an sbatch script the way Megatron-Bridge's perf scripts do, submit it, wait for it, cancel it.

Script conventions (Bridge ``scripts/performance/utils/executors.py::slurm_executor``, research/B §5):
``#SBATCH --exclusive --mem=0``; ``--segment`` on 4-GPU GB200/GB300 nodes so an allocation stays inside one
NVL72 rack (the node count if <= 18, else its largest divisor <= 18); pyxis container flags on ``srun``
(``--container-image``, ``--container-mounts``, ``--no-container-mount-home``, ``--container-writable``); the
recipe's environment exported before ``srun``; one task per GPU (Megatron backend) or one ``torchrun`` per node
(torch backend). ``container=False`` renders the same job for clusters without pyxis.

Every user-supplied value is either validated against a safe pattern (``#SBATCH`` lines) or shell-quoted
(``export`` values, ``srun`` arguments); secret values are never written: they reach the job through
``sbatch --export=ALL`` from the submitting process's environment.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nemo_muon._validation import shown
from nemo_muon.config.limits import ENV_NAME

NVL72_MAX_NODES = 18
"""Nodes of 4 GPUs in one NVL72 rack (72 GPUs)."""
RACK_SYSTEMS: tuple[str, ...] = ("gb200", "gb300")
RDZV_PORT = 29500
KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
"""srun ends every task once one exits non-zero: a rank whose collective timed out on a stalled peer
(system.collective_timeout_s) ends the job instead of leaving the other tasks waiting."""
PREFLIGHT_STEP_WAIT_S = 60
"""The preflight step's srun ends the tasks still running this long after the first one exits (chosen; srun
``--wait``)."""
PREFLIGHT_STEP_END: tuple[str, ...] = ("--kill-on-bad-exit=0", f"--wait={PREFLIGHT_STEP_WAIT_S}")
"""How the preflight step ends: its ranks refuse (exit 2) or fail a check (exit 1) together, each with that code;
``--kill-on-bad-exit=1`` would SIGTERM the ranks a moment slower than the first, and the step's (the job's) exit code
would be their 143. A rank that crashes still ends the step `PREFLIGHT_STEP_WAIT_S` later (and the preflight's own
``--time-limit-s`` bounds a hang)."""
SAFE_VALUE = re.compile(r"[A-Za-z0-9_.:@+\-/]+\Z", re.ASCII)
"""What a job name, account or partition may hold (it is written into an ``#SBATCH`` line unquoted)."""
_SAFE_PATH = re.compile(r"/[A-Za-z0-9_.:@+\-/%]*\Z", re.ASCII)
TIME_LIMIT = re.compile(r"([0-9]{1,5}-)?[0-9]{1,3}(:[0-9]{2}){0,2}\Z", re.ASCII)
"""A Slurm time limit: [D-]HH:MM:SS, MM, MM:SS, D-HH... (ASCII digits only: ``\\d`` would take any script's)."""
DEPENDENCY = re.compile(r"[a-z]+:[0-9]{1,20}(:[0-9]{1,20}){0,99}\Z", re.ASCII)
"""An ``#SBATCH --dependency`` value such as 'afterany:123'."""
JOB_ID = re.compile(r"[0-9]{1,20}(_[0-9]{1,20})?\Z", re.ASCII)
"""A Slurm job id (an array task: '1234_5')."""


def segment_size(num_nodes: int) -> int:
    """``--segment`` for 4-GPU rack nodes: all nodes if <= 18, else the largest divisor of num_nodes <= 18."""
    if num_nodes <= NVL72_MAX_NODES:
        return num_nodes
    return max(d for d in range(1, NVL72_MAX_NODES + 1) if num_nodes % d == 0)


@dataclass(kw_only=True)
class SlurmJob:
    """Everything an sbatch script needs; validated at construction."""

    job_name: str
    nodes: int
    gpus_per_node: int
    """GPUs per node; on gpu='cpu' the number of training processes per node."""
    gpu: str
    command: list[str]
    """argv of the training program (after torchrun's arguments, or per srun task); [] for a job that is its
    ``preflight`` step alone (`nemo-muon preflight --executor slurm`)."""
    python: str = "python"
    """Interpreter on the compute nodes (the image's python, or the submitting venv's with container=False)."""
    launcher: str = "torchrun"
    """'torchrun' (one torchrun per node) or 'tasks' (one srun task per GPU, as Bridge's perf scripts)."""
    output_dir: Path
    workdir: Path
    account: str | None = None
    partition: str | None = None
    time: str = "01:00:00"
    container: bool = True
    image: str | None = None
    mounts: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Written into the script as ``export NAME='value'`` (never secrets)."""
    forwarded_env: list[str] = field(default_factory=list)
    """Names passed from the submitting environment (secrets); only their names appear in the script."""
    exclusive: bool = True
    dependency: str | None = None
    """e.g. 'afterany:123' to run after another job (bench runs its baseline back to back)."""
    preflight: list[str] | None = None
    """argv of the preflight program (``-m nemo_muon.preflight.main ...``), started like the training program as the
    job's first srun step on the same nodes; the training step runs only when it exited 0 (``set -e``)."""

    def __post_init__(self) -> None:
        for name in ("job_name", "account", "partition"):
            value = getattr(self, name)
            if value is not None and not SAFE_VALUE.match(value):
                raise ValueError(f"slurm {name} must match [A-Za-z0-9_.:@+-/]+; got {shown(value)}")
        if not isinstance(self.time, str) or not TIME_LIMIT.match(self.time):
            raise ValueError(f"slurm time must be [D-]HH:MM:SS (or MM, MM:SS, D-HH...); got {shown(self.time)}")
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"slurm nodes and gpus_per_node must be >= 1; got {self.nodes} x {self.gpus_per_node}")
        if not self.command and not self.preflight:
            raise ValueError("slurm command must name the training program (or preflight the preflight's); got neither")
        if self.launcher not in ("torchrun", "tasks"):
            raise ValueError(f"slurm launcher must be one of ('torchrun', 'tasks'); got {shown(self.launcher)}")
        for name in ("output_dir", "workdir"):
            if not _SAFE_PATH.match(str(getattr(self, name))):  # \Z: no trailing newline
                raise ValueError(f"slurm {name} must be an absolute path of [A-Za-z0-9_.:@+-/]; got "
                                 f"{shown(str(getattr(self, name)))}")
        if self.container and not self.image:
            raise ValueError("--image must be set (or --no-container): a job in a container (pyxis) needs the "
                             f"container image; got image={shown(self.image)}")
        if self.dependency is not None and not DEPENDENCY.match(self.dependency):
            raise ValueError(f"slurm dependency must look like 'afterany:123'; got {shown(self.dependency)}")
        for name in [*self.env, *self.forwarded_env]:
            if not ENV_NAME.match(name):
                raise ValueError(f"environment variable name must match [A-Za-z_][A-Za-z0-9_]*; got {shown(name)}")

    @property
    def segment(self) -> int | None:
        """The --segment value, or None where it does not apply."""
        if self.gpu in RACK_SYSTEMS and self.gpus_per_node == 4:
            return segment_size(self.nodes)
        return None


def _srun_args(job: SlurmJob, preflight: bool = False) -> list[str]:
    args = ["srun", *(PREFLIGHT_STEP_END if preflight else (KILL_ON_BAD_EXIT,))]
    if job.launcher == "torchrun":
        args += ["--ntasks-per-node=1"]
    if job.gpu != "cpu":
        args += ["--mpi=pmix"]
    if job.container:
        args += [f"--container-image={job.image}"]
        if job.mounts:
            args += ["--container-mounts=" + ",".join(job.mounts)]
        args += ["--no-container-mount-home", "--container-writable", f"--container-workdir={job.workdir}"]
    return args


def _program(job: SlurmJob, command: list[str]) -> str:
    """The shell text that starts ``command`` (the training or the preflight program) on each node/task (user values
    quoted)."""
    quoted = " ".join(shlex.quote(a) for a in command)
    if job.launcher == "tasks":
        return f"{shlex.quote(job.python)} {quoted}"
    if job.nodes == 1:
        rdzv = "--standalone"
    else:
        rdzv = (f'--nnodes "$SLURM_NNODES" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:{RDZV_PORT}" '
                '--rdzv-id "$SLURM_JOB_ID"')
    return f"{shlex.quote(job.python)} -m nemo_muon.launchers.torchrun {rdzv} --nproc-per-node {job.gpus_per_node} {quoted}"


def render_sbatch(job: SlurmJob, *, header: str = "") -> str:
    """The complete sbatch script for ``job`` (exactly what ``submit`` writes and submits)."""
    tasks = job.gpus_per_node if job.launcher == "tasks" else 1
    lines = ["#!/bin/bash"]
    lines += [f"# {h}" for h in header.splitlines()]
    lines += [f"#SBATCH --job-name={job.job_name}"]
    if job.account:
        lines.append(f"#SBATCH --account={job.account}")
    if job.partition:
        lines.append(f"#SBATCH --partition={job.partition}")
    lines += [f"#SBATCH --nodes={job.nodes}", f"#SBATCH --ntasks-per-node={tasks}"]
    if job.gpu == "cpu":
        if job.launcher == "torchrun":
            lines.append(f"#SBATCH --cpus-per-task={job.gpus_per_node}")
    else:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    lines.append(f"#SBATCH --time={job.time}")
    if job.exclusive:
        lines += ["#SBATCH --exclusive", "#SBATCH --mem=0"]
    if job.segment is not None:
        lines.append(f"#SBATCH --segment={job.segment}")
    if job.dependency:
        lines.append(f"#SBATCH --dependency={job.dependency}")
    lines += [f"#SBATCH --output={job.output_dir}/slurm-%j.out", f"#SBATCH --chdir={job.workdir}", "",
              "set -euo pipefail", ""]
    if job.env:
        lines.append("# environment of the recipe and the command line")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in job.env.items()]
    if job.forwarded_env:
        lines.append("# passed from the submitting environment (sbatch --export=ALL); values are not written here: "
                     + " ".join(job.forwarded_env))
    lines += ['export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
              f"export MASTER_PORT={RDZV_PORT}", ""]
    srun = " ".join(shlex.quote(a) for a in _srun_args(job))
    if job.preflight is not None:
        check = " ".join(shlex.quote(a) for a in _srun_args(job, preflight=True)) + " " + _program(job, job.preflight)
        if not job.command:
            return "\n".join([*lines, "# nemo-muon preflight: the optimizer path on a tiny model of the family", check]) \
                + "\n"
        lines += ["# step 1: nemo-muon preflight, the optimizer path on a tiny model of the family on these nodes; the",
                  "# training (step 2) starts only when it passed: set -e ends the job with its exit code otherwise",
                  check, "# step 2: the training"]
    lines.append(f"{srun} {_program(job, job.command)}")
    return "\n".join(lines) + "\n"


def sbatch_argv(script_path: Path) -> list[str]:
    """The submission command: the environment goes with the job (secrets included, never printed)."""
    return ["sbatch", "--parsable", "--export=ALL", str(script_path)]


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; a missing command is a RuntimeError saying where to run instead."""
    try:
        return subprocess.run(list(argv), env=None if env is None else dict(env), capture_output=True, text=True,
                              check=False)
    except FileNotFoundError:
        raise RuntimeError(f"{argv[0]} is not on PATH: run on a Slurm login node (scripts/slurm_up.sh starts a "
                           "one-node cluster for trials)") from None


def submit(script_path: Path, env: Mapping[str, str]) -> str:
    """Submit the written script with ``env`` as sbatch's environment; returns the job id."""
    out = _run(sbatch_argv(script_path), env)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch failed (exit {out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]


def job_state(job_id: str) -> tuple[str, str]:
    """(JobState, ExitCode) from scontrol, e.g. ('COMPLETED', '0:0'); ('UNKNOWN', '') once Slurm forgot it."""
    out = _run(["scontrol", "show", "job", str(job_id)])
    state = re.search(r"JobState=(\S+)", out.stdout, re.ASCII)
    code = re.search(r"ExitCode=(\S+)", out.stdout, re.ASCII)
    return (state.group(1) if state else "UNKNOWN", code.group(1) if code else "")


def is_queued(job_id: str) -> bool:
    """True while squeue lists the job (pending, running or completing)."""
    out = _run(["squeue", "-h", "-j", str(job_id), "-o", "%T"])
    return bool(out.stdout.strip())


def wait(job_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5,
         on_poll: Callable[[str, float], None] | None = None) -> tuple[str, str]:
    """Poll squeue every poll_s until the job leaves the queue; returns job_state(); TimeoutError on timeout."""
    start = time.monotonic()
    while is_queued(job_id):
        elapsed = time.monotonic() - start
        if timeout_s is not None and elapsed > timeout_s:
            raise TimeoutError(f"slurm job {job_id} still queued after {timeout_s:.0f} s")
        if on_poll is not None:
            on_poll(job_state(job_id)[0], elapsed)
        time.sleep(poll_s)
    return job_state(job_id)


def exit_status(code: str) -> int | None:
    """The exit status of Slurm's ``ExitCode`` (``'2:0'`` -> 2); None when it is not one (empty, a signal name)."""
    status = code.split(":")[0]
    return int(status) if status.isascii() and status.isdigit() and len(status) <= 3 else None


def cancel(job_id: str) -> None:
    """scancel the job (raises with scancel's message on failure)."""
    if not JOB_ID.match(str(job_id)):
        raise ValueError(f"slurm job id must be ASCII digits, e.g. 1234 or 1234_5 (an array task); got {shown(job_id)}")
    out = _run(["scancel", str(job_id)])
    if out.returncode != 0:
        raise RuntimeError(f"scancel {job_id} failed (exit {out.returncode}): {out.stderr.strip()}")


def quote_argv(argv: Sequence[str]) -> str:
    """A shell-safe rendering of an argv."""
    return shlex.join(argv)
