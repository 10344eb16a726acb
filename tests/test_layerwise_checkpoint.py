"""Checkpoints of the layer-wise optimizer: bitwise resume, resume at another DP size, clear errors, killed saves."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.layerwise.checkpoint import (
    FORMAT,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_dir,
)
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer
from tests.distributed import run_distributed
from tests.test_layerwise_optimizer import make_model, params_of, portable, tensors, train

CFG = MuonConfig(lr=2e-2, weight_decay=0.1)
BUCKET_MB = 0.002


def _opt(model: nn.Module, group: Any) -> WholeTensorOptimizer:
    return WholeTensorOptimizer(model, CFG, dp_group=group, bucket_size_mb=BUCKET_MB)


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
    # every rank refuses with the same message, naming the rank that found the problem (rank 0 prints it)
    assert f"failed verification after load: {{'rank 1': ['optimizer state {name}']}}" in err
    assert res[0]["tampered"] == res[1]["tampered"]
    assert "optim_rank1.pt is corrupt" in res[1]["corrupt_shard"][0]
    assert res[0]["corrupt_shard"][0] == res[1]["corrupt_shard"][0]
    assert res[0]["corrupt_shard"][1] and res[1]["corrupt_shard"][1]

    model = make_model(seed=5)
    opt = _opt(model, None)
    assert load_checkpoint(latest_checkpoint(root), model, opt) == {"step": 2, "note": "hello"}
    train(model, opt, 2, start=2, micro=2)
    got = params_of(model)
    assert all(torch.equal(got[n], want[n]) for n in want)  # DP 2 -> 1


def _fresh(root: Path) -> tuple[nn.Module, WholeTensorOptimizer, Path]:
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
        load_checkpoint(ckpt, other, WholeTensorOptimizer(other, CFG, dp_group=None))
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


def test_a_save_never_writes_through_links_planted_in_the_checkpoint_root(tmp_path: Path) -> None:
    """A link at the temporary folder is removed (never what it points to); one at the final name is refused."""
    model, opt, _ = _fresh(tmp_path)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    (tmp_path / ".tmp_step_00000002").symlink_to(elsewhere)
    save_checkpoint(tmp_path, 2, model, opt, {"step": 2})
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"] and step_dir(tmp_path, 2).is_dir()
    step_dir(tmp_path, 3).symlink_to(tmp_path / "nowhere")  # dangling: .exists() is False
    with pytest.raises(FileExistsError, match="never overwritten"):
        save_checkpoint(tmp_path, 3, model, opt, {"step": 3})
    assert not (tmp_path / "nowhere").exists()


class _Payload:
    """What a hostile checkpoint carries: unpickling it runs code (here: os.mkdir of a marker folder)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def _plant(ckpt: Path, name: str, marker: Path) -> None:
    """Add a payload to checkpoint file ``name`` and rewrite its SHA-256 in the manifest (which anyone who can
    write the files can do), so only the loader stands between the payload and its execution."""
    obj = torch.load(ckpt / name, weights_only=True)
    torch.save({**obj, "payload": _Payload(marker)}, ckpt / name)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256((ckpt / name).read_bytes()).hexdigest()
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["extra.pt", "model.pt", "optim_rank0.pt"])
def test_a_planted_payload_is_refused_without_running(tmp_path: Path, name: str) -> None:
    live, never = tmp_path / "live_marker", tmp_path / "never_marker"
    torch.save({"payload": _Payload(live)}, tmp_path / "control.pt")
    torch.load(tmp_path / "control.pt", weights_only=False)  # the control: an unchecked load runs the payload
    assert live.is_dir()
    _, _, ckpt = _fresh(tmp_path / "root")
    _plant(ckpt, name, never)
    model = make_model(seed=9)
    before = params_of(model)
    with pytest.raises(CheckpointError, match=rf"{re.escape(name)} holds more than tensors and plain containers "
                                              r"\(it refers to \S*mkdir\): refused without unpickling it"):
        load_checkpoint(ckpt, model, _opt(model, None))
    assert not never.exists()  # the payload never ran
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing was loaded


def test_save_refuses_an_extra_that_needs_code_to_load(tmp_path: Path) -> None:
    model, opt, _ = _fresh(tmp_path)
    for extra, where in (({"step": 2, "sched": {"scale": np.float64(1.0)}}, r"extra\['sched'\]\['scale'\] is a "
                                                                            r"numpy.float64"),
                         ({"rng": [torch.get_rng_state(), _Payload(tmp_path / "x")]}, r"extra\['rng'\]\[1\] is a "),
                         ({(1, 2): 3}, r"extra has a key of type tuple")):
        with pytest.raises(TypeError, match=r"extra must hold plain data only .*weights_only=True; got: " + where):
            save_checkpoint(tmp_path, 2, model, opt, extra)
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 1) and not step_dir(tmp_path, 2).exists()
    save_checkpoint(tmp_path, 2, model, opt, {"rng": torch.get_rng_state(), "betas": (0.9, 0.95), "name": None})
    assert load_checkpoint(step_dir(tmp_path, 2), model, opt)["betas"] == (0.9, 0.95)


def _empty(mf: Path) -> None:
    mf.write_text("")


def _truncated(mf: Path) -> None:
    mf.write_text(mf.read_text()[:60])


@pytest.mark.parametrize(("damage", "message"), [
    (Path.unlink, "manifest.json is missing"),
    (_empty, "manifest.json is empty"),
    (_truncated, "manifest.json is not valid JSON"),
    (lambda mf: mf.write_text("[1, 2]"), "manifest.json must hold a JSON object; got list"),
    (lambda mf: mf.write_text(json.dumps({"format": FORMAT})), r"manifest.json lacks or mangles \['step \(int"),
    # hostile manifests (issue 35): a RecursionError and an integer-conversion ValueError before
    (lambda mf: mf.write_text("[" * 100_000 + "]" * 100_000), "manifest.json is not valid JSON .*nested at most 100"),
    (lambda mf: mf.write_text(mf.read_text().replace('"step": 2', '"step": ' + "9" * 5000)),
     "manifest.json is not valid JSON .*integers of at most 40 digits"),
    (lambda mf: (mf.unlink(), os.mkfifo(mf)), "manifest.json must be a regular file; got .*, a FIFO"),
])
def test_a_damaged_manifest_is_refused_never_skipped(tmp_path: Path, damage: Any, message: str) -> None:
    model, opt, _ = _fresh(tmp_path)
    train(model, opt, 1, start=1)
    newest = save_checkpoint(tmp_path, 2, model, opt, {"step": 2})
    damage(newest / "manifest.json")
    assert latest_checkpoint(tmp_path) == newest  # not passed over for step 1 (which would crash at its next save)
    fresh = make_model()
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(newest))}.*{message}.*move the folder "
                                              rf"{re.escape(str(newest))} aside"):
        load_checkpoint(latest_checkpoint(tmp_path), fresh, _opt(fresh, None))
