"""The CPU preflight runs the preflight tests share: every rank of `nemo_muon.preflight.main.preflight_on_rank` on gloo
ranks with the harness's shims (tests/megatron_cpu/shims.py), and the planted faults a test may add to one."""

from __future__ import annotations

from pathlib import Path

from nemo_muon.preflight.request import PreflightRequest
from tests.distributed import run_distributed

STEPS = 6
"""Steps of each test preflight (the loss of the tiny model falls over 6 steps, not yet over 4; CI time)."""


def _plant_wrong_owner(out_dir, moment, role, replica):
    """Rank 0's optimizer of ours drops its first owned matrix: a gradient reduced to an owner that never updates it."""
    import torch.distributed as dist

    if moment != "built" or role != "ours" or dist.get_rank() != 0:
        return
    for sub in getattr(replica.optimizer, "chained_optimizers", [replica.optimizer]):
        for model_group, master_group in zip(sub.float16_groups, sub.fp32_from_float16_groups, strict=True):
            if model_group and model_group[0].dim() == 2:
                master = master_group[0]
                del model_group[0], master_group[0]
                for group in sub.optimizer.param_groups:
                    group["params"] = [p for p in group["params"] if p is not master]
                return


def _plant_skipped_gather(out_dir, moment, role, replica):
    """After the resume, the last rank keeps its stale copies of the parameters other ranks update (a skipped
    gather)."""
    import torch
    import torch.distributed as dist

    from nemo_muon.preflight.state import masters, settle

    if moment != "resumed" or dist.get_rank() != dist.get_world_size() - 1:
        return
    owned = set(masters(replica.optimizer, replica.names))
    others = [p for n, p in replica.params.items() if n not in owned and p.dim() == 2]
    step = replica.optimizer.step

    def step_without_gather(*args, **kwargs):
        before = [p.detach().clone() for p in others]
        out = step(*args, **kwargs)
        settle(replica.ddp_model)
        with torch.no_grad():
            for p, old in zip(others, before, strict=True):
                p.copy_(old)
        return out

    replica.optimizer.step = step_without_gather


def _plant_corrupted_shard(out_dir, moment, role, replica):
    """After the save, rank 0 zeroes 4 KiB in the middle of every shard file."""
    import torch.distributed as dist

    if moment != "saved" or dist.get_rank() != 0:
        return
    for path in Path(out_dir).glob("checkpoint-*/*.distcp"):
        data = bytearray(path.read_bytes())
        mid = len(data) // 2
        data[mid:mid + 4096] = bytes(len(data[mid:mid + 4096]))
        path.write_bytes(bytes(data))


def _plant_unplanned_owner(out_dir, moment, role, replica):
    """The plan of ours names another owner for one dense matrix than the one the replica's ranks give it (a matrix
    reduced to a rank the plan did not choose): DDP's cost layout on >= 0.18, the NS-cost ownership on 0.16 / 0.17."""
    import torch.distributed as dist

    from nemo_muon.megatron.shared.engine import megatron_nodes

    if moment != "built" or role != "ours":
        return
    plan = getattr(replica.ddp_model, "cost_layout_plan", None)
    if plan is not None:
        param = next(p for p in plan.owners if getattr(p, "allreduce", True) is not False and p not in plan.splits)
        plan.owners[param] = (plan.owners[param] + 1) % dist.get_world_size()
        return
    plan = next(n.dense_plan for n in megatron_nodes(replica.optimizer) if getattr(n, "dense_plan", None) is not None)
    name = next(k for k in sorted(plan.owners) if k not in plan.splits)
    plan.owners[name] = (plan.owners[name] + 1) % plan.num_ranks


def _plant_unreduced_gradients(out_dir, moment, role, replica):
    """On both paths, DDP's gradient reduction does nothing: each owner updates with its own rank's gradient (the two
    paths agree with each other; only the single-process reference shows it)."""
    if moment == "built":
        replica.ddp_model.finish_grad_sync = lambda *args, **kwargs: None


def _plant_unreduced_expert_gradients(out_dir, moment, role, replica):
    """On both paths, the experts' gradients are not reduced over expert data parallelism (the dense ones are): each
    expert's owner updates with the tokens its own expert-parallel group routed (the paths agree, the replicas stay
    identical through the owner's broadcast; of the checks before the resume, only the single-process reference,
    every EP rank's experts gathered, shows it)."""
    if moment == "built":
        for bucket_group in replica.ddp_model.expert_parallel_bucket_groups:
            bucket_group.finish_grad_sync = lambda *args, **kwargs: None


def _plant_misplaced_experts(out_dir, moment, role, replica):
    """After the load at another expert-parallel size, each rank's first two local experts trade weights (an expert
    offset computed for the old layout: every weight loaded, some under another expert's index)."""
    import torch

    if moment != "resharded":
        return
    params = dict(replica.ddp_model.module.named_parameters())
    first = next(n for n in sorted(params) if ".local_experts.0." in n)
    second = first.replace(".local_experts.0.", ".local_experts.1.")
    with torch.no_grad():
        held = params[first].detach().clone()
        params[first].copy_(params[second])
        params[second].copy_(held)


PLANTS = {"unreduced_gradients": _plant_unreduced_gradients,
          "unreduced_expert_gradients": _plant_unreduced_expert_gradients, "wrong_owner": _plant_wrong_owner,
          "unplanned_owner": _plant_unplanned_owner, "skipped_gather": _plant_skipped_gather,
          "corrupted_shard": _plant_corrupted_shard,
          "misplaced_experts": _plant_misplaced_experts}


def preflight_rank(rank, world_size, group, request, plant):
    import functools

    from nemo_muon.preflight.bridge_setup import bridge_setup_applies
    from tests.megatron_cpu import shims

    if bridge_setup_applies():  # ours through Bridge's setup: Bridge imports (with the harness's TE stub) before
        # the shims replace torch.cuda names (transformers annotates with torch.cuda.Stream at import)
        from tests.megatron_cpu.te_stub import bridge_imports_without_te

        bridge_imports_without_te()
    shims.install()
    from nemo_muon.preflight.main import preflight_on_rank

    doc, code = preflight_on_rank(request, functools.partial(PLANTS[plant], request.out_dir) if plant else None)
    return {"code": code, "failed": [c["name"] for c in doc["checks"] if not c["passed"]],
            "first_failure": doc["first_failure"], "checks": [c["verdict"] for c in doc["checks"]]}


def run_cpu_preflight(tmp_path, recipe="kimi_k2_muon", world_size=2, plant=None, **kwargs):
    """(rank 0's result, the report folder) of a `STEPS`-step preflight; every rank must return the same."""
    request = PreflightRequest(recipe=recipe, world_size=world_size, out_dir=str(tmp_path / "pf"), steps=STEPS,
                               **kwargs)
    results = run_distributed(preflight_rank, world_size=world_size, args=(request, plant), timeout_s=600,
                              daemon=False)
    assert all(r == results[0] for r in results[1:]), results
    return results[0], tmp_path / "pf"


