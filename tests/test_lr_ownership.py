"""The learning rate has one owner: a torch LR scheduler sets absolute rates on the optimizer's param groups, the
whole-tensor optimizer applies that rate (also with a factory optimizer), the metrics log it, a resume restores it."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from nemo_muon.config.recipe import SchedulerConfig
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer
from nemo_muon.optim.routed import place_state_value
from nemo_muon.train.schedule import build_lr_scheduler, lr_multiplier


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5, bias=False), torch.nn.Linear(5, 3))


def _sgd(named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for _, p in named], lr=0.5)


def test_a_factory_optimizer_gets_the_schedules_absolute_rate() -> None:
    """With a factory, ``param_groups[0]['lr']`` is the rate applied (it was a ratio to the factory's own lr)."""
    model = _model()
    optimizer = WholeTensorOptimizer(model, _sgd, dp_group=None)
    assert optimizer.param_groups[0]["lr"] == 0.5  # the factory's rate, read from the optimizer it built
    cfg = SchedulerConfig(kind="constant", warmup_steps=2)
    sched = build_lr_scheduler(optimizer, cfg, 4, peak_lr=0.01)
    for step in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        grads = [torch.randn_like(p) for p in model.parameters()]
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g.clone()
        rate = 0.01 * lr_multiplier(cfg, step, 4)
        assert optimizer.param_groups[0]["lr"] == rate
        optimizer.step()
        assert optimizer.inner.param_groups[0]["lr"] == rate
        for p, b, g in zip(model.parameters(), before, grads, strict=True):
            assert torch.equal(p.detach(), b.add(g, alpha=-rate))
        sched.step()


def test_groups_keep_their_ratio_to_the_reference_rate() -> None:
    """A factory with two rates: the largest is the reference, the other keeps its ratio."""
    def two_rates(named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer:
        return torch.optim.SGD([{"params": [named[0][1]], "lr": 0.4}, {"params": [p for _, p in named[1:]],
                                                                          "lr": 0.1}])
    optimizer = WholeTensorOptimizer(_model(), two_rates, dp_group=None)
    assert optimizer.param_groups[0]["lr"] == 0.4
    optimizer.param_groups[0]["lr"] = 0.02
    for p in optimizer.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert [g["lr"] for g in optimizer.inner.param_groups] == [0.02, pytest.approx(0.005, rel=1e-15)]


def test_the_scheduler_sets_the_rate_of_its_start_step() -> None:
    optimizer = WholeTensorOptimizer(_model(), _sgd, dp_group=None)
    cfg = SchedulerConfig(kind="cosine", warmup_steps=1, min_lr_ratio=0.1)
    sched = build_lr_scheduler(optimizer, cfg, 5, peak_lr=0.02, start_step=3)
    assert optimizer.param_groups[0]["lr"] == 0.02 * lr_multiplier(cfg, 3, 5)
    for p in optimizer.param_groups[0]["params"]:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    sched.step()
    assert optimizer.param_groups[0]["lr"] == 0.02 * lr_multiplier(cfg, 4, 5)
    optimizer.step()
    sched.step()  # past the end: the last step's rate
    assert optimizer.param_groups[0]["lr"] == 0.02 * lr_multiplier(cfg, 4, 5)
    with pytest.raises(ValueError, match=r"start_step must be in \[0, 5\]; got 6"):
        build_lr_scheduler(optimizer, cfg, 5, peak_lr=0.02, start_step=6)


def test_loaded_step_counts_stay_on_the_host() -> None:
    """A loaded AdamW/SOAP ``step`` stays a host tensor (reading it is then no device sync per parameter); the other
    state tensors go to the parameter's device (``meta`` stands in for a GPU)."""
    meta = torch.device("meta")
    assert place_state_value("step", torch.tensor(3.0), meta).device.type == "cpu"
    assert place_state_value("exp_avg", torch.ones(2), meta).device == meta
    assert place_state_value("lr", 0.1, meta) == 0.1
    from nemo_muon.optim.muon import Muon

    src = Muon([("lm_head.weight", torch.nn.Parameter(torch.ones(4, 3)))], lr=0.01)
    src.param_groups[0]["params"][0].grad = torch.ones(4, 3)
    src.step()
    dst = Muon([("lm_head.weight", torch.nn.Parameter(torch.empty(4, 3, device=meta)))], lr=0.01)
    dst.load_state_dict(src.state_dict())
    state = next(iter(dst.state.values()))
    assert state["step"].device.type == "cpu" and state["exp_avg"].device == meta


def _count_host_reads(monkeypatch, reads: dict[str, int], files: tuple[str, ...]) -> None:  # noqa: ANN001
    """Count ``Tensor.item`` / ``float(tensor)`` / ``bool(tensor)`` called from ``files`` (each a host sync on a GPU)."""
    for method in ("item", "__float__", "__bool__"):
        original = getattr(torch.Tensor, method)

        def counted(self: torch.Tensor, *args, _original=original):  # noqa: ANN002, ANN202
            caller = sys._getframe(1).f_code.co_filename
            for f in files:
                if caller.endswith(f):
                    reads[f] = reads.get(f, 0) + 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, method, counted)


def test_the_logged_lr_is_the_rate_applied_and_a_resume_restores_it(tmp_path, monkeypatch) -> None:
    """A short single-process Muon run, interrupted after 2 of 4 steps and resumed: every logged lr is the rate the
    inner optimizer applied at that step, the schedule's; the rate restored from the checkpoint is the one the
    resumed step applies (the scheduler does not have to correct it). The resumed run reads the device from the loop
    once per step and once per validation (not per micro-batch: 4 per step here) and from the whole-tensor optimizer twice
    per step (grad norm, non-finite check; not once per tensor)."""
    from nemo_muon.train.loop import train
    from tests.test_train_loop import short

    applied: list[float] = []
    restored: list[float] = []
    step, load = WholeTensorOptimizer.step, WholeTensorOptimizer.load_state_dict

    def spy_step(self: WholeTensorOptimizer, closure: None = None) -> None:
        step(self, closure)
        applied.append(self.inner.param_groups[0]["lr"])

    def spy_load(self: WholeTensorOptimizer, state_dict: dict) -> None:
        load(self, state_dict)
        restored.append(self.param_groups[0]["lr"])

    monkeypatch.setattr(WholeTensorOptimizer, "step", spy_step)
    monkeypatch.setattr(WholeTensorOptimizer, "load_state_dict", spy_load)

    def recipe(resume: bool):  # noqa: ANN202
        r = short("tiny_qwen3_moe_muon", tmp_path, steps=4)
        r.trainer.micro_batch_size, r.system.num_nodes, r.system.gpus_per_node = 2, 1, 1
        r.scheduler.warmup_steps, r.checkpoint.save_interval, r.checkpoint.resume = 3, 2, resume
        r.validate()
        return r

    first = recipe(False)
    train(first, stop_after_steps=2)
    reads: dict[str, int] = {}
    loop_file = "nemo_muon/train/loop.py"
    optimizer_files = ("nemo_muon/layerwise/optimizer.py", "nemo_muon/layerwise/grad_reduction.py")  # the whole-tensor optimizer's parts
    _count_host_reads(monkeypatch, reads, (loop_file, *optimizer_files))
    out = train(recipe(True))
    assert reads.get(loop_file) == 2 + 2, reads  # steps 3, 4 each validated (eval_interval 3, end)
    assert sum(reads.get(f, 0) for f in optimizer_files) == 2 * 2, reads
    assert out["start_step"] == 2
    expected = [first.optimizer.lr * lr_multiplier(first.scheduler, s, 4) for s in range(4)]
    assert len(set(expected)) == 4
    events = [json.loads(line) for line in open(f"{out['run_dir']}/metrics.jsonl", encoding="utf-8")]
    logged = [e["lr"] for e in events if e["event"] == "train"]
    assert logged == applied and applied == pytest.approx(expected, rel=1e-15)
    assert restored == [applied[2]]
