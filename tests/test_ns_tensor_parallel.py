"""Tensor-parallel Newton–Schulz (and Muon / SOAP on TP shards) on gloo ranks, against the unsharded result, and\nMuon on TP shards against Megatron-Core's TensorParallelMuon.

Each world size is one spawn running every case (spawns cost seconds); the tests below assert on its results.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.distributed import run_distributed

SHAPES = {"wide": (24, 96), "tall": (96, 24), "square": (48, 48), "stack": (3, 16, 64)}
MODES = ("duplicated", "distributed", "blockwise", "auto")


def _shard(full: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    return full.chunk(world, dim=dim)[rank].contiguous()


def _ns_cases(rank: int, world: int, group) -> dict:
    from nemo_muon.optim.ns_iteration import newton_schulz, newton_schulz_many

    out: dict = {}
    for label, shape in SHAPES.items():
        torch.manual_seed(10)
        full = torch.randn(*shape)
        ref = newton_schulz(full)
        for pdim in (len(shape) - 2, len(shape) - 1):
            local = _shard(full, pdim, rank, world)
            for mode in MODES:
                stats: dict = {}
                y = newton_schulz_many([local], tp_group=group, tp_mode=mode, partition_dims=[pdim], stats=stats)[0]
                want = _shard(ref, pdim, rank, world)
                entry = {"diff": (y - want).abs().max().item(), "mode": stats["modes"][0]}
                if mode == "blockwise":
                    entry["own"] = (y - newton_schulz(local)).abs().max().item()
                out[(label, pdim, mode)] = entry
    # fused collectives: 6 wide matrices sharded along their long side
    torch.manual_seed(11)
    fulls = [torch.randn(16 + 8 * i, 128) for i in range(6)]
    locals_ = [_shard(f, 1, rank, world) for f in fulls]
    refs = [_shard(newton_schulz(f, algorithm=a), 1, rank, world) for f in fulls for a in ("gram",)]
    for algorithm in ("gram", "standard"):
        stats = {}
        ys = newton_schulz_many(locals_, tp_group=group, tp_mode="distributed", partition_dims=1,
                                algorithm=algorithm, stats=stats)
        out[("fused", algorithm)] = {
            "calls": stats["all_reduce_calls"],
            "diff": max((y - r).abs().max().item() for y, r in zip(ys, refs, strict=True)),
        }
    stats = {}
    newton_schulz_many(locals_, tp_group=group, tp_mode="distributed", partition_dims=1, algorithm="gram",
                       bucket_bytes=3 * 16 * 16 * 4, stats=stats)
    out[("fused", "small_buckets")] = {"calls": stats["all_reduce_calls"]}
    stats = {}
    newton_schulz_many([_shard(f, 0, rank, world) for f in fulls], tp_group=group, tp_mode="duplicated",
                       partition_dims=0, stats=stats)
    out[("gather", "duplicated")] = {"calls": stats["all_gather_calls"]}
    out.update(_every_set_cases(fulls, locals_, rank, world, group))
    out.update(_stacked_cases(rank, world, group))
    return out


def _stacked_cases(rank: int, world: int, group) -> dict:
    """Same-shape shards stacked (``stack=True``: three matrices and a 3-D stack of two) in every mode, against each
    unsharded matrix's own NS: one program for all of them, the TP mode's result per matrix."""
    from nemo_muon.optim.ns_iteration import newton_schulz, newton_schulz_many

    torch.manual_seed(14)
    fulls = [torch.randn(24, 96) for _ in range(3)] + [torch.randn(2, 24, 96)]
    out: dict = {}
    for pdim in (-2, -1):
        locals_ = [_shard(f, pdim, rank, world) for f in fulls]
        for mode in MODES:
            stats: dict = {}
            ys = newton_schulz_many(locals_, tp_group=group, tp_mode=mode, partition_dims=pdim, stack=True,
                                    stats=stats)
            wants = [newton_schulz(x) if mode == "blockwise" else _shard(newton_schulz(f), pdim, rank, world)
                     for f, x in zip(fulls, locals_, strict=True)]
            out[("stacked", pdim, mode)] = {"stacks": stats["stacks"], "diff": max(
                (y - w).abs().max().item() for y, w in zip(ys, wants, strict=True))}
    return out


def _every_set_cases(fulls: list[torch.Tensor], locals_: list[torch.Tensor], rank: int, world: int, group) -> dict:
    """Distributed NS of every coefficient set (5 steps, aol its 4), Gram and standard, against the unsharded one."""
    from nemo_muon.config.optimizer import COEFFICIENT_SETS, REVERSED_PAST_TABLE
    from nemo_muon.optim.ns_iteration import newton_schulz, newton_schulz_many

    out: dict = {}
    for name in COEFFICIENT_SETS:
        steps = min(5, REVERSED_PAST_TABLE.get(name, 5))
        refs = [_shard(newton_schulz(f, steps, name), 1, rank, world) for f in fulls]
        for algorithm in ("gram", "standard"):
            ys = newton_schulz_many(locals_, steps, name, tp_group=group, tp_mode="distributed", partition_dims=1,
                                    algorithm=algorithm)
            out[("set", name, algorithm)] = max((y - r).abs().max().item() for y, r in zip(ys, refs, strict=True))
    return out


def _model_params() -> list[tuple[str, torch.Tensor, int | None]]:
    torch.manual_seed(12)
    return [
        ("layers.0.mlp.linear_fc1.weight", torch.randn(32, 16), 0),  # fused [gate; up], column-parallel
        ("layers.0.mlp.linear_fc2.weight", torch.randn(16, 16), 1),  # row-parallel
        ("layers.0.norm.weight", torch.randn(16), None),
        ("layers.1.mlp.linear_fc1.weight", torch.randn(32, 16), 0),  # stacked with layer 0's (Muon's default)
    ]


def _tp_shard(name: str, full: torch.Tensor, pdim: int | None, rank: int, world: int) -> torch.Tensor:
    """Megatron's shard: a fused [gate; up] is sharded per half, so each rank holds [gate_r; up_r]."""
    if pdim is None:
        return full
    if "linear_fc1" in name:
        return torch.cat([_shard(half, pdim, rank, world) for half in full.chunk(2, dim=0)])
    return _shard(full, pdim, rank, world)


