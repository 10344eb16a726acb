"""Checkpoints and resume: stop after k steps, resume, and the next losses equal an uninterrupted run, at the same
DP size (bitwise) and across DP 2 -> 1 (to float summation order), for Muon and the AdamW baseline alike (both
through nemo_muon.layerwise.checkpoint); a corrupt or damaged checkpoint is refused with a clear message (never
skipped), temporary folders of killed saves are ignored, a used run folder is never overwritten."""

import json
import shutil

import pytest
import torch

from nemo_muon.layerwise.checkpoint import CheckpointError
from tests.distributed import run_distributed
from tests.test_train_loop import short, small_corpus

NAMES = ("tiny_kimi_k2_muon", "tiny_kimi_k2_adamw")


def _variant(name, root, run, *, resume=False, world=2, corpus=None):
    r = short(name, root, corpus=corpus)
    r.logging.run_name = f"{name}-{run}"
    r.checkpoint.save_interval = 3
    r.checkpoint.resume = resume
    r.system.gpus_per_node = world
    return r


def _runs(rank, world, group, root, corpus):
    import torch.distributed as dist

    from nemo_muon.train.loop import train

    out = {}
    for name in NAMES:
        full = train(_variant(name, root, "full", corpus=corpus), group=group)
        first = train(_variant(name, root, "cut", corpus=corpus), group=group, stop_after_steps=3)
        if rank == 0:  # the same checkpoints, for a DP-1 resume later
            shutil.copytree(root / f"{name}-cut" / "checkpoints", root / f"{name}-dp1" / "checkpoints")
        dist.barrier(group)
        rest = train(_variant(name, root, "cut", resume=True, corpus=corpus), group=group)
        out[name] = (full, first, rest)
    return out


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    corpus = small_corpus(root / "corpus")
    return root, corpus, run_distributed(_runs, world_size=2, args=(root, corpus), timeout_s=240)[0]


@pytest.mark.parametrize("name", NAMES)
def test_resume_same_dp_is_bitwise_identical(resumed, name):
    root, _, out = resumed
    full, first, rest = out[name]
    assert first["end_step"] == 3 and rest["start_step"] == 3 and rest["resumed_from"].endswith("step_00000003")
    assert sorted(rest["losses"]) == [4, 5, 6]
    for step in (4, 5, 6):
        assert rest["losses"][step] == full["losses"][step]
    assert rest["val_losses"][6] == full["val_losses"][6]
    tokens = [{e["step"]: e["tokens"] for e in map(json.loads, (root / f"{name}-{run}" / "metrics.jsonl").open())
               if e["event"] == "train"} for run in ("full", "cut")]
    assert tokens[1] == tokens[0] and tokens[0][6] == 6 * 8 * 32  # cumulative over the resume, not restarted
    elapsed = [e["elapsed_s"] for e in map(json.loads, (root / f"{name}-cut" / "metrics.jsonl").open())
               if e["event"] == "train"]
    assert len(elapsed) == 6 and elapsed == sorted(elapsed)  # time continues over the resume too


@pytest.mark.parametrize("name", NAMES)
def test_resume_across_dp_2_to_1(resumed, name):
    from nemo_muon.train.loop import train

    root, corpus, out = resumed
    full = out[name][0]
    torch.set_num_threads(1)
    dp1 = train(_variant(name, root, "dp1", resume=True, world=1, corpus=corpus), group=None)
    assert dp1["world_size"] == 1 and dp1["start_step"] == 3
    # DP 1 accumulates 4 micro-batches where DP 2 adds 2 + 2: the same math in another float order. The first
    # resumed step shows the state was restored exactly; later steps may drift slightly because top-k expert
    # routing is discontinuous (a rounding-level change can move a token to another expert).
    assert dp1["losses"][4] == pytest.approx(full["losses"][4], abs=2e-5)
    for step in (5, 6):
        assert dp1["losses"][step] == pytest.approx(full["losses"][step], abs=1e-2)
    assert dp1["val_losses"][6] == pytest.approx(full["val_losses"][6], abs=1e-2)


