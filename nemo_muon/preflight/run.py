"""What every rank of a preflight runs: the recipe's optimizer path and the reference path, side by side, then checks.

On the ranks of the allocation (torch.distributed's default group initialized by the caller: NCCL on GPUs, gloo on
CPU), inside Megatron's model-parallel state with the request's pipeline and expert-parallel sizes: two replicas of
the tiny model
of the recipe's family from one seed, ours (`preflight_plan`: the recipe's optimizer as the job builds it) and the
reference (the same optimizer on the least-patched path), trained step by step on the same batches; the masters are
compared after the first step (with the reference path's and, with our engine, with the single-process reference's,
stepped after the runs on rank 0 in a model-parallel state of its own: `nemo_muon.preflight.single_process`), the
losses after every step. Ours is saved
at `PreflightRequest.checkpoint_step` with Megatron's `dist_checkpointing`, a third replica resumed from it and
trained to the end, and one more step of that replica gets a NaN gradient on the last data-parallel rank; a fourth
loads the checkpoint at another layout (another pipeline size, so another data-parallel size), after the runs, in a
model-parallel state of its own (`nemo_muon.preflight.reshard`). Every rank
returns the same `Figures`; `nemo_muon.preflight.checks` turns them into verdicts.

``plant`` (tests): ``plant(moment, role, replica)`` is called on every rank at ``"built"`` (after a replica's
optimizer is built), ``"saved"`` / ``"resumed"`` (after the save, after the resume) and ``"resharded"`` (after
the load at another layout); a planted fault (a wrong
owner, a skipped gather after resume, a corrupted shard) must make the check it breaks fail.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nemo_muon.preflight.replica import Replica, build_replica, rank_device, train_step
from nemo_muon.preflight.request import WARMUP_STEPS, ParallelLayout, PreflightRequest, preflight_plan
from nemo_muon.preflight.world import (
    gather,
    load_error,
    master_worst,
    matrix_keys,
    merged,
    owned_masters,
    replica_problems,
    weight_digests,
    world_key,
)

if TYPE_CHECKING:
    from nemo_muon.preflight.reshard import Resharded, SavedRun
    from nemo_muon.preflight.single_process import FirstStep

Plant = Callable[[str, str, Replica], None]


@dataclasses.dataclass
class Figures:
    """What the runs showed, identical on every rank (reduced or gathered over the world)."""

    paths: dict[str, str]
    losses: dict[str, list[float]]
    step_s: dict[str, list[float]]
    skipped: dict[str, list[int]]
    master_worst: tuple[str, float] | None = None
    """The masters after the first step (from equal states, on the same batch): (parameter, `master_worst`)."""
    single_process: tuple[str, float] | None = None
    """Ours' masters after the first step against the single-process reference
    (`nemo_muon.preflight.single_process`): (parameter, `master_worst`); None where it did not run."""
    single_process_reference: tuple[str, float] | None = None
    """The reference path's against the same (reported, not checked: it tells which path departs)."""
    single_process_not_run: str | None = None
    """Why the single-process reference did not run (`single_process.not_run_reason`)."""
    master_worst_last: tuple[str, float] | None = None
    """The same after the last step (reported, not checked: later steps start from states that already differ by
    the paths' rounding, which reroutes tokens between experts and moves an expert's update by a sizable fraction;
    measured 0.23-0.31 on CPU after 6 steps of tiny Kimi K2 where the first step was bit for bit)."""
    owner_problems: list[str] = dataclasses.field(default_factory=list)
    planned: dict[str, str] = dataclasses.field(default_factory=dict)
    """Path -> the `PLAN_KINDS` key of the plan its owners were also compared with (`plan_problems`)."""
    replica_problems: list[str] = dataclasses.field(default_factory=list)
    resume_problems: list[str] = dataclasses.field(default_factory=list)
    reshard: tuple[ParallelLayout, ParallelLayout] | None = None
    """(the layout saved at, the one resumed at) of the resharded resume (`nemo_muon.preflight.reshard`); None where
    it did not run."""
    reshard_not_run: str | None = None
    """Why the resharded resume did not run (`reshard.other_layout`)."""
    resharded: Resharded | None = None
    """What the resharded resume showed, where it ran."""
    nonfinite: dict[str, Any] = dataclasses.field(default_factory=dict)
    matrices: int = 0
    devices: list[str] = dataclasses.field(default_factory=list)

    def step_time_ratio(self) -> float:
        """Median optimizer-step time after `WARMUP_STEPS`, ours over the reference's (slowest rank per step)."""
        ours, ref = (statistics.median(self.step_s[r][WARMUP_STEPS:]) for r in ("ours", "reference"))
        return ours / ref if ref > 0 else float("inf")