def _grads(step: int) -> list[torch.Tensor]:
    torch.manual_seed(100 + step)
    return [torch.randn(32, 16), torch.randn(16, 16), torch.randn(16), torch.randn(32, 16)]


def _run_optimizer(kind: str, mode: str, rank: int, world: int, group, batch_ns: bool = True) -> list[torch.Tensor]:
    """Three steps of Muon / SOAP on this rank's shards (world 1 and group None: the full reference)."""
    from nemo_muon.optim.muon import Muon
    from nemo_muon.optim.soap import SOAP

    params = []
    named = []
    for name, full, pdim in _model_params():
        p = torch.nn.Parameter(full if group is None else _tp_shard(name, full, pdim, rank, world))
        if pdim is not None:
            p.tensor_model_parallel, p.partition_dim = True, pdim
        params.append((p, pdim))
        named.append((name, p))
    if kind == "muon":
        opt = Muon(named, lr=0.02, weight_decay=0.1, tp_group=group, tp_mode=mode, batch_ns=batch_ns)
    else:
        opt = SOAP(named, lr=0.02, weight_decay=0.1, tp_group=group, precondition_frequency=2)
    for step in range(3):
        for (name, _), (p, pdim), g in zip(named, params, _grads(step), strict=True):
            p.grad = g if group is None else _tp_shard(name, g, pdim, rank, world)
        opt.step()
    return [p.detach().clone() for p, _ in params]


def _optimizer_cases(rank: int, world: int, group) -> dict:
    out = {}
    for kind, mode in [("muon", "duplicated"), ("muon", "distributed"), ("muon", "auto"), ("soap", "-")]:
        ref = _run_optimizer(kind, mode, 0, 1, None, batch_ns=False)  # Muon: batched shards vs per-matrix whole
        got = _run_optimizer(kind, mode, rank, world, group)
        diffs = []
        for (name, _, pdim), r, g in zip(_model_params(), ref, got, strict=True):
            want = _tp_shard(name, r, pdim, rank, world)
            diffs.append((g - want).abs().max().item())
        out[(kind, mode)] = max(diffs)
    return out


def _megatron_cases(rank: int, world: int, group) -> dict:
    """One step of Megatron-Core's TensorParallelMuon on TP shards vs ours, duplicated and distributed modes."""
    from types import SimpleNamespace

    from megatron.core.optimizer.emerging_optimizers import TensorParallelMuon

    from nemo_muon.optim.muon import Muon

    torch.manual_seed(13)
    fulls = {"layers.0.linear_fc2.weight": (torch.randn(16, 48), 1),  # row-parallel
             "layers.0.linear_proj.weight": (torch.randn(48, 16), 0)}  # column-parallel
    grads = {n: torch.randn(t.shape) for n, (t, _) in fulls.items()}
    pgs = SimpleNamespace(tp=group, expt_tp=group, gtp_remat=None, expt_gtp_remat=None)
    out = {}
    for mode in ("duplicated", "distributed"):
        results = []
        for impl in ("megatron", "ours"):
            params = {}
            for n, (t, pdim) in fulls.items():
                p = torch.nn.Parameter(_shard(t, pdim, rank, world).clone())  # a dim-0 shard is a view of t
                p.tensor_model_parallel, p.partition_dim = True, pdim
                p.grad = _shard(grads[n], pdim, rank, world)
                params[n] = p
            if impl == "megatron":
                opt = TensorParallelMuon(list(params.values()), lr=0.02, momentum=0.95, nesterov=True,
                                         weight_decay=0.1, fp32_matmul_prec="highest", pg_collection=pgs,
                                         tp_mode=mode, is_qkv_fn=lambda p: False)
            else:
                opt = Muon(list(params.items()), lr=0.02, weight_decay=0.1, tp_group=group, tp_mode=mode,
                           scale_mode="spectral")  # TensorParallelMuon's default
            opt.step()
            results.append([p.detach().clone() for p in params.values()])
        out[("megatron", mode)] = max((a - b).abs().max().item() for a, b in zip(*results, strict=True))
    return out


