"""Config dataclasses: defaults in one place, validation errors that name field, value and allowed values."""

import math

import pytest

from nemo_muon.config import (
    AdamWConfig,
    DataConfig,
    LoggingConfig,
    MuonConfig,
    ParallelismConfig,
    SchedulerConfig,
    SoapConfig,
    SystemConfig,
    TrainerConfig,
    TrainingRecipe,
)
from nemo_muon.models.specs import KIMI_K2


def test_muon_defaults_take_the_documented_steps():
    """MuonConfig's defaults, as documented (docs/optimizers.md, ARCHITECTURE.md): weight decay 0.1, Nesterov
    momentum 0.95, 5 quintic Newton–Schulz steps, match_rms_adamw scale 0.2·sqrt(max(m, n)) (bench/lr_transfer.py),
    and AdamW(betas=(0.9, 0.95), eps=1e-8) at the same lr for 1-D params. Two steps of an optimizer built from the defaults equal that rule."""
    import torch

    from nemo_muon.optim.factory import build_optimizer
    from nemo_muon.optim.ns_iteration import newton_schulz

    torch.manual_seed(0)
    w, b = torch.nn.Parameter(torch.randn(12, 40)), torch.nn.Parameter(torch.randn(40))
    ref_b = torch.nn.Parameter(b.detach().clone())
    opt = build_optimizer(MuonConfig(lr=0.02), [("layer.weight", w), ("layer.bias", b)])
    ref_opt = torch.optim.AdamW([ref_b], lr=0.02, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    want, buf = w.detach().clone(), torch.zeros(12, 40)
    for _ in range(2):
        g = torch.randn(12, 40)
        w.grad, b.grad = g, torch.randn(40)
        ref_b.grad = b.grad.clone()
        opt.step()
        ref_opt.step()
        buf = buf.lerp(g, 1 - 0.95)
        update = newton_schulz(g.lerp(buf, 0.95), steps=5, coefficients="quintic") * 0.2 * math.sqrt(40)
        want = want * (1 - 0.02 * 0.1) - 0.02 * update
        assert torch.allclose(w.detach(), want, atol=1e-6, rtol=0)
        assert torch.allclose(b.detach(), ref_b.detach(), atol=1e-7, rtol=0)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: MuonConfig(tp_mode="dup"), r"muon.tp_mode must be one of \('duplicated', 'distributed', 'blockwise', 'auto'\); got 'dup'"),
        (lambda: MuonConfig(momentum=math.nan), r"muon.momentum must be a number in \[0.0, 1.0\); got nan"),
        (lambda: MuonConfig(momentum=1.0), r"muon.momentum must be a number in \[0.0, 1.0\)"),
        (lambda: MuonConfig(ns_steps=0), r"muon.ns_steps must be an integer in \[1, 100\]; got 0"),
        (lambda: MuonConfig(ns_steps=10**9), r"muon.ns_steps must be an integer in \[1, 100\]; got 1000000000"),
        (lambda: MuonConfig(lr=-1.0), r"muon.lr must be a number in \[0.0, inf\); got -1.0"),
        (lambda: MuonConfig(lr=math.inf), r"muon.lr must be a number in \[0.0, inf\); got inf"),
        (lambda: MuonConfig(weight_decay=math.inf), r"muon.weight_decay must be a number in \[0.0, inf\); got inf"),
        (lambda: MuonConfig(extra_scale_factor=math.inf), r"muon.extra_scale_factor must be a number in \(0.0, inf\)"),
        (lambda: MuonConfig(adamw_eps=math.inf), r"muon.adamw_eps must be a number in \(0.0, inf\); got inf"),
        (lambda: MuonConfig(lr=10**400), r"muon.lr must be a number in \[0.0, inf\); got 1000"),
        (lambda: MuonConfig(adamw_betas=(0.9,)), r"muon.adamw_betas must be a pair"),
        (lambda: SoapConfig(precondition_frequency=0), r"soap.precondition_frequency must be an integer >= 1"),
        (lambda: AdamWConfig(betas=(0.9, 1.5)), r"adamw.betas\[1\] must be a number in \[0.0, 1.0\)"),
        (lambda: ParallelismConfig(tp=0), r"parallelism.tp must be an integer >= 1; got 0"),
        (lambda: SystemConfig(gpu="a100"), r"system.gpu must be one of"),
        (lambda: TrainerConfig(micro_batch_size=0), r"trainer.micro_batch_size must be an integer >= 1"),
        (lambda: TrainerConfig(max_steps=10**26), r"trainer.max_steps must be an integer in \[1, 1000000000\]"),
        (lambda: TrainerConfig(global_batch_size=2**60), r"trainer.global_batch_size must be an integer in \[1, 9007"),
        (lambda: TrainerConfig(seed=2**40), r"trainer.seed must be an integer in \[0, 2147483647\]"),
        (lambda: SystemConfig(gpu="gb300", gpus_per_node=8), r"system.gpus_per_node must be <= 4 \(GPUs per gb300 "
                                                             r"node\); got 8"),
        (lambda: SystemConfig(gpu="cpu", gpus_per_node=1000), r"system.gpus_per_node must be <= 256"),
        (lambda: SystemConfig(gpu="h100", num_nodes=2**18), r"system.num_nodes \* system.gpus_per_node must be <= "
                                                           r"524288 ranks; got 262144 \* 4 = 1048576"),
        (lambda: SystemConfig(collective_timeout_s=0), r"system.collective_timeout_s must be a number in "
                                                       r"\(0.0, 86400.0\]; got 0"),
        (lambda: SystemConfig(collective_timeout_s=math.inf), r"system.collective_timeout_s must be a number in"),
        (lambda: LoggingConfig(run_name="../../escape"), r"logging.run_name must match \[A-Za-z0-9\]"),
        (lambda: LoggingConfig(run_name="a\nb"), r"logging.run_name must match .*; got 'a\\nb'"),
        (lambda: LoggingConfig(root="/tmp/a:/etc"), r"logging.root must be a path of .*; got '/tmp/a:/etc'"),
        (lambda: LoggingConfig(root="/tmp/a,/etc"), r"logging.root must be a path of"),
        (lambda: LoggingConfig(root=""), r"logging.root must be a path of"),
        (lambda: TrainingRecipe(name="../x", model=KIMI_K2), r"recipe.name must match"),
        (lambda: KIMI_K2.replace(vocab_size=1), r"model\[kimi_k2\].vocab_size must be an integer >= 2; got 1"),
        (lambda: KIMI_K2.replace(qk_rope_head_dim=63), r"qk_rope_head_dim must be an even number"),
        (lambda: KIMI_K2.replace(max_position_embeddings=0), r"max_position_embeddings must be an integer >= 1"),
        (lambda: KIMI_K2.replace(num_shared_experts=-1), r"num_shared_experts must be an integer >= 0"),
        (lambda: SchedulerConfig(kind="linear"), r"scheduler.kind must be one of \('cosine', 'wsd', 'constant'\)"),
        (lambda: DataConfig(kind="indexed"), r"data.path must name a Megatron indexed dataset prefix"),
    ],
)
def test_bad_values_raise_with_field_value_and_allowed(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_recipe_validate_catches_mutation_after_construction():
    recipe = TrainingRecipe(name="r", model=KIMI_K2)
    recipe.optimizer.tp_mode = "sideways"
    with pytest.raises(ValueError, match="muon.tp_mode must be one of"):
        recipe.validate()


def test_recipe_rejects_a_non_optimizer_section():
    with pytest.raises(ValueError, match=r"recipe.optimizer must be an optimizer config \(nemo_muon.registry lists "
                                         r"them\); got dict"):
        TrainingRecipe(name="r", model=KIMI_K2, optimizer={"lr": 1e-3})


def test_data_parallel_size_is_what_remains_of_the_world():
    p = ParallelismConfig(tp=2, pp=4, cp=1)
    assert p.dp(64) == 8
    with pytest.raises(ValueError, match=r"world size must be a multiple of tp\*pp\*cp = 2\*4\*1 = 8; got 60"):
        p.dp(60)


def test_corpus_root_only_with_the_stdlib_text_corpus():
    assert DataConfig(kind="stdlib_text", corpus_root="/data/py").corpus_root == "/data/py"
    with pytest.raises(ValueError, match=r"data.corpus_root must be None unless data.kind='stdlib_text' \(it names a "
                                         r"\.py corpus\); got '/data/py' with data.kind='mock'"):
        DataConfig(kind="mock", corpus_root="/data/py")


def test_a_section_changed_in_place_is_validated_again_and_an_unchanged_one_is_not():
    """`validate_once`: a recipe validates each section where it is made; `TrainingRecipe.validate` validates again
    only what changed since (in place included), so a bad value set after construction is still refused."""
    from nemo_muon.recipes import get_recipe

    recipe = get_recipe("tiny_kimi_k2_muon")
    recipe.validate()
    recipe.optimizer.lr = 0.0  # a frozen phase: accepted
    recipe.validate()
    recipe.optimizer.lr = -1.0
    with pytest.raises(ValueError, match=r"muon.lr must be a number in \[0.0, inf\); got -1.0"):
        recipe.validate()
    recipe.optimizer.adamw_betas = (0.9, 0.95)
    recipe.optimizer.lr = 0.02
    recipe.trainer.max_steps = 0
    with pytest.raises(ValueError, match="trainer.max_steps"):
        recipe.validate()


def test_a_learning_rate_of_zero_is_accepted_where_megatron_accepts_it():
    """lr 0 (a frozen phase; Megatron's warm-up starts there) builds every optimizer config and steps without moving
    a weight; negative, NaN and infinite rates stay refused."""
    import torch

    from nemo_muon.config.optimizer import AdamWConfig, SoapConfig
    from nemo_muon.optim.muon import Muon
    from nemo_muon.optim.soap import SOAP

    for cfg in (MuonConfig(lr=0.0), SoapConfig(lr=0.0), AdamWConfig(lr=0.0)):
        assert cfg.lr == 0.0
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    before = [p.detach().clone() for p in model.parameters()]
    for opt in (Muon(model, lr=0.0), SOAP(model, lr=0.0)):
        model(torch.randn(4, 8)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    for bad in (-1e-3, math.nan, math.inf):
        with pytest.raises(ValueError, match="muon.lr must be a number in"):
            MuonConfig(lr=bad)
    with pytest.raises(ValueError, match=r"muon.adamw_lr must be None when muon.lr is 0"):
        MuonConfig(lr=0.0, adamw_lr=1e-3)
