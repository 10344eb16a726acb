"""``optimizer.lr`` from ``--factory`` to the update on the torch backend: the functions of ours it passes through
(`tests.lr_walk`), at most 10, and validated where it enters (each config made with it, once) rather than by every
check that reads the recipe."""

from __future__ import annotations

from tests.lr_walk import SENTINEL, walk

MAX_FUNCTIONS = 10
"""Issue 36's bound on the walk (docs/ARCHITECTURE.md lists it)."""


def test_the_learning_rate_walks_through_at_most_ten_functions_on_the_torch_backend(tmp_path):
    from nemo_muon.recipes.execute import build_recipe
    from nemo_muon.recipes.resolved import from_document, to_document

    from nemo_muon.train.pretrain import pretrain

    overrides = [f"optimizer.lr={SENTINEL}", "trainer.max_steps=1", "scheduler.warmup_steps=0",
                 "trainer.global_batch_size=2", "trainer.micro_batch_size=2", "trainer.seq_length=16",
                 "system.gpus_per_node=1", "trainer.eval_interval=0", "data.kind=mock", f"logging.root={tmp_path}"]

    def factory_to_update() -> None:  # what `nemo llm pretrain --factory` and each rank do, in one process
        document = to_document(build_recipe("tiny_kimi_k2_muon", overrides), source="tiny_kimi_k2_muon",
                               overrides=overrides)
        pretrain(from_document(document))

    _, seen = walk(factory_to_update)
    assert len(seen.functions) <= MAX_FUNCTIONS, seen.report()
    assert "nemo_muon.optim.muon.Muon.__init__" in seen.calls  # it does reach the optimizer
    assert "nemo_muon.train.schedule.build_lr_scheduler" in seen.calls  # which the scheduler drives
    # validated where it enters: the override's config, the rank's decoded config, the optimizer's own group check;
    # not again by each check that reads the recipe (tests/test_config.py: a changed section is re-validated)
    assert seen.calls.get("nemo_muon._validation.check_range", 0) <= 5, seen.report()
