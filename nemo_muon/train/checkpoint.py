"""Training checkpoints of the torch backend: atomic, verified, never overwritten, independent of the DP size.

A checkpoint is a folder ``<root>/step_<NNNNNNN>/`` holding ``model.pt`` (full model state), ``optimizer.pt``
(the full optimizer state, as the training optimizer's `state_dict()` returns it) and ``manifest.json`` (step,
recipe, world size, data fingerprint and the SHA-256 of each file). Rank 0 writes it under a temporary name and
renames it into place, so a folder with a manifest is complete. An existing step folder is never replaced.
Resume picks the newest folder whose files match their manifest hashes; corrupt or partial ones are reported
and skipped, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(root: str | os.PathLike, step: int, *, model_state: dict[str, Any],
                    optimizer_state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write checkpoint ``step`` atomically (call on one rank); raises if that step already exists."""
    final = step_dir(root, step)
    if final.exists():
        raise FileExistsError(f"checkpoint {str(final)!r} already exists; checkpoints are never overwritten "
                              "(resume with checkpoint.resume=True or choose a new checkpoint.dir)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    tmp.mkdir()
    files = {"model.pt": model_state, "optimizer.pt": optimizer_state}
    for name, obj in files.items():
        torch.save(obj, tmp / name)
    manifest = dict(meta, step=step, files={name: _sha256(tmp / name) for name in files})
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    os.rename(tmp, final)
    return final


def verify_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a complete checkpoint whose files match their hashes; raises ValueError otherwise."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ValueError(f"checkpoint {str(path)!r} must contain {MANIFEST}; it is missing (partial write?)")
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
    for name, digest in manifest.get("files", {}).items():
        f = path / name
        if not f.is_file() or _sha256(f) != digest:
            raise ValueError(f"checkpoint file {str(f)!r} must match its manifest SHA-256 {digest[:12]}...; "
                             "it is missing or corrupt")
    return manifest


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest verified checkpoint under ``root`` (None when there is none); bad ones are warned about."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)
    for _, path in steps:
        try:
            verify_checkpoint(path)
        except ValueError as err:
            warnings.warn(f"skipping unusable checkpoint: {err}", stacklevel=2)
            continue
        return path
    return None


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(model_state, optimizer_state, manifest) of a verified checkpoint, on the CPU."""
    path = Path(path)
    manifest = verify_checkpoint(path)
    model_state = torch.load(path / "model.pt", map_location="cpu", weights_only=False)
    optimizer_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
    return model_state, optimizer_state, manifest


def remove_partial(root: str | os.PathLike) -> None:
    """Delete temporary folders left by writers that died mid-save (call on one rank, before saving)."""
    root = Path(root)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".step_") and ".tmp" in p.name:
                shutil.rmtree(p, ignore_errors=True)
