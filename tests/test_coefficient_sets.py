"""The six Newton–Schulz coefficient sets of emerging-optimizers 0.3.0 (issue 35 item 2), against its own code.

How exact each comparison is, and why:
- The schedule (which (a, b, c) each step uses, past the table too) is compared with the triples emerging-optimizers'
  ``newton_schulz`` hands its step function: equal.
- The standard form issues the same operations as emerging-optimizers' step (A = X·Xᵀ; ``addmm(A, A, A, beta=b,
  alpha=c)``; ``addmm(X, B, X, beta=a)``, ``baddbmm`` for a 3-D stack), so it is equal bit for bit once the normalized
  input is. The inputs are ±1 matrices of m·n = 1024 entries: the Frobenius norm is 32, which both normalizations (ours
  sums x², theirs ``F.normalize``) compute exactly, and dividing by it is exact. (On Gaussian input the two
  normalizations may differ in the last bit, and the schedule amplifies that to a few 1e-6: tests/test_newton_schulz.py.)
- The Gram form is the same polynomial, reassociated (R = X·Xᵀ once, then Z = aI + bR + cR², Q <- Z·Q, R <- Z·R·Z,
  Q·X at the end), so it differs by fp32 rounding: u = 2⁻²⁴ ≈ 6e-8 per product over m <= 64 terms (√m·u ≈ 5e-7 on
  entries <= 1), amplified along the smallest singular values by the steps' leading coefficients a_k (2.3 to 8.5; their
  product over 5 steps is ~10³). A square ±1 matrix has singular values near 0, which stay in that steep region for
  every step: worst case ~5e-4; GRAM_TOL_SQUARE = 2e-4. At aspect 4 the smallest singular value is a third of the
  largest and leaves that region after one or two steps (amplification ≲ a₁·a₂ ≈ 35: ~2e-5); GRAM_TOL = 5e-5.
  Measured with AVX-512, AVX2 and SSE4.1 kernels: square <= 2.0e-5, aspect 4 <= 9.6e-6 (cans). Two different sets
  differ by more than 50x the larger bound (test_the_tolerances_separate_the_sets), so neither bound can hide a wrong
  set or a wrong step.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import get_args

import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers import muon_utils
from torch.utils.flop_counter import FlopCounterMode

from nemo_muon.accounting.hardware import Hardware
from nemo_muon.accounting.ns_choice import GRAM_BF16_DIVERGES, choose_algorithm
from nemo_muon.accounting.step_time import IMPLEMENTATIONS, MatrixWork, ns_operators, ns_seconds
from nemo_muon.config.optimizer import COEFFICIENT_SETS, REVERSED_PAST_TABLE, CoefficientSet, MuonConfig
from nemo_muon.optim.coefficients import SCHEDULE_END, SOURCES, coefficient_schedule, defined_steps
from nemo_muon.optim.muon import Muon, newton_schulz_stacked
from nemo_muon.optim.ns_iteration import newton_schulz, newton_schulz_many
from nemo_muon.optim.ns_kernels import ns_program, run_programs
from nemo_muon.registry.cost import ns_cost, ns_flop_terms
from tests.tolerances import GRAM_TOL, GRAM_TOL_SQUARE

SHAPES = {"square": (32, 32), "wide": (16, 64), "tall": (64, 16), "stack": (3, 16, 64)}
REPO = Path(__file__).resolve().parents[1]


def _signs(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A ±1 matrix (or stack): m·n = 1024 per matrix, so its Frobenius norm (32) is exact in fp32."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, shape, generator=g).float() * 2 - 1


def _steps(name: str) -> list[int]:
    """Step counts to compare: the default 5, the set's own table, and past its end, where allowed."""
    limit = REVERSED_PAST_TABLE.get(name, math.inf)
    return sorted({s for s in (5, defined_steps(name), defined_steps(name) + 3) if s <= limit})


