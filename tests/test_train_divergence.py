"""Training that diverges says so: a warning per skipped step naming the step and the cause, a stop after
trainer.max_consecutive_skips skipped steps in a row (a `stop` event, exit code 3 from the entry point), and a
validated limit with one default."""

from __future__ import annotations

import json
import math

import pytest

from nemo_muon.config.recipe import TrainerConfig
from nemo_muon.train.divergence import DivergenceWatch
from nemo_muon.train.refusals import DIVERGED_EXIT, TrainingDiverged
from tests.test_train_loop import short, small_corpus

NAN = math.nan


def test_watch_warns_per_skipped_step_and_stops_at_the_limit() -> None:
    watch = DivergenceWatch(limit=3)
    assert watch.observe(1, 5.0, 1.0, skipped=False) is None
    assert watch.observe(2, NAN, NAN, skipped=True) == (
        "step 2 skipped: non-finite gradient (grad norm nan) and loss nan; 1 consecutive skipped step(s), training "
        "stops at 3 (trainer.max_consecutive_skips)")
    assert watch.observe(3, 4.0, 2.0, skipped=False) is None  # a healthy step ends the run of skips
    assert watch.observe(4, math.inf, 2.0, skipped=False) == "step 4: loss is inf (non-finite): training is diverging"
    assert watch.observe(5, 4.0, NAN, skipped=True).startswith("step 5 skipped: non-finite gradient (grad norm nan);")
    assert "; 2 consecutive skipped step(s)" in watch.observe(6, 4.0, math.inf, skipped=True)
    with pytest.raises(TrainingDiverged, match=r"steps 5-7 were all skipped \(3 in a row, "
                                               r"trainer.max_consecutive_skips=3\) because of a non-finite gradient"):
        watch.observe(7, 4.0, NAN, skipped=True)


def test_limit_zero_never_stops_and_the_limit_is_validated() -> None:
    watch = DivergenceWatch(limit=0)
    for step in range(1, 50):
        assert "trainer.max_consecutive_skips=0: never stops" in watch.observe(step, NAN, NAN, skipped=True)
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match=rf"trainer.max_consecutive_skips must be an integer >= 0; got {bad!r}"):
            TrainerConfig(max_consecutive_skips=bad)
    assert TrainerConfig().max_consecutive_skips == 10


def test_cli_flag_has_the_config_default_and_is_validated(capsys) -> None:
    from nemo_muon.train import pretrain

    assert pretrain.SKIP_LIMIT_DEFAULT == TrainerConfig().max_consecutive_skips
    with pytest.raises(SystemExit) as caught:
        pretrain.main(["--help"])
    assert caught.value.code == 0
    assert f"{TrainerConfig().max_consecutive_skips} unless the recipe sets it" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as caught:
        pretrain.main(["tiny_kimi_k2_muon", "--max-consecutive-skips", "-1"])
    assert caught.value.code == 2
    assert "trainer.max_consecutive_skips must be an integer >= 0; got -1" in capsys.readouterr().err


def test_a_diverging_run_warns_stops_and_records_why(tmp_path, capsys) -> None:
    from nemo_muon.train.loop import train

    r = short("tiny_kimi_k2_muon", tmp_path, steps=8, corpus=small_corpus(tmp_path / "corpus", n=4))
    r.system.gpus_per_node, r.optimizer.lr, r.trainer.max_consecutive_skips = 1, 1e30, 2
    with pytest.raises(TrainingDiverged, match=r"training diverged: steps 2-3 were all skipped \(2 in a row"):
        train(r, group=None)
    err = capsys.readouterr().err
    assert ("warning: step 2 skipped: non-finite gradient (grad norm nan); 1 consecutive skipped step(s), training "
            "stops at 2 (trainer.max_consecutive_skips)") in err
    events = [json.loads(line) for line in (tmp_path / r.name / "metrics.jsonl").open()]
    train_events = [e for e in events if e["event"] == "train"]
    assert [(e["step"], e["skipped"], e["skipped_steps"]) for e in train_events] == [(1, False, 0), (2, True, 1),
                                                                                    (3, True, 2)]
    assert events[-1]["event"] == "stop" and events[-1]["step"] == 3 and events[-1]["reason"] == "diverged"
    assert events[0]["max_consecutive_skips"] == 2


def test_entry_point_prints_one_line_and_exits_non_zero(tmp_path, capsys, monkeypatch) -> None:
    from nemo_muon.launchers import run_recipe

    monkeypatch.delenv("RANK", raising=False)
    corpus = small_corpus(tmp_path / "corpus", n=4)
    overrides = ["system.gpus_per_node=1", "trainer.max_steps=6", "trainer.global_batch_size=8",
                 "trainer.micro_batch_size=2", "trainer.seq_length=32", "trainer.eval_iters=1",
                 "scheduler.warmup_steps=1", f"logging.root={tmp_path}", f"data.tokenizer_dir={tmp_path / 'tok'}",
                 f"data.corpus_root={corpus}", "optimizer.lr=1e30", "trainer.max_consecutive_skips=2"]
    assert run_recipe.main(["--recipe", "tiny_kimi_k2_adamw", *overrides]) == DIVERGED_EXIT
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: training diverged: steps 2-3 were all skipped")
    assert "Traceback" not in err


def test_nonfinite_raise_stops_at_the_first_bad_step(tmp_path) -> None:
    from nemo_muon.train.loop import train

    r = short("tiny_kimi_k2_muon", tmp_path, steps=4, corpus=small_corpus(tmp_path / "corpus", n=4))
    r.system.gpus_per_node, r.optimizer.lr, r.optimizer.nonfinite = 1, 1e30, "raise"
    with pytest.raises(TrainingDiverged, match=r"training diverged at step 2: non-finite gradient .*set "
                                               r"optimizer.nonfinite=skip"):
        train(r, group=None)
    events = [json.loads(line) for line in (tmp_path / r.name / "metrics.jsonl").open()]
    assert events[-1]["event"] == "stop" and events[-1]["step"] == 2
