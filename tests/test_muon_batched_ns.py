"""Muon's batched step (``batch_ns=True``, the default): same-shape matrices stacked into one Newton–Schulz call and
the element-wise work multi-tensor give the per-matrix step's result within fp32 reordering of the batched GEMMs
(`tests.tolerances.update_tolerance` per step), with the momentum bit for bit."""

from __future__ import annotations

import pytest
import torch

import nemo_muon.optim.muon_batched as batched_module
from nemo_muon.optim.muon import Muon, newton_schulz_stacked
from nemo_muon.optim.ns_iteration import newton_schulz
from nemo_muon.optim.routing import QKVLayout
from tests.tolerances import update_tolerance

LR, STEPS = 0.02, 3
LAYOUTS = {"linear_qkv": QKVLayout(num_attention_heads=4, num_query_groups=2, head_dim=4)}


def _params(seed: int = 0) -> list[tuple[str, torch.nn.Parameter]]:
    """Every kind of member a stack can have: plain matrices of one shape over layers, square ones, 3-D expert
    stacks of that shape, a fused gate/up (linear_fc1) and a fused QKV over layers, one shape met once, a vector."""
    g = torch.Generator().manual_seed(seed)
    shapes = {f"layers.{i}.mlp.down_proj.weight": (24, 40) for i in range(3)}
    shapes |= {f"layers.{i}.self_attn.o_proj.weight": (40, 40) for i in range(2)}
    shapes |= {f"layers.{i}.mlp.linear_fc1.weight": (48, 40) for i in range(2)}
    shapes |= {f"layers.{i}.self_attention.linear_qkv.weight": (32, 40) for i in range(2)}
    shapes |= {"layers.0.mlp.experts.down_proj": (4, 24, 40), "layers.1.mlp.experts.down_proj": (4, 24, 40),
               "layers.0.mlp.up_proj.weight": (56, 40), "model.norm.weight": (40,)}
    return [(n, torch.nn.Parameter(torch.randn(*s, generator=g) * 0.1)) for n, s in shapes.items()]


def test_stacked_ns_equals_one_call_per_matrix() -> None:
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(24, 40, generator=g) for _ in range(3)] + [torch.randn(4, 24, 40, generator=g),
                                                                 torch.randn(40, 24, generator=g)]
    got = newton_schulz_stacked(xs, 5, "quintic", precision="fp32")
    for x, y in zip(xs, got, strict=True):
        want = newton_schulz(x, 5, "quintic")
        assert y.shape == x.shape and (y - want).abs().max().item() < 1e-5


def _run(batch: bool, stack_bytes: int, monkeypatch) -> tuple[dict, dict, list]:  # noqa: ANN001
    from nemo_muon.optim.ns_iteration import newton_schulz_many as many

    calls: list[list[tuple[int, ...]]] = []

    def spy(xs, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append([tuple(x.shape) for x in xs])
        return many(xs, *args, **kwargs)

    monkeypatch.setattr(batched_module, "newton_schulz_many", spy)
    params = _params()
    named = dict(params)
    groups = [{"params": [(n, p) for n, p in params if "o_proj" not in n]},
              {"params": [(n, p) for n, p in params if "o_proj" in n], "nesterov": False, "lr": LR / 2}]
    opt = Muon(groups, lr=LR, weight_decay=0.1, batch_ns=batch, stack_bytes=stack_bytes, fused_layouts=LAYOUTS)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 + step)
        for _, p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    momenta = {n: opt.state[p]["momentum_buffer"].clone() for n, p in named.items() if p.ndim > 1}
    return {n: p.detach().clone() for n, p in params}, momenta, calls


@pytest.mark.parametrize("stack_bytes", [2**30, 4 * 24 * 40 * 4], ids=["one_stack_per_class", "stacks_of_4"])
def test_batched_muon_steps_equal_the_per_matrix_steps(stack_bytes: int, monkeypatch) -> None:
    plain, plain_momenta, plain_calls = _run(False, stack_bytes, monkeypatch)
    batched, batched_momenta, calls = _run(True, stack_bytes, monkeypatch)
    assert not plain_calls  # the per-matrix step never enters the batched path
    if stack_bytes == 2**30:
        assert len(calls) == STEPS, calls  # one NS call per step: one batch
    else:
        assert len(calls) > STEPS and max(len(c) for c in calls) > 1, calls  # several batches, some stacked
    start = dict(_params())
    for name, p in plain.items():
        bound = STEPS * update_tolerance(LR, max(p.shape[-2:], default=1), min(p.shape[-2:], default=1))
        assert (batched[name] - p).abs().max().item() <= bound, name
        assert (p - start[name]).abs().max().item() > 10 * bound, name  # far more than the bound moved it
    for name, m in plain_momenta.items():
        assert torch.equal(batched_momenta[name], m), name  # the same lerp, operator for operator


def test_fused_weights_are_split_once_per_stack() -> None:
    """Two fused QKV weights of one shape: their Q, K and V parts reach Newton–Schulz as stacks of two (the K and V
    stacks, of one shape, stacked again into one of four)."""
    from nemo_muon.optim.ns_iteration import newton_schulz_many

    seen: list[list[tuple[int, ...]]] = []

    def spy(xs, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append([tuple(x.shape) for x in xs])
        return newton_schulz_many(xs, *args, **kwargs)

    params = [(n, p) for n, p in _params() if "linear_qkv" in n]
    opt = Muon(params, lr=LR, fused_layouts=LAYOUTS)
    for _, p in params:
        p.grad = torch.randn_like(p)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batched_module, "newton_schulz_many", spy)
        opt.step()
    assert seen == [[(2, 16, 40), (2, 8, 40), (2, 8, 40)]]  # q: 2 groups x 8 rows, k and v: 2 x 4


@pytest.mark.parametrize("shapes", [[(8, 8)], [(8, 16), (16, 8)]])
def test_a_shape_met_once_is_not_stacked(shapes) -> None:
    xs = [torch.randn(*s) for s in shapes]
    got = newton_schulz_stacked(xs, 5, "quintic", precision="fp32")
    assert all(torch.equal(y, newton_schulz(x, 5, "quintic")) for x, y in zip(xs, got, strict=True))


def test_stack_bytes_is_checked() -> None:
    with pytest.raises(ValueError, match=r"stack_bytes must be an integer >= 1; got 0"):
        Muon(_params(), lr=LR, stack_bytes=0)
