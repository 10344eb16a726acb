"""The resume at another layout: the checkpoint ours saved, loaded with the parameters laid out otherwise.

On W ranks at pipeline size p and expert parallelism e, the dense parameters' data-parallel group has W / p ranks and
each expert's W / (p e). So the data-parallel sizes a resume on the allocation's ranks can change are changed by the
pipeline size (the dense and the experts') and by the expert-parallel size (the experts'): `other_layout` picks
another pipeline size where the ranks and the tiny model's layers allow it, and another expert-parallel size above 1
where the experts allow it, and says why not otherwise (at EP=1 Megatron's optimizer groups the experts with the
dense parameters, at EP > 1 in groups of their own, so no checkpoint loads across EP=1 and EP > 1, Megatron's own
engine's neither). Every layout steps on the same global batch (one micro-batch per rank of the world:
`nemo_muon.preflight.replica.micro_batches_per_rank`). `run_resharded` builds ours again at that layout, in a
model-parallel state of its own, loads the checkpoint through Megatron's `dist_checkpointing`
(``fully_reshardable``, as megatron.training resumes) and compares it with the uninterrupted run by the names of the
model at EP = PP = 1 (`nemo_muon.preflight.single_process.world_key_to_name`):

- at the load: every weight (its bits' SHA-256) and every master the optimizers update, bit for bit with the saved
  ones (a load at another layout moves bytes, it computes nothing);
- after one more step: the loss within the request's ``loss_rtol`` and each matrix's master within ``master_rtol`` x
  how far the step moved it (the gradients are summed over other groups, in another order), and the replicas
  bit-identical.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nemo_muon.preflight.request import ParallelLayout, hostable_sizes


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


def other_layout(saved: ParallelLayout, layers: int, experts: int) -> tuple[ParallelLayout | None, str | None]:
    """(the layout the resharded resume loads at, None) or (None, why it does not run): on ``saved``'s ranks, with the
    tiny model's ``layers`` and ``experts``, another pipeline size first (the data-parallel size changes), another
    expert-parallel size too where it can (the experts' placement changes), twice or half the saved one where it can;
    an expert-parallel size above 1 where the saved one is, and 1 where it is 1."""
    ranks, pp, ep = saved.ranks, saved.pp, saved.ep
    candidates = [ParallelLayout(ranks, p, e) for p in hostable_sizes(ranks, layers)
                  for e in hostable_sizes(ranks // p, experts) if (p, e) != (pp, ep) and (e > 1) == (ep > 1)]
    if not candidates:
        why = (f"world_size={ranks} with the tiny model's {layers} layers and {experts} experts hosts no other layout "
               f"than {saved.describe()}")
        if ep > 1:
            why += " with expert parallelism above 1 (a checkpoint does not load across EP=1 and EP > 1: Megatron's "
            why += "optimizer keeps the experts in the dense parameters' groups at EP=1, in groups of their own above)"
        return None, why

    def preference(layout: ParallelLayout) -> tuple[bool, bool, bool, bool]:
        return (layout.pp != pp, layout.ep != ep, layout.pp in (2 * pp, pp // 2), layout.ep in (2 * ep, ep // 2))

    return max(candidates, key=preference), None


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


def run_resharded(request: Any, recipe: Any, path: Any, layout: ParallelLayout, checkpoint_dir: str,
                  saved: SavedRun, plant: Any) -> Resharded:
    """Ours loaded from ``checkpoint_dir`` at ``layout``, against ``saved`` (module doc); no problems when it resumes
    as saved. Call it outside any other model-parallel state; collective."""
    import numpy as np
    from megatron.core import parallel_state

    from nemo_muon.preflight import world
    from nemo_muon.preflight.replica import build_replica, train_step
    from nemo_muon.preflight.state import resume_from

    ep, at = layout.ep, layout.describe()
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=layout.pp, expert_model_parallel_size=ep)
    try:
        ep_rank = parallel_state.get_expert_model_parallel_rank()
        dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
        replica = build_replica("resharded", path.opt, path.layout, recipe, ep, path.setup, request.steps + 1,
                                layout.pp)
        local_experts = (replica.ddp_model.config.num_moe_experts or 0) // ep
        error = world.load_error(lambda: resume_from(replica.ddp_model, replica.optimizer, checkpoint_dir))
        if error is not None:
            return Resharded([f"the checkpoint saved at {request.layout.describe()} does not load at {at}: {error}"])
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
            problems.append(f"step {request.checkpoint_step + 1} at {at}: loss {loss!r} where the uninterrupted "
                            f"run had {saved.next_loss!r} (tolerance {request.loss_rtol:g} relative)")
        after = gathered_by_name(world.owned_masters(replica, ep_rank), local_experts)
        common = saved.matrices & set(after) & set(saved.next_masters)
        key, worst = world.master_worst({k: after[k] for k in common}, {k: saved.next_masters[k] for k in common},
                                      saved.masters)
        if worst > request.master_rtol:
            problems.append(f"step {request.checkpoint_step + 1} at {at}: {key}'s master is {worst:.3g} x the "
                            f"step's movement from the uninterrupted run's (tolerance {request.master_rtol:g})")
        problems += world.replica_problems("resharded", replica, ep_rank)
        return Resharded(problems, loss_diff, (key, worst))
    finally:
        parallel_state.destroy_model_parallel()