def owner_problems(role: str, owned_by_rank: list[dict[str, Any]], keys: set[str], splits_allowed: bool) -> list[str]:
    """Parameters no rank updates, or several ranks update without split ownership, or whose split owners disagree."""
    import numpy as np

    problems = []
    for key in sorted(keys):
        owners = [r for r, owned in enumerate(owned_by_rank) if key in owned]
        if not owners:
            problems.append(f"{role}: {key} has no owner")
        elif len(owners) > 1 and not splits_allowed:
            problems.append(f"{role}: {key} is updated by ranks {owners} without split ownership")
        elif len(owners) > 1 and any(not np.array_equal(owned_by_rank[owners[0]][key], owned_by_rank[r][key])
                                     for r in owners[1:]):
            problems.append(f"{role}: the split owners {owners} of {key} disagree")
    return problems


PLAN_KINDS = {"cost_layout": "the cost layout's plan", "ns_cost": "the NS-cost ownership plan"}
"""Whose plan a replica's owners are compared with: DDP's cost layout (Megatron-Core >= 0.18,
``collectives='reduce_scatter'``) or our layer-wise optimizer's NS-cost ownership (0.16 / 0.17,
`nemo_muon.megatron.core_016_017.cost_balanced`)."""


def plan_kind(replica: Replica) -> str | None:
    """The `PLAN_KINDS` key of the plan ``replica``'s owners come from; None where Megatron assigns them itself."""
    from nemo_muon.megatron.shared.engine import megatron_nodes

    if getattr(replica.ddp_model, "cost_layout_plan", None) is not None:
        return "cost_layout"
    if any(getattr(node, "dense_plan", None) is not None for node in megatron_nodes(replica.optimizer)):
        return "ns_cost"
    return None


def _planned(replica: Replica, ep_rank: int, dense_rank: int, expert_rank: int) -> tuple[list[str], list[str]]:
    """(world-wide keys of the matrices the plan gives this rank, keys of the split matrices whose block this rank
    may help without the plan naming it) from the replica's plan (`plan_kind`)."""
    from nemo_muon.megatron.shared.engine import megatron_nodes

    names = replica.names

    def key(param: Any) -> str:
        return world_key(param, names[id(param)], ep_rank)

    def domain_rank(param: Any) -> int:
        return expert_rank if getattr(param, "allreduce", True) is False else dense_rank

    plan = getattr(replica.ddp_model, "cost_layout_plan", None)
    if plan is not None:  # keyed by parameter; a split matrix: its block's first rank
        return (sorted(key(p) for p in plan.owners if plan.owners[p] == domain_rank(p)),
                sorted(key(p) for p in plan.splits))
    node = next(n for n in megatron_nodes(replica.optimizer) if getattr(n, "dense_plan", None) is not None)
    by_engine_name = dict(replica.ddp_model.named_parameters())  # the engine names chunk parameters so
    planned = []
    for owned_plan, rank in ((node.dense_plan, dense_rank), (node.expert_plan, expert_rank)):
        for name, owner in (owned_plan.owners.items() if owned_plan is not None else ()):
            split = owned_plan.splits.get(name)
            if owner == rank or (split is not None and rank in split.ranks):  # every block member updates it
                planned.append(key(by_engine_name[name]))
    return sorted(planned), []


