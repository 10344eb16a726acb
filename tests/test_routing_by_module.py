"""Routing by what a parameter is (issue 37 item 1) on plain ``torch.nn`` models: ``Muon(model)`` reads module types,
tying and nn.MultiheadAttention's fused QKV; ``Muon(model.named_parameters())`` keeps the name rule and reports what it
cannot place; unknown keywords name the allowed ones; ``opt.routes()``; non-real parameters refused (issue 35)."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
from torch import nn

from nemo_muon.optim.keywords import UnknownKeywordError
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.normuon import NorMuon
from nemo_muon.optim.ns_iteration import newton_schulz
from nemo_muon.optim.routing import ADAMW, MATRIX, QKVLayout
from nemo_muon.optim.soap import SOAP

VOCAB, DIM = 50, 16


class TinyLM(nn.Module):
    """Layers named as people name them (``emb``, ``head``), an nn.MultiheadAttention, a norm, a scalar."""

    def __init__(self, *, tie: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.norm = nn.LayerNorm(DIM)
        self.ff = nn.Linear(DIM, 32)
        self.ff2 = nn.Linear(32, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.scale = nn.Parameter(torch.tensor(1.0))
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        return self.head(h + self.ff2(torch.relu(self.ff(h)))) * self.scale


def _algorithms(opt: torch.optim.Optimizer, model: nn.Module) -> dict[str, str]:
    return {n: opt.route_of(p).algorithm for n, p in model.named_parameters()}


def test_module_routes_embedding_head_norm_bias_scalar_to_adamw() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the module settles every role: nothing to report
        opt = Muon(model, lr=0.02)
    got = _algorithms(opt, model)
    assert got == {"emb.weight": ADAMW, "attn.in_proj_weight": MATRIX, "attn.in_proj_bias": ADAMW,
                   "attn.out_proj.weight": MATRIX, "attn.out_proj.bias": ADAMW, "norm.weight": ADAMW,
                   "norm.bias": ADAMW, "ff.weight": MATRIX, "ff.bias": ADAMW, "ff2.weight": MATRIX, "ff2.bias": ADAMW,
                   "head.weight": ADAMW, "scale": ADAMW}
    assert opt.route_of(model.attn.in_proj_weight).layout == QKVLayout(1, 1, DIM)
    reasons = {r.name: r.reason for r in opt.routes()}
    assert "embedding (nn.Embedding 'emb')" in reasons["emb.weight"]
    assert "output head 'head'" in reasons["head.weight"] and "shaped like embedding 'emb'" in reasons["head.weight"]


def test_names_only_keeps_the_name_rule_and_reports_what_it_cannot_place() -> None:
    model = TinyLM()
    with pytest.warns(UserWarning, match=r"^Muon: routed by name only .*2 parameter\(s\) whose names hint at an "
                                         r"embedding or output head: emb\.weight, head\.weight; .*matrix_rule") as rec:
        opt = Muon(model.named_parameters(), lr=0.02)
    assert len(rec) == 1 and "\n" not in str(rec[0].message)
    got = _algorithms(opt, model)
    assert got["emb.weight"] == got["head.weight"] == MATRIX  # the documented name rule, now reported
    assert opt.route_of(model.attn.in_proj_weight).layout == QKVLayout(1, 1, DIM)  # torch's name: split by name too
    assert [r.name for r in opt.routes() if "unsure" in r.reason] == ["emb.weight", "head.weight"]


def test_tied_weights_follow_the_embedding_by_identity() -> None:
    class HeadFirst(nn.Module):  # the tied head is registered first and is not the last Linear
        def __init__(self) -> None:
            super().__init__()
            self.proj_out = nn.Linear(DIM, VOCAB, bias=False)
            self.table = nn.Embedding(VOCAB, DIM)
            self.proj_out.weight = self.table.weight
            self.body = nn.Linear(DIM, DIM)

    model = HeadFirst()
    assert [n for n, _ in model.named_parameters()] == ["proj_out.weight", "body.weight", "body.bias"]
    opt = Muon(model, lr=0.02)
    assert _algorithms(opt, model) == {"proj_out.weight": ADAMW, "body.weight": MATRIX, "body.bias": ADAMW}
    assert "tied to embedding 'table'" in opt.routes()[0].reason
    tied = TinyLM(tie=True)
    assert "head.weight" not in dict(tied.named_parameters())
    assert Muon(tied, lr=0.02).route_of(tied.emb.weight).algorithm == ADAMW


def test_a_linear_shaped_like_the_embedding_is_the_head_only_when_last() -> None:
    """The documented shape rule: an untied Linear whose weight is shaped like an embedding table is the head only if
    it is the model's last Linear (an up-projection to VOCAB features inside the body is a hidden matrix)."""
    model = nn.Sequential(nn.Embedding(VOCAB, DIM), nn.Linear(DIM, VOCAB), nn.Linear(VOCAB, DIM))
    opt = Muon(model, lr=0.02)
    assert _algorithms(opt, model) == {"0.weight": ADAMW, "1.weight": MATRIX, "1.bias": ADAMW, "2.weight": MATRIX,
                                       "2.bias": ADAMW}


