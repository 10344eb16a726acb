"""`make demo` end to end at test size: both runs on 2 gloo ranks, report folder, printed table."""

import pytest

from nemo_muon.train.demo import demo_recipes, main, run_demo
from tests.test_train_loop import small_corpus


def _shrink(r, corpus):
    r.data.corpus_root = corpus
    r.trainer.max_steps, r.trainer.global_batch_size, r.trainer.micro_batch_size = 4, 8, 4
    r.trainer.seq_length, r.trainer.eval_interval, r.trainer.eval_iters = 32, 2, 1
    r.scheduler.warmup_steps = 1


def test_demo_writes_report_and_prints_table(tmp_path, capsys):
    out = run_demo("kimi_k2", runs_root=str(tmp_path / "runs"), reports_root=str(tmp_path / "reports"),
                   adjust=lambda r: _shrink(r, small_corpus(tmp_path / "corpus")))
    printed = capsys.readouterr().out
    report = out["report"]
    assert report.parent.parent == tmp_path / "reports" and report.parent.name.startswith("demo-kimi_k2-")
    text = report.read_text()
    for run in ("tiny_kimi_k2_muon-", "tiny_kimi_k2_adamw-"):
        assert run in text and run in printed
    assert "Muon vs AdamW" in text and "final val loss" in printed
    assert (report.parent / "loss_vs_step.png").is_file() and (report.parent / "loss_vs_time.png").is_file()
    assert [s["end_step"] for s in out["runs"]] == [4, 4]
    assert out["runs"][0]["losses"][1] == out["runs"][1]["losses"][1]  # same init, same first batch


def test_demo_recipes_share_data_and_seed(tmp_path):
    muon, adamw = demo_recipes("kimi_k2", steps=17, runs_root=str(tmp_path), stamp="x")
    assert (muon.optimizer.name, adamw.optimizer.name) == ("muon", "adamw")
    assert muon.trainer == adamw.trainer and muon.data == adamw.data and muon.model == adamw.model
    assert muon.trainer.max_steps == 17 and muon.logging.run_name == "tiny_kimi_k2_muon-x"
    assert muon.data.tokenizer_dir == str(tmp_path / "_cache")  # one tokenizer cache for both runs
    with pytest.raises(ValueError, match=r"family must be one of \('kimi_k2', 'qwen3_moe'\); got 'llama'"):
        demo_recipes("llama", steps=None, runs_root=str(tmp_path), stamp="x")
    # the second run is the registry's baseline of the first: any optimizer with a baseline and a tiny recipe
    soap, baseline = demo_recipes("kimi_k2", steps=None, runs_root=str(tmp_path), stamp="y", optimizer="soap")
    assert (soap.name, baseline.name) == ("tiny_kimi_k2_soap", "tiny_kimi_k2_adamw")
    with pytest.raises(ValueError, match=r"optimizer must be one of \(.*'muon'.*\); got 'adamw'"):
        demo_recipes("kimi_k2", steps=None, runs_root=str(tmp_path), stamp="z", optimizer="adamw")


def test_demo_cli_rejects_bad_steps(capsys):
    with pytest.raises(SystemExit):
        main(["--steps", "0"])
    assert "--steps must be an integer >= 1; got 0" in capsys.readouterr().err


def test_demo_steps_below_the_warmup_are_refused_before_training(capsys, tmp_path):
    """The demo's recipes go through the one validation of a run (`build_recipe`): a --steps the schedule cannot
    honour is a usage error naming the fields, not a run whose warmup never ends."""
    warmup = demo_recipes("kimi_k2", steps=None, runs_root=str(tmp_path), stamp="x")[0].scheduler.warmup_steps
    with pytest.raises(SystemExit) as exit_info:
        main(["--steps", str(warmup - 1), "--runs-root", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--steps {warmup - 1}: scheduler.warmup_steps must be < trainer.max_steps ({warmup - 1})" in err
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing written
