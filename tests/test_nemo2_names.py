"""NeMo 2 habits carry over (issue 37 item 6): NeMo 2's override names map onto our fields or are refused naming the
field to set, from one table (`recipes/overrides.py` NEMO2_NAMES / NEMO2_REFUSED), the one docs/recipes.md shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.recipes import get_recipe
from nemo_muon.recipes.overrides import NEMO2_NAMES, NEMO2_REFUSED, apply_overrides

DOC = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
VALUES = {  # a value of each of our fields that differs from kimi_k2_muon's and passes the field's own checks
    "system.num_nodes": "2", "system.gpus_per_node": "2", "trainer.eval_interval": "7", "trainer.eval_iters": "3",
    "trainer.log_interval": "5", "parallelism.tp": "2", "parallelism.pp": "2", "parallelism.vp": "2",
    "parallelism.cp": "2", "parallelism.ep": "8", "parallelism.etp": "2", "parallelism.sequence_parallel": "true",
    "trainer.global_batch_size": "1024", "trainer.micro_batch_size": "4", "trainer.seq_length": "2048",
    "optimizer.lr": "1e-4", "optimizer.weight_decay": "0.05", "trainer.grad_clip": "0.5",
    "scheduler.warmup_steps": "5", "logging.root": "/tmp/nemo2-names", "logging.run_name": "r1",
    "checkpoint.save_interval": "50", "checkpoint.resume": "true", "model.<field>": "3",
}


def _doc_table() -> dict[str, str]:
    text = DOC.read_text()
    block = text[text.index("<!-- nemo2-names"):text.index("<!-- /nemo2-names -->")]
    return dict(re.findall(r"^\s*\| `([^`]+)` \| (.+?) \|\s*$", block, re.M))


def test_the_docs_show_the_one_table_of_nemo2_names() -> None:
    expected = {**{k: f"`{v}`" for k, v in NEMO2_NAMES.items()}, **{k: f"refused: set {v}" for k, v in
                                                                    NEMO2_REFUSED.items()}}
    assert _doc_table() == expected


@pytest.mark.parametrize(("nemo2", "ours"), NEMO2_NAMES.items())
def test_a_nemo2_name_sets_our_field_of_the_same_meaning(nemo2: str, ours: str) -> None:
    base = get_recipe("kimi_k2_muon")
    value = VALUES[ours]
    if ours == "model.<field>":
        nemo2, ours = "model.config.num_layers", "model.num_layers"
    theirs = apply_overrides(base, [f"{nemo2}={value}"])
    assert theirs == apply_overrides(base, [f"{ours}={value}"]) != base


@pytest.mark.parametrize(("nemo2", "instead"), NEMO2_REFUSED.items())
def test_a_nemo2_name_of_another_meaning_is_refused_naming_our_field(nemo2: str, instead: str) -> None:
    with pytest.raises(ValueError) as refused:
        apply_overrides(get_recipe("kimi_k2_muon"), [f"{nemo2}=1"])
    assert str(refused.value) == (f"override key '{nemo2}' is NeMo 2's; it has no exact equivalent here: set "
                                  f"{instead}")


def test_nemo2_names_work_on_the_command_line() -> None:
    result = CliRunner().invoke(main, ["plan", "--recipe", "tiny_kimi_k2_muon", "data.global_batch_size=16",
                                       "trainer.devices=2", "--json"])
    assert result.exit_code == 0, result.output
    refused = CliRunner().invoke(main, ["plan", "--recipe", "tiny_kimi_k2_muon", "trainer.accumulate_grad_batches=2"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert "set trainer.global_batch_size (accumulation is derived" in " ".join(refused.output.split())