def test_multihead_attention_in_proj_is_three_matrices() -> None:
    """One step on in_proj_weight (3E, E) equals Muon on q, k and v as separate (E, E) matrices."""
    torch.manual_seed(1)
    model = TinyLM()
    grad = torch.randn_like(model.attn.in_proj_weight)
    before = model.attn.in_proj_weight.detach().clone()
    opt = Muon(model, lr=0.1, weight_decay=0.0, nesterov=False, momentum=0.0, scale_mode="spectral")
    model.attn.in_proj_weight.grad = grad
    opt.step()
    expected = torch.cat([before[i * DIM:(i + 1) * DIM] - 0.1 * newton_schulz(g) * math.sqrt(DIM)
                          for i, g in enumerate(grad.split(DIM))])
    assert torch.allclose(model.attn.in_proj_weight.detach(), expected, atol=1e-5)
    assert not torch.allclose(expected, before - 0.1 * newton_schulz(grad) * math.sqrt(3 * DIM), atol=1e-3)


def test_soap_and_normuon_share_the_module_routing() -> None:
    model = TinyLM()
    for opt in (SOAP(model, lr=1e-3), NorMuon(model, lr=0.02)):
        got = _algorithms(opt, model)
        assert got["emb.weight"] == got["head.weight"] == got["norm.weight"] == ADAMW, type(opt).__name__
        assert got["ff.weight"] == got["attn.in_proj_weight"] == MATRIX, type(opt).__name__
    table = {r.name: r.update for r in SOAP(model, lr=1e-3).routes()}
    assert table["attn.in_proj_weight"] == "SOAP"  # SOAP preconditions a fused weight whole
    assert {r.name: r.update for r in Muon(model, lr=0.02).routes()}["attn.in_proj_weight"] == "Muon, q, k, v apart"


def test_module_routing_trains_and_resumes() -> None:
    torch.manual_seed(2)
    model = TinyLM()
    opt = Muon(model, lr=0.02)
    tokens = torch.randint(0, VOCAB, (4, 8))
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    resumed = Muon(TinyLM(), lr=0.02)
    resumed.load_state_dict(opt.state_dict())
    assert torch.equal(resumed.state_dict()["state"][2]["momentum_buffer"], opt.state_dict()["state"][2]["momentum_buffer"])


def test_convolution_kernels_are_refused_unless_placed() -> None:
    model = nn.Sequential(nn.Conv1d(3, 8, 5), nn.Flatten(), nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"parameter '0.weight' with shape \(8, 3, 5\) is a convolution kernel of "
                                         r"Conv1d '0'.*place it with matrix_rule"):
        Muon(model, lr=0.02)
    opt = Muon(model, lr=0.02, matrix_rule=lambda name, shape: "adamw" if len(shape) == 3 else None)
    assert opt.route_of(model[0].weight).algorithm == ADAMW
    assert opt.routes()[0].reason == "matrix_rule -> 'adamw'"