def _body(rank: int, world: int, group, with_optimizers: bool) -> dict:
    out = _ns_cases(rank, world, group)
    if with_optimizers:
        out.update(_optimizer_cases(rank, world, group))
        out.update(_megatron_cases(rank, world, group))
    return out


@functools.cache
def _results(world: int) -> list[dict]:
    return run_distributed(_body, world_size=world, args=(world == 2,), timeout_s=150)


@pytest.mark.parametrize("world", [2, 4])
def test_tp_modes_match_unsharded(world: int) -> None:
    for res in _results(world):
        for (label, pdim, mode), entry in ((k, v) for k, v in res.items() if k[0] in SHAPES):
            case = f"{label} pdim={pdim} {mode} (ran as {entry['mode']})"
            if mode == "duplicated":
                assert entry["diff"] <= 1e-5, case
            elif mode in ("distributed", "auto"):
                assert entry["diff"] <= 1e-4, case
            else:  # blockwise: the shard alone, which is not the full result
                assert entry["own"] == 0.0, case
                assert entry["diff"] > 1e-2, case


@pytest.mark.parametrize("world", [2, 4])
def test_stacked_shards_run_as_one_program_in_every_mode(world: int) -> None:
    from tests.tolerances import GRAM_TOL

    for res in _results(world):
        cases = {k[1:]: v for k, v in res.items() if k[0] == "stacked"}
        assert len(cases) == 2 * len(MODES)
        for case, entry in cases.items():
            assert entry["stacks"] == 1, case
            assert entry["diff"] <= GRAM_TOL, case  # a batched GEMM's reordering (tests/tolerances.py)


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_runs_distributed_only_on_the_long_side(world: int) -> None:
    res = _results(world)[0]
    assert res[("wide", 1, "distributed")]["mode"] == "distributed"  # cols are the long side
    assert res[("tall", 0, "distributed")]["mode"] == "distributed"
    assert res[("stack", 2, "distributed")]["mode"] == "distributed"
    assert res[("wide", 0, "distributed")]["mode"] == "duplicated"  # short side: logged fallback
    assert res[("tall", 1, "distributed")]["mode"] == "duplicated"


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_collectives_are_fused_per_round(world: int) -> None:
    res = _results(world)[0]
    # 6 matrices: Gram NS = 2 rounds (norm, Gram), standard = 1 + 5 steps; one bucket per round, not one per matrix
    assert res[("fused", "gram")]["calls"] == 2
    assert res[("fused", "standard")]["calls"] == 6
    assert res[("fused", "gram")]["diff"] <= 1e-4 and res[("fused", "standard")]["diff"] <= 1e-4
    assert 2 < res[("fused", "small_buckets")]["calls"] < 12  # bucket size honoured, still fused
    assert res[("gather", "duplicated")]["calls"] == 1


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_ns_of_every_coefficient_set_matches_unsharded(world: int) -> None:
    from nemo_muon.config.optimizer import COEFFICIENT_SETS

    for res in _results(world):
        diffs = {k[1:]: v for k, v in res.items() if k[0] == "set"}
        assert {name for name, _ in diffs} == set(COEFFICIENT_SETS)
        assert max(diffs.values()) <= 1e-4, diffs


def test_muon_and_soap_on_tp_shards_match_single_process() -> None:
    for res in _results(2):
        assert res[("muon", "duplicated")] <= 1e-6
        assert res[("muon", "distributed")] <= 1e-5
        assert res[("muon", "auto")] <= 1e-5
        assert res[("soap", "-")] <= 1e-5


def test_tp_muon_matches_megatron_tensor_parallel_muon() -> None:
    """Megatron-Core 0.19.2's own TensorParallelMuon at TP=2 (gloo, duck-typed pg_collection), one step."""
    for res in _results(2):
        assert res[("megatron", "duplicated")] <= 1e-5
        assert res[("megatron", "distributed")] <= 1e-5
