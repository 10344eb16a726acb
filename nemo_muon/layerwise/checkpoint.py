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
  findings are gathered so every rank raises together, with the same message. Never trains on wrong weights
  silently.
- Data only: every file holds tensors and plain containers (dict, list, tuple, str, numbers, None), checked when
  saving, and is read with ``torch.load(..., weights_only=True)``, so a file that would run code when unpickled
  is refused without running it. The SHA-256 values detect accidents (truncation, bit flips, mixed folders), not
  tampering: whoever can write the files can rewrite the manifest too. A checkpoint is trusted for its numbers
  only, never for code.
- Never skipped: ``latest_checkpoint`` returns the newest ``step_*`` folder whether or not it is intact (a save
  creates that name only once complete); a missing, empty or unreadable ``manifest.json`` is refused with the
  folder named, never passed over for an older checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon._validation import check_positive_int, shown
from nemo_muon.config.files import load_json, read_text
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer

FORMAT = "nemo_muon.layerwise.checkpoint/1"
MAX_MANIFEST_BYTES = 1 << 30
"""Largest manifest.json read (a digest per parameter and per state tensor: MBs for the largest models)."""
_STEP_DIR = re.compile(r"step_([0-9]{8,20})\Z", re.ASCII)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded as it is (incomplete, corrupt, from another model, failed checks)."""


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """The directory of checkpoint ``step`` under ``root``."""
    return Path(root) / f"step_{step:08d}"


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The ``step_*`` folder with the highest step under ``root``, or None (``.tmp_step_*`` of killed saves are
    ignored). It is returned even without a valid manifest: a save names a folder ``step_*`` only once it is
    complete, so such a folder is damaged and `load_checkpoint` refuses it; it is never skipped for an older one."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), d) for d in root.iterdir() if (m := _STEP_DIR.match(d.name)) and d.is_dir()]
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


_PLAIN_LEAVES: tuple[type, ...] = (type(None), bool, int, float, str, bytes, torch.Tensor, torch.nn.Parameter)
_PLAIN_CONTAINERS: tuple[type, ...] = (dict, OrderedDict, list, tuple)


def plain_data_problem(obj: Any, where: str = "extra") -> str | None:
    """Why ``obj`` is not plain data that ``torch.load(weights_only=True)`` reads back, or None when it is.

    Plain data: tensors, None, bool, int, float, str, bytes, and dict / list / tuple of plain data (exact types:
    a numpy scalar or a namedtuple is not plain, it would need code to load).
    """
    kind = type(obj)
    if kind in _PLAIN_LEAVES:
        return None
    if kind not in _PLAIN_CONTAINERS:
        return f"{where} is a {kind.__module__}.{kind.__qualname__}"
    if kind in (dict, OrderedDict):
        for k, v in obj.items():
            if type(k) not in (str, int):
                return f"{where} has a key of type {type(k).__qualname__} ({shown(k)})"
            if (problem := plain_data_problem(v, f"{where}[{shown(k)}]")) is not None:
                return problem
        return None
    for i, v in enumerate(obj):
        if (problem := plain_data_problem(v, f"{where}[{i}]")) is not None:
            return problem
    return None


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


def _require_dense(optimizer: WholeTensorOptimizer, group: dist.ProcessGroup | None) -> None:
    if group is not optimizer.dp_group:
        raise ValueError(f"group must be the optimizer's dp_group ({optimizer.dp_group!r}); got {group!r} (every rank "
                         "of the data-parallel group takes part in a save or load)")
    if optimizer.expert_dp_group is not None:
        raise NotImplementedError("checkpoints of a layer-wise optimizer with an expert_dp_group (expert "
                                  "parallelism) are not supported yet: model.pt would hold only rank 0's experts")


def save_checkpoint(root: str | os.PathLike[str], step: int, model: torch.nn.Module,
                    optimizer: WholeTensorOptimizer, extra: dict[str, Any] | None = None,
                    group: dist.ProcessGroup | None = None, *, _after_shard: Any = None) -> Path:
    """Write checkpoint ``step`` under ``root`` (all ranks of ``group`` call it); return its directory.

    ``extra`` (plain data only: tensors, numbers, str, None and dict / list / tuple of them, see
    `plain_data_problem`; e.g. scheduler, data position, RNG) is taken from rank 0 and returned by the load.
    ``_after_shard`` is a test hook called after this rank's shard is on disk (to kill a save midway).
    """
    check_positive_int("step", step, minimum=0)
    _require_dense(optimizer, group)
    rank, world = _rank_world(group)
    root = Path(root)
    final, tmp = step_dir(root, step), root / f".tmp_step_{step:08d}"
    optimizer.finish_param_gather()
    shard = optimizer.state_dict()
    checks = _gather_objects((final.exists() or final.is_symlink(), plain_data_problem(dict(extra or {})),
                              plain_data_problem(shard, f"optimizer state of rank {rank}")), group)
    exists, problem = checks[0][0], checks[0][1]  # rank 0's extra is the one written; every rank raises together
    if problem is not None:
        raise TypeError(f"extra must hold plain data only (tensors, numbers, str, None, dict / list / tuple), so "
                        f"that the load reads it with weights_only=True; got: {problem}")
    if shard_problems := [c[2] for c in checks if c[2] is not None]:
        raise TypeError(f"the optimizer state must be plain data so that the load reads it with weights_only=True; "
                        f"got: {shard_problems[0]}")
    if exists:
        raise FileExistsError(f"checkpoint {final} already exists; checkpoints are never overwritten "
                              "(choose another step or root, or delete it yourself)")
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.is_symlink():  # planted: the link goes, never what it points to
            tmp.unlink()
        elif tmp.exists():  # left by a save that was killed midway
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier(group)
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


_MANIFEST_KEYS: dict[str, type] = {"format": str, "step": int, "dp_size": int, "files": dict, "params": dict,
                                   "shards": dict, "optimizer_state": dict}


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint folder ``path``; a missing, empty, truncated or malformed one is refused."""
    mf = path / "manifest.json"
    fix = (f"move the folder {path} aside (resume then starts from the previous checkpoint) or restore its "
           "manifest.json")
    if not (mf.exists() or mf.is_symlink()):
        raise CheckpointError(f"{path} is not a complete checkpoint: manifest.json is missing (a save writes it "
                              f"before the folder gets its step_* name, so the folder was damaged); {fix}")
    try:  # a bounded regular file (a FIFO or a device is refused by kind)
        text = read_text(mf, max_bytes=MAX_MANIFEST_BYTES, what=mf.name)
    except ValueError as e:
        raise CheckpointError(f"{path} is not a complete checkpoint: {e}; {fix}") from None
    if not text:
        raise CheckpointError(f"{path} is not a complete checkpoint: {mf.name} is empty; {fix}")
    try:  # JSON nested too deeply or holding a 5000-digit number is one error, never a RecursionError
        manifest = load_json(text, what="its text")
    except ValueError as e:
        raise CheckpointError(f"{path} is not a complete checkpoint: {mf.name} is not valid JSON ({e}); {fix}") \
            from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: manifest.json must hold a JSON object; got {type(manifest).__name__}; {fix}")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mf}: format must be {FORMAT!r}; got {shown(manifest.get('format'))}; {fix}")
    bad = [f"{k} ({kind.__name__} expected)" for k, kind in _MANIFEST_KEYS.items()
           if not isinstance(manifest.get(k), kind)]
    if bad:
        raise CheckpointError(f"{path}: manifest.json lacks or mangles {bad}; {fix}")
    if problem := _manifest_entry_problem(manifest):
        raise CheckpointError(f"{mf}: {problem}; {fix}")
    return manifest