def test_corrupt_checkpoint_is_refused_and_partial_ones_ignored(resumed):
    from nemo_muon.train.loop import train

    root, corpus, _ = resumed
    name = "tiny_kimi_k2_adamw"
    r = _variant(name, root, "bad", resume=True, world=1, corpus=corpus)
    r.checkpoint.save_interval = 0  # resume, take one step, write nothing
    ckpts = root / f"{name}-bad" / "checkpoints"
    shutil.copytree(root / f"{name}-cut" / "checkpoints", ckpts)  # steps 3 and 6
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000003", "step_00000006"]
    (ckpts / ".tmp_step_00000009").mkdir()  # a save killed midway: ignored
    (ckpts / "step_00000012").mkdir()  # a step folder without manifest: damaged, refused (never skipped)
    with open(ckpts / "step_00000006" / "model.pt", "r+b") as f:  # flip one byte: corrupt
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=r"cannot resume from .*step_00000012.*manifest.json is missing.*"
                                              r"move the folder .*step_00000012 aside"):
        train(r, group=None, stop_after_steps=1)
    shutil.move(ckpts / "step_00000012", root / "moved_aside_12")
    with pytest.raises(CheckpointError, match=r"cannot resume from .*step_00000006.*model.pt is corrupt.*"
                                              r"Move that folder aside"):
        train(r, group=None, stop_after_steps=1)
    shutil.move(ckpts / "step_00000006", root / "moved_aside")
    out = train(r, group=None, stop_after_steps=1)
    assert out["start_step"] == 3 and out["resumed_from"].endswith("step_00000003") and sorted(out["losses"]) == [4]


def test_resume_refuses_another_optimizers_checkpoint_and_layerwise_off(resumed):
    from nemo_muon.train.loop import train

    root, corpus, _ = resumed
    r = _variant("tiny_kimi_k2_adamw", root, "from-muon", resume=True, world=1, corpus=corpus)
    shutil.copytree(root / "tiny_kimi_k2_muon-cut" / "checkpoints", root / "tiny_kimi_k2_adamw-from-muon" / "checkpoints")
    with pytest.raises(ValueError, match=r"optimizer.name must match the checkpoint's optimizer 'muon' to resume; "
                                         r"got 'adamw'"):
        train(r, group=None)
    r.layerwise = False
    with pytest.raises(ValueError, match=r"recipe.layerwise must be True for backend 'torch'.*got False"):
        train(r, group=None)


def test_fresh_run_refuses_a_used_run_folder(resumed):
    from nemo_muon.train.loop import train

    root, corpus, _ = resumed
    r = _variant("tiny_kimi_k2_adamw", root, "full", world=1, corpus=corpus)
    with pytest.raises(ValueError, match=r"already holds checkpoints; set checkpoint.resume=True"):
        train(r, group=None)
    r.checkpoint.save_interval = 0
    with pytest.raises(ValueError, match=r"logging.run_name must name a new run folder.*already holds metrics.jsonl"):
        train(r, group=None)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    from nemo_muon.train.loop import train

    r = _variant("tiny_kimi_k2_adamw", tmp_path, "none", resume=True, world=1,
                 corpus=small_corpus(tmp_path / "corpus"))
    with pytest.raises(ValueError, match=r"checkpoint.resume=True needs a verified checkpoint under .*; found none"):
        train(r, group=None)


def test_resume_refuses_a_changed_learning_rate_schedule(resumed):
    from nemo_muon.train.loop import train

    root, corpus, _ = resumed
    r = _variant("tiny_kimi_k2_muon", root, "sched", resume=True, world=1, corpus=corpus)
    shutil.copytree(root / "tiny_kimi_k2_muon-cut" / "checkpoints", root / "tiny_kimi_k2_muon-sched" / "checkpoints")
    r.trainer.max_steps = 8
    with pytest.raises(ValueError, match=r"trainer.max_steps must equal the checkpoint's 6 to continue its "
                                         r"learning-rate schedule; got 8"):
        train(r, group=None)
    r.trainer.max_steps, r.scheduler.min_lr_ratio = 6, 0.5
    with pytest.raises(ValueError, match=r"scheduler.min_lr_ratio must equal the checkpoint's 0.1 .*; got 0.5"):
        train(r, group=None)
