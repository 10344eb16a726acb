"""Refuse a Megatron ``dist_checkpointing`` checkpoint (torch_dist format) with a missing or truncated file, naming it.

Megatron-Core loads in place, into the live model and optimizer tensors: a shard file that ends early fails in the
middle of a load (PyTorch's DCP reader raises on a short read, without the file's name, after part of the state was
overwritten). Megatron-Core 0.19 can hash every file (``verify_integrity``); 0.16 cannot, and Megatron-Bridge's load
passes no such flag on any release. `check_checkpoint_files` reads the checkpoint's DCP index (``.metadata``: every
stored item's file, offset and length) and checks that each file it names exists and is long enough, before anything
is read: a file cut by a full disk or a killed writer is refused with its name, its size and the size the index needs.
A file of the right length with flipped bytes is found only by a hash (Megatron-Core 0.19's manifest, where written).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from nemo_muon.layerwise.checkpoint import CheckpointError

INDEX_FILE = ".metadata"
"""PyTorch DCP's index of a torch_dist checkpoint folder."""
CHECKPOINT_FOLDER = re.compile(r"^(iter_\d{7}|release)$")
"""One checkpoint's own folder under a Megatron / Bridge save root."""
TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""Megatron's pointer to the latest complete save under a save root (Megatron-Bridge writes it too)."""


def needed_sizes(folder: Path) -> dict[str, int]:
    """File name -> the bytes the checkpoint's index reads from it (the end of its last stored item)."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # a missing, cut or foreign index: what is wrong is the file, named here
        raise CheckpointError(f"checkpoint {folder}: its index {folder / INDEX_FILE} cannot be read "
                              f"({type(exc).__name__}: {exc}); the checkpoint is incomplete or not a torch_dist "
                              "checkpoint") from exc
    sizes: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
    return sizes


def check_checkpoint_files(folder: str | os.PathLike[str]) -> None:
    """Raise `CheckpointError` naming the first file of checkpoint ``folder`` that is missing or shorter than its
    index says."""
    folder = Path(folder)
    for name, needed in sorted(needed_sizes(folder).items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder}: file {path} is missing; its index stores data in it")
        size = path.stat().st_size
        if size < needed:
            raise CheckpointError(f"checkpoint {folder}: file {path} is truncated: {size} bytes, its index reads "
                                  f"up to byte {needed}; resume from an earlier checkpoint or save again")


def latest_iteration_folder(save_root: str | os.PathLike[str]) -> Path | None:
    """The folder Megatron's tracker file under ``save_root`` points to (``iter_<7 digits>`` or ``release``); None
    when the root has no tracker (nothing saved yet)."""
    root = Path(save_root)
    tracker = root / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if text == "release":
        return root / "release"
    if not text.isdigit():
        raise CheckpointError(f"checkpoint tracker {tracker} holds {text!r}; expected an iteration number or "
                              "'release'")
    return root / f"iter_{int(text):07d}"


def inside_checkpoint_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies inside one checkpoint's own folder (`CHECKPOINT_FOLDER`)."""
    return any(CHECKPOINT_FOLDER.match(part) for part in Path(path).parent.parts)


def check_resume_folder(save_root: str | os.PathLike[str]) -> Path | None:
    """Check the checkpoint a Megatron / Bridge resume from ``save_root`` would load (`check_checkpoint_files`);
    returns its folder, None when there is none yet."""
    folder = latest_iteration_folder(save_root)
    if folder is not None:
        check_checkpoint_files(folder)
    return folder