def plan_problems(role: str, replica: Replica, ep_rank: int, dense_rank: int, expert_rank: int) -> list[str]:
    """Where the owners come from a plan of ours (`plan_kind`), the matrices each rank's layer-wise optimizer updates
    against the plan's owners (``dense_rank``, ``expert_rank``: this rank's place in the dense and expert
    data-parallel groups the plan counts in); [] where Megatron assigns the owners itself (collective)."""
    kind = plan_kind(replica)
    if kind is None:
        return []
    planned, split = _planned(replica, ep_rank, dense_rank, expert_rank)
    by_rank = gather((planned, sorted(matrix_keys(replica, ep_rank)), split))
    plan = PLAN_KINDS[kind]
    problems = []
    for rank, (planned_keys, updated, split_keys) in enumerate(by_rank):
        problems += [f"{role}: rank {rank} does not update {k}, which {plan} gives it"
                     for k in sorted(set(planned_keys) - set(updated))]
        problems += [f"{role}: rank {rank} updates {k}, which {plan} gives another rank"
                     for k in sorted(set(updated) - set(planned_keys) - set(split_keys))]
    return problems


def _compare_masters(ours: dict[str, Any], ref: dict[str, Any], initial: dict[str, Any],
                     matrices: set[str]) -> tuple[str, float]:
    """`master_worst` over the matrices both paths report. Adam's parameters are left out: its first step moves
    each element by +-lr along the sign of its gradient, so a near-zero gradient summed in another order flips an
    element's update (measured: 1.67x the movement on 0.16 at DP=2, EP=2); the matrices' update is orthogonalized
    over the whole gradient."""
    common = set(ours) & set(ref) & matrices
    return master_worst({k: ours[k] for k in common}, {k: ref[k] for k in common}, initial)


def _against_single(ours: dict[str, Any], single: dict[str, Any], initial: dict[str, Any]) -> tuple[str, float]:
    """`master_worst` of ours against the single-process reference; a matrix no rank of ours updates is infinitely
    far (named)."""
    missing = sorted(set(single) - set(ours))
    if missing:
        return missing[0], float("inf")
    return master_worst({k: ours[k] for k in single}, single, initial)


