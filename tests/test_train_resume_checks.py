"""What a resume refuses, and how: changed optimizer hyper-parameters (unless opted in, then recorded), damaged
manifests (never skipped for an older checkpoint), files that would run code; each refusal arrives once, as one
line, from every entry point (in-process, spawned ranks, torchrun)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nemo_muon.layerwise.checkpoint import CheckpointError
from nemo_muon.train.refusals import REFUSED_EXIT, RunRefused
from tests.test_layerwise_checkpoint import _plant
from tests.test_train_loop import short, small_corpus

NAME = "tiny_kimi_k2_muon"
SIZES = ["trainer.max_steps=6", "trainer.global_batch_size=8", "trainer.micro_batch_size=2", "trainer.seq_length=32",
         "trainer.eval_interval=3", "trainer.eval_iters=1", "scheduler.warmup_steps=1"]


def _recipe(root: Path, corpus: str, run: str, *, resume: bool, world: int = 1):
    r = short(NAME, root, corpus=corpus)
    r.logging.run_name, r.system.gpus_per_node = run, world
    r.checkpoint.save_interval, r.checkpoint.resume = 2, resume
    return r


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A run stopped after 4 of 6 steps, with checkpoints at steps 2 and 4."""
    from nemo_muon.train.loop import train

    root = tmp_path_factory.mktemp("checks")
    corpus = small_corpus(root / "corpus", n=4)
    torch.set_num_threads(1)
    train(_recipe(root, corpus, "base", resume=False), group=None, stop_after_steps=4)
    return root, corpus


def _copy(base, run: str, *, world: int = 1):
    """A resume of the base run's checkpoints in a new run folder."""
    root, corpus = base
    shutil.copytree(root / "base" / "checkpoints", root / run / "checkpoints")
    return _recipe(root, corpus, run, resume=True, world=world)


def _run_events(root: Path, run: str) -> list[dict]:
    return [e for e in map(json.loads, (root / run / "metrics.jsonl").open()) if e["event"] == "run"]


def test_changed_optimizer_hyper_parameters_are_refused(base) -> None:
    from nemo_muon.train.loop import train

    r = _copy(base, "changed")
    lr = r.optimizer.lr
    r.optimizer.lr, r.optimizer.momentum, r.optimizer.weight_decay = lr * 2, 0.9, 0.0
    with pytest.raises(RunRefused, match=rf"optimizer.lr must equal the checkpoint's {lr!r} to resume, got {lr * 2!r}; "
                                         r"optimizer.momentum must equal the checkpoint's 0.95 to resume, got 0.9; "
                                         r"optimizer.weight_decay must equal the checkpoint's 0.1 to resume, got 0.0 "
                                         r"\(checkpoint '.*step_00000004'\)\. Resume with the checkpoint's values, or "
                                         r"set checkpoint.allow_optimizer_change=true"):
        train(r, group=None)
    r.optimizer.lr, r.optimizer.momentum, r.optimizer.weight_decay = lr, 0.95, 0.1
    r.trainer.grad_clip = 0.5
    with pytest.raises(RunRefused, match=r"^trainer.grad_clip must equal the checkpoint's 1.0 to resume, got 0.5"):
        train(r, group=None)


def test_opting_in_resumes_and_records_the_changes(base) -> None:
    from nemo_muon.train.loop import train

    root, _ = base
    same = train(_copy(base, "same"), group=None, stop_after_steps=1)
    assert same["start_step"] == 4 and _run_events(root, "same")[-1]["optimizer_changes"] == {}
    r = _copy(base, "opted-in")
    lr = r.optimizer.lr
    r.optimizer.lr, r.checkpoint.allow_optimizer_change = lr / 2, True
    out = train(r, group=None, stop_after_steps=1)
    assert out["start_step"] == 4 and sorted(out["losses"]) == [5]
    assert _run_events(root, "opted-in")[-1]["optimizer_changes"] == {"optimizer.lr": {"checkpoint": lr, "now": lr / 2}}
    from nemo_muon.train.schedule import lr_multiplier

    step5 = [e for e in map(json.loads, (root / "opted-in" / "metrics.jsonl").open()) if e["event"] == "train"][-1]
    assert step5["step"] == 5  # the new peak applies from the resumed step on, at the schedule's position
    assert step5["lr"] == pytest.approx(lr / 2 * lr_multiplier(r.scheduler, 4, r.trainer.max_steps), rel=1e-12)


