"""nemo_muon.Muon on one process: the update rule, scale modes, the AdamW part, optimizer conventions (state_dict,
zero_grad, closures, schedulers), non-finite gradients, low-precision params, bad input."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from nemo_muon.optim.muon import Muon, muon_scale
from nemo_muon.optim.ns_iteration import newton_schulz


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 24), torch.nn.LayerNorm(24),
                               torch.nn.Linear(24, 5))


def _named(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    names = {"0.weight": "embed_tokens.weight", "3.weight": "lm_head.weight", "3.bias": "lm_head.bias"}
    return [(names.get(n, n), p) for n, p in model.named_parameters()]


def _loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return model(torch.randint(0, 11, (16,), generator=g)).pow(2).mean()


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for s in steps:
        opt.zero_grad()
        _loss(model, s).backward()
        opt.step()


def test_update_is_the_scaled_orthogonalized_momentum() -> None:
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(12, 40))
    g1, g2 = torch.randn(12, 40), torch.randn(12, 40)
    opt = Muon([("w", p)], lr=0.1, weight_decay=0.5, momentum=0.9, nesterov=True, scale_mode="spectral")
    w0 = p.detach().clone()
    p.grad = g1
    opt.step()
    p.grad = g2
    w1 = p.detach().clone()
    opt.step()
    buf = 0.1 * g1
    u1 = g1.lerp(buf, 0.9)
    assert torch.allclose(w1, w0 * (1 - 0.1 * 0.5) - 0.1 * newton_schulz(u1) * math.sqrt(40), atol=1e-5)
    buf = buf.lerp(g2, 0.1)
    u2 = g2.lerp(buf, 0.9)
    assert torch.allclose(p.detach(), w1 * (1 - 0.05) - 0.1 * newton_schulz(u2) * math.sqrt(40), atol=1e-5)


def test_plain_momentum_without_nesterov() -> None:
    torch.manual_seed(2)
    p = torch.nn.Parameter(torch.zeros(6, 6))
    opt = Muon([("w", p)], lr=1.0, weight_decay=0.0, nesterov=False, momentum=0.5, scale_mode="unit_rms_norm")
    g1, g2 = torch.randn(6, 6), torch.randn(6, 6)
    p.grad = g1
    opt.step()
    p.grad = g2
    before = p.detach().clone()
    opt.step()
    assert torch.allclose(before - p.detach(), newton_schulz(0.25 * g1 + 0.5 * g2), atol=1e-5)


@pytest.mark.parametrize(("mode", "expected"), [
    ("spectral", math.sqrt(32)), ("shape_scaling", 1.0), ("unit_rms_norm", math.sqrt(8 / 32)),
    ("match_rms_adamw", 0.2 * math.sqrt(32)),
])
def test_scale_modes(mode: str, expected: float) -> None:
    assert muon_scale(8, 32, mode) == pytest.approx(expected)
    assert muon_scale(32, 8, "shape_scaling") == pytest.approx(2.0)
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.zeros(8, 32))
    g = torch.randn(8, 32)
    p.grad = g
    Muon([("w", p)], lr=1.0, scale_mode=mode, extra_scale_factor=0.5).step()
    assert torch.allclose(-p.detach(), newton_schulz(g) * expected * 0.5, atol=1e-5)


def test_adamw_part_matches_torch_adamw() -> None:
    torch.manual_seed(8)
    shapes = {"embed_tokens.weight": (11, 8), "lm_head.bias": (5,), "norm.weight": (24,)}
    ours = {n: torch.nn.Parameter(torch.randn(s)) for n, s in shapes.items()}
    ref = {n: torch.nn.Parameter(p.detach().clone()) for n, p in ours.items()}
    opt = Muon(list(ours.items()), lr=1e-2, weight_decay=0.1, adamw_betas=(0.8, 0.9), adamw_eps=1e-6)
    ref_opt = torch.optim.AdamW(ref.values(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-6)
    for _ in range(3):
        for n in shapes:
            ours[n].grad = torch.randn(shapes[n])
            ref[n].grad = ours[n].grad.clone()
        opt.step()
        ref_opt.step()
    for n in shapes:
        assert torch.allclose(ours[n], ref[n], atol=1e-6, rtol=0), n


def test_adamw_lr_follows_the_scheduler() -> None:
    torch.manual_seed(4)
    b = torch.nn.Parameter(torch.zeros(4))
    opt = Muon([("bias", b)], lr=1.0, weight_decay=0.0, adamw_lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    deltas = []
    for _ in range(2):
        b.grad = torch.ones(4)
        before = b.detach().clone()
        opt.step()
        sched.step()
        deltas.append((before - b.detach()).abs().max().item())
    assert deltas[0] == pytest.approx(0.1, rel=1e-4)  # first AdamW step moves by lr
    assert deltas[1] == pytest.approx(0.05, rel=1e-4)  # halved with the scheduler
    assert opt.param_groups[0]["lr"] == 0.25


def test_state_dict_roundtrip_resumes_bitwise() -> None:
    model = _model()
    opt = Muon(_named(model), lr=1e-2, weight_decay=0.1)
    _train(model, opt, range(2))
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    _train(model, opt, range(2, 4))
    resumed = _model()
    resumed.load_state_dict(saved_model)
    resumed_opt = Muon(_named(resumed), lr=1e-2, weight_decay=0.1)
    resumed_opt.load_state_dict(saved_opt)
    _train(resumed, resumed_opt, range(2, 4))
    for (n, p), q in zip(model.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q), n


def test_zero_grad_and_closure() -> None:
    model = _model()
    opt = Muon(_named(model), lr=1e-2)
    calls = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _loss(model, 0)
        loss.backward()
        calls.append(loss.item())
        return loss

    loss = opt.step(closure)
    assert calls == [loss.item()]
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_nonfinite_grad_skips_the_whole_step_and_warns_once() -> None:
    model = _model()
    opt = Muon(_named(model), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        opt.zero_grad()
        _loss(model, 0).backward()
        model[2].weight.grad[3] = float("nan")
        assert opt.has_nonfinite_grads() and opt.nonfinite_param_names() == ["2.weight"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        assert opt.last_step_skipped
        if opt.skipped_steps == 1:
            assert len(caught) == 1 and "non-finite gradient in 2.weight" in str(caught[0].message)
        else:
            assert caught == []
    assert opt.skipped_steps == 2
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert opt.state == {} or all(not s for s in opt.state.values())
    opt.zero_grad()
    _loss(model, 0).backward()
    opt.step()
    assert not opt.last_step_skipped and opt.skipped_steps == 2


def test_nonfinite_raise_names_the_param() -> None:
    model = _model()
    opt = Muon(_named(model), lr=1e-2, nonfinite="raise")
    _loss(model, 0).backward()
    model[1].weight.grad[0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="non-finite gradient in 1.weight"):
        opt.step()


def test_caller_side_nonfinite_check() -> None:
    torch.manual_seed(5)
    p = torch.nn.Parameter(torch.randn(4, 4))
    opt = Muon([("w", p)], lr=1e-2)
    p.grad = torch.randn(4, 4)
    assert not opt.has_nonfinite_grads()
    before = p.detach().clone()
    opt.step(skip_nonfinite_check=True)
    assert not torch.equal(before, p.detach())
    with pytest.warns(UserWarning, match="outside this optimizer"):
        opt.report_nonfinite()  # what a caller does after a global (all-reduced) check found a NaN elsewhere
    assert opt.last_step_skipped and opt.skipped_steps == 1


def test_bf16_params_with_fp32_master_weights() -> None:
    torch.manual_seed(6)
    init = torch.ones(8, 8)
    plain = torch.nn.Parameter(init.clone().bfloat16())
    master = torch.nn.Parameter(init.clone().bfloat16())
    opt_plain = Muon([("w", plain)], lr=1e-4, scale_mode="shape_scaling")
    opt_master = Muon([("w", master)], lr=1e-4, scale_mode="shape_scaling", master_weights=True)
    for _ in range(20):
        g = torch.randn(8, 8).bfloat16()
        plain.grad, master.grad = g.clone(), g.clone()
        opt_plain.step()
        opt_master.step()
    state = opt_master.state[master]
    assert state["master"].dtype == torch.float32 and state["momentum_buffer"].dtype == torch.float32
    assert torch.equal(master.detach(), state["master"].bfloat16())
    assert torch.equal(plain.detach(), init.bfloat16())  # 1e-4 steps vanish in bf16 without a master copy
    assert (state["master"] - init).abs().max() > 1e-4  # ... and accumulate with one
    saved = opt_master.state_dict()
    fresh = Muon([("w", master)], lr=1e-4, master_weights=True)
    fresh.load_state_dict(saved)
    assert fresh.state[master]["master"].dtype == torch.float32  # not cast down to the param dtype


def test_fp16_params_and_bf16_newton_schulz() -> None:
    """An fp16 param moves by the bf16-NS update (to fp16 rounding, ~1e-3 here), which is measurably not the fp32-NS
    one (~2e-2 apart), so ns_precision is honoured and the fp16 param is updated in its own dtype."""
    torch.manual_seed(7)
    p = torch.nn.Parameter(torch.zeros(8, 16).half())
    opt = Muon([("w", p)], lr=1.0, ns_precision="bf16", scale_mode="spectral")
    g = torch.randn(8, 16).half()
    p.grad = g.clone()
    opt.step()
    assert p.dtype == torch.float16
    want = -newton_schulz(g.float(), precision="bf16") * math.sqrt(16)
    fp32 = -newton_schulz(g.float(), precision="fp32") * math.sqrt(16)
    assert (p.detach().float() - want).abs().max().item() < 2e-3
    assert (want - fp32).abs().max().item() > 5e-3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lr": -1.0}, "muon.lr must be a number in"),
    ({"momentum": 1.0}, "muon.momentum must be a number in"),
    ({"momentum": float("nan")}, "muon.momentum must be a number in"),
    ({"tp_mode": "dup"}, "muon.tp_mode must be one of"),
    ({"coefficients": "cubic"}, "muon.coefficients must be one of"),
    ({"scale_mode": "rms"}, "muon.scale_mode must be one of"),
    ({"nonfinite": "ignore"}, "muon.nonfinite must be one of"),
    ({"ns_steps": 0}, "muon.ns_steps must be an integer"),
    ({"adamw_betas": (0.9,)}, "muon.adamw_betas must be a pair"),
])
def test_bad_arguments_name_the_field(kwargs: dict, message: str) -> None:
    args = {"lr": 1e-3, **kwargs}
    with pytest.raises(ValueError, match=message):
        Muon([("w", torch.nn.Parameter(torch.randn(3, 3)))], **args)


def test_named_params_inside_param_groups() -> None:
    model = _model()
    named = _named(model)
    opt = Muon([{"params": named[:3], "lr": 0.1}, {"params": named[3:], "weight_decay": 0.0}], lr=1e-2)
    assert opt.param_groups[0]["param_names"] == ["embed_tokens.weight", "1.weight", "1.bias"]
    assert opt.route_of(named[0][1]).algorithm == "adamw" and opt.route_of(named[1][1]).algorithm == "matrix"
    _train(model, opt, range(2))
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0


def test_build_optimizer_from_configs() -> None:
    from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig
    from nemo_muon.optim.factory import build_optimizer
    from nemo_muon.optim.soap import SOAP

    model = _model()
    muon = build_optimizer(MuonConfig(lr=0.02, weight_decay=0.05, coefficients="polar_express"), _named(model),
                           master_weights=True)
    assert isinstance(muon, Muon) and muon.master_weights
    assert muon.param_groups[0]["coefficients"] == "polar_express" and muon.param_groups[0]["weight_decay"] == 0.05
    soap = build_optimizer(SoapConfig(lr=1e-3, precondition_frequency=7), _named(model))
    assert isinstance(soap, SOAP) and soap.param_groups[0]["precondition_frequency"] == 7
    adamw = build_optimizer(AdamWConfig(lr=1e-3, betas=(0.8, 0.9)), model.parameters())
    assert type(adamw) is torch.optim.AdamW and adamw.param_groups[0]["betas"] == (0.8, 0.9)
    _train(model, muon, range(1))
    with pytest.raises(ValueError, match=r"runtime arguments for soap must be among .*; got \['tp_mode'\]"):
        build_optimizer(SoapConfig(), _named(model), tp_mode="distributed")
    with pytest.raises(ValueError, match=r"runtime arguments for adamw must be among \(\); got \['tp_group'\]"):
        build_optimizer(AdamWConfig(), model.parameters(), tp_group=None)
    cfg = MuonConfig()
    cfg.momentum = 1.5  # recipes may mutate: validated again when built
    with pytest.raises(ValueError, match="muon.momentum must be a number in"):
        build_optimizer(cfg, _named(model))


def test_param_group_overrides_are_validated() -> None:
    w = torch.nn.Parameter(torch.randn(3, 3))
    with pytest.raises(ValueError, match=r"param_groups\[0\]: muon.momentum must be a number in"):
        Muon([{"params": [w], "momentum": 1.5}], lr=1e-3)
    opt = Muon([{"params": [("w", w)], "ns_steps": 3}], lr=1e-3)
    with pytest.raises(ValueError, match=r"param_groups\[1\]: muon.coefficients must be one of"):
        opt.add_param_group({"params": [("v", torch.nn.Parameter(torch.randn(2, 2)))], "coefficients": "cubic"})
    assert len(opt.param_groups) == 1


def test_every_shared_default_equals_the_configs() -> None:
    """Muon's and SOAP's keyword defaults are the configs' defaults, field by field (no second default)."""
    import dataclasses
    import inspect

    from nemo_muon.config.optimizer import MuonConfig, SoapConfig
    from nemo_muon.optim.soap import SOAP

    for cls, cfg in ((Muon, MuonConfig()), (SOAP, SoapConfig())):
        signature = inspect.signature(cls.__init__).parameters
        shared = [f.name for f in dataclasses.fields(cfg) if f.init and f.name in signature and f.name != "lr"]
        assert len(shared) >= 5, (cls.__name__, shared)
        for name in shared:
            default = signature[name].default
            expected = getattr(cfg, name)
            assert (tuple(default) if isinstance(default, list) else default) == expected, (cls.__name__, name)
