"""`nemo llm pretrain` with the real NeMo 2.7 installed: NeMo's recipes and ours through one command.

NeMo 2.7 provides the ``llm`` namespace; nemo-muon's recipes join its ``pretrain`` (recipes/nemo_run_registration.py):
``--factory <ours>`` runs our recipe, every other factory stays NeMo's. The in-process checks use NeMo-Run's own CLI
app (one NeMo import for all of them); the training run is the real ``nemo`` command, started without the virtualenv
on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def nemo_cli(tmp_path_factory):
    """NeMo-Run's `nemo` app with the `llm` namespace built (as for `nemo llm ...`)."""
    from nemo_run.cli.api import create_cli

    os.environ["NEMORUN_HOME"] = str(tmp_path_factory.mktemp("nemorun"))
    argv, sys.argv = sys.argv, ["nemo", "llm"]  # NeMo-Run builds a namespace's commands for argv[1]
    try:
        app = create_cli()
    finally:
        sys.argv = argv
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_llm_namespace_is_nemos_with_our_recipes_joined():
    from nemo.collections import llm
    from nemo_muon.recipes import list_recipes, nemo_run_registration
    from nemo_run.cli.api import catalogue
    from nemo_run.config import get_type_namespace

    entry = nemo_run_registration.JOINED_LLM_PRETRAIN
    assert entry is not None and entry.fn is llm.pretrain  # NeMo's function, NeMo's entrypoint object
    assert entry.run_ctx_cls is nemo_run_registration.LlmPretrainRunContext
    namespace = get_type_namespace(llm.pretrain)

    def factory_module(name: str) -> str:
        return catalogue._get((namespace, name)).__module__

    assert factory_module("llama3_8b").startswith("nemo.collections.llm.recipes")
    # every recipe of ours joined (none is named like a NeMo factory, which would stay NeMo's)
    assert nemo_run_registration.JOINED_RECIPES == set(list_recipes())
    assert {factory_module(name) for name in list_recipes()} == {nemo_run_registration.__name__}


@pytest.mark.parametrize("name", ["kimi_k2_muon", "kimi_k2_adamw"])
def test_our_factory_prints_our_resolved_recipe(nemo_cli, name):
    out = nemo_cli("llm", "pretrain", "--factory", name, "optim.lr=2e-4", "--dryrun", "--yes")
    assert out.exit_code == 0, out.output[-3000:]
    assert f"# {name}: 256 x gb300 (64 nodes x 4), TP1 PP4 VP4 CP1 EP64 ETP1 DP64" in out.output
    assert "lr: 0.0002" in out.output and "backend: megatron" in out.output
    if name.endswith("muon"):
        assert "engine: nemo_muon" in out.output


def test_our_factory_keeps_our_override_errors_and_stack_refusals(nemo_cli):
    bad = nemo_cli("llm", "pretrain", "--factory", "kimi_k2_adamw", "optim.lrr=1", "--dryrun", "--yes")
    assert bad.exit_code == 1 and "override key 'optim.lrr' is unknown" in bad.output
    own = nemo_cli("llm", "pretrain", "--factory", "kimi_k2_muon", "optim.engine=megatron", "--dryrun", "--yes")
    assert own.exit_code == 1  # Megatron-Core 0.16's own Muon + emerging-optimizers 0.3.0: refused, with the fix
    assert "[mcore016-muon-emerging-optimizers]" in own.output and "fix: use optimizer.engine=nemo_muon" in own.output


def test_our_factory_refuses_secret_overrides_with_nemo_muon_launchs_message(nemo_cli):
    from nemo_muon.secret_policy import override_refusal

    secret = "hf_" + "Sx9" * 12
    for args, key in [(["env.HF_TOKEN=" + secret, "--dryrun"], "env.HF_TOKEN"),
                      (["run.executor=local", "env.WANDB_API_KEY=" + secret], "env.WANDB_API_KEY")]:
        out = nemo_cli("llm", "pretrain", "--factory", "tiny_kimi_k2_muon", *args, "--yes")
        assert out.exit_code == 1 and override_refusal(key) in " ".join(out.output.split()), out.output[-3000:]
        assert secret not in out.output
    home = Path(os.environ["NEMORUN_HOME"])
    assert not [p for p in home.rglob("*") if p.is_file() and secret in p.read_text(errors="ignore")]


def test_nemos_factory_still_prints_nemos_recipe(nemo_cli):
    out = nemo_cli("llm", "pretrain", "--factory", "llama3_8b", "--dryrun", "--yes")
    assert out.exit_code == 0, out.output[-3000:]
    assert "Dry run for task nemo.collections.llm.api:pretrain" in out.output
    assert "LlamaModel(config=Llama3Config8B())" in out.output and "MegatronOptimizerModule(" in out.output


def test_nemos_recipe_takes_our_optimizer_recipe_from_the_command_line(nemo_cli):
    out = nemo_cli("llm", "pretrain", "--factory", "llama3_8b", "optim=muon_with_cosine_annealing",
                   "optim.lr_scheduler.warmup_steps=7", "--dryrun", "--yes")
    assert out.exit_code == 0, out.output[-3000:]
    text = " ".join(out.output.replace("│", " ").split())
    assert "optim EmergingOptimizerModule( optimizer=MuonConfig(" in text
    assert "lr_scheduler=CosineAnnealingScheduler(warmup_steps=7," in text and "LlamaModel(" in text


def test_help_shows_both(nemo_cli):
    group = nemo_cli("llm", "--help")
    assert group.exit_code == 0 and "also nemo-muon's recipes" in group.output and "finetune" in group.output
    command = nemo_cli("llm", "pretrain", "--help")
    assert command.exit_code == 0
    assert "nemo-muon recipes (--factory): kimi_k2_adamw" in " ".join(command.output.split())
    assert "llama3_8b" in command.output and "qwen3_30b_a3b_muon" in command.output


def test_tiny_recipe_trains_through_the_local_executor_without_an_activated_venv(tmp_path):
    runs = tmp_path / "runs"
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != VENV_BIN)
    env = {**os.environ, "PATH": path or os.defpath, "NEMORUN_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        [str(VENV_BIN / "nemo"), "llm", "pretrain", "--factory", "tiny_kimi_k2_muon", "run.executor=local",
         "trainer.max_steps=2", "scheduler.warmup_steps=1", "trainer.global_batch_size=4",
         "trainer.micro_batch_size=2", "trainer.seq_length=32",
         "trainer.eval_interval=0", "data.kind=mock", f"logging.root={runs}", "--yes"],
        env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    events = [json.loads(line) for line in (runs / "tiny_kimi_k2_muon" / "metrics.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "run" and events[0]["world_size"] == 2 and events[0]["optimizer"] == "muon"
    steps = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] == e["loss"] for e in steps)  # not NaN