def _rewrite_extra(ckpt: Path, change) -> None:
    extra = torch.load(ckpt / "extra.pt", weights_only=True)
    change(extra)
    torch.save(extra, ckpt / "extra.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["extra.pt"] = hashlib.sha256((ckpt / "extra.pt").read_bytes()).hexdigest()
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_a_checkpoint_without_recorded_settings_needs_the_opt_in(base) -> None:
    from nemo_muon.train.loop import train

    r = _copy(base, "format1")
    _rewrite_extra(Path(r.logging.root) / "format1" / "checkpoints" / "step_00000004",
                   lambda e: (e.update(format="nemo_muon.train.state/1"), e.pop("optimizer_settings")))
    with pytest.raises(RunRefused, match=r"does not record the optimizer hyper-parameters.*set "
                                         r"checkpoint.allow_optimizer_change=true"):
        train(r, group=None)
    r.checkpoint.allow_optimizer_change = True
    assert train(r, group=None, stop_after_steps=1)["start_step"] == 4


def _empty(mf: Path) -> None:
    mf.write_text("")


def _truncated(mf: Path) -> None:
    mf.write_text(mf.read_text()[:100])


@pytest.mark.parametrize(("damage", "what"), [(Path.unlink, "missing"), (_empty, "empty"),
                                              (_truncated, "not valid JSON")])
def test_a_damaged_manifest_is_refused_with_the_folder_and_the_fix(base, damage, what) -> None:
    from nemo_muon.train.loop import train

    r = _copy(base, f"manifest-{what.split()[0]}")
    newest = Path(r.logging.root) / r.logging.run_name / "checkpoints" / "step_00000004"
    damage(newest / "manifest.json")
    with pytest.raises(CheckpointError, match=rf"cannot resume from '{newest}': {newest} is not a complete checkpoint: "
                                              rf"manifest.json is {what}.*; move the folder {newest} aside"):
        train(r, group=None)
    shutil.move(newest, Path(r.logging.root) / f"aside-{what.split()[0]}")  # the stated fix
    assert train(r, group=None, stop_after_steps=1)["start_step"] == 2


def test_a_planted_payload_in_a_training_checkpoint_never_runs(base, tmp_path) -> None:
    from nemo_muon.train.loop import train

    r = _copy(base, "payload")
    marker = tmp_path / "marker"
    _plant(Path(r.logging.root) / "payload" / "checkpoints" / "step_00000004", "extra.pt", marker)
    with pytest.raises(CheckpointError, match=r"extra.pt holds more than tensors and plain containers \(it refers to "
                                              r"\S*mkdir\): refused without unpickling it"):
        train(r, group=None)
    assert not marker.exists()


def test_spawned_ranks_refuse_with_one_line(base) -> None:
    from nemo_muon.train.spawn import launch_local

    r = _copy(base, "spawned", world=2)
    r.optimizer.weight_decay = 0.0
    with pytest.raises(RunRefused) as caught:  # re-raised in the parent: the rank's message, not its traceback
        launch_local(r, timeout_s=240)
    message = str(caught.value)
    assert message.startswith("optimizer.weight_decay must equal the checkpoint's 0.1 to resume, got 0.0")
    assert "\n" not in message and "Traceback" not in message


@pytest.mark.slow
def test_torchrun_ranks_print_a_refusal_once(base) -> None:
    root, corpus = base
    run = "torchrun"
    shutil.copytree(root / "base" / "checkpoints", root / run / "checkpoints")
    overrides = [*SIZES, "system.gpus_per_node=2", "checkpoint.save_interval=2", "checkpoint.resume=true",
                 "optimizer.momentum=0.9", f"logging.root={root}", f"logging.run_name={run}",
                 f"data.tokenizer_dir={root / 'tokenizer'}", f"data.corpus_root={corpus}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "nemo_muon.launchers.torchrun", "--standalone", "--nproc-per-node",
                           "2", "-m", "nemo_muon.launchers.run_recipe", "--recipe", NAME, *overrides],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == REFUSED_EXIT, proc.stderr  # the job's exit code says it was refused
    after_torchrun_banner = [line for line in proc.stderr.splitlines() if line and not line.startswith("W")]
    assert len(after_torchrun_banner) == 1 and after_torchrun_banner[0].startswith(
        "error: optimizer.momentum must equal the checkpoint's 0.95 to resume, got 0.9"), proc.stderr
    for launcher_report in ("ChildFailedError", "Traceback", "exitcode", "SIGTERM", "FAILED"):
        assert launcher_report not in proc.stderr, proc.stderr  # no rank traceback, no torchrun failure block