def _reference(x: torch.Tensor, name: str, steps: int) -> torch.Tensor:
    return muon_utils.newton_schulz(x, steps=steps, coefficient_type=name)


def _gram_tol(shape: tuple[int, ...]) -> float:
    return GRAM_TOL_SQUARE if shape[-1] == shape[-2] else GRAM_TOL


def test_the_sets_are_emerging_optimizers_sets() -> None:
    theirs = tuple(muon_utils._COEFFICIENT_SETS)
    assert COEFFICIENT_SETS == theirs == tuple(n for n in get_args(muon_utils.NSCoeffT) if n != "custom")
    assert get_args(CoefficientSet) == COEFFICIENT_SETS  # the Literal the overrides convert with
    assert set(SCHEDULE_END) == set(SOURCES) == set(COEFFICIENT_SETS)
    assert {n: defined_steps(n) for n in COEFFICIENT_SETS} == {
        "simple": 1, "quintic": 5, "polar_express": 8, "cans": 5, "aol": 4, "deepseekv4": 10}


@pytest.mark.parametrize("name", COEFFICIENT_SETS)
def test_the_schedule_is_the_one_emerging_optimizers_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to and past the table's end (cycle or repeat the last triple): the triples its step function receives."""
    seen: list[tuple[float, float, float]] = []
    step = muon_utils.newton_schulz_step

    def recording_step(x, a, b, c, tp_group=None):  # noqa: ANN001, ANN202
        seen.append((a, b, c))
        return step(x, a, b, c, tp_group=tp_group)

    monkeypatch.setattr(muon_utils, "newton_schulz_step", recording_step)
    for steps in (1, defined_steps(name), defined_steps(name) + 3, 2 * defined_steps(name) + 1):
        seen.clear()
        _reference(_signs((16, 64)), name, steps)
        assert [tuple(map(float, t)) for t in seen] == coefficient_schedule(name, steps), steps


@pytest.mark.parametrize("name", COEFFICIENT_SETS)
def test_the_standard_form_is_emerging_optimizers_iteration_bit_for_bit(name: str) -> None:
    for (label, shape), steps in itertools.product(SHAPES.items(), _steps(name)):
        x = _signs(shape)
        ours = newton_schulz(x, steps, name, algorithm="standard")
        assert torch.equal(ours, _reference(x, name, steps)), (label, steps)


@pytest.mark.parametrize("name", COEFFICIENT_SETS)
def test_the_gram_form_equals_it_within_fp32_rounding(name: str) -> None:
    for (label, shape), steps in itertools.product(SHAPES.items(), _steps(name)):
        x = _signs(shape)
        diff = (newton_schulz(x, steps, name, algorithm="gram") - _reference(x, name, steps)).abs().max().item()
        assert diff <= _gram_tol(shape), (label, steps, diff)


@pytest.mark.parametrize("name", COEFFICIENT_SETS)
def test_many_matrices_at_once_and_batched_stacks_equal_it(name: str) -> None:
    """``newton_schulz_many`` (one call for every shape) and Muon's ``batch_ns`` stacking (same-shape matrices run as
    one batched call: ``baddbmm`` may sum in another order than ``addmm``, so within the Gram bound)."""
    steps = _steps(name)[0]
    xs = [_signs(shape, seed=i) for i, shape in enumerate(SHAPES.values())]
    refs = [_reference(x, name, steps) for x in xs]
    for x, ours, ref in zip(xs, newton_schulz_many(xs, steps, name, algorithm="standard"), refs, strict=True):
        assert torch.equal(ours, ref), tuple(x.shape)
    for x, ours, ref in zip(xs, newton_schulz_many(xs, steps, name), refs, strict=True):
        assert (ours - ref).abs().max().item() <= _gram_tol(tuple(x.shape)), tuple(x.shape)
    wide = [_signs((16, 64), seed=10 + i) for i in range(3)]
    for x, ours in zip(wide, newton_schulz_stacked(wide, steps, name, precision="fp32"), strict=True):
        assert (ours - _reference(x, name, steps)).abs().max().item() <= GRAM_TOL


