"""One list of good and bad overrides through all four entry points: ``--dryrun``, ``plan``, ``launch`` and the job.

Every bad override is refused by all four with the same message (the one `build_recipe` raises: field, value and
what is allowed) and no traceback; every good one is accepted by all four, and then trains: the torch-backend ones
for two steps through the job entry itself, the megatron ones through the mapping the megatron backend runs before
Bridge (a real `OptimizerConfig` of the installed Megatron-Core, Bridge's field overrides).
"""

from __future__ import annotations

import json

import pytest
from nemo_muon.recipes.execute import build_recipe

from tests.entry_points import REFUSED_EXIT, EntryPoints, describe

TINY_RUN = ["system.gpus_per_node=1", "trainer.max_steps=2", "scheduler.warmup_steps=1", "trainer.global_batch_size=4",
            "trainer.micro_batch_size=2", "trainer.seq_length=32", "trainer.eval_interval=0", "data.kind=mock"]
"""Overrides that make a tiny recipe train two steps in this process (one rank, mock data)."""

GOOD: list[tuple[str, list[str]]] = [
    ("kimi_k2_muon", ["optim.lr=2e-4", "trainer.max_steps=20", "system.collective_timeout_s=1200"]),
    ("qwen3_30b_a3b_soap", ["trainer.global_batch_size=1024", "logging.run_name=soap-run.2"]),
    ("qwen3_30b_a3b_muon_h100", ["precision.kind=bf16", "optimizer.tp_mode=blockwise"]),
    ("tiny_kimi_k2_muon", [*TINY_RUN, "model.hidden_size=100", "logging.run_name=tiny-run.1"]),
    ("tiny_qwen3_moe_adamw", [*TINY_RUN, "system.collective_timeout_s=30", "optimizer.weight_decay=0"]),
]

BAD: list[tuple[str, str, str]] = [
    # (recipe, override, start of the message every entry point prints)
    ("kimi_k2_muon", "optimizer.lr=inf", "muon.lr must be a number in [0.0, inf); got inf"),
    ("kimi_k2_muon", "optimizer.lr=1e400", "muon.lr must be a number in [0.0, inf); got inf"),
    ("kimi_k2_muon", "optimizer.weight_decay=inf", "muon.weight_decay must be a number in [0.0, inf); got inf"),
    ("kimi_k2_muon", "optimizer.extra_scale_factor=inf", "muon.extra_scale_factor must be a number in (0.0, inf)"),
    ("kimi_k2_muon", "optimizer.adamw_eps=inf", "muon.adamw_eps must be a number in (0.0, inf); got inf"),
    ("kimi_k2_muon", "logging.run_name=../../escape", "logging.run_name must match [A-Za-z0-9][A-Za-z0-9_.-]*"),
    ("kimi_k2_muon", "logging.run_name=a\nb", "logging.run_name must match"),
    ("kimi_k2_muon", "name=../up", "recipe.name must match"),
    ("kimi_k2_muon", "logging.root=/tmp/a:/etc", "logging.root must be a path of [A-Za-z0-9_.@+%~/-]"),
    ("kimi_k2_muon", "system.gpus_per_node=8", "system.gpus_per_node must be <= 4 (GPUs per gb300 node); got 8"),
    ("kimi_k2_muon", "optimizer.split_gate_up=true", "muon.split_gate_up=True cannot be honoured by Megatron-Core"),
    ("kimi_k2_muon", "optimizer.engine=megatron optimizer.nonfinite=skip",
     "muon.nonfinite='skip' cannot be honoured by Megatron-Core"),
    ("kimi_k2_muon", "optimizer.tp_mode=auto", "muon.tp_mode (Megatron-Core) must be one of ('duplicated',"),
    ("kimi_k2_muon", "optimizer.adamw_lr=0.001", "muon.adamw_lr=0.001 cannot be honoured by Megatron-Core"),
    ("kimi_k2_muon", "model.vocab_size=1", "model[kimi_k2].vocab_size must be an integer >= 2; got 1"),
    ("kimi_k2_muon", "model.hidden_size=7168", None),  # unchanged: accepted (control)
    ("kimi_k2_muon", "model.num_layers=60", "model.num_layers must stay 61 for the megatron backend"),
    ("kimi_k2_muon", "optimizer.ns_steps=1000000000", "muon.ns_steps must be an integer in [1, 100]; got 1000000000"),
    ("kimi_k2_muon", "trainer.max_steps=100000000000000000000000000", "trainer.max_steps must be an integer in [1,"),
    ("kimi_k2_muon", "scheduler.warmup_steps=50", "scheduler.warmup_steps must be < trainer.max_steps (50)"),
    ("kimi_k2_muon", "system.collective_timeout_s=90", "system.collective_timeout_s must be a whole number of minutes"),
    ("kimi_k2_muon", "system.gpu=cpu", "system.gpu must be a GPU for the megatron backend"),
    ("kimi_k2_muon", "data.kind=stdlib_text", "data.kind must be one of ('mock', 'indexed') for the megatron backend"),
    ("qwen3_30b_a3b_muon_h100", "precision.kind=mxfp8", "precision.kind='mxfp8' needs system.gpu to be one of"),
    ("qwen3_30b_a3b_muon", "system.num_nodes=3", "etp*ep must divide tp*cp*dp"),
    ("kimi_k2_muon", "trainer.global_batch_size=100", "trainer.global_batch_size must be divisible by micro_batch_size*dp"),
    ("tiny_kimi_k2_muon", "model.hidden_size=130", "model.hidden_size must be a multiple of 4 with precision.kind='fp32'"),
    ("tiny_kimi_k2_muon", "model.qk_rope_head_dim=15", "model[tiny_kimi_k2].qk_rope_head_dim must be an even number"),
    ("tiny_qwen3_moe_muon", "model.head_dim=31", "model[tiny_qwen3_moe].head_dim must be an even number"),
    ("tiny_kimi_k2_muon", "model.vocab_size=100", "model.vocab_size must be >= 257 with data.kind='stdlib_text'"),
    ("tiny_kimi_k2_muon", "precision.kind=bf16 model.moe_ffn_hidden_size=100",
     "model.moe_ffn_hidden_size must be a multiple of 8 with precision.kind='bf16'"),
    ("tiny_kimi_k2_muon", "parallelism.tp=2", "parallelism.tp must be 1 for backend 'torch'"),
    ("tiny_kimi_k2_muon", "trainer.seq_length=1024", "trainer.seq_length must be <= model.max_position_embeddings (512)"),
    ("tiny_kimi_k2_muon", "trainer.max_steps=5", "scheduler.warmup_steps must be < trainer.max_steps (5)"),
    ("tiny_kimi_k2_muon", "system.gpus_per_node=257", "system.gpus_per_node must be <= 256"),
]