def run_preflight(request: PreflightRequest, checkpoint_dir: str, plant: Plant | None = None) -> Figures:
    """Run the preflight of ``request`` on every rank of the default group (see the module doc); collective."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from nemo_muon.preflight.bridge_setup import bridge_setup_applies
    from nemo_muon.preflight.request import tiny_experts, tiny_layers
    from nemo_muon.preflight.reshard import other_layout, run_resharded
    from nemo_muon.preflight.single_process import run_first_step
    from nemo_muon.preflight.wiring import has_layouts

    recipe = request.training_recipe()
    paths = preflight_plan(recipe, has_layouts(), bridge_setup_applies())
    world = dist.get_world_size()
    if world != request.world_size:
        raise ValueError(f"preflight.world_size is {request.world_size} but {world} ranks joined")
    reshard_layout, reshard_not_run = other_layout(request.layout, tiny_layers(recipe), tiny_experts(recipe))
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=request.pp,
                                             expert_model_parallel_size=request.ep)
    try:
        figures, first, saved = _run(request, recipe, paths, checkpoint_dir, plant or (lambda *_: None),
                                     parallel_state, reshard_layout is not None)
    finally:
        parallel_state.destroy_model_parallel()
    figures.reshard_not_run = reshard_not_run
    if saved is not None:  # the resharded resume, in its own model-parallel state at another layout
        figures.reshard = (request.layout, reshard_layout)
        figures.resharded = run_resharded(request, recipe, paths[0], reshard_layout, checkpoint_dir, saved,
                                          plant or (lambda *_: None))
    if first is not None:  # the single-process reference, in its own model-parallel state at EP = PP = 1
        single = run_first_step(first, recipe, rank_device())
        figures.single_process = _against_single(first.ours, single, first.initial)
        figures.single_process_reference = _against_single(first.reference, single, first.initial)
    return figures


def _run(request: PreflightRequest, recipe: Any, paths: Any, checkpoint_dir: str, plant: Plant,
         parallel_state: Any, reshards: bool) -> tuple[Figures, FirstStep | None, SavedRun | None]:
    """The runs and their figures, what the single-process comparison needs and what the resharded resume compares
    with (``reshards``; each None where it does not run)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from nemo_muon.preflight.reshard import SavedRun, gathered_by_name
    from nemo_muon.preflight.single_process import FirstStep, not_run_reason, whole_model_state, world_key_to_name
    from nemo_muon.preflight.state import checkpoint_state, integrity_check, settle

    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    replicas = {}
    for path in paths:
        replicas[path.role] = build_replica(path.role, path.opt, path.layout, recipe, request.ep, path.setup,
                                            request.steps + 1, request.pp)
        plant("built", path.role, replicas[path.role])
    figures = Figures(paths={r.role: p.describe() for r, p in zip(replicas.values(), paths, strict=True)},
                      losses={r: [] for r in replicas}, step_s={r: [] for r in replicas},
                      skipped={r: [] for r in replicas}, devices=gather(str(rank_device())))
    dense_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    expert_rank = parallel_state.get_expert_data_parallel_rank()
    for role, replica in replicas.items():
        figures.owner_problems += plan_problems(role, replica, ep_rank, dense_rank, expert_rank)
        kind = plan_kind(replica)
        if kind is not None:
            figures.planned[role] = kind
    initial = merged(gather(owned_masters(replicas["reference"], ep_rank)))
    keys = set().union(*(set().union(*gather(matrix_keys(r, ep_rank))) for r in replicas.values()))
    figures.single_process_not_run = not_run_reason(recipe)
    single_runs = figures.single_process_not_run is None
    local_experts = (replicas["reference"].ddp_model.config.num_moe_experts or 0) // request.ep
    state = whole_model_state(replicas["reference"].ddp_model.module, ep_rank, local_experts,
                              contributes=expert_rank == 0) if single_runs else None
    first_step = saved = at_save = None
    for step in range(request.steps):
        for role, replica in replicas.items():
            loss, seconds, ok = train_step(replica, step, dp_rank, dp_size)
            figures.losses[role].append(loss)
            figures.step_s[role].append(seconds)
            if not ok:
                figures.skipped[role].append(step)
        if step == 0:  # from equal states on the same batch: the two paths' masters are comparable (MASTER_RTOL)
            first = {role: merged(gather(owned_masters(replica, ep_rank))) for role, replica in replicas.items()}
            figures.master_worst = _compare_masters(first["ours"], first["reference"], initial, keys)
            if single_runs:
                first_step = FirstStep(state, keys, first["ours"], first["reference"], initial, dp_size,
                                       local_experts, replicas["ours"].micro_batches)
        if step + 1 == request.checkpoint_step:
            ours = replicas["ours"]
            settle(ours.ddp_model)  # as megatron.training syncs the parameters before a save
            dist_checkpointing.save(checkpoint_state(ours.ddp_model, ours.optimizer, loading=False), checkpoint_dir,
                                    **integrity_check())
            dist.barrier()
            if reshards:  # what the resharded resume must find after its load (EP=1 names)
                at_save = (gathered_by_name(weight_digests(ours, ep_rank), local_experts),
                           gathered_by_name(owned_masters(ours, ep_rank), local_experts))
            plant("saved", "ours", ours)
        if at_save is not None and step == request.checkpoint_step:  # the step after the save
            saved = SavedRun(*at_save, gathered_by_name(owned_masters(replicas["ours"], ep_rank), local_experts),
                             figures.losses["ours"][step], {world_key_to_name(k, local_experts) for k in keys})
    owned = {role: gather(owned_masters(replica, ep_rank)) for role, replica in replicas.items()}
    for role, replica in replicas.items():
        split = getattr(replica.opt, "ns_split_target", None) is not None
        figures.owner_problems += owner_problems(role, owned[role], keys, split)
        figures.replica_problems += replica_problems(role, replica, ep_rank)
    ours_masters = merged(owned["ours"])
    figures.master_worst_last = _compare_masters(ours_masters, merged(owned["reference"]), initial, keys)
    figures.matrices = len(keys)
    resumed = _resume(request, recipe, paths[0], checkpoint_dir, plant, dp_rank, dp_size, ep_rank, figures,
                      ours_masters)
    figures.nonfinite = nonfinite_step(resumed, request.steps, dp_rank, dp_size,
                                       getattr(resumed.opt, "nonfinite", "raise"))
    return figures, first_step, saved


