"""SOAP through Megatron-Bridge's own checkpoint functions, on the model and optimizer Bridge's own setup builds with
the product's default wiring (Megatron's legacy layer-wise path; the cost layout where the recipe opts in with
``optimizer.collectives=reduce_scatter``, `routes_cost_layout`): saves every
other step, a resume that continues the loss curve bit for bit, no save touching an earlier checkpoint's files
(Megatron-Bridge #2307: the layer-wise optimizer's file at the save root), and a rank killed inside a save leaving
the previous checkpoint the one a resume loads. Runs in every release environment after 26.02 (Makefile)."""

from __future__ import annotations

import json

import pytest

from nemo_muon.layerwise.checkpoint import CheckpointError
from nemo_muon.megatron.bridge.container import routes_cost_layout as routes
from nemo_muon.megatron.shared.checkpoint_files import TRACKER_FILE, check_checkpoint_files, check_resume_folder
from tests.distributed import run_distributed
from tests.megatron_cpu.bridge_checkpoint import _files, resume_and_die_in_save, train_and_save
from tests.megatron_cpu.training import optimizer_config

OPTIMIZER = "soap"
TRACKERS = {TRACKER_FILE, "latest_train_state.pt"}
"""What Bridge writes at the save root besides the checkpoint folders (Megatron's tracker and Bridge's)."""


def _under(files: dict[str, str], folder: str) -> dict[str, str]:
    return {k: v for k, v in files.items() if k.startswith(folder + "/")}


def test_soap_saves_resumes_and_survives_a_killed_save_through_bridges_checkpoints(tmp_path):
    cost_layout = routes(optimizer_config(OPTIMIZER))  # what the installed Bridge trains on (product's decision)
    root = tmp_path / "checkpoints"
    straight = run_distributed(train_and_save, world_size=2, args=(OPTIMIZER, str(root), 5, (2, 4), cost_layout),
                               timeout_s=300, daemon=False)[0]
    assert "SOAP" not in straight["optimizer"] and straight["rng_reads"] > 0  # Bridge's chain; its save read RNG
    after_2, after_4 = straight["files"][2], straight["files"][4]
    assert _under(after_2, "iter_0000002") and _under(after_4, "iter_0000004")
    assert _under(after_4, "iter_0000002") == _under(after_2, "iter_0000002")  # the second save replaced nothing
    assert {k for k in after_4 if "/" not in k} == TRACKERS  # no layer_wise_optimizer_<r>.pt at the root (#2307)
    check_checkpoint_files(root / "iter_0000004")

    with pytest.raises(RuntimeError, match="a rank died with exit code 9"):
        run_distributed(resume_and_die_in_save, world_size=2, args=(OPTIMIZER, str(root), cost_layout, 1),
                        timeout_s=300, daemon=False, collective_timeout_s=5)
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed == {"iteration": 4, "loss": straight["losses"][4]}  # step 5 after the resume, bit for bit

    after_kill = _files(str(root))
    assert {k: after_kill[k] for k in after_4} == after_4  # the killed save touched no earlier file
    assert _under(after_kill, "iter_0000006"), "the killed save started writing"
    assert (root / TRACKER_FILE).read_text().strip() == "4"
    assert check_resume_folder(root) == root / "iter_0000004"  # a resume loads the last complete save
    with pytest.raises(CheckpointError, match=r"iter_0000006/\.metadata must be a readable regular file"):
        check_checkpoint_files(root / "iter_0000006")  # the incomplete one is refused by name if pointed at
