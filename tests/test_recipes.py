"""Recipe registry, the Bridge 26.02 numbers of the shipped recipes, systems/env data, and overrides."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import nemo_muon.recipes as registry
import pytest
from nemo_muon.recipes import get_recipe, list_recipes, recipe
from nemo_muon.recipes.execute import build_recipe
from nemo_muon.recipes.overrides import apply_overrides, check_override_keys, valid_keys
from nemo_muon.recipes.systems import bridge_perf_recipe

from nemo_muon.accounting.layout import LayoutError
from nemo_muon.config.optimizer import AdamWConfig, MuonConfig, SoapConfig
from nemo_muon.megatron.bridge.perf_presets import BRIDGE_PERF_LAYOUTS
from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B
from nemo_muon.registry import names

# The NVIDIA blog / Megatron-Bridge 26.02 GB300 perf configurations (the numbers), written as the spec.
BRIDGE_2602 = {
    "kimi_k2": dict(gpus=256, tp=1, pp=4, vp=4, cp=1, ep=64, gbs=4096, mbs=2, seq=4096),
    "qwen3_30b_a3b": dict(gpus=8, tp=1, pp=1, vp=1, cp=1, ep=8, gbs=512, mbs=8, seq=4096),
}
OPTIMIZER_CLASSES = {"muon": MuonConfig, "adamw": AdamWConfig, "soap": SoapConfig}


def test_every_recipe_builds_offline_without_torch():
    code = ("import sys, json; from nemo_muon.recipes import list_recipes, get_recipe\n"
            "names = list_recipes(); [get_recipe(n) for n in names]\n"
            "print(json.dumps({'names': names, 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    assert result["names"] == list_recipes() and len(result["names"]) >= 13


@pytest.mark.parametrize("model", ["kimi_k2", "qwen3_30b_a3b"])
@pytest.mark.parametrize("optimizer", ["muon", "adamw", "soap"])
def test_shipped_recipes_carry_the_bridge_2602_gb300_numbers(model, optimizer):
    r = get_recipe(f"{model}_{optimizer}")
    want = BRIDGE_2602[model]
    par, tr = r.parallelism, r.trainer
    assert r.model is {"kimi_k2": KIMI_K2, "qwen3_30b_a3b": QWEN3_30B_A3B}[model]
    assert (r.system.gpu, r.world_size, r.system.gpus_per_node) == ("gb300", want["gpus"], 4)
    assert (par.tp, par.pp, par.vp, par.cp, par.ep) == tuple(want[k] for k in ("tp", "pp", "vp", "cp", "ep"))
    assert (tr.global_batch_size, tr.micro_batch_size, tr.seq_length) == (want["gbs"], want["mbs"], want["seq"])
    assert (r.precision.kind, r.backend, r.data.kind) == ("mxfp8", "megatron", "mock")  # the blog's perf runs
    assert isinstance(r.optimizer, OPTIMIZER_CLASSES[optimizer])
    # HybridEP spans the EP group inside the NVL72 domain
    assert r.env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == str(want["ep"])
    assert ("NVTE_NORM_FWD_USE_CUDNN" in r.env) is (model == "kimi_k2")  # Bridge keeps cuDNN norms for Kimi MXFP8


def test_variants_differ_from_their_base_only_where_named():
    base = get_recipe("kimi_k2_muon")
    for name, changed in {"kimi_k2_muon_bf16": {"precision"}, "kimi_k2_muon_fp8_cs": {"precision"},
                          "kimi_k2_muon_qk_clip": {"qk_clip"}}.items():
        variant = get_recipe(name)
        diff = {f for f in ("model", "optimizer", "parallelism", "system", "trainer", "scheduler", "data",
                            "precision", "checkpoint", "logging", "qk_clip", "layerwise", "backend")
                if getattr(variant, f) != getattr(base, f)}
        assert diff == changed, name
    assert get_recipe("kimi_k2_muon_fp8_cs").precision.kind == "fp8_cs"
    assert "NVTE_NORM_FWD_USE_CUDNN" not in get_recipe("kimi_k2_muon_bf16").env


def test_get_recipe_returns_fresh_objects_and_lists_choices_on_typos():
    a, b = get_recipe("qwen3_30b_a3b_muon"), get_recipe("qwen3_30b_a3b_muon")
    a.trainer.max_steps = a.trainer.max_steps + 1
    assert b != a and b == get_recipe("qwen3_30b_a3b_muon")
    with pytest.raises(ValueError, match=r"recipe must be one of \(.*'kimi_k2_muon'.*; got 'kimi_k2_moun'"):
        get_recipe("kimi_k2_moun")


def test_registry_refuses_duplicates_and_misnamed_recipes():
    def kimi_k2_muon():  # same name as the shipped factory, other module
        raise AssertionError("never built")

    with pytest.raises(ValueError, match=r"'kimi_k2_muon' is registered twice: nemo_muon\.recipes\.kimi_k2"):
        recipe(kimi_k2_muon)

    def test_only_misnamed():
        return get_recipe("qwen3_30b_a3b_adamw")

    recipe(test_only_misnamed)
    try:
        with pytest.raises(ValueError, match=r"must return a recipe named 'test_only_misnamed'"):
            get_recipe("test_only_misnamed")
    finally:
        del registry._FACTORIES["test_only_misnamed"]


def test_parameterized_systems_scale_batch_and_validate_layout():
    for (model, gpu), row in BRIDGE_PERF_LAYOUTS.items():  # a preset row becomes a recipe field by field
        spec = {"kimi_k2": KIMI_K2, "qwen3_30b_a3b": QWEN3_30B_A3B}[model]
        r = bridge_perf_recipe("x", spec, gpu=gpu)
        p, t = r.parallelism, r.trainer
        assert (r.world_size, t.global_batch_size, t.micro_batch_size, t.seq_length) == (
            row.num_gpus, row.global_batch_size, row.micro_batch_size, row.seq_length)
        assert (p.tp, p.pp, p.vp, p.cp, p.ep, p.etp) == (row.tp, row.pp, row.vp, row.cp, row.ep, row.etp)
    r = bridge_perf_recipe("x", KIMI_K2, gpu="gb300", num_gpus=512)
    assert (r.system.num_nodes, r.trainer.global_batch_size) == (128, 8192)  # Bridge's gbs_scaling_factor
    assert bridge_perf_recipe("x", QWEN3_30B_A3B, gpu="h100").env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    with pytest.raises(ValueError, match=r"system\.gpu \(Bridge presets for kimi_k2\) must be one of"):
        bridge_perf_recipe("x", KIMI_K2, gpu="h200")
    with pytest.raises(ValueError, match=r"multiple of 4 GPUs per gb300 node; got 6"):
        bridge_perf_recipe("x", QWEN3_30B_A3B, num_gpus=6)
    with pytest.raises(LayoutError):
        bridge_perf_recipe("x", KIMI_K2, num_gpus=8)  # PP4 x EP64 cannot fit on 8 GPUs


# ---------------------------------------------------------------- overrides

def test_overrides_convert_by_type_and_leave_the_input_alone():
    base = get_recipe("kimi_k2_muon")
    r = apply_overrides(base, ["optim.lr=1e-3", "trainer.max_steps=7", "optim.adamw_betas=(0.9,0.99)",
                               "qk_clip=yes", "env.MY_VAR=x", "model.num_layers=8", "log.root=/tmp/r",
                               "optim.adamw_lr=none"])
    assert (r.optimizer.lr, r.trainer.max_steps, r.optimizer.adamw_betas) == (1e-3, 7, (0.9, 0.99))
    assert r.qk_clip is True and r.env["MY_VAR"] == "x" and r.model.num_layers == 8 and r.logging.root == "/tmp/r"
    assert base == get_recipe("kimi_k2_muon")
    switched = apply_overrides(base, ["optim=adamw", "optim.eps=1e-5", "model=qwen3_30b_a3b"])
    assert isinstance(switched.optimizer, AdamWConfig) and switched.optimizer.eps == 1e-5
    assert switched.optimizer.lr == base.optimizer.lr and switched.model is QWEN3_30B_A3B


def test_fields_of_one_section_are_set_together_whichever_comes_first():
    """A rule between two fields of a section (here: a corpus folder only with data.kind='stdlib_text') holds for the
    fields' new values together, not for a half-applied section, in either order; a bad pair is still refused."""
    base = get_recipe("tiny_kimi_k2_muon")
    base.data = dataclasses.replace(base.data, corpus_root="/tmp/py")
    for overrides in (["data.kind=mock", "data.corpus_root=none"], ["data.corpus_root=none", "data.kind=mock"]):
        data = apply_overrides(base, overrides).data
        assert (data.kind, data.corpus_root) == ("mock", None), overrides
    with pytest.raises(ValueError, match=r"data\.corpus_root must be None unless data\.kind='stdlib_text'"):
        apply_overrides(base, ["data.kind=mock", "trainer.max_steps=7"])


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("optim.lrr=1", r"'optim\.lrr' is unknown: optimizer \(MuonConfig\) has the fields \('lr', 'weight_decay'"),
        ("foo.bar=1", r"section \(in 'foo\.bar'\) must be one of \('model', 'optimizer'.*got 'foo'"),
        ("optim.tp_mode=dup", r"tp_mode must be one of \('duplicated', 'distributed', 'blockwise', 'auto'\); "
                              r"got 'dup'"),
        ("optim.momentum=2", r"muon\.momentum must be a number in \[0\.0, 1\.0\); got 2\.0"),
        ("trainer.max_steps=1.5", r"trainer\.max_steps must be an integer \(ASCII digits, at most 30\); got '1\.5'"),
        ("qk_clip=maybe", r"qk_clip must be a boolean"),
        ("optim.adamw_betas=(1,2,3)", r"must be a tuple of 2 values"),
        ("noequals", r"override must have the form key=value"),
        ("optim=sgd", re.escape(f"optimizer must be one of {names()}; got 'sgd'")),
        ("precision.kind=fp4", r"precision\.kind must be one of \('fp32', 'bf16', 'fp8_cs', 'mxfp8'\); got 'fp4'"),
        ("parallelism.ep=7", r"ep must divide the number of experts \(384\)"),
    ],
)
def test_bad_overrides_name_the_key_and_what_is_valid(override, match):
    with pytest.raises(ValueError, match=match):
        build_recipe("kimi_k2_muon", [override])  # overrides, validation, then the layout check