@pytest.fixture(scope="module")
def entry_points(tmp_path_factory: pytest.TempPathFactory) -> EntryPoints:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEMORUN_HOME", str(tmp_path_factory.mktemp("nemorun")))
        yield EntryPoints()


@pytest.mark.parametrize(("recipe", "override", "message"), BAD, ids=[f"{r}:{o[:40]}" for r, o, _ in BAD])
def test_every_entry_point_refuses_the_same_recipes_with_the_same_message(entry_points, tmp_path, recipe, override,
                                                                         message) -> None:
    overrides = [f"logging.root={tmp_path / 'runs'}", *override.split(" ")]
    if message is None:
        outcomes = entry_points.all(recipe, overrides, job=False)
        assert all(o.accepted and not o.crashed for o in outcomes.values()), describe(outcomes)
        return
    with pytest.raises(ValueError) as built:
        build_recipe(recipe, overrides)
    expected = " ".join(str(built.value).split())
    assert expected.startswith(message), expected
    outcomes = entry_points.all(recipe, overrides, job=True)
    for name, outcome in outcomes.items():
        assert not outcome.crashed and outcome.exit_code == REFUSED_EXIT[name], describe(outcomes)
        assert expected in " ".join(outcome.output.split()), (name, expected, describe(outcomes))
    assert not (tmp_path / "runs").exists()  # nothing was written anywhere


@pytest.mark.parametrize(("recipe", "overrides"), GOOD, ids=[r for r, _ in GOOD])
def test_every_entry_point_accepts_the_same_recipes_and_they_train(entry_points, tmp_path, recipe, overrides) -> None:
    overrides = [f"logging.root={tmp_path / 'runs'}", *overrides]
    outcomes = entry_points.all(recipe, overrides, job=False)
    assert all(o.accepted and not o.crashed for o in outcomes.values()), describe(outcomes)
    built = build_recipe(recipe, overrides)
    if built.backend == "torch":
        from nemo_muon.launchers.run_recipe import main as job_main

        assert job_main(["--recipe", recipe, *overrides]) == 0
        run_dir = tmp_path / "runs" / (built.logging.run_name or built.name)
        steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line).get("event") == "train"]
        assert steps == [1, 2]
        return
    import dataclasses

    from megatron.core.optimizer import OptimizerConfig

    from nemo_muon.megatron.bridge.container import bridge_field_overrides, bridge_optimizer_spec

    spec = bridge_optimizer_spec(built, {f.name for f in dataclasses.fields(OptimizerConfig)})
    OptimizerConfig(**spec.kwargs)  # the installed Megatron-Core takes the mapped optimizer
    fields = bridge_field_overrides(built)
    assert fields["dist"]["distributed_timeout_minutes"] == built.system.collective_timeout / 60
