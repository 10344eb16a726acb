"""Tiny Kimi-K2-family (MLA, MoE + shared expert, dense first layer) and Qwen3-MoE models train through
Megatron-Core's real stack on 2 gloo CPU ranks, on whichever Megatron-Core this interpreter has (0.19.2 in .venv,
0.16.0 in the container-stack environment; `make test` runs this file in both): loss falls, DP replicas are
identical, and a Megatron `dist_checkpointing` save + resume continues the loss curve bit for bit."""

from __future__ import annotations

import importlib.metadata

import pytest

from nemo_muon.megatron.stack import installed_versions, problems_for_optimizer
from tests.distributed import run_distributed
from tests.megatron_cpu.training import train_tiny

MCORE = importlib.metadata.version("megatron-core")
STEPS = 12


def _runs(optimizer: str) -> bool:
    return not problems_for_optimizer(optimizer, installed_versions())


@pytest.mark.parametrize("spec", ["tiny_kimi_k2", "tiny_qwen3_moe"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_tiny_model_trains_through_megatron(spec, optimizer):
    if not _runs(optimizer):  # the stack refuses it: the refusal is what is tested (0.16 + emerging-optimizers 0.3)
        with pytest.raises(RuntimeError, match=f"optimizer.name='{optimizer}' cannot run on the installed stack"):
            run_distributed(train_tiny, world_size=2, args=(spec, optimizer, 1), timeout_s=240)
        return
    result = run_distributed(train_tiny, world_size=2, args=(spec, optimizer, STEPS), timeout_s=240)[0]
    losses = result["losses"]
    assert len(losses) == STEPS
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 0.5, f"loss did not fall on megatron-core {MCORE}: {losses}"
    assert result["replica_max_diff"] == 0.0  # both DP ranks hold the same parameters after every update
    # Muon: whole matrices per DP rank (layer-wise) beside Adam for the rest; AdamW: ZeRO-1 sharded state
    expected = "LayerWiseDistributedOptimizer" if optimizer == "muon" else "DistributedOptimizer"
    assert expected in result["optimizers"], result["optimizers"]


@pytest.mark.parametrize("spec, optimizer", [("tiny_qwen3_moe", "adamw"), ("tiny_kimi_k2", "muon")])
def test_megatron_checkpoint_resume_continues_the_loss_curve(spec, optimizer, tmp_path):
    if not _runs(optimizer):
        assert optimizer == "muon"  # AdamW runs on every supported stack; Muon's refusal is tested above
        return
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # 6 steps straight, saving after step 3 (dist_checkpointing's writer starts processes: non-daemon ranks)
    straight = run_distributed(train_tiny, world_size=2, args=(spec, optimizer, 6, (), str(ckpt), 3),
                               timeout_s=240, daemon=False)[0]
    resumed = run_distributed(train_tiny, world_size=2, args=(spec, optimizer, 3, (), str(ckpt), None, 3),
                              timeout_s=240, daemon=False)[0]
    assert resumed["losses"] == straight["losses"][3:]  # same steps 4-6, bit for bit, after save + load
    assert resumed["replica_max_diff"] == 0.0
