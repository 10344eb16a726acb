"""Refuse a Megatron ``dist_checkpointing`` checkpoint (torch_dist format) with a missing or truncated file, naming it.

Megatron-Core loads in place, into the live model and optimizer tensors: a shard file that ends early fails in the
middle of a load (PyTorch's DCP reader raises on a short read, without the file's name, after part of the state was
overwritten). Megatron-Core 0.19 can hash every file (``verify_integrity``); 0.16 cannot, and Megatron-Bridge's load
passes no such flag on any release. `check_checkpoint_files` reads the checkpoint's DCP index (``.metadata``: every
stored item's file, offset and length) and checks that each file it names exists and is long enough, before anything
is read: a file cut by a full disk or a killed writer is refused with its name, its size and the size the index needs.
A file of the right length with flipped bytes is found only by a hash (Megatron-Core 0.19's manifest, where written).

The index is a pickle, and ``pickle.load`` (what torch's ``FileSystemReader.read_metadata`` and Megatron run) calls
whatever a pickle names: a planted ``.metadata`` would run code when a resume reads the folder. It is read here only
through `IndexUnpickler`, whose ``find_class`` admits the checkpoint library's own classes, by name
(`INDEX_CLASSES`: PyTorch DCP's metadata dataclasses, ``_StorageInfo``, the save-plan dataclasses Megatron-Core's
decentralized save keeps in the index, ``torch.Size``, torch dtypes and layouts, paths, and Megatron's two empty
legacy classes, read as a placeholder), and refuses anything else naming it, before
Megatron opens the folder. The set is what torch.distributed.checkpoint and Megatron-Core's torch_dist strategy
write (a real index, inspected: tests/test_checkpoint_index.py). The index and the tracker file are read as bounded
regular files (`nemo_muon.config.files`): a FIFO or a device is refused by kind, and the tracker's iteration must be
ASCII digits.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

from nemo_muon._validation import shown
from nemo_muon.config.files import read_file, read_text
from nemo_muon.layerwise.checkpoint import CheckpointError

INDEX_FILE = ".metadata"
"""PyTorch DCP's index of a torch_dist checkpoint folder."""
CHECKPOINT_FOLDER = re.compile(r"(iter_[0-9]{7,}|release)\Z", re.ASCII)
"""One checkpoint's own folder under a Megatron / Bridge save root."""
TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""Megatron's pointer to the latest complete save under a save root (Megatron-Bridge writes it too)."""
TRACKER_ITERATION = re.compile(r"[0-9]{1,10}", re.ASCII)
"""The tracker's iteration: ASCII digits, at most 10 (``int()`` also takes '²'-like digits of any script)."""
MAX_TRACKER_BYTES = 64
MAX_INDEX_BYTES = 1 << 30
"""Largest ``.metadata`` read (1 GiB: a trillion-parameter checkpoint's index is tens of MB)."""
INDEX_CLASSES: tuple[tuple[str, str], ...] = (
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    # Megatron-Core's decentralized save keeps every rank's plan in the index (Metadata.all_local_plans)
    *(("torch.distributed.checkpoint.planner", name) for name in (
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData")),
    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),  # indexes written by older torch
    ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
)
"""What a torch_dist index may name (module, name); torch dtypes (``torch.float32``...) are admitted too."""
MEGATRON_PLACEHOLDERS: tuple[tuple[str, str], ...] = (
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"),
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan"),
)
"""Megatron-Core's empty classes kept "to load old checkpoints": read as `_Placeholder`, without importing Megatron."""


class _Placeholder:
    """Stands for one of Megatron's empty legacy classes in an index (state kept, never used)."""


class IndexRefused(pickle.UnpicklingError):
    """A checkpoint index that names something other than the checkpoint library's own classes."""


class IndexUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only `INDEX_CLASSES`, torch dtypes and `MEGATRON_PLACEHOLDERS`, refusing
    any other global (``os.system``, ``builtins.exec``...) by name, and any persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in MEGATRON_PLACEHOLDERS:
            return _Placeholder
        if (module, name) in INDEX_CLASSES:
            try:
                return getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                raise IndexRefused(f"{module}.{name} (a class this torch does not have)") from None
        if module == "torch":
            import torch

            dtype = getattr(torch, name, None)
            if isinstance(dtype, torch.dtype):
                return dtype
        text = f"{module}.{name}"
        raise IndexRefused(text if len(text) <= 200 and text.isprintable() else shown(text))

    def persistent_load(self, pid: Any) -> Any:
        raise IndexRefused(f"persistent id {shown(pid)}")


def read_index(folder: str | os.PathLike[str]) -> Any:
    """The DCP index (``Metadata``) of torch_dist checkpoint ``folder``, read by `IndexUnpickler` from a bounded
    regular file; `CheckpointError` naming the file and what it refers to when it is anything else."""
    from torch.distributed.checkpoint.metadata import Metadata

    index = Path(folder) / INDEX_FILE
    fix = "the checkpoint is incomplete, not a torch_dist checkpoint, or was tampered with; it was not loaded"
    try:
        data = read_file(index, max_bytes=MAX_INDEX_BYTES, what=f"checkpoint index {index}")
        metadata = IndexUnpickler(io.BytesIO(data)).load()
    except IndexRefused as e:
        raise CheckpointError(f"checkpoint index {index} must hold only PyTorch DCP metadata; it refers to {e}: "
                              f"refused without unpickling it ({fix})") from None
    except ValueError as e:  # not a regular file, too large
        raise CheckpointError(f"{e}; {fix}") from None
    except Exception as e:  # noqa: BLE001 - a cut or foreign pickle fails in many ways; what is wrong is the file
        raise CheckpointError(f"checkpoint index {index} cannot be read ({type(e).__name__}: "
                              f"{shown(str(e))}); {fix}") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"checkpoint index {index} must hold a DCP Metadata; got a {type(metadata).__name__}; "
                              f"{fix}")
    return metadata


def _stored_file(index: Path, name: Any) -> str:
    """A storage entry's file: one name inside the checkpoint folder."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CheckpointError(f"checkpoint index {index} must name files inside its folder; got {shown(name)}")
    return name


def needed_sizes(folder: Path) -> dict[str, int]:
    """File name -> the bytes the checkpoint's index reads from it (the end of its last stored item)."""
    folder = Path(folder)
    metadata = read_index(folder)
    storage = metadata.storage_data or {}
    if not isinstance(storage, dict):
        raise CheckpointError(f"checkpoint index {folder / INDEX_FILE} must map items to storage; got "
                              f"{type(storage).__name__}")
    sizes: dict[str, int] = {}
    for info in storage.values():
        name = _stored_file(folder / INDEX_FILE, getattr(info, "relative_path", None))
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 for v in (offset, length)):
            raise CheckpointError(f"checkpoint index {folder / INDEX_FILE} must give each item a byte offset and "
                                  f"length; got {shown(offset)} and {shown(length)} for {name}")
        sizes[name] = max(sizes.get(name, 0), offset + length)
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
    when the root has no tracker (nothing saved yet). The tracker is read as a small regular file."""
    root = Path(save_root)
    tracker = root / TRACKER_FILE
    if not (tracker.exists() or tracker.is_symlink()):
        return None
    try:
        text = read_text(tracker, max_bytes=MAX_TRACKER_BYTES, what=f"checkpoint tracker {tracker}").strip()
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if text == "release":
        return root / "release"
    if not TRACKER_ITERATION.fullmatch(text):
        raise CheckpointError(f"checkpoint tracker {tracker} must hold an iteration number (ASCII digits, at most "
                              f"10) or 'release'; got {shown(text)}")
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