def _resume(request: PreflightRequest, recipe: Any, path: Any, checkpoint_dir: str, plant: Plant, dp_rank: int,
            dp_size: int, ep_rank: int, figures: Figures, ours_masters: dict[str, Any]) -> Replica:
    """A fresh replica of ours resumed from the checkpoint and trained to the end: its losses and masters must be
    ours' bit for bit, its replicas agree; problems go to ``figures.resume_problems``."""
    import numpy as np
    import torch.distributed as dist

    from nemo_muon.preflight.state import resume_from

    resumed = build_replica("resumed", path.opt, path.layout, recipe, request.ep, path.setup, request.steps + 1,
                            request.pp)
    error = load_error(lambda: resume_from(resumed.ddp_model, resumed.optimizer, checkpoint_dir))
    if error is not None:
        figures.resume_problems.append(f"the checkpoint saved after step {request.checkpoint_step} does not load: "
                                       f"{error}")
        return build_replica("resumed", path.opt, path.layout, recipe, request.ep, path.setup, request.steps + 1,
                            request.pp)
    plant("resumed", "ours", resumed)
    for step in range(request.checkpoint_step, request.steps):
        loss, _, _ = train_step(resumed, step, dp_rank, dp_size)
        if loss != figures.losses["ours"][step]:
            figures.resume_problems.append(f"step {step + 1} after resume: loss {loss!r} where the uninterrupted run "
                                           f"had {figures.losses['ours'][step]!r}")
            break
    masters = merged(gather(owned_masters(resumed, ep_rank)))
    differ = sorted(k for k in ours_masters if k not in masters or not np.array_equal(masters[k], ours_masters[k]))
    if differ:
        figures.resume_problems.append(f"{len(differ)} masters differ from the uninterrupted run after "
                                       f"{request.steps} steps, first {differ[0]}")
    figures.resume_problems += replica_problems("resumed", resumed, ep_rank)
    dist.barrier()
    return resumed


def nonfinite_step(replica: Replica, step: int, dp_rank: int, dp_size: int, policy: str) -> dict[str, Any]:
    """One step in which the last data-parallel rank alone has a NaN in a reduced gradient it owns: what every rank
    did under ``policy`` ('skip': skipped, state untouched; 'raise': FloatingPointError)."""
    import torch

    from nemo_muon.preflight.batches import forward_backward
    from nemo_muon.preflight.state import bits, state_tensors

    names = replica.names
    params = replica.params
    forward_backward(replica.ddp_model, replica.optimizer, step, dp_rank, replica.vocab, replica.micro_batches)
    if dp_rank == dp_size - 1:
        from nemo_muon.preflight.state import matrix_masters

        owned = sorted(matrix_masters(replica.optimizer, names)) or sorted(params)
        params[owned[0]].main_grad.view(-1)[0] = float("nan")
    before = state_tensors(replica.ddp_model, replica.optimizer, names)
    outcome: dict[str, Any]
    try:
        ok, _, _ = replica.optimizer.step()
        after = state_tensors(replica.ddp_model, replica.optimizer, names)
        untouched = before.keys() == after.keys() and all(torch.equal(bits(before[k]), bits(after[k]))
                                                          for k in before)
        outcome = {"outcome": "applied" if ok else "skipped", "untouched": untouched}
    except FloatingPointError as exc:
        outcome = {"outcome": "raised", "untouched": None, "error": str(exc)[:200]}
    return {"policy": policy, "ranks": gather(outcome)}
