"""What each rank of a NeMo-Run launch runs (`nemo_muon.recipes.execute.nemo_run_task` on the resolved document the
launch built) reports a refusal of the run as `nemo-muon launch` does: one line from rank 0, the refusal's exit
code, no traceback."""

from __future__ import annotations

import pytest
from nemo_muon.recipes.execute import build_recipe, nemo_run_task
from nemo_muon.recipes.resolved import to_document

OVERRIDES = ["trainer.max_steps=2", "scheduler.warmup_steps=1"]


@pytest.mark.parametrize("given", ["document", "name"])
def test_a_refused_run_is_one_line_and_exit_code_2(capsys, monkeypatch, tmp_path, given):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    overrides = [f"logging.root={tmp_path}", *OVERRIDES]
    # the tiny recipe asks for 2 ranks; this process is one rank alone: the loop refuses before training
    with pytest.raises(SystemExit) as exited:
        if given == "document":  # what NeMo-Run's run.Partial hands every rank
            nemo_run_task(to_document(build_recipe("tiny_kimi_k2_muon", overrides), source="tiny_kimi_k2_muon",
                                   overrides=overrides))
        else:  # a name is resolved once, in this process
            nemo_run_task("tiny_kimi_k2_muon", overrides)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "running ranks" in err[0], err
    assert "Traceback" not in err[0]


def test_a_document_takes_no_overrides():
    document = to_document(build_recipe("tiny_kimi_k2_muon"))
    with pytest.raises(ValueError, match=r"overrides must be empty with a resolved recipe document .*got \['a=b'\]"):
        nemo_run_task(document, ["a=b"])
