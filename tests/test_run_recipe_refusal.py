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


def test_torchrun_ends_quietly_only_when_every_failed_rank_was_refused():
    """`nemo_muon.launchers.torchrun` keeps torchrun's failure report unless the first failure exited with a refusal
    code and the others with it or the agent's SIGTERM (the ranks it stopped)."""
    import logging

    from nemo_muon.launchers.torchrun import RefusalLines, refusal_exit

    assert refusal_exit({0: 2, 1: -15}, first=0) == 2
    assert refusal_exit({0: 3}, first=0) == 3
    assert refusal_exit({0: 1, 1: -15}, first=0) is None  # a crash: torchrun's block and exit code
    assert refusal_exit({0: 2, 1: 1}, first=0) is None  # a refusal and a crash: the crash is reported
    assert refusal_exit({0: 2, 1: -9}, first=0) is None  # a rank killed by something else than the agent

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("torch.distributed.elastic", logging.ERROR, __file__, 1, message, (), None)

    lines = RefusalLines()
    assert not lines.filter(record("Sending process 7 closing signal SIGTERM"))
    assert not lines.filter(record("failed (exitcode: 2) local_rank: 0 (pid: 8) of binary: python"))
    assert lines.filter(record("failed (exitcode: 1) local_rank: 1 (pid: 9) of binary: python"))
