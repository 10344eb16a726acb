"""A Megatron torch_dist checkpoint's index (``.metadata``, a pickle) and tracker file, planted by an attacker: the
index is read only through an allow-listed unpickler (nothing it names runs), the tracker only as ASCII digits, each
refusal one line naming the file, before Megatron opens the folder (`nemo_muon.megatron.shared.checkpoint_files`).

The allow-list is what PyTorch DCP and Megatron-Core's torch_dist strategy write: a Megatron-Core 0.16 save of
ShardedTensors (float32, bfloat16) and a ShardedObject names exactly DCP's metadata dataclasses, ``_StorageInfo``,
``torch.Size``, two dtypes and ``torch.serialization._get_layout``; DCP's own save adds ``pathlib.PosixPath``
(its checkpoint id); Megatron-Core 0.19's decentralized save also keeps every rank's SavePlan in it. The first test
writes a real index with DCP and reads it back.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata

from nemo_muon.layerwise.checkpoint import CheckpointError
from nemo_muon.megatron.shared.checkpoint_files import (
    INDEX_FILE,
    TRACKER_FILE,
    check_checkpoint_files,
    check_resume_folder,
    latest_iteration_folder,
    needed_sizes,
    read_index,
)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A real torch_dist-format folder written by torch.distributed.checkpoint (one process, no group)."""
    folder = tmp_path / "iter_0000005"
    state = {"w": torch.randn(4, 3), "b": torch.zeros(3, dtype=torch.bfloat16), "step": 5, "note": {"s": "x"}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    (tmp_path / TRACKER_FILE).write_text("5\n")
    return folder


def test_a_real_dcp_index_is_read_through_the_allow_list(saved: Path) -> None:
    sizes = needed_sizes(saved)
    assert sizes and all((saved / name).stat().st_size >= end for name, end in sizes.items())
    assert isinstance(read_index(saved), Metadata)
    assert check_resume_folder(saved.parent) == saved


class _Payload:
    """A pickle that runs a shell command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_in_the_index_is_refused_by_name_and_never_runs(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (saved / INDEX_FILE).write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError) as refused:
        check_resume_folder(saved.parent)
    message = str(refused.value)
    assert f"{saved / INDEX_FILE} must hold only PyTorch DCP metadata; it refers to {os.system.__module__}.system" \
        in message and "\n" not in message
    assert not marker.exists(), "the index ran code"


def test_a_payload_hidden_inside_real_metadata_is_refused(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    metadata = pickle.loads((saved / INDEX_FILE).read_bytes())
    metadata.planner_data = {"w": ("w",), "x": _Payload(marker)}
    (saved / INDEX_FILE).write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=r"it refers to (posix|nt|os)\.system"):
        check_checkpoint_files(saved)
    assert not marker.exists()
    metadata.planner_data = {"x": eval}  # a builtin by name is refused the same way
    (saved / INDEX_FILE).write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=r"it refers to builtins\.eval"):
        check_checkpoint_files(saved)


def test_megatrons_empty_legacy_classes_are_read_as_placeholders(saved: Path, monkeypatch) -> None:  # noqa: ANN001
    name = "megatron.core.dist_checkpointing.strategies.torch"
    legacy = types.ModuleType(name)
    legacy.MCoreMetadata = type("MCoreMetadata", (), {"__module__": name})
    monkeypatch.setitem(sys.modules, name, legacy)  # only to write the pickle; reading never imports Megatron
    metadata = pickle.loads((saved / INDEX_FILE).read_bytes())
    metadata.planner_data = {"mcore": legacy.MCoreMetadata()}
    (saved / INDEX_FILE).write_bytes(pickle.dumps(metadata))
    monkeypatch.delitem(sys.modules, name)
    check_checkpoint_files(saved)


def test_megatrons_decentralized_save_plans_in_the_index_are_read(saved: Path) -> None:
    """Megatron-Core 0.19's decentralized save stores every rank's SavePlan in the index (``all_local_plans``)."""
    metadata = pickle.loads((saved / INDEX_FILE).read_bytes())
    planner = DefaultSavePlanner()
    planner.set_up_planner({"w": torch.randn(4, 3), "step": 5}, is_coordinator=True)
    plan = dataclasses.replace(planner.create_local_plan(), storage_data=_StoragePrefix("__0_"))
    metadata.all_local_plans = [plan]
    (saved / INDEX_FILE).write_bytes(pickle.dumps(metadata))
    assert read_index(saved).all_local_plans == [plan]


def test_an_index_naming_a_file_outside_its_folder_is_refused(saved: Path) -> None:
    metadata = pickle.loads((saved / INDEX_FILE).read_bytes())
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = "../outside.distcp"
    (saved / INDEX_FILE).write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=r"must name files inside its folder; got '../outside.distcp'"):
        check_checkpoint_files(saved)


@pytest.mark.timeout(20)
def test_an_index_that_is_a_fifo_is_refused_by_kind(saved: Path) -> None:
    (saved / INDEX_FILE).unlink()
    os.mkfifo(saved / INDEX_FILE)
    with pytest.raises(CheckpointError, match="must be a regular file; got .*, a FIFO"):
        check_checkpoint_files(saved)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("text", "allowed"), [("²", False), ("1" * 5000, False), ("١٢", False), ("12\n", True),
                                               ("release", True), ("12x", False), ("fifo", False)])
def test_the_tracker_must_hold_ascii_digits_or_release(tmp_path: Path, text: str, allowed: bool) -> None:
    tracker = tmp_path / TRACKER_FILE
    if text == "fifo":
        os.mkfifo(tracker)
    else:
        tracker.write_text(text, encoding="utf-8")
    if allowed:
        assert latest_iteration_folder(tmp_path) == tmp_path / ("release" if text == "release" else "iter_0000012")
        return
    with pytest.raises(CheckpointError) as refused:
        latest_iteration_folder(tmp_path)
    message = str(refused.value)
    assert str(tracker) in message and "\n" not in message and len(message) < 600
