"""`nemo-muon doctor`: real facts of this machine, judged against the pinned table; each finding has a fix."""

from __future__ import annotations

import importlib.metadata
import json

from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.launchers.doctor import Facts, judge, release_in_effect

from nemo_muon.versions import CONTAINER_RELEASES, DEFAULT_RELEASE, get_release


def _doctor(*args: str, env: dict[str, str] | None = None):
    return CliRunner(env=env).invoke(main, ["doctor", *args])


def test_doctor_json_reports_this_machine_against_the_release(monkeypatch) -> None:
    result = _doctor("--json", env={"NEMO_MUON_RELEASE": "26.02", "HF_TOKEN": "doctor-secret-1", "NCCL_DEBUG": "WARN"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["release"] == "26.02"
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["python"]["status"] == "ok"
    mcore = importlib.metadata.version("megatron-core")
    expected = "ok" if mcore.startswith("0.16.0") else "warn"  # 26.02 pins megatron-core 0.16.0
    assert checks["megatron-core"]["status"] == expected and mcore in checks["megatron-core"]["detail"]
    assert checks["emerging-optimizers"]["status"] == "ok"  # 0.3.0 is pinned and installed
    for c in data["checks"]:
        assert c["status"] in ("ok", "warn", "fail")
        assert c["status"] == "ok" or c["fix"], c
    assert "doctor-secret-1" not in result.output and data["facts"]["env"]["HF_TOKEN"] == "****"
    assert data["facts"]["env"]["NCCL_DEBUG"] == "WARN"


def test_doctor_text_lists_every_item_with_its_status() -> None:
    result = _doctor()
    assert result.exit_code == 0, result.output
    for name in ("python", "torch", "transformer-engine", "megatron-core", "megatron-bridge", "nemo-toolkit",
                 "nemo-run", "emerging-optimizers", "triton", "gpus", "triton/syrk", "env"):
        assert f"] {name} " in result.output, name


def test_unknown_release_is_a_usage_error() -> None:
    result = _doctor(env={"NEMO_MUON_RELEASE": "99.99"})
    assert result.exit_code == 2 and "'99.99'" in result.output


def test_recipe_env_comparison_names_the_missing_variables() -> None:
    result = _doctor("--json", "--recipe", "kimi_k2_muon", env={"NCCL_NVLS_ENABLE": "0"})
    env_check = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "env")
    assert env_check["status"] == "warn" and "CUDA_DEVICE_MAX_CONNECTIONS" in env_check["detail"]
    assert "NCCL_NVLS_ENABLE," not in env_check["detail"]


def _facts(**kw) -> Facts:
    rel = get_release("26.02")
    dists = {**{d: v for d, v in rel.expected_distributions().items()}, "emerging-optimizers": "0.3.0",
             "triton": "3.4.0"}
    base = dict(python="3.12.3", distributions=dists, cuda="13.0", cuda_available=True, nccl="2.27.3",
                gpus=[{"name": "NVIDIA GB300", "capability": [10, 3], "memory_gb": 279.0}] * 4)
    base.update(kw)
    return Facts(**base)


def test_container_like_facts_warn_on_megatrons_own_optimizers_only() -> None:
    """NGC 26.02's Megatron-Core 0.16 with emerging-optimizers 0.3.0: Megatron's own Muon cannot be built and it has
    no SOAP; the default engine (nemo-muon's Muon and SOAP inside Megatron's layer-wise optimizer) uses neither, so
    both are warnings naming the engine, not failures."""
    checks = judge(_facts(), get_release("26.02"))
    assert {c.name: c.status for c in checks if c.status != "ok"} == {
        "stack:mcore016-muon-emerging-optimizers": "warn", "stack:mcore-soap": "warn"}
    muon = next(c for c in checks if c.name == "stack:mcore016-muon-emerging-optimizers")
    assert "use_nesterov" in muon.detail and "emerging-optimizers" in muon.detail
    assert muon.detail.startswith("muon with engine 'megatron' cannot run") and "engine=nemo_muon" in muon.fix
    facts = _facts()
    facts.distributions["nemo-toolkit"], facts.distributions["megatron-core"] = "2.7.0", "0.19.2"  # a real failure
    assert {c.name: c.status for c in judge(facts, get_release("26.02"))
            if c.name.startswith("stack")} == {"stack:nemo27-mcore019": "fail"}
    assert next(c for c in checks if c.name == "gpus").detail == "4 x NVIDIA GB300"
    facts = _facts()
    facts.distributions["megatron-core"], facts.distributions["nemo-toolkit"] = "0.19.2", None  # NGC 26.06: no NeMo 2.7
    assert all(c.status == "ok" for c in judge(facts, get_release("26.06")) if c.name.startswith("stack"))


def test_old_python_missing_torch_and_unsupported_syrk_gpu_are_flagged() -> None:
    facts = _facts(python="3.11.9", gpus=[{"name": "T4", "capability": [7, 5], "memory_gb": 15.0}])
    facts.distributions["torch"] = None
    facts.distributions["triton"] = "3.2.0"
    status = {c.name: c.status for c in judge(facts, get_release("26.02"))}
    assert status["python"] == "fail" and status["torch"] == "fail" and status["triton/syrk"] == "warn"
    facts = _facts(gpus=[{"name": "T4", "capability": [7, 5], "memory_gb": 15.0}])
    syrk = next(c for c in judge(facts, get_release("26.02")) if c.name == "triton/syrk")
    assert syrk.status == "warn" and "(7, 5)" in syrk.detail


def _stack_facts(tag: str) -> Facts:
    """A machine with release ``tag``'s documented stack installed (no NeMo toolkit where the release has none)."""
    rel = get_release(tag)
    dists = {d: None for d in ("torch", "transformer-engine", "megatron-core", "megatron-bridge", "nemo-toolkit",
                               "nemo-run", "emerging-optimizers", "triton")}
    dists.update(rel.image_distributions(), triton="3.6.0")
    return Facts(python="3.12.3", distributions=dists)


def test_every_releases_stack_is_named_as_that_release_without_the_variable() -> None:
    """The 26.08 stack was judged as 'container release 26.02' and told to switch containers."""
    for tag in CONTAINER_RELEASES:
        release, source = release_in_effect(_stack_facts(tag), environ={})
        assert release.tag == tag and source.startswith("detected: megatron-bridge "), (tag, source)
        checks = judge(_stack_facts(tag), release, source=source)
        assert all("nvcr.io/nvidia/nemo:" not in c.fix for c in checks), (tag, [c for c in checks if c.fix])
    facts = _stack_facts("26.08")
    facts.distributions.update({"megatron-bridge": "0.6.2", "megatron-core": "0.19.2"})  # PyPI's newest patches
    assert release_in_effect(facts, environ={})[0].tag == "26.08"
    facts.distributions["megatron-bridge"] = None  # a login node without Bridge: the default, said so
    release, source = release_in_effect(facts, environ={})
    assert release.tag == DEFAULT_RELEASE and source.startswith("the default")


def test_a_release_without_the_nemo_toolkit_does_not_ask_for_it() -> None:
    """With NEMO_MUON_RELEASE=26.08, doctor asked for the NeMo toolkit that 26.08 does not ship."""
    for tag in ("26.04", "26.06", "26.08"):
        release, source = release_in_effect(_stack_facts(tag), environ={"NEMO_MUON_RELEASE": tag})
        assert source == "$NEMO_MUON_RELEASE"
        nemo = next(c for c in judge(_stack_facts(tag), release, source=source) if c.name == "nemo-toolkit")
        assert (nemo.status, nemo.fix) == ("ok", "") and "ships no NeMo toolkit" in nemo.detail
    missing = next(c for c in judge(_stack_facts("26.04"), get_release("26.02")) if c.name == "nemo-toolkit")
    assert missing.status == "warn" and "nemo:26.02" in missing.fix  # 26.02 ships NeMo 2.7


def test_a_variable_naming_another_release_than_the_installed_stack_is_a_warning_naming_both() -> None:
    release, source = release_in_effect(_stack_facts("26.04"), environ={"NEMO_MUON_RELEASE": "26.08"})
    check = judge(_stack_facts("26.04"), release, source=source)[0]
    assert check.name == "release" and check.status == "warn"
    assert "26.08 ($NEMO_MUON_RELEASE)" in check.detail and "release 26.04's" in check.detail
    assert "set it to 26.04" in check.fix


def test_a_patch_of_the_releases_line_is_matched_by_pinning_not_by_another_container() -> None:
    facts = _stack_facts("26.08")
    facts.distributions["megatron-core"] = "0.19.2"
    core = next(c for c in judge(facts, get_release("26.08")) if c.name == "megatron-core")
    assert core.status == "warn" and core.fix == "pip install megatron-core==0.19.0 to match release 26.08 exactly"


def test_doctor_names_how_it_chose_the_release() -> None:
    result = _doctor("--json", env={"NEMO_MUON_RELEASE": ""})
    data = json.loads(result.stdout)
    assert data["release_source"].startswith(("detected", "the default")) and data["checks"][0]["name"] == "release"