def _manifest_entry_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with an entry of the manifest's tables, or None (the loader indexes them without checks)."""
    def is_file_name(name: Any) -> bool:  # a file of this folder: no path
        return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name

    for name, digest in manifest["files"].items():
        if not is_file_name(name) or not isinstance(digest, str):
            return f"files.{_brief(name)[:80]} must map a file name to its SHA-256 hex string; got {shown(digest)}"
    for name, entry in manifest["params"].items():
        ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and isinstance(entry.get("sha256"), str)
              and isinstance(entry.get("shape"), list)
              and all(type(d) is int and d >= 0 for d in entry["shape"]))
        if not ok:
            return (f"params.{_brief(name)[:80]} must be {{'shape': [non-negative integers], 'dtype': str, 'sha256': str}}; "
                    f"got {shown(entry)}")
    for name, owned in manifest["shards"].items():
        if not is_file_name(name) or not isinstance(owned, list) or not all(isinstance(n, str) for n in owned):
            return f"shards.{_brief(name)[:80]} must map a shard file name to a list of parameter names; got {shown(owned)}"
    for name, digests in manifest["optimizer_state"].items():
        if not isinstance(digests, dict):
            return f"optimizer_state.{_brief(name)[:80]} must be an object of state names to digests; got {shown(digests)}"
    return None