def test_the_tolerances_separate_the_sets() -> None:
    """At 4 steps (every set allowed) each pair of sets differs by far more than the bounds above, except deepseekv4
    and simple: DeepSeek-V4's table starts with 8 of simple's triple, so up to 8 steps it is simple, bit for bit."""
    x = _signs(SHAPES["square"])
    outs = {n: newton_schulz(x, 4, n, algorithm="standard") for n in COEFFICIENT_SETS}
    for a, b in itertools.combinations(COEFFICIENT_SETS, 2):
        if {a, b} == {"simple", "deepseekv4"}:
            assert torch.equal(outs[a], outs[b])
        else:
            assert (outs[a] - outs[b]).abs().max().item() > 50 * GRAM_TOL_SQUARE, (a, b)
    assert torch.equal(newton_schulz(x, 8, "deepseekv4"), newton_schulz(x, 8, "simple"))
    assert (newton_schulz(x, 10, "deepseekv4") - newton_schulz(x, 10, "simple")).abs().max().item() > 1e-2


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_aol_past_its_table_would_reverse_the_update_and_is_refused() -> None:
    """emerging-optimizers cycles aol's 4-step table; its first step maps a singular value of 1 to a + b + c = -0.585,
    so at 5-8 steps the orthogonalized update points backwards. Which sets do that is derived from the tables."""
    derived = {n: defined_steps(n) for n in COEFFICIENT_SETS
               if SCHEDULE_END[n] == "cycle" and sum(coefficient_schedule(n, 1)[0]) <= 0}
    assert derived == REVERSED_PAST_TABLE == {"aol": 4}
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    assert _cosine(_reference(x, "aol", 5), _reference(x, "aol", 4)) < -0.99  # the reference itself reverses it
    assert _cosine(newton_schulz(x, 4, "aol"), _reference(x, "aol", 4)) > 0.999
    # even at 4 steps, a direction holding > 78% of the energy (sigma > 0.884 once normalized) comes out reversed
    u, v = torch.randn(64, 1), torch.randn(1, 256)
    noise = torch.randn(64, 256)
    nearly_rank_one = u @ v / (u.norm() * v.norm()) + 0.3 * noise / noise.norm()
    left, sigma, right = torch.linalg.svd(nearly_rank_one, full_matrices=False)
    assert (sigma[0] / sigma.norm()).item() > 0.884
    for y in (newton_schulz(nearly_rank_one, 4, "aol"), _reference(nearly_rank_one, "aol", 4)):
        assert (left[:, 0] @ y @ right[0]).item() < -0.9
    message = (r"muon\.ns_steps must be <= 4 with muon\.coefficients='aol' \(its 4-step table cycles, and its first "
               r"step reverses an orthogonalized update: config\.optimizer\.REVERSED_PAST_TABLE\); got 5")
    with pytest.raises(ValueError, match=message):
        MuonConfig(coefficients="aol")
    with pytest.raises(ValueError, match=r"^steps must be <= 4 with coefficients='aol'"):
        newton_schulz(x, 5, "aol")
    with pytest.raises(ValueError, match=r"^muon\.ns_steps must be <= 4 with muon\.coefficients='aol'"):
        Muon([("w", torch.nn.Parameter(x.clone()))], lr=0.02, coefficients="aol")
    opt = Muon([("w", torch.nn.Parameter(x.clone()))], lr=0.02, coefficients="aol", ns_steps=4)
    with pytest.raises(ValueError, match=r"^param_groups\[1\]: muon\.ns_steps must be <= 4"):
        opt.add_param_group({"params": [("v", torch.nn.Parameter(torch.randn(4, 8)))], "ns_steps": 6})


