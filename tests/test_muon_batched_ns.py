"""Muon's ``batch_ns``: same-shape matrices of a step orthogonalized in one stacked NS call give the per-matrix
result within fp32 rounding."""

from __future__ import annotations

import pytest
import torch

import nemo_muon.optim.muon as muon_module
from nemo_muon.optim.muon import Muon, newton_schulz_stacked
from nemo_muon.optim.ns_iteration import newton_schulz


def _params(seed: int = 0) -> list[tuple[str, torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(seed)
    shapes = {f"layers.{i}.mlp.down_proj.weight": (24, 40) for i in range(3)}
    shapes |= {f"layers.{i}.self_attn.o_proj.weight": (40, 40) for i in range(2)}
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


def test_batched_muon_steps_equal_the_per_matrix_steps(monkeypatch) -> None:
    calls: list[list[tuple[int, ...]]] = []
    many = muon_module.newton_schulz_many

    def spy(xs, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append([tuple(x.shape) for x in xs])
        return many(xs, *args, **kwargs)

    monkeypatch.setattr(muon_module, "newton_schulz_many", spy)
    runs = {}
    for batch in (False, True):
        params = _params()
        opt = Muon(params, lr=0.02, weight_decay=0.1, batch_ns=batch)
        calls.clear()
        for step in range(3):
            g = torch.Generator().manual_seed(100 + step)
            for _, p in params:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        runs[batch] = ({n: p.detach().clone() for n, p in params}, list(calls))
    (plain, plain_calls), (batched, batched_calls) = runs[False], runs[True]
    assert len(plain_calls) == 3 * 8 and len(batched_calls) == 3  # one call per step instead of one per matrix
    assert sorted(batched_calls[0]) == sorted([(3 + 2 * 4, 24, 40), (2, 40, 40), (56, 40)])  # stacked; single as is
    for name, p in plain.items():
        assert (batched[name] - p).abs().max().item() <= 1e-6 * max(1.0, p.abs().max().item()), name


@pytest.mark.parametrize("shapes", [[(8, 8)], [(8, 16), (16, 8)]])
def test_a_shape_met_once_is_not_stacked(shapes) -> None:
    xs = [torch.randn(*s) for s in shapes]
    got = newton_schulz_stacked(xs, 5, "quintic", precision="fp32")
    assert all(torch.equal(y, newton_schulz(x, 5, "quintic")) for x, y in zip(xs, got, strict=True))