def _load_verified(path: Path, name: str, manifest: dict[str, Any]) -> Any:
    f = path / name
    if not f.is_file():
        raise CheckpointError(f"checkpoint {path} is missing {name} (saved at DP size {manifest['dp_size']} with "
                              f"files {sorted(manifest['files'])})")
    if name not in manifest["files"]:
        raise CheckpointError(f"checkpoint {path}: manifest.json lists no SHA-256 for {name}; move the folder aside")
    if _file_sha256(f) != manifest["files"][name]:
        raise CheckpointError(f"checkpoint file {f} is corrupt: its SHA-256 differs from the manifest "
                              "(truncated or modified after the save)")
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(e), re.ASCII)
        what = f" (it refers to {found.group(1)})" if found else ""
        raise CheckpointError(f"checkpoint file {f} holds more than tensors and plain containers{what}: refused "
                              "without unpickling it (a nemo_muon checkpoint is data only; this file was not "
                              "written by nemo_muon or was modified after the save)") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise CheckpointError(f"checkpoint file {f} cannot be read as a torch file ({_brief(str(e))})"
                              "; move the folder aside") from None


def _brief(value: Any, limit: int = 300, cut_mark: str = "") -> str:
    """``value`` for a one-line message: a str as is, anything else as `shown` (a repr), on one line, cut to
    ``limit`` characters (followed by ``cut_mark`` when cut)."""
    text = value if isinstance(value, str) else shown(value)
    return " ".join(text[:limit].split()) + (cut_mark if len(text) > limit else "")


def _check_params(params: Any, model: torch.nn.Module, f: Path) -> None:
    """Refuse a model.pt that is not every parameter of ``model`` by name, with its shape and dtype."""
    if not isinstance(params, dict):
        raise CheckpointError(f"checkpoint file {f} must hold a dict of parameter name -> tensor; got a "
                              f"{type(params).__name__}; move the folder aside")
    for n, p in model.named_parameters():
        t = params.get(n)
        if not torch.is_tensor(t) or t.shape != p.shape or t.dtype != p.dtype:
            got = f"a tensor {list(t.shape)} {t.dtype}" if torch.is_tensor(t) else _brief(t)
            raise CheckpointError(f"checkpoint file {f}: {n} must be a tensor {list(p.shape)} {p.dtype} (the "
                                  f"manifest's); got {got}; move the folder aside")


_QUOTED_CHARS = 60
"""Longest rendering of one value read from a manifest in a refusal (names, shapes, dtypes: a file may hold any)."""


def _quoted(value: Any) -> str:
    """A manifest's ``value`` in a refusal: `_brief`, cut to `_QUOTED_CHARS` (marked with '...')."""
    return _brief(value, _QUOTED_CHARS, "...")


def _listed(items: list[str], most: int = 10) -> str:
    """The first ``most`` of ``items`` as a list's repr, then how many more there are."""
    more = f", ... {len(items) - most} more" if len(items) > most else ""
    return "[" + ", ".join(repr(item) for item in items[:most]) + more + "]"


def _check_same_model(model: torch.nn.Module, manifest: dict[str, Any], path: Path) -> None:
    mine = {n: list(p.shape) for n, p in model.named_parameters()}
    saved = {n: v["shape"] for n, v in manifest["params"].items()}
    missing, unexpected = sorted(set(saved) - set(mine)), sorted(set(mine) - set(saved))
    shapes = sorted(f"{n}: saved {_quoted(saved[n])}, model {mine[n]}" for n in set(mine) & set(saved)
                    if mine[n] != saved[n])
    dtypes = {n: str(p.dtype) for n, p in model.named_parameters()}
    casts = sorted(f"{n}: saved {_quoted(manifest['params'][n]['dtype'])}, model {dtypes[n]}"
                   for n in set(mine) & set(saved) if dtypes[n] != manifest["params"][n]["dtype"])
    if missing or unexpected or shapes or casts:
        only_saved, only_mine = _listed([_quoted(n) for n in missing]), _listed([_quoted(n) for n in unexpected])
        raise CheckpointError(f"checkpoint {path} is from another model: params only in the checkpoint {only_saved}, "
                              f"only in the model {only_mine}, shape differences {_listed(shapes)}, dtype "
                              f"differences {_listed(casts)} (a load never casts)")