def _flops(fn) -> int:  # noqa: ANN001
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", COEFFICIENT_SETS)
def test_every_set_costs_what_the_cost_model_counts(name: str) -> None:
    """Every set runs exactly ``steps`` iterations of the same three-matmul step, in emerging-optimizers and here: the
    measured FLOPs are the counting rule's (``ns_flop_terms``, which the planner and step-time model price), whatever
    the set; no set adds a step, a rescaling or another form."""
    m, n = SHAPES["wide"]
    x = _signs((m, n))
    for steps in _steps(name):
        standard = sum(ns_flop_terms(m, n, steps))
        assert _flops(lambda: _reference(x, name, steps)) == standard == ns_cost((m, n), steps)  # noqa: B023
        assert _flops(lambda: newton_schulz(x, steps, name, algorithm="standard")) == standard  # noqa: B023
        gram = sum(ns_flop_terms(m, n, steps, algorithm="gram"))
        assert _flops(lambda: newton_schulz(x, steps, name, algorithm="gram")) == gram  # noqa: B023
        assert sum(f for f, _ in ns_operators(m, n, steps, "gram", 4)) == gram


def test_the_planner_counts_ns_steps_whatever_the_set() -> None:
    from nemo_muon.recipes.execute import build_recipe

    from nemo_muon.accounting.planner import plan_recipe

    def ns_flops(*overrides: str) -> float:
        return plan_recipe(build_recipe("tiny_kimi_k2_muon", list(overrides)))["ns_flops_per_step"]

    four = {n: ns_flops("optimizer.ns_steps=4", f"optimizer.coefficients={n}") for n in COEFFICIENT_SETS}
    assert len(set(four.values())) == 1, four
    assert ns_flops("optimizer.ns_steps=5") == pytest.approx(1.25 * four["quintic"])  # the count follows ns_steps


def test_bf16_ns_of_cans_runs_the_standard_form_and_the_step_time_model_prices_it() -> None:
    """cans' bf16 Gram iteration diverges (next test); ``auto`` runs bf16 cans in the standard form, an explicit
    ``gram`` is refused, and the step-time model prices the form that runs."""
    assert GRAM_BF16_DIVERGES == ("cans",)
    m, n = 64, 256
    assert choose_algorithm(m, n, "cpu", torch.float32, "cans") == "gram"
    assert choose_algorithm(m, n, "cpu", torch.bfloat16, "quintic") == "gram"
    assert choose_algorithm(m, n, "cpu", torch.bfloat16, "cans") == "standard"
    torch.manual_seed(0)
    x = torch.randn(m, n)
    auto = newton_schulz(x, 5, "cans", precision="bf16")
    assert torch.equal(auto, newton_schulz(x, 5, "cans", precision="bf16", algorithm="standard"))
    with pytest.raises(ValueError, match=r"^algorithm must be 'standard' or 'auto' with coefficients='cans' in "
                                         r"precision 'bf16' \(its bf16 Gram iteration diverges"):
        newton_schulz(x, 5, "cans", precision="bf16", algorithm="gram")
    numbers = dict(peak_flops={"bf16": 1e12, "fp32": 1e12}, hbm_bytes_per_s=1e11, nvlink_bytes_per_s=1e10,
                   nvlink_domain=1, scale_out_bytes_per_s=1e10, kernel_floor_s=0.0, collective_latency_s=0.0)
    cpu, gpu = (Hardware(name=f"toy-{kind}", kind=kind, **numbers) for kind in ("cpu", "cuda"))  # type: ignore[arg-type]
    impl, work = IMPLEMENTATIONS["nemo_muon"], [MatrixWork(((m, n),), flops=ns_cost((m, n)))]
    standard = ns_seconds(work, gpu, impl, 5, "bf16", "quintic")  # bf16 on a GPU: the standard form, any set
    assert ns_seconds(work, cpu, impl, 5, "bf16", "cans") == standard
    assert ns_seconds(work, cpu, impl, 5, "bf16", "quintic") < standard  # Gram: 13.1 MFLOP instead of 23.6


