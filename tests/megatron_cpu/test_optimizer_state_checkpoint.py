"""A SOAP checkpoint through Megatron's `dist_checkpointing` (its Kronecker factors, eigenbases and per-matrix step
as tensors keyed by the parameter: `nemo_muon.megatron.shared.state_checkpoint`), checked on the way back in: every rank's
weights equal their owners' masters after the load (Megatron-LM #6920), and a cut or missing shard file is refused
by name before anything is read (`nemo_muon.megatron.shared.checkpoint_files`). Runs on Megatron-Core 0.19 (.venv) and 0.16
(.venv-ngc); the resume itself, bit for bit and at another data-parallel size, is in `test_megatron_training.py`."""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from nemo_muon.layerwise.checkpoint import CheckpointError
from nemo_muon.megatron.shared.checkpoint_files import (
    TRACKER_FILE,
    check_checkpoint_files,
    check_resume_folder,
    needed_sizes,
)
from nemo_muon.megatron.shared.state_checkpoint import KEY_PREFIX
from tests.distributed import run_distributed
from tests.megatron_cpu.training import (
    attempt_resumes,
    integrity_check,
    layer_wise_file_writes,
    resumed_weights_against_owners,
    train_tiny,
)

MCORE = importlib.metadata.version("megatron-core")
SPEC, OPTIMIZER = "tiny_kimi_k2", "soap"


@pytest.fixture(scope="module")
def soap_checkpoint(tmp_path_factory) -> Path:
    """Two SOAP steps on 2 DP ranks (the first only builds the preconditioner), then a save."""
    folder = tmp_path_factory.mktemp("soap") / "ckpt"
    folder.mkdir()
    run_distributed(train_tiny, world_size=2, args=(SPEC, OPTIMIZER, 2, (), str(folder), 2), timeout_s=300,
                    daemon=False)
    return folder


def _keys(folder: Path) -> set[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(folder)).read_metadata().state_dict_metadata)


def test_soap_factors_are_saved_as_tensors_keyed_by_parameter(soap_checkpoint):
    keys = _keys(soap_checkpoint)
    for state_key in ("L", "R", "Q_L", "Q_R", "step"):
        ours = [k for k in keys if f"{KEY_PREFIX}.{state_key}.decoder.layers." in k]
        assert ours, f"no {state_key} of any matrix in the checkpoint"
    assert any(".optimizer.state.exp_avg.decoder.layers." in k for k in keys)  # shaped like the param: Megatron's


@pytest.mark.parametrize("resumed_at_dp", [2, 1])
def test_after_a_resume_every_rank_holds_its_owners_weights_before_the_first_forward(soap_checkpoint, resumed_at_dp):
    results = run_distributed(resumed_weights_against_owners, world_size=resumed_at_dp,
                              args=(SPEC, OPTIMIZER, str(soap_checkpoint)), timeout_s=300, daemon=False)
    for result in results:
        assert result["checked"] > 0 and result["mismatched"] == [], result
        assert result["changed_by_load"] == result["checked"]  # the comparison sees loaded weights, not fresh ones
    assert all(r["owned_here"] > 0 for r in results)  # every rank owns matrices: the gather crosses ranks


def test_a_truncated_or_missing_shard_is_refused_naming_the_file(soap_checkpoint, tmp_path):
    check_checkpoint_files(soap_checkpoint)  # the saved checkpoint passes
    sizes = needed_sizes(soap_checkpoint)
    assert sorted(sizes) == sorted(p.name for p in soap_checkpoint.glob("*.distcp"))
    cut = tmp_path / "cut"
    shutil.copytree(soap_checkpoint, cut)
    shard = sorted(cut.glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[: sizes[shard.name] - 1])
    with pytest.raises(CheckpointError, match=rf"file {shard} is truncated: {sizes[shard.name] - 1} bytes, its index "
                                              rf"reads up to byte {sizes[shard.name]}"):
        check_checkpoint_files(cut)
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"file {shard} is missing"):
        check_checkpoint_files(cut)
    (cut / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"\.metadata cannot be read"):
        check_checkpoint_files(cut)


def test_the_resume_check_follows_megatrons_tracker_file(soap_checkpoint, tmp_path):
    assert check_resume_folder(tmp_path) is None  # nothing saved yet: nothing to check
    shutil.copytree(soap_checkpoint, tmp_path / "iter_0000002")
    (tmp_path / TRACKER_FILE).write_text("2\n")
    assert check_resume_folder(tmp_path) == tmp_path / "iter_0000002"
    shard = sorted((tmp_path / "iter_0000002").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"file {shard} is truncated"):
        check_resume_folder(tmp_path)
    (tmp_path / TRACKER_FILE).write_text("two")
    with pytest.raises(CheckpointError, match=rf"{TRACKER_FILE} must hold an iteration number \(ASCII digits, at most "
                                              r"10\) or 'release'; got 'two'"):
        check_resume_folder(tmp_path)


def test_a_corrupted_soap_shard_of_the_right_length(soap_checkpoint, tmp_path):
    """Bytes flipped inside a file of the right length: Megatron-Core's integrity manifest (0.17 onwards:
    ``verify_integrity``) refuses it naming the file, with nothing loaded; 0.16 writes no manifest, so nothing can
    tell (the length check passes)."""
    bad = tmp_path / "flipped"
    shutil.copytree(soap_checkpoint, bad)
    shard = sorted(bad.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    shard.write_bytes(bytes(data))
    check_checkpoint_files(bad)  # same length: only a hash can tell
    if not integrity_check():
        assert Version(MCORE) < Version("0.17") and not (bad / "integrity.json").exists()
        return
    (outcome, _) = run_distributed(attempt_resumes, world_size=2, args=([(SPEC, OPTIMIZER, str(bad))],),
                                   timeout_s=300, daemon=False)
    assert outcome[0]["error"] is not None and f"{shard.name}: hash mismatch" in outcome[0]["error"]
    assert outcome[0]["unchanged"], outcome[0]["changed"]


def test_the_layer_wise_file_is_written_only_inside_a_checkpoint_folder(tmp_path):
    """Megatron-Bridge 0.3 / 0.4 save the layer-wise optimizer's torch file at the save root at every save (#2307:
    each save replaces the last one's, no resume reads it); ours writes it only inside a checkpoint's folder."""
    for result in run_distributed(layer_wise_file_writes, world_size=2, args=(str(tmp_path),), timeout_s=300,
                                  daemon=False):
        assert result == {"at_root": False, "in_folder": True, "class": result["class"]}
        assert result["class"] in ("LayerWiseDistributedOptimizer", "NsBalancedLayerWiseOptimizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000003"]
