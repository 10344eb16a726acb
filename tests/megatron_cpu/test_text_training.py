"""The text harness of `bench/megatron_quality.py` (`text_training.train_on_text`): a tiny Kimi K2 trains on real text
through Megatron-Core on 2 gloo ranks with Muon (ours, inside the layer-wise optimizer) and with AdamW (Megatron's
distributed Adam) from the same weights and batches, the loss falls, and the validation points come where asked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from nemo_muon.recipes import get_recipe

from nemo_muon.config.optimizer import AdamWConfig
from nemo_muon.config.recipe import DataConfig
from nemo_muon.megatron.shared.optimizer_config import MEGATRON_MUON_DEFAULTS
from nemo_muon.train.data import build_token_data
from tests.distributed import run_distributed
from tests.megatron_cpu.text_training import TextRun, train_on_text
from tests.test_train_loop import small_corpus

SEQ = 32


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> TextRun:
    root = tmp_path_factory.mktemp("text")
    data = build_token_data(DataConfig(kind="stdlib_text", corpus_root=small_corpus(root / "corpus"), val_fraction=0.2),
                            vocab_size=get_recipe("tiny_kimi_k2_muon").model.vocab_size, seq_length=SEQ, seed=1,
                            cache_dir=root / "cache")
    np.save(root / "tokens.npy", data.tokens)
    return TextRun(tokens_path=str(root / "tokens.npy"), num_train=data.num_train, num_val=data.num_val, steps=6,
                   seq=SEQ, global_batch=8, micro_batch=2, warmup=1, min_lr_ratio=0.1, grad_clip=1.0, seed=1,
                   eval_interval=3, eval_windows=8)


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_tiny_kimi_k2_trains_on_text_and_validates(text_run, optimizer):
    recipe = get_recipe(f"tiny_kimi_k2_{optimizer}")
    opt = recipe.optimizer
    if optimizer == "muon":
        opt = dataclasses.replace(opt, **{**MEGATRON_MUON_DEFAULTS, "scale_mode": opt.scale_mode})  # the tiny's
    assert isinstance(opt, AdamWConfig) is (optimizer == "adamw")
    ranks = run_distributed(train_on_text, 2, (recipe.model.name, opt, text_run), timeout_s=300)
    assert ranks[0] == ranks[1]  # all-reduced losses: both ranks report the same curve
    losses, val = ranks[0]["losses"], ranks[0]["val"]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5, losses
    assert [step for step, _ in val] == [3, 6] and val[1][1] < val[0][1], val


def test_a_run_that_does_not_split_over_the_ranks_is_refused(text_run):
    bad = dataclasses.replace(text_run, eval_windows=6)
    with pytest.raises(RuntimeError, match=r"TextRun.eval_windows=6 must be a multiple of DP x micro_batch = 4"):
        run_distributed(train_on_text, 2, ("tiny_kimi_k2", get_recipe("tiny_kimi_k2_adamw").optimizer, bad),
                        timeout_s=300)