def test_the_bf16_gram_iteration_diverges_for_cans_only() -> None:
    """Why ``GRAM_BF16_DIVERGES``: the bf16 Gram program of each set (restarts every 2 steps) on a Gaussian 64x256
    matrix at 5 steps (aol: 4): cans' largest singular value is 9.4 (fp32: 1.12); every other set stays <= 1.14."""
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    for name in COEFFICIENT_SETS:
        coefficients = coefficient_schedule(name, _steps(name)[0])
        y = run_programs([ns_program(x, coefficients, algorithm="gram", compute_dtype=torch.bfloat16)], [None])[0]
        top = torch.linalg.svdvals(y.double()).max().item()
        assert (top > 3.0) == (name in GRAM_BF16_DIVERGES), (name, top)


def test_a_set_the_installed_emerging_optimizers_lacks_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """emerging-optimizers 0.2.0 (our minimum) has simple, quintic, polar_express and aol only."""
    old = {n: t for n, t in muon_utils._COEFFICIENT_SETS.items() if n in ("simple", "quintic", "polar_express", "aol")}
    monkeypatch.setattr(muon_utils, "_COEFFICIENT_SETS", old)
    allowed = r"\('simple', 'quintic', 'polar_express', 'aol'\) \(install emerging-optimizers >= 0\.3\.0"
    with pytest.raises(ValueError, match=rf"^param_groups\[0\]: muon\.coefficients must be a set of the installed "
                                         rf"emerging-optimizers \S+: {allowed}.*; got 'cans'"):
        Muon([("w", torch.nn.Parameter(torch.randn(8, 16)))], lr=0.02, coefficients="cans")
    with pytest.raises(ValueError, match=r"^coefficients must be a set of the installed .*; got 'deepseekv4'"):
        newton_schulz(torch.randn(8, 16), coefficients="deepseekv4")
    Muon([("w", torch.nn.Parameter(torch.randn(8, 16)))], lr=0.02, coefficients="aol", ns_steps=4)


def test_the_docs_give_every_set_its_published_source() -> None:
    text = (REPO / "docs" / "optimizers.md").read_text()
    for name, source in SOURCES.items():
        cited = re.findall(r"arXiv [0-9]{4}\.[0-9]{4,5}|https://[^ ,;:)]+", source, re.ASCII)
        assert cited, name
        first = cited[0].rstrip(".")
        assert f"`{name}`" in text and first in text, (name, first)


@pytest.mark.parametrize("name", COEFFICIENT_SETS)
def test_muon_and_normuon_with_every_set_equal_emerging_optimizers(name: str) -> None:
    """Three steps on a tall and a wide matrix, fp32: ours vs emerging-optimizers' Muon and AdaptiveMuon(normuon).
    Ours runs Gram NS at aspect 3, theirs the standard form: each step's NS output within ~1e-5 of theirs (the Gram
    bound's estimate above) on entries of ~0.25 (4e-5 relative), and momentum carries a step's difference into the next
    input: bound 2e-4 of the total update (measured <= 4.3e-5, with cans)."""
    from emerging_optimizers.orthogonalized_optimizers.adaptive_muon import AdaptiveMuon
    from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EoMuon

    from nemo_muon.optim.normuon import NorMuon

    steps = _steps(name)[0]
    common = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "scale_mode": "spectral"}
    peers = {
        "muon": (lambda ps: Muon([(f"w{i}", p) for i, p in enumerate(ps)], coefficients=name, ns_steps=steps,
                                 **common),
                 lambda ps: EoMuon(ps, fp32_matmul_prec="highest", coefficient_type=name, num_ns_steps=steps,
                                   **common)),
        "normuon": (lambda ps: NorMuon([(f"w{i}", p) for i, p in enumerate(ps)], coefficients=name, ns_steps=steps,
                                       beta2=0.9, eps=1e-7, **common),
                    lambda ps: AdaptiveMuon(ps, fp32_matmul_prec="highest", coefficient_type=name, num_ns_steps=steps,
                                            moment2_method="normuon", beta2=0.9, eps=1e-7, **common)),
    }
    for kind, (ours_of, ref_of) in peers.items():
        start = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate([(48, 16), (16, 48)])]
        ours, ref = ([torch.nn.Parameter(w.clone()) for w in start] for _ in range(2))
        opts = [ours_of(ours), ref_of(ref)]
        gen = torch.Generator().manual_seed(7)
        for _ in range(3):
            grads = [torch.randn(w.shape, generator=gen) for w in start]
            for params, opt in zip((ours, ref), opts, strict=True):
                for p, g in zip(params, grads, strict=True):
                    p.grad = g.clone()
                opt.step()
        for o, r, w in zip(ours, ref, start, strict=True):
            moved = (r - w).abs().max().item()
            assert moved > 0.01 and (o - r).abs().max().item() <= 2e-4 * moved, (kind, (o - r).abs().max().item())


