"""The resume at another expert-parallel size: the checkpoint ours saved, loaded with the experts laid out otherwise.

On W ranks at expert parallelism e, each expert's data-parallel group has W / e ranks; the dense parameters' has W at
TP = PP = 1, which the same ranks cannot change. So the data-parallel size a resume on the allocation can change is the
experts': `other_ep` picks another expert-parallel size above 1 where the request allows it, and says why not otherwise
(at EP=1 Megatron's optimizer groups the experts with the dense parameters, so no checkpoint loads across EP=1 and
EP > 1, Megatron's own engine's neither). `run_resharded` builds ours again at that
size, in a model-parallel state of its own, loads the checkpoint through Megatron's `dist_checkpointing`
(``fully_reshardable``, as megatron.training resumes) and compares it with the uninterrupted run by the names of the
EP=1 model (`nemo_muon.preflight.single_process.world_key_to_name`):

- at the load: every weight (its bits' SHA-256) and every master the optimizers update, bit for bit with the saved
  ones (a load at another layout moves bytes, it computes nothing);
- after one more step: the loss within the request's ``loss_rtol`` and each matrix's master within ``master_rtol`` x
  how far the step moved it (the experts' gradients are summed over another group, in another order), and the
  replicas bit-identical.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class SavedRun:
    """What the uninterrupted run of ours showed around its save, by EP=1 names (identical on every rank)."""

    weights: dict[str, str]
    """Name -> SHA-256 of the bf16 weight's bits at the save."""
    masters: dict[str, Any]
    """Name -> fp32 master (numpy) at the save, of every parameter the optimizers update."""
    next_masters: dict[str, Any]
    """The same after the step that follows the save."""
    next_loss: float
    """The loss of that step."""
    matrices: set[str]
    """The names of the matrices the layer-wise matrix optimizer updates."""


@dataclasses.dataclass
class Resharded:
    """What the resharded resume showed."""

    problems: list[str]
    loss_diff: float | None = None
    """|loss - the uninterrupted run's| / |the uninterrupted run's| of the step after the load."""
    master_worst: tuple[str, float] | None = None
    """(matrix, max |resharded - uninterrupted| / the step's movement) after that step (`nemo_muon.preflight.world.master_worst`)."""


def other_ep(ep: int, ranks: int, experts: int) -> tuple[int | None, str | None]:
    """(the expert-parallel size the resharded resume loads at, None) or (None, why it does not run): another size
    above 1 that divides the ``ranks`` and the tiny model's ``experts``, twice or half ``ep`` where it can."""
    if ep == 1:
        return None, ("ep=1: Megatron's optimizer keeps the experts in the dense parameters' groups at EP=1 and in "
                      "groups of their own at EP > 1, so a checkpoint does not load across the two; a preflight at "
                      "ep > 1 resumes at another")
    hostable = [d for d in range(2, ranks + 1) if ranks % d == 0 and experts % d == 0 and d != ep]
    if not hostable:
        return None, (f"world_size={ranks} with the tiny model's {experts} experts hosts no expert-parallel size "
                      f"above 1 but ep={ep}")
    return next((d for d in (2 * ep, ep // 2) if d in hostable), hostable[0]), None


def gathered_by_name(part: dict[str, Any], local_experts: int) -> dict[str, Any]:
    """Every rank's ``part`` (keyed by `nemo_muon.preflight.world.world_key`) merged, by the EP=1 model's names
    (collective)."""
    from nemo_muon.preflight.single_process import world_key_to_name
    from nemo_muon.preflight.world import gather, merged

    return {world_key_to_name(k, local_experts): v for k, v in merged(gather(part)).items()}


def _differ(what: str, got: dict[str, Any], saved: dict[str, Any], equal: Any) -> list[str]:
    missing = sorted(set(saved) - set(got))
    if missing:
        return [f"{len(missing)} {what} saved are not in the resharded optimizer, first {missing[0]}"]
    differ = sorted(k for k in saved if not equal(got[k], saved[k]))
    return [f"{len(differ)} {what} differ from the saved ones after the load, first {differ[0]}"] if differ else []


def run_resharded(request: Any, recipe: Any, path: Any, ep: int, checkpoint_dir: str, saved: SavedRun,
                  plant: Any) -> Resharded:
    """Ours loaded from ``checkpoint_dir`` at expert parallelism ``ep``, against ``saved`` (module doc); no problems
    when it resumes as saved. Call it outside any other model-parallel state; collective."""
    import numpy as np
    from megatron.core import parallel_state

    from nemo_muon.preflight import world
    from nemo_muon.preflight.replica import build_replica, train_step
    from nemo_muon.preflight.state import resume_from

    parallel_state.initialize_model_parallel(expert_model_parallel_size=ep)
    try:
        ep_rank = parallel_state.get_expert_model_parallel_rank()
        dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
        replica = build_replica("resharded", path.opt, path.layout, recipe, ep, path.setup, request.steps + 1)
        local_experts = (replica.ddp_model.config.num_moe_experts or 0) // ep
        error = world.load_error(lambda: resume_from(replica.ddp_model, replica.optimizer, checkpoint_dir))
        if error is not None:
            return Resharded([f"the checkpoint saved at EP={request.ep} does not load at EP={ep}: {error}"])
        plant("resharded", "ours", replica)
        weights = gathered_by_name(world.weight_digests(replica, ep_rank), local_experts)
        masters = gathered_by_name(world.owned_masters(replica, ep_rank), local_experts)
        problems = _differ("weights", weights, saved.weights, str.__eq__)
        problems += _differ("masters", masters, saved.masters, np.array_equal)
        if problems:
            return Resharded(problems)
        loss, _, _ = train_step(replica, request.checkpoint_step, dp_rank, dp_size)
        loss_diff = abs(loss - saved.next_loss) / abs(saved.next_loss) if saved.next_loss else float("inf")
        if not loss_diff <= request.loss_rtol:  # NaN fails
            problems.append(f"step {request.checkpoint_step + 1} at EP={ep}: loss {loss!r} where the uninterrupted "
                            f"run had {saved.next_loss!r} (tolerance {request.loss_rtol:g} relative)")
        after = gathered_by_name(world.owned_masters(replica, ep_rank), local_experts)
        common = saved.matrices & set(after) & set(saved.next_masters)
        key, worst = world.master_worst({k: after[k] for k in common}, {k: saved.next_masters[k] for k in common},
                                      saved.masters)
        if worst > request.master_rtol:
            problems.append(f"step {request.checkpoint_step + 1} at EP={ep}: {key}'s master is {worst:.3g} x the "
                            f"step's movement from the uninterrupted run's (tolerance {request.master_rtol:g})")
        problems += world.replica_problems("resharded", replica, ep_rank)
        return Resharded(problems, loss_diff, (key, worst))
    finally:
        parallel_state.destroy_model_parallel()
