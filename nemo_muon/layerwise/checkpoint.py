"""DP-size-independent, verified checkpoints of a model trained with the layer-wise distributed optimizer.

Layout of ``<root>/step_<step:08d>/``: ``model.pt`` (every parameter by name, written by rank 0: params are
identical on all DP ranks), ``optim_rank<r>.pt`` (rank r's optimizer shard, keyed by parameter name), ``extra.pt``
(the caller's dict, from rank 0) and ``manifest.json`` (shapes, dtypes, SHA-256 of every file, of every parameter
and of every optimizer-state tensor, which shard holds which name). Rules:

- Atomic: everything is written into ``<root>/.tmp_step_<step>`` and the directory is renamed once complete; a save
  killed midway leaves only that temp directory (ignored by ``latest_checkpoint``, removed by the next save).
- Never overwrites: saving a step whose directory exists raises ``FileExistsError``.
- Any DP size: a load reads the shards holding the names this rank owns now, whatever DP size wrote them.
- Verified: file hashes are checked before unpickling (truncated / tampered / missing files give a clear error);
  after the load every rank hashes its params and its optimizer state and compares with the manifest; the
  mismatch count is all-reduced so every rank raises together. Never trains on wrong weights silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon._validation import check_positive_int
from nemo_muon.layerwise.optimizer import LayerWiseDistributedOptimizer

FORMAT = "nemo_muon.layerwise.checkpoint/1"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded as it is (incomplete, corrupt, from another model, failed checks)."""


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """The directory of checkpoint ``step`` under ``root``."""
    return Path(root) / f"step_{step:08d}"


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint (has a manifest) with the highest step under ``root``, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), d) for d in root.iterdir()
             if (m := _STEP_DIR.match(d.name)) and (d / "manifest.json").is_file()]
    return max(steps)[1] if steps else None


def tensor_sha256(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (any dtype), with its dtype and shape."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _value_digest(v: Any) -> str:
    return tensor_sha256(v) if torch.is_tensor(v) else repr(v)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _save_file(obj: Any, path: Path) -> str:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return _file_sha256(path)


def _state_digests(shard: dict[str, Any]) -> dict[str, dict[str, str]]:
    out = {n: {k: _value_digest(v) for k, v in st.items()} for n, st in shard["state"].items()}
    for n, m in shard["masters"].items():
        out.setdefault(n, {})["<master>"] = tensor_sha256(m)
    return out


def _rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    return (0, 1) if group is None else (dist.get_rank(group), dist.get_world_size(group))


def _gather_objects(obj: Any, group: dist.ProcessGroup | None) -> list[Any]:
    if group is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _barrier(group: dist.ProcessGroup | None) -> None:
    if group is not None:
        dist.barrier(group=group)


def _require_dense(optimizer: LayerWiseDistributedOptimizer, group: dist.ProcessGroup | None) -> None:
    if group is not optimizer.dp_group:
        raise ValueError(f"group must be the optimizer's dp_group ({optimizer.dp_group!r}); got {group!r} (every rank "
                         "of the data-parallel group takes part in a save or load)")
    if optimizer.expert_dp_group is not None:
        raise NotImplementedError("checkpoints of a layer-wise optimizer with an expert_dp_group (expert "
                                  "parallelism) are not supported yet: model.pt would hold only rank 0's experts")


def save_checkpoint(root: str | os.PathLike[str], step: int, model: torch.nn.Module,
                    optimizer: LayerWiseDistributedOptimizer, extra: dict[str, Any] | None = None,
                    group: dist.ProcessGroup | None = None, *, _after_shard: Any = None) -> Path:
    """Write checkpoint ``step`` under ``root`` (all ranks of ``group`` call it); return its directory.

    ``extra`` (any picklable dict: scheduler, data position, RNG) is taken from rank 0 and returned by the load.
    ``_after_shard`` is a test hook called after this rank's shard is on disk (to kill a save midway).
    """
    check_positive_int("step", step, minimum=0)
    _require_dense(optimizer, group)
    rank, world = _rank_world(group)
    root = Path(root)
    final, tmp = step_dir(root, step), root / f".tmp_step_{step:08d}"
    exists = final.exists()
    if _gather_objects(exists, group)[0]:
        raise FileExistsError(f"checkpoint {final} already exists; checkpoints are never overwritten "
                              "(choose another step or root, or delete it yourself)")
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a save that was killed midway
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier(group)
    optimizer.finish_param_gather()
    shard = optimizer.state_dict()
    shard_name = f"optim_rank{rank}.pt"
    info = {"file": shard_name, "sha256": _save_file(shard, tmp / shard_name), "owned": shard["owned"],
            "state": _state_digests(shard)}
    if _after_shard is not None:
        _after_shard(rank)
    infos = _gather_objects(info, group)
    if rank == 0:
        params = {n: p.detach().cpu() for n, p in model.named_parameters()}
        files = {"model.pt": _save_file(params, tmp / "model.pt"),
                 "extra.pt": _save_file(dict(extra or {}), tmp / "extra.pt")}
        files.update({i["file"]: i["sha256"] for i in infos})
        manifest = {
            "format": FORMAT, "step": step, "dp_size": world, "files": files,
            "params": {n: {"shape": list(p.shape), "dtype": str(p.dtype), "sha256": tensor_sha256(p)}
                       for n, p in params.items()},
            "shards": {i["file"]: i["owned"] for i in infos},
            "optimizer_state": {n: d for i in infos for n, d in i["state"].items()},
        }
        with open(tmp / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        dir_fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    _barrier(group)
    return final


def _read_manifest(path: Path) -> dict[str, Any]:
    mf = path / "manifest.json"
    if not mf.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no manifest.json); use latest_checkpoint(root)")
    manifest = json.loads(mf.read_text())
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mf}: format must be {FORMAT!r}; got {manifest.get('format')!r}")
    return manifest


