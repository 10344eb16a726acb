"""A short run of every tiny recipe (and of every registered matrix optimizer without one, by override) on 2 gloo
ranks: finite, decreasing loss, metrics JSONL, and a report."""

import json
import math
import shutil

import pytest
from nemo_muon.recipes import get_recipe, list_recipes
from nemo_muon.recipes.overrides import apply_overrides

from nemo_muon.registry import specs
from nemo_muon.train.data import stdlib_source_files
from nemo_muon.train.schedule import lr_multiplier
from tests.distributed import run_distributed

VARIANTS: dict[str, str] = {f"tiny_kimi_k2_{s.name}": s.name for s in specs()
                            if s.matrix is not None and f"tiny_kimi_k2_{s.name}" not in list_recipes()}
"""Every registered matrix optimizer without a tiny recipe of its own (AdaMuon) trains too: ``tiny_kimi_k2_muon`` with
``optimizer=<name>``, named as its recipe would be."""
TINY = sorted([*(n for n in list_recipes() if n.startswith("tiny_")), *VARIANTS])


def small_corpus(root, n=12):
    """A small real corpus: the first ``n`` stdlib modules of 2-20 KB, copied under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    files = [f for f in stdlib_source_files() if 2_000 < f.stat().st_size < 20_000][:n]
    for i, f in enumerate(files):
        shutil.copy(f, root / f"m{i:02d}.py")
    return str(root)


def short(name, root, steps=6, corpus=None):
    """The recipe with a test-sized loop: 8 windows of 32 tokens per step, 2 micro-batches per rank; ``corpus``
    (a folder of .py files) as ``data.corpus_root``."""
    if name in VARIANTS:
        r = apply_overrides(get_recipe("tiny_kimi_k2_muon"), [f"optimizer={VARIANTS[name]}"])
        r.name = name
    else:
        r = get_recipe(name)
    r.trainer.max_steps, r.trainer.global_batch_size, r.trainer.micro_batch_size = steps, 8, 2
    r.trainer.seq_length, r.trainer.eval_interval, r.trainer.eval_iters = 32, 3, 1
    r.scheduler.warmup_steps = 1
    r.logging.root, r.data.tokenizer_dir = str(root), str(root / "tokenizer")
    r.data.corpus_root = corpus
    r.validate()
    return r


def _train_all(rank, world, group, names, root, corpus):
    from nemo_muon.train.loop import train

    return {n: train(short(n, root, corpus=corpus), group=group) for n in names}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    corpus = small_corpus(root / "corpus")
    results = run_distributed(_train_all, world_size=2, args=(TINY, root, corpus), timeout_s=240)
    return root, results


def test_every_tiny_recipe_is_covered():
    assert {"tiny_kimi_k2_muon", "tiny_kimi_k2_adamw", "tiny_kimi_k2_soap", "tiny_qwen3_moe_muon",
            "tiny_qwen3_moe_adamw", "tiny_kimi_k2_adamuon"} <= set(TINY)


@pytest.mark.parametrize("name", TINY)
def test_short_run_loss_is_finite_and_decreasing(runs, name):
    _, results = runs
    s0, s1 = results[0][name], results[1][name]
    losses = [s0["losses"][k] for k in sorted(s0["losses"])]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[0] > math.log(4096) - 0.5  # starts near uniform over the vocabulary
    assert sum(losses[-2:]) / 2 < losses[0] - 0.25, losses
    assert s0["val_losses"][6] < s0["val_losses"][3] and math.isfinite(s0["val_losses"][6])
    assert s0["losses"] == s1["losses"] and s0["val_losses"] == s1["val_losses"]  # ranks agree


@pytest.mark.parametrize("name", TINY)
def test_metrics_jsonl_follows_the_schema(runs, name):
    root, _ = runs
    events = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "run" and events[0]["world_size"] == 2 and events[0]["recipe"] == name
    assert events[0]["model_params"] > 1_000_000
    train = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in train] == [1, 2, 3, 4, 5, 6]
    for e in train:
        for key in ("loss", "lr", "grad_norm", "tokens", "step_time_s", "optimizer_time_s", "tokens_per_s",
                    "model_tflops", "ns_tflops", "elapsed_s"):
            assert isinstance(e[key], (int, float)), key
        assert 0 < e["optimizer_time_s"] < e["step_time_s"]
    assert train[-1]["tokens"] == 6 * 8 * 32
    r = short(name, root)
    for e in train:  # the logged lr is the recipe's peak times its schedule at that step
        assert e["lr"] == pytest.approx(r.optimizer.lr * lr_multiplier(r.scheduler, e["step"] - 1, 6), rel=1e-12)
    assert (train[0]["ns_tflops"] > 0) == ("muon" in name)
    assert [e["step"] for e in events if e["event"] == "val"] == [3, 6]


def test_report_of_a_muon_adamw_pair(runs, tmp_path):
    from nemo_muon.reporting import write_report

    root, _ = runs
    md = write_report([root / "tiny_kimi_k2_muon", root / "tiny_kimi_k2_adamw"], tmp_path / "report")
    text = md.read_text()
    assert "tiny_kimi_k2_muon" in text and "tiny_kimi_k2_adamw" in text
    assert (tmp_path / "report" / "loss_vs_step.png").stat().st_size > 1000
    assert (tmp_path / "report" / "loss_vs_time.png").stat().st_size > 1000


@pytest.mark.parametrize(("field", "value", "message"), [
    ("precision.kind", "fp8_cs", r"precision.kind must be one of \('fp32', 'bf16'\) for backend 'torch'; got 'fp8_cs'"),
    ("precision.kind", "mxfp8", r"precision.kind must be one of \('fp32', 'bf16'\) for backend 'torch'; got 'mxfp8'"),
    ("parallelism.tp", 2, r"parallelism.tp must be 1 for backend 'torch' \(data parallelism only\); got 2"),
    ("parallelism.sequence_parallel", True, r"parallelism.sequence_parallel must be False .*; got True and None"),
    ("parallelism.pipeline_layout", "Et|L", r"parallelism.pipeline_layout None .*; got False and 'Et\|L'"),
    ("qk_clip", True, r"recipe.qk_clip must be False for backend 'torch'.*got True"),
])
def test_torch_backend_refuses_what_it_cannot_honour(field, value, message):
    from nemo_muon.train.loop import check_torch_recipe

    r = get_recipe("tiny_kimi_k2_muon")
    assert check_torch_recipe(r, r.world_size) >= 1  # the recipe as shipped is accepted
    *path, last = field.split(".")
    setattr(r if not path else getattr(r, path[0]), last, value)
    with pytest.raises(ValueError, match=message):
        check_torch_recipe(r, r.world_size)


def test_training_device_follows_system_gpu():
    import torch

    from nemo_muon.train.loop import training_device

    r = get_recipe("tiny_kimi_k2_muon")
    assert training_device(r) == torch.device("cpu")
    r.system.gpu = "h200"
    if torch.cuda.is_available():
        assert training_device(r).type == "cuda"
    else:
        with pytest.raises(ValueError, match=r"system.gpu must be 'cpu' for backend 'torch' on a machine without "
                                             r"CUDA devices; got 'h200'"):
            training_device(r)


def test_log_interval_and_eval_interval_zero_are_honoured(runs):
    from nemo_muon.train.loop import train

    root, _ = runs  # its corpus and tokenizer cache
    r = short("tiny_qwen3_moe_adamw", root, steps=3, corpus=str(root / "corpus"))
    r.logging.run_name = "intervals"
    r.system.gpus_per_node, r.trainer.global_batch_size = 1, 4
    r.trainer.log_interval, r.trainer.eval_interval, r.trainer.grad_clip = 2, 0, 0.0
    out = train(r, group=None)
    events = [json.loads(line) for line in (root / "intervals" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "train"] == [2, 3]  # every 2nd step and the last
    assert [e["step"] for e in events if e["event"] == "val"] == [3] and sorted(out["val_losses"]) == [3]
    assert sorted(out["losses"]) == [1, 2, 3]


def test_more_validation_windows_than_the_data_holds_is_refused():
    import numpy as np

    from nemo_muon.train.data import split_tokens
    from nemo_muon.train.loop import check_eval_windows

    r = get_recipe("tiny_kimi_k2_muon")
    data = split_tokens(np.arange(100 * 128 + 1), 128, 0.05, {})  # 100 windows, 5 for validation
    r.trainer.global_batch_size, r.trainer.eval_iters = 4, 1
    check_eval_windows(r, data)
    r.trainer.eval_iters = 0  # all of them
    check_eval_windows(r, data)
    r.trainer.eval_iters = 2
    with pytest.raises(ValueError, match=r"trainer.eval_iters \* global_batch_size must be <= the 5 validation windows "
                                         r".*; got 2 \* 4 = 8"):
        check_eval_windows(r, data)


def test_launch_local_refuses_a_gpu_recipe():
    from nemo_muon.recipes import get_recipe

    from nemo_muon.train.spawn import launch_local

    with pytest.raises(ValueError, match=r"system.gpu must be 'cpu' for launch_local .*; got 'gb300'"):
        launch_local(get_recipe("qwen3_30b_a3b_muon"))