def test_routes_prints_one_line_per_parameter() -> None:
    model = TinyLM()
    opt = Muon(model, lr=0.02)
    table = opt.routes()
    text = str(table).splitlines()
    assert text[0].split() == ["name", "shape", "update", "reason"]
    assert len(text) == 1 + len(list(model.parameters())) == 1 + len(table)
    row = next(r for r in table if r.name == "attn.in_proj_weight")
    assert row.shape == (3 * DIM, DIM) and row.update == "Muon, q, k, v apart"
    line = next(t for t in text if t.startswith("head.weight"))
    assert "AdamW" in line and "output head" in line


@pytest.mark.parametrize(("cls", "kwargs", "message"), [
    (Muon, {"betas": (0.9, 0.95)}, r"Muon got unknown keyword argument\(s\) 'betas' \('betas' is called 'adamw_betas' "
                                   r"here\); allowed: params, lr, weight_decay, momentum, .*adamw_betas, adamw_eps"),
    (Muon, {"eps": 1e-8, "amsgrad": True}, r"'eps', 'amsgrad' \('eps' is called 'adamw_eps' here; 'amsgrad' is not "
                                           r"offered\)"),
    (Muon, {"adjust_lr_fn": "match_rms_adamw"}, r"'adjust_lr_fn' is called 'scale_mode' here"),
    (SOAP, {"amsgrad": True}, r"SOAP got unknown .*'amsgrad' is not offered\); allowed: params, lr, weight_decay, betas"),
    (NorMuon, {"betas": (0.9, 0.95)}, r"NorMuon got unknown .*'adamw_betas' here\); allowed: params, lr, weight_decay, "
                                      r"beta2, eps, momentum"),
])
def test_unknown_keywords_name_the_allowed_ones(cls: type, kwargs: dict, message: str) -> None:
    with pytest.raises(UnknownKeywordError, match=message) as info:
        cls(TinyLM(), lr=1e-3, **kwargs)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_the_signatures_stay_the_documented_ones() -> None:
    assert list(inspect.signature(Muon.__init__).parameters)[:4] == ["self", "params", "lr", "weight_decay"]
    assert "scale_mode" in inspect.signature(Muon.__init__).parameters
    assert "beta2" in inspect.signature(NorMuon.__init__).parameters


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64])
@pytest.mark.parametrize("cls", [Muon, SOAP])
def test_non_real_parameters_are_refused(cls: type, dtype: torch.dtype) -> None:
    """Issue 35: a complex matrix was accepted and its imaginary part never updated (the update cast the gradient to
    float); now refused in one line naming the parameter and what is allowed."""
    p = nn.Parameter(torch.zeros(4, 4, dtype=dtype), requires_grad=dtype.is_complex)
    with pytest.raises(ValueError, match=rf"^{cls.label}: parameter 'w' has dtype {dtype}; allowed: real "
                                         r"floating-point parameters \(float32, bfloat16, float16, float64\)"):
        cls([("w", p)], lr=1e-3)
    model = TinyLM()
    model.register_parameter("phase", nn.Parameter(torch.zeros(3, dtype=torch.complex64)))
    with pytest.raises(ValueError, match="parameter 'phase' has dtype torch.complex64"):
        cls(model, lr=1e-3)


def test_unnamed_vectors_are_placed_by_shape() -> None:
    bias = nn.Parameter(torch.zeros(4))
    opt = Muon([{"params": [bias]}], lr=1e-3)  # 1-D goes to AdamW whatever its name
    assert opt.route_of(bias).algorithm == ADAMW
    w = nn.Parameter(torch.zeros(4, 4))
    assert Muon([w], lr=1e-3, matrix_rule=lambda n, s: "matrix").route_of(w).algorithm == MATRIX


@pytest.mark.parametrize(("name", "word"), [
    ("emb.weight", "emb"), ("model.tok_emb.weight", "tok"), ("head.weight", "head"), ("lm_proj.weight", "lm"),
    ("pos", "pos"), ("decoder.vocab_proj.weight", "vocab"),
    ("blocks.0.multihead_attn.in_proj_weight", None), ("bert.encoder.layer.0.attention.output.dense.weight", None),
    ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", None), ("model.layers.1.mlp.experts.gate_up_proj", None),
])
def test_which_names_hint_at_an_embedding_or_head(name: str, word: str | None) -> None:
    from nemo_muon.optim.routing import hint_word

    assert hint_word(name) == word