def test_key_precheck_and_valid_key_listing():
    base = get_recipe("kimi_k2_muon")
    check_override_keys(base, ["optim.lr=x", "trainer.max_steps=y", "env.A=1"])  # values are not converted here
    with pytest.raises(ValueError, match="unknown"):
        check_override_keys(base, ["trainer.maxsteps=3"])
    keys = valid_keys(base)
    assert "optimizer.lr" in keys and "trainer.max_steps" in keys and "env.<NAME>" in keys


def test_environment_follows_bridges_per_system_rules():
    from nemo_muon.recipes.environment import hybrid_ep_env, perf_env

    gb200 = bridge_perf_recipe("x", QWEN3_30B_A3B, gpu="gb200").env
    assert gb200["NCCL_NET_GDR_LEVEL"] == "PHB" and gb200["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "8"
    b200 = bridge_perf_recipe("x", KIMI_K2, gpu="b200").env  # alltoall dispatcher: no HybridEP variables
    assert "NVLINK_DOMAIN_SIZE" not in b200 and "NCCL_NET_GDR_LEVEL" not in b200
    assert hybrid_ep_env("h100", 64) == {"NVLINK_DOMAIN_SIZE": "8", "USE_MNNVL": "0",
                                         "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8"}
    assert perf_env("h100", tp=2)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # Hopper + TP comm overlap
    # streams must not serialize on Blackwell or under HybridEP, whatever the TP size
    assert perf_env("b200", tp=2)["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert perf_env("h100", tp=2, ep=8, hybrid_ep=True)["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    with pytest.raises(ValueError, match=r"parallelism\.ep must be <= 72"):
        hybrid_ep_env("gb300", 128)
    with pytest.raises(ValueError, match=r"system\.gpu must be one of"):
        perf_env("cpu")


def test_every_megatron_recipe_is_a_consistent_layout_on_the_system_its_name_says():
    """Each megatron recipe's world is tp*pp*cp*dp GPUs on whole nodes, its batch is whole micro-batches on every DP
    rank, its experts divide over EP, and its name's suffixes say its GPU and precision (Hopper has no MXFP8)."""
    megatron = [get_recipe(n) for n in list_recipes() if get_recipe(n).backend == "megatron"]
    assert {r.system.gpu for r in megatron} >= {"gb300", "gb200", "b200", "h100"}
    for r in megatron:
        p, t, gpus = r.parallelism, r.trainer, r.world_size
        assert gpus == r.system.num_nodes * r.system.gpus_per_node, r.name
        model_parallel = p.tp * p.pp * p.cp
        assert gpus % model_parallel == 0, r.name
        dp = gpus // model_parallel
        assert t.global_batch_size % (t.micro_batch_size * dp) == 0, r.name
        assert r.model.num_experts % p.ep == 0 and (p.tp * p.cp * dp) % (p.ep * p.etp) == 0, r.name
        suffixes = set(r.name.removeprefix(r.model.name).split("_")[2:])  # after "_<optimizer>"
        gpu_suffix = suffixes & {"gb200", "b200", "h100", "gb300"}
        assert gpu_suffix == ({r.system.gpu} - {"gb300"}), r.name  # no suffix: the blog's GB300
        precision = {"bf16": "bf16", "fp8": "fp8_cs"}
        named = [precision[x] for x in suffixes if x in precision]
        default = "fp8_cs" if r.system.gpu == "h100" else "mxfp8"
        assert r.precision.kind == (named[0] if named else default), r.name


def test_recipes_doc_lists_the_deliberate_differences_from_bridge():
    """docs/recipes.md prints every generation's table of deliberate differences, row for row (Bridge 0.3, 0.4, 0.5,
    0.6)."""
    from pathlib import Path

    from nemo_muon.megatron.bridge_03.library_recipe import DELIBERATE_DIFFERENCES
    from nemo_muon.megatron.bridge_04_05.library_recipe import DELIBERATE_DIFFERENCES_04, DELIBERATE_DIFFERENCES_05
    from nemo_muon.megatron.bridge_06.perf_recipes import DELIBERATE_DIFFERENCES_06

    doc = (Path(__file__).resolve().parent.parent / "docs" / "recipes.md").read_text()
    table_03 = ["| field | Bridge's perf scripts | ours | why |", "|---|---|---|---|"]
    table_03 += [f"| `{d.field}` | {d.bridge} | {d.ours} | {d.why} |" for d in DELIBERATE_DIFFERENCES]
    assert "\n".join(table_03) + "\n" in doc
    for header, rows in (("Bridge 0.4.2's perf run", DELIBERATE_DIFFERENCES_04),
                         ("Bridge 0.5.1's perf run", DELIBERATE_DIFFERENCES_05),
                         ("Bridge 0.6's perf recipe", DELIBERATE_DIFFERENCES_06)):
        table = [f"| fields | {header} | ours | why |", "|---|---|---|---|"]
        table += [f"| {', '.join(f'`{f}`' for f in d.fields)} | {d.bridge} | {d.ours} | {d.why} |" for d in rows]
        assert "\n".join(table) + "\n" in doc, header