def load_checkpoint(path: str | os.PathLike[str], model: torch.nn.Module, optimizer: WholeTensorOptimizer,
                    group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Load checkpoint directory ``path`` (any DP size) into ``model`` and ``optimizer``; verify; return ``extra``."""
    _require_dense(optimizer, group)
    path = Path(path)
    manifest = _read_manifest(path)
    _check_same_model(model, manifest, path)
    optimizer.finish_param_gather()  # an in-flight gather must not overwrite the loaded weights (Megatron-LM #6920)
    params = _load_verified(path, "model.pt", manifest)
    _check_params(params, model, path / "model.pt")
    extra = _load_verified(path, "extra.pt", manifest)
    if not isinstance(extra, dict):
        raise CheckpointError(f"checkpoint file {path / 'extra.pt'} must hold a dict (the saved extra); got a "
                              f"{type(extra).__name__}; move the folder aside")
    error: str | None = None
    try:  # each rank reads only the shards it needs, so a bad shard may fail on some ranks only
        merged = _read_shards(path, manifest, set(optimizer.state_names))
    except CheckpointError as e:
        error = str(e)
    # every rank refuses together, with the same message (none is left waiting in a collective)
    errors = [e for e in _gather_objects(error, group) if e is not None]
    if errors:
        raise CheckpointError(errors[0])
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
    if merged:
        try:  # a shard's contents (hashed, not yet checked) may still not fit this optimizer
            optimizer.load_state_dict(merged)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError) as e:
            error = (f"checkpoint {path}: the optimizer state in {sorted(manifest['shards'])} does not fit this "
                     f"optimizer ({type(e).__name__}: {_brief(str(e))}); move the folder aside")
    errors = [e for e in _gather_objects(error, group) if e is not None]
    if errors:
        raise CheckpointError(errors[0])
    bad = _gather_objects(_verify(model, optimizer, manifest)[:10], group)  # every rank raises the same error
    if any(bad):
        found = {f"rank {r}": names for r, names in enumerate(bad) if names}
        raise CheckpointError(f"checkpoint {path} failed verification after load: {found}; not training on wrong "
                              "weights; move the folder aside")
    return extra


def _read_shards(path: Path, manifest: dict[str, Any], mine: set[str]) -> dict[str, Any]:
    """The optimizer state of the names in ``mine``, merged from the shards that hold them (verified files)."""
    merged: dict[str, Any] = {}
    for shard_file, owned in sorted(manifest["shards"].items()):
        if mine & set(owned):
            shard = _load_verified(path, shard_file, manifest)
            if not (isinstance(shard, dict) and isinstance(shard.get("state"), dict)
                    and isinstance(shard.get("masters"), dict)):
                raise CheckpointError(f"checkpoint file {path / shard_file} must hold an optimizer shard (a dict with "
                                      f"'state' and 'masters' dicts); got {_brief(shard)}; move the folder aside")
            if not merged:
                merged = {**shard, "state": {}, "masters": {}}
            merged["state"].update({n: v for n, v in shard["state"].items() if n in mine})
            merged["masters"].update({n: v for n, v in shard["masters"].items() if n in mine})
    if mine and not merged:
        raise CheckpointError(f"checkpoint {path} has no optimizer state for {sorted(mine)[:10]}")
    return merged


def _verify(model: torch.nn.Module, optimizer: WholeTensorOptimizer, manifest: dict[str, Any]) -> list[str]:
    """Names whose loaded param or optimizer state differs from the manifest (dtypes equal: _check_same_model)."""
    bad = []
    for n, p in model.named_parameters():
        saved = manifest["params"][n]
        if tensor_sha256(p) != saved["sha256"]:
            bad.append(f"param {n}")
    want = manifest["optimizer_state"]
    shard = optimizer.state_dict()  # with splits a collective: every rank verifies
    got = _state_digests(shard)
    for n in shard["owned"]:
        w, g = want.get(n, {}), got.get(n, {})
        if "<master>" not in w:
            g.pop("<master>", None)
        if w != g:
            bad.append(f"optimizer state {n}")
    return bad
