"""Checkpoints of the layer-wise optimizer: bitwise resume, resume at another DP size, clear errors, killed saves."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.layerwise.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_dir,
)
from nemo_muon.layerwise.optimizer import LayerWiseDistributedOptimizer
from tests.distributed import run_distributed
from tests.test_layerwise_optimizer import make_model, params_of, portable, tensors, train

CFG = MuonConfig(lr=2e-2, weight_decay=0.1)
BUCKET_MB = 0.002


def _opt(model: nn.Module, group: Any) -> LayerWiseDistributedOptimizer:
    return LayerWiseDistributedOptimizer(model, CFG, dp_group=group, bucket_size_mb=BUCKET_MB)


def _resume_body(rank: int, world: int, group: Any, root: str, root_from_dp1: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = make_model()
    opt = _opt(model, group)
    train(model, opt, 4, rank, world)
    out["uninterrupted"] = params_of(model)

    model = make_model()
    opt = _opt(model, group)
    train(model, opt, 2, rank, world)
    save_checkpoint(root, 2, model, opt, {"step": 2, "note": "hello"}, group)
    model = make_model(seed=123)  # a fresh process: other init, fresh optimizer
    opt = _opt(model, group)
    extra = load_checkpoint(step_dir(root, 2), model, opt, group)
    train(model, opt, 2, rank, world, start=2)
    out["resumed"] = params_of(model)
    out["extra"] = extra
    try:
        save_checkpoint(root, 2, model, opt, {}, group)
    except FileExistsError as e:
        out["overwrite_error"] = str(e)

    model = make_model(seed=7)
    opt = _opt(model, group)
    load_checkpoint(step_dir(root_from_dp1, 2), model, opt, group)  # saved by a single process
    train(model, opt, 2, rank, world, start=2)
    out["from_dp1"] = params_of(model)

    # a recorded optimizer-state checksum that only rank 1 (the owner) can check: both ranks must refuse
    bad = Path(root) / "tampered" / "step_00000002"
    name = next(n for n, r in opt.plans[0].owners.items() if r == 1)
    if rank == 0:
        shutil.copytree(step_dir(root, 2), bad)
        manifest = json.loads((bad / "manifest.json").read_text())
        manifest["optimizer_state"][name]["momentum_buffer"] = "0" * 64
        (bad / "manifest.json").write_text(json.dumps(manifest))
    dist.barrier(group=group)
    try:
        load_checkpoint(bad, model, opt, group)
    except CheckpointError as e:
        out["tampered"] = (name, str(e))

    # a corrupt shard that only rank 1 reads: both ranks refuse (none is left waiting in a collective), and no
    # rank has changed its weights
    corrupt = Path(root) / "corrupt_shard" / "step_00000002"
    if rank == 0:
        shutil.copytree(step_dir(root, 2), corrupt)
        data = bytearray((corrupt / "optim_rank1.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (corrupt / "optim_rank1.pt").write_bytes(bytes(data))
    dist.barrier(group=group)
    before = params_of(model)
    try:
        load_checkpoint(corrupt, model, opt, group)
    except CheckpointError as e:
        out["corrupt_shard"] = (str(e), all(torch.equal(p, before[n]) for n, p in model.named_parameters()))
    return portable(out)


def test_resume_same_dp_bitwise_and_across_dp_sizes(tmp_path: Path) -> None:
    """DP=2 save/resume is bitwise identical to an uninterrupted DP=2 run; a DP=2 checkpoint resumed by one process
    (2 accumulated micro-batches: the same sums) and a single-process checkpoint resumed at DP=2 match it too."""
    root, root1 = tmp_path / "dp2", tmp_path / "dp1"
    model = make_model()
    opt = _opt(model, None)
    train(model, opt, 2, micro=2)
    save_checkpoint(root1, 2, model, opt, {"step": 2})

    res = tensors(run_distributed(_resume_body, world_size=2, args=(str(root), str(root1)), timeout_s=150))
    want = res[0]["uninterrupted"]
    for r in res:
        assert all(torch.equal(r["resumed"][n], want[n]) for n in want)
        assert all(torch.equal(r["from_dp1"][n], want[n]) for n in want)
        assert r["extra"] == {"step": 2, "note": "hello"}
        assert "already exists" in r["overwrite_error"]
    name, err = res[1]["tampered"]
    assert f"optimizer state {name}" in err and "on this rank" in err
    assert "failed verification after load on another rank" in res[0]["tampered"][1]
    assert "optim_rank1.pt is corrupt" in res[1]["corrupt_shard"][0]
    assert "reading an optimizer shard failed on another rank" in res[0]["corrupt_shard"][0]
    assert res[0]["corrupt_shard"][1] and res[1]["corrupt_shard"][1]

    model = make_model(seed=5)
    opt = _opt(model, None)
    assert load_checkpoint(latest_checkpoint(root), model, opt) == {"step": 2, "note": "hello"}
    train(model, opt, 2, start=2, micro=2)
    got = params_of(model)
    assert all(torch.equal(got[n], want[n]) for n in want)  # DP 2 -> 1


def _fresh(root: Path) -> tuple[nn.Module, LayerWiseDistributedOptimizer, Path]:
    model = make_model()
    opt = _opt(model, None)
    train(model, opt, 1)
    return model, opt, save_checkpoint(root, 1, model, opt, {"step": 1})


def test_corrupt_missing_and_foreign_checkpoints_raise_clear_errors(tmp_path: Path) -> None:
    model, opt, ckpt = _fresh(tmp_path / "a")

    def load_copy(name: str, damage: Any) -> None:
        bad = tmp_path / name / ckpt.name
        shutil.copytree(ckpt, bad)
        damage(bad)
        load_checkpoint(bad, make_model(), _opt(make_model(), None))

    def flip_byte(d: Path) -> None:
        data = bytearray((d / "optim_rank0.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (d / "optim_rank0.pt").write_bytes(bytes(data))

    with pytest.raises(CheckpointError, match=r"optim_rank0.pt is corrupt"):
        load_copy("tampered", flip_byte)
    with pytest.raises(CheckpointError, match=r"model.pt is corrupt"):
        load_copy("truncated", lambda d: os.truncate(d / "model.pt", 100))
    with pytest.raises(CheckpointError, match=r"missing optim_rank0.pt"):
        load_copy("missing", lambda d: (d / "optim_rank0.pt").unlink())
    with pytest.raises(CheckpointError, match=r"not a complete checkpoint"):
        load_copy("no_manifest", lambda d: (d / "manifest.json").unlink())

    def edit_manifest(d: Path) -> None:  # consistent files, but the recorded param checksum disagrees
        m = json.loads((d / "manifest.json").read_text())
        m["params"]["proj.weight"]["sha256"] = "0" * 64
        (d / "manifest.json").write_text(json.dumps(m))

    with pytest.raises(CheckpointError, match=r"failed verification after load.*param proj.weight"):
        load_copy("mismatch", edit_manifest)

    with pytest.raises(ValueError, match="group must be the optimizer's dp_group"):
        save_checkpoint(tmp_path / "b", 1, model, opt, {}, group=object())  # type: ignore[arg-type]
    other = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(CheckpointError, match=r"another model.*only in the model \['0.bias', '0.weight'\]"):
        load_checkpoint(ckpt, other, LayerWiseDistributedOptimizer(other, CFG, dp_group=None))
    resized = make_model()
    resized.proj = nn.Linear(48, 8, bias=False)
    with pytest.raises(CheckpointError, match=r"shape differences \['proj.weight: saved \[16, 48\], model \[8, 48\]'\]"):
        load_checkpoint(ckpt, resized, _opt(resized, None))
    half = make_model(torch.bfloat16)  # an fp32 checkpoint is never cast down silently
    with pytest.raises(CheckpointError, match=r"dtype differences \['attn.weight: saved torch.float32, model "
                                              r"torch.bfloat16'"):
        load_checkpoint(ckpt, half, _opt(half, None))
    with pytest.raises(FileExistsError, match="never overwritten"):
        save_checkpoint(tmp_path / "a", 1, model, opt, {})


def _killed_save_body(rank: int, world: int, group: Any, root: str) -> None:
    model = make_model()
    opt = _opt(model, group)
    train(model, opt, 1)
    save_checkpoint(root, 1, model, opt, {"step": 1}, group)
    train(model, opt, 1, start=1)
    save_checkpoint(root, 2, model, opt, {"step": 2}, group, _after_shard=lambda r: os._exit(1))


def test_save_killed_midway_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="died with exit code 1"):
        run_distributed(_killed_save_body, world_size=1, args=(str(tmp_path),), timeout_s=60)
    assert (tmp_path / ".tmp_step_00000002" / "optim_rank0.pt").is_file()  # the killed save got that far
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 1)
    model = make_model(seed=3)
    opt = _opt(model, None)
    assert load_checkpoint(latest_checkpoint(tmp_path), model, opt) == {"step": 1}
    train(model, opt, 1, start=1)
    save_checkpoint(tmp_path, 2, model, opt, {"step": 2})  # the stale temp dir is replaced
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 2)
    assert not (tmp_path / ".tmp_step_00000002").exists()
