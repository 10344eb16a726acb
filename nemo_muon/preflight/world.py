"""What the ranks of a preflight hold, by names valid across the world, gathered and compared (collectives over the
default group): each rank's fp32 masters and weight digests, the replicas' agreement, a parameter's distance to a
reference, a checkpoint load's first error."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_muon.preflight.replica import Replica


def world_key(param: Any, name: str, ep_rank: int) -> str:
    """A parameter's name across the world (``name``: its name in the whole model, `replica.pipeline_names`): an
    expert's is per expert-parallel rank (each holds other experts)."""
    return f"ep{ep_rank}/{name}" if getattr(param, "allreduce", True) is False else name


def owned_masters(replica: Replica, ep_rank: int) -> dict[str, Any]:
    """World-wide key -> fp32 master (numpy) of every parameter this rank's optimizer updates."""
    from nemo_muon.preflight.state import masters

    params = replica.params
    return {world_key(params[n], n, ep_rank): m for n, m in masters(replica.optimizer, replica.names).items()}


def matrix_keys(replica: Replica, ep_rank: int) -> set[str]:
    """World-wide keys of the matrices this rank's layer-wise matrix optimizer updates (the owners the plan decides;
    the rest is Megatron's distributed Adam, sharded by Megatron)."""
    from nemo_muon.preflight.state import matrix_masters

    params = replica.params
    return {world_key(params[n], n, ep_rank) for n in matrix_masters(replica.optimizer, replica.names)}


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (collective)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def weight_digests(replica: Replica, ep_rank: int) -> dict[str, str]:
    """Key -> SHA-256 of the bf16 weight this rank's model holds (after the gathers a step left to the forward)."""
    import hashlib

    from nemo_muon.preflight.state import bits, settle

    settle(replica.ddp_model)
    return {world_key(p, n, ep_rank): hashlib.sha256(bits(p.detach().cpu()).numpy().tobytes()).hexdigest()
            for n, p in replica.params.items()}


def replica_problems(role: str, replica: Replica, ep_rank: int) -> list[str]:
    """Parameters whose weights differ between ranks that should hold the same copy, named (collective)."""
    by_rank = gather(weight_digests(replica, ep_rank))
    problems = []
    for key in sorted(set().union(*by_rank)):
        holders = {d[key] for d in by_rank if key in d}
        if len(holders) > 1:
            problems.append(f"{role}: {key} differs between data-parallel replicas ({len(holders)} versions)")
    return problems


def master_worst(ours: dict[str, Any], ref: dict[str, Any], initial: dict[str, Any]) -> tuple[str, float]:
    """(key, max |ours - reference| / max |reference - initial|) of the parameter farthest from the reference."""
    import numpy as np

    worst = ("", 0.0)
    for key, theirs in ref.items():
        moved = float(np.abs(theirs - initial[key]).max())
        diff = float(np.abs(ours[key] - theirs).max())
        figure = diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf"))
        if figure > worst[1] or not worst[0]:
            worst = (key, figure)
    return worst


def merged(owned_by_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' dicts in one (a key several ranks hold: the last rank's)."""
    out: dict[str, Any] = {}
    for owned in owned_by_rank:
        out.update(owned)
    return out


def load_error(load: Callable[[], None]) -> str | None:
    """Run ``load`` on every rank: the first rank's error (type, first line, where it was raised), the same on every
    rank, or None when every rank loaded (collective)."""
    from torch.distributed.checkpoint.api import CheckpointException

    error = None
    try:
        load()
    except (Exception, CheckpointException) as exc:  # whatever Megatron raises is the verdict
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{_where(exc)}"[:300]
    return next((e for e in gather(error) if e), None)


def _where(exc: BaseException) -> str:
    """`` (at <file>:<line> in <function>)`` of the innermost frame that raised ``exc``."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {'/'.join(last.filename.split('/')[-3:])}:{last.lineno} in {last.name})"