TINY_RUN = ["system.gpus_per_node=1", "trainer.max_steps=2", "scheduler.warmup_steps=1", "trainer.global_batch_size=4",
            "trainer.micro_batch_size=2", "trainer.seq_length=32", "trainer.eval_interval=0", "data.kind=mock"]
"""Overrides that make a tiny recipe train two steps in this process (one rank, mock data)."""


@pytest.mark.parametrize("name", COEFFICIENT_SETS)
def test_every_set_is_a_recipe_override_on_both_backends(name: str) -> None:
    from nemo_muon.recipes.execute import build_recipe

    steps = [f"optimizer.ns_steps={REVERSED_PAST_TABLE[name]}"] if name in REVERSED_PAST_TABLE else []
    for recipe in ("tiny_kimi_k2_muon", "tiny_kimi_k2_normuon", "kimi_k2_muon"):
        for overrides in ([f"optimizer.coefficients={name}", *steps], [*steps, f"optimizer.coefficients={name}"]):
            assert build_recipe(recipe, overrides).optimizer.coefficients == name, (recipe, overrides)


def test_a_bad_set_override_lists_all_six() -> None:
    from nemo_muon.recipes.execute import build_recipe

    with pytest.raises(ValueError, match=re.escape(f"optimizer.coefficients must be one of {COEFFICIENT_SETS}; got "
                                                   f"'cubic5'")):
        build_recipe("tiny_kimi_k2_muon", ["optimizer.coefficients=cubic5"])
    with pytest.raises(ValueError, match=r"^muon\.ns_steps must be <= 4 with muon\.coefficients='aol'"):
        build_recipe("tiny_kimi_k2_muon", ["optimizer.coefficients=aol"])


def test_a_tiny_torch_backend_run_trains_with_the_set_it_names(tmp_path: Path) -> None:
    """Two steps of the tiny Kimi K2 recipe in this process: deepseekv4 at 5 steps is simple, so its second loss is
    simple's bit for bit, while cans' differs (the override reaches the optimizer's Newton–Schulz)."""
    from nemo_muon.recipes.execute import build_recipe

    from nemo_muon.train.loop import train

    losses = {}
    for name in ("simple", "deepseekv4", "cans"):
        recipe = build_recipe("tiny_kimi_k2_muon", [*TINY_RUN, f"optimizer.coefficients={name}",
                                                    f"logging.root={tmp_path}", f"logging.run_name={name}"])
        losses[name] = train(recipe)["losses"]  # step -> loss
    assert all(math.isfinite(x) for run in losses.values() for x in run.values())
    assert sorted(losses["simple"]) == [1, 2] and losses["deepseekv4"] == losses["simple"]
    assert losses["cans"][1] == losses["simple"][1] and losses["cans"][2] != losses["simple"][2]