def _load_verified(path: Path, name: str, manifest: dict[str, Any]) -> Any:
    f = path / name
    if not f.is_file():
        raise CheckpointError(f"checkpoint {path} is missing {name} (saved at DP size {manifest['dp_size']} with "
                              f"files {sorted(manifest['files'])})")
    if _file_sha256(f) != manifest["files"][name]:
        raise CheckpointError(f"checkpoint file {f} is corrupt: its SHA-256 differs from the manifest "
                              "(truncated or modified after the save)")
    return torch.load(f, map_location="cpu", weights_only=False)


def _check_same_model(model: torch.nn.Module, manifest: dict[str, Any], path: Path) -> None:
    mine = {n: list(p.shape) for n, p in model.named_parameters()}
    saved = {n: v["shape"] for n, v in manifest["params"].items()}
    missing, unexpected = sorted(set(saved) - set(mine)), sorted(set(mine) - set(saved))
    shapes = sorted(f"{n}: saved {saved[n]}, model {mine[n]}" for n in set(mine) & set(saved) if mine[n] != saved[n])
    dtypes = {n: str(p.dtype) for n, p in model.named_parameters()}
    casts = sorted(f"{n}: saved {manifest['params'][n]['dtype']}, model {dtypes[n]}" for n in set(mine) & set(saved)
                   if dtypes[n] != manifest["params"][n]["dtype"])
    if missing or unexpected or shapes or casts:
        raise CheckpointError(f"checkpoint {path} is from another model: params only in the checkpoint "
                              f"{missing[:10]}, only in the model {unexpected[:10]}, shape differences {shapes[:10]}, "
                              f"dtype differences {casts[:10]} (a load never casts)")


def load_checkpoint(path: str | os.PathLike[str], model: torch.nn.Module, optimizer: LayerWiseDistributedOptimizer,
                    group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Load checkpoint directory ``path`` (any DP size) into ``model`` and ``optimizer``; verify; return ``extra``."""
    _require_dense(optimizer, group)
    path = Path(path)
    manifest = _read_manifest(path)
    _check_same_model(model, manifest, path)
    optimizer.finish_param_gather()  # an in-flight gather must not overwrite the loaded weights (Megatron-LM #6920)
    params = _load_verified(path, "model.pt", manifest)
    extra = _load_verified(path, "extra.pt", manifest)
    error: CheckpointError | None = None
    try:  # each rank reads only the shards it needs, so a bad shard may fail on some ranks only
        merged = _read_shards(path, manifest, set(optimizer.owned_names))
    except CheckpointError as e:
        error = e
    # every rank refuses together (none is left waiting in a collective)
    if _max_over_ranks(float(error is not None), group, optimizer.comm_device) > 0:
        raise error or CheckpointError(f"checkpoint {path}: reading an optimizer shard failed on another rank; "
                                       "not loading")
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
    if merged:
        optimizer.load_state_dict(merged)
    bad = _verify(model, optimizer, manifest)
    if _max_over_ranks(float(len(bad)), group, optimizer.comm_device) > 0:
        raise CheckpointError(f"checkpoint {path} failed verification after load on "
                              f"{'this rank' if bad else 'another rank'}: {bad[:10]}; not training on wrong weights")
    return extra


def _read_shards(path: Path, manifest: dict[str, Any], mine: set[str]) -> dict[str, Any]:
    """The optimizer state of the names in ``mine``, merged from the shards that hold them (verified files)."""
    merged: dict[str, Any] = {}
    for shard_file, owned in sorted(manifest["shards"].items()):
        if mine & set(owned):
            shard = _load_verified(path, shard_file, manifest)
            if not merged:
                merged = {**shard, "state": {}, "masters": {}}
            merged["state"].update({n: v for n, v in shard["state"].items() if n in mine})
            merged["masters"].update({n: v for n, v in shard["masters"].items() if n in mine})
    if mine and not merged:
        raise CheckpointError(f"checkpoint {path} has no optimizer state for {sorted(mine)[:10]}")
    return merged


def _max_over_ranks(value: float, group: dist.ProcessGroup | None, device: torch.device) -> float:
    t = torch.tensor([value], device=device)  # on the params' device: an NCCL group takes no CPU tensors
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def _verify(model: torch.nn.Module, optimizer: LayerWiseDistributedOptimizer, manifest: dict[str, Any]) -> list[str]:
    """Names whose loaded param or optimizer state differs from the manifest (dtypes equal: _check_same_model)."""
    bad = []
    for n, p in model.named_parameters():
        saved = manifest["params"][n]
        if tensor_sha256(p) != saved["sha256"]:
            bad.append(f"param {n}")
    want = manifest["optimizer_state"]
    got = _state_digests(optimizer.state_dict())
    for n in optimizer.owned_names:
        w, g = want.get(n, {}), got.get(n, {})
        if "<master>" not in w:
            g.pop("<master>", None)
        if w != g:
            bad.append(f"optimizer state {n}")
    return bad
