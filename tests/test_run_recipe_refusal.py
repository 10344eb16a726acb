"""What each rank of a NeMo-Run launch runs (`nemo_muon.recipes.execute.run_recipe`) reports a refusal of the run as
`nemo-muon launch` does: one line from rank 0, the refusal's exit code, no traceback."""

from __future__ import annotations

import pytest
from nemo_muon.recipes.execute import run_recipe


def test_a_refused_run_is_one_line_and_exit_code_2(capsys, monkeypatch, tmp_path):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    # the tiny recipe asks for 2 ranks; this process is one rank alone: the loop refuses before training
    with pytest.raises(SystemExit) as exited:
        run_recipe("tiny_kimi_k2_muon", [f"logging.root={tmp_path}", "trainer.max_steps=2", "scheduler.warmup_steps=1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "running ranks" in err[0], err
    assert "Traceback" not in err[0]
