"""``nemo-muon doctor``: what to check before a run, each item ok / warn / fail with a fix.

Facts are collected from this machine (``collect_facts``: Python, installed distributions, torch/CUDA/NCCL, GPUs,
Triton, environment) and judged by ``judge`` against the pinned versions of the container release in effect
(``release_in_effect``: ``$NEMO_MUON_RELEASE`` where set, else the release whose Megatron-Bridge / Megatron-Core the
machine has, ``nemo_muon.versions.installed_release``, else the default), asking only for what that release ships
(no NeMo toolkit from 26.04 on).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import click

from nemo_muon._validation import shown
from nemo_muon.accounting.ns_choice import SYRK_CAPABILITIES
from nemo_muon.secret_policy import MASK, is_secret

STATUSES: tuple[str, ...] = ("ok", "warn", "fail")
DISTRIBUTIONS: tuple[str, ...] = ("torch", "transformer-engine", "megatron-core", "megatron-bridge", "nemo-toolkit",
                                  "nemo-run", "emerging-optimizers", "triton")
KEY_ENV_PREFIXES: tuple[str, ...] = ("NCCL_", "NVTE_", "CUDA_", "TORCH_NCCL_", "PYTORCH_CUDA_ALLOC_CONF", "HF_",
                                     "WANDB_", "NEMO_MUON_", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
                                     "SLURM_JOB_ID", "OMP_NUM_THREADS")
SYRK_MIN_TRITON = (3, 4)


@dataclass(kw_only=True)
class Facts:
    """What doctor looked at (plain data, JSON-ready)."""

    python: str
    distributions: dict[str, str | None]
    torch_error: str | None = None
    cuda: str | None = None
    cuda_available: bool = False
    nccl: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    """One entry per visible GPU: name, capability (major, minor), memory_gb."""
    env: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class Check:
    """One doctor item."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _version(dist: str) -> str | None:
    for candidate in (dist, dist.replace("-", "_")):
        try:
            return importlib.metadata.version(candidate)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def collect_facts(environ: Mapping[str, str] | None = None) -> Facts:
    """Probe this machine (imports torch if installed; never fails)."""
    environ = os.environ if environ is None else environ
    facts = Facts(python=platform.python_version(), distributions={d: _version(d) for d in DISTRIBUTIONS})
    facts.env = {k: (MASK if is_secret(k, v) else v) for k, v in sorted(environ.items())
                 if k.startswith(KEY_ENV_PREFIXES)}
    if facts.distributions["torch"] is None:
        return facts
    try:
        import torch
    except Exception as e:  # a broken install is a finding, not a crash
        facts.torch_error = f"{type(e).__name__}: {e}"
        return facts
    facts.cuda = torch.version.cuda
    facts.cuda_available = bool(torch.cuda.is_available())
    if facts.cuda_available:
        try:
            v = torch.cuda.nccl.version()
            facts.nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # NCCL missing from this build
            facts.nccl = None
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            facts.gpus.append({"name": p.name, "capability": [p.major, p.minor],
                               "memory_gb": round(p.total_memory / 2**30, 1)})
    return facts


def _release_numbers(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def release_in_effect(facts: Facts, environ: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """(the `ContainerRelease` to judge against, how it was chosen): ``$NEMO_MUON_RELEASE`` where set (the image sets
    it; a ValueError names the known tags), else the release of the installed Megatron-Bridge / Megatron-Core, else
    the default."""
    from nemo_muon.versions import DEFAULT_RELEASE, RELEASE_ENV_VAR, get_release, installed_release

    environ = os.environ if environ is None else environ
    tag = environ.get(RELEASE_ENV_VAR, "").strip()
    if tag:
        return get_release(tag), f"${RELEASE_ENV_VAR}"
    detected = installed_release(facts.distributions)
    if detected is not None:
        return detected, f"detected: megatron-bridge {facts.distributions['megatron-bridge']}"
    return get_release(DEFAULT_RELEASE), "the default: no release's Megatron-Bridge installed here"


def _release_check(facts: Facts, release: Any, source: str) -> Check:
    from nemo_muon.versions import RELEASE_ENV_VAR, installed_release

    stack = installed_release(facts.distributions)
    if stack is not None and stack.tag != release.tag:
        return Check(name="release", status="warn", detail=f"{release.tag} ({source}), but the installed "
                     f"megatron-bridge {facts.distributions['megatron-bridge']} is release {stack.tag}'s",
                     fix=f"unset {RELEASE_ENV_VAR} or set it to {stack.tag}, or use nvcr.io/nvidia/nemo:{release.tag}")
    return Check(name="release", status="ok", detail=f"{release.tag} ({source})")


def judge(facts: Facts, release: Any, *, recipe_env: Mapping[str, str] | None = None,
          source: str = "given") -> list[Check]:
    """Judge the facts against ``release`` (a nemo_muon.versions.ContainerRelease; ``source``: how it was chosen)."""
    from nemo_muon.versions import version_matches

    checks: list[Check] = [_release_check(facts, release, source)]
    py_ok = _release_numbers(facts.python)[:2] >= (3, 12)
    checks.append(Check(name="python", status="ok" if py_ok else "fail", detail=facts.python,
                        fix="" if py_ok else "use Python >= 3.12 (the NGC container's 3.12)"))
    expected = release.image_distributions()
    tag = release.tag
    for dist in DISTRIBUTIONS:
        have = facts.distributions.get(dist)
        want = expected.get(dist)
        if have is None and dist == "nemo-toolkit" and release.nemo is None:
            checks.append(Check(name=dist, status="ok", detail=f"not installed (release {tag} ships no NeMo toolkit)"))
        elif have is None:
            required = dist in ("torch", "emerging-optimizers")
            checks.append(Check(name=dist, status="fail" if required else "warn", detail="not installed",
                                fix=f"run inside nvcr.io/nvidia/nemo:{tag} (or the nemo-muon image)" if not required
                                else f"pip install {dist}" + (f"=={want}" if want else "")))
        elif want is None:
            checks.append(Check(name=dist, status="ok", detail=f"{have} (no pin in release {tag})"))
        elif version_matches(want, have):
            checks.append(Check(name=dist, status="ok", detail=f"{have} (release {tag} pins {want})"))
        elif _release_numbers(have)[:2] == _release_numbers(want)[:2]:  # the release's line, another patch
            checks.append(Check(name=dist, status="warn", detail=f"{have}, release {tag} pins {want} (same line)",
                                fix=f"pip install {dist}=={want} to match release {tag} exactly"))
        else:
            checks.append(Check(name=dist, status="warn", detail=f"{have}, release {tag} pins {want}",
                                fix=f"use nvcr.io/nvidia/nemo:{tag}, or set NEMO_MUON_RELEASE to the release you run"))
    if facts.torch_error:
        checks.append(Check(name="torch import", status="fail", detail=facts.torch_error,
                            fix="reinstall torch matching this CUDA driver"))
    if facts.cuda_available and facts.gpus:
        names = sorted({g["name"] for g in facts.gpus})
        checks.append(Check(name="gpus", status="ok", detail=f"{len(facts.gpus)} x {', '.join(names)}"))
        checks.append(Check(name="cuda", status="ok", detail=f"CUDA {facts.cuda}"
                            + (f", release {tag} pins {release.cuda}" if release.cuda else "")))
        checks.append(Check(name="nccl", status="ok" if facts.nccl else "warn", detail=facts.nccl or "not available",
                            fix="" if facts.nccl else "use a torch build with NCCL (the NGC container's)"))
    else:
        why = "torch not importable" if facts.distributions.get("torch") is None or facts.torch_error else \
            f"torch {facts.distributions.get('torch')} sees no CUDA device"
        checks.append(Check(name="gpus", status="warn", detail=f"no GPU ({why})",
                            fix="fine for plan/launch on a login node and the CPU recipes; training Megatron recipes "
                                "needs GPU nodes"))
    checks.extend(_stack_checks(facts))
    checks.append(_syrk_check(facts))
    checks.append(_env_check(facts, recipe_env))
    return checks


def _stack_checks(facts: Facts) -> list[Check]:
    """The known-broken version combinations (nemo_muon.megatron.shared.stack) among the installed distributions."""
    from nemo_muon.megatron.shared.stack import DEFAULT_ENGINE, stack_problems

    problems = stack_problems(facts.distributions)
    if not problems:
        return [Check(name="stack", status="ok", detail="no known-broken Megatron-Core / emerging-optimizers / NeMo "
                                                         "combination")]
    checks = []
    for p in problems:
        # a break of a non-default Muon engine does not stop what recipes run by default: warn, naming the engine
        non_default = p.engine is not None and p.engine != DEFAULT_ENGINE
        who = (f"{p.optimizer} " if p.optimizer else "") + (f"with engine {p.engine!r} " if p.engine else "")
        checks.append(Check(name=f"stack:{p.rule}", status="warn" if non_default else "fail",
                            detail=(f"{who}cannot run: " if who else "") + p.message, fix=p.fix))
    return checks


def _syrk_check(facts: Facts) -> Check:
    triton = facts.distributions.get("triton")
    if triton is None:
        return Check(name="triton/syrk", status="warn", detail="triton not installed; NS uses plain matmuls",
                     fix="pip install triton>=3.4 for the SYRK kernels")
    if _release_numbers(triton)[:2] < SYRK_MIN_TRITON:
        return Check(name="triton/syrk", status="warn", detail=f"triton {triton} < 3.4: no SYRK",
                     fix="use triton >= 3.4")
    caps = {tuple(g["capability"]) for g in facts.gpus}
    if not caps:
        return Check(name="triton/syrk", status="warn", detail=f"triton {triton}; no GPU, NS falls back to matmul",
                     fix="SYRK needs a GPU of SM 8.0/9.0/10.x")
    bad = sorted(c for c in caps if c not in SYRK_CAPABILITIES)
    if bad:
        return Check(name="triton/syrk", status="warn", detail=f"triton {triton}; SM {bad} not supported by tsyrk_ex",
                     fix="NS uses matmuls on this GPU (correct, slower); SYRK runs on SM 8.0/9.0/10.x")
    return Check(name="triton/syrk", status="ok", detail=f"triton {triton}; SM {sorted(caps)} supported")


def _env_check(facts: Facts, recipe_env: Mapping[str, str] | None) -> Check:
    shown = ", ".join(f"{k}={v}" for k, v in facts.env.items()) or "none set"
    if not recipe_env:
        return Check(name="env", status="ok", detail=shown)
    differ = [k for k, v in recipe_env.items() if facts.env.get(k) != v]
    if not differ:
        return Check(name="env", status="ok", detail=f"recipe variables all set; {shown}")
    return Check(name="env", status="warn", detail=f"recipe variables not set as the recipe wants: {', '.join(differ)}",
                 fix="nemo-muon launch sets them for the job; export them yourself only when running by hand")


@click.command("doctor")
@click.option("--recipe", default=None, help="Also compare the environment with this recipe's variables.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def doctor(recipe: str | None, as_json: bool) -> None:
    """Check Python, torch/CUDA/NCCL, TE, Megatron/Bridge/NeMo/NeMo-Run/emerging-optimizers, Triton/SYRK, GPUs, env."""
    facts = collect_facts()
    try:
        release, source = release_in_effect(facts)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    recipe_env = None
    if recipe is not None:
        from nemo_muon.recipes import get_recipe, list_recipes

        if recipe not in list_recipes():
            raise click.UsageError(f"--recipe must be one of {tuple(list_recipes())}; got {shown(recipe)}")
        recipe_env = get_recipe(recipe).env
    checks = judge(facts, release, recipe_env=recipe_env, source=source)
    worst = max((STATUSES.index(c.status) for c in checks), default=0)
    if as_json:
        click.echo(json.dumps({"release": release.tag, "release_source": source, "status": STATUSES[worst], "checks": [asdict(c) for c in checks],
                               "facts": asdict(facts)}, indent=2))
    else:
        click.echo(f"nemo-muon doctor (container release {release.tag}, {source}; Python {sys.version.split()[0]})")
        width = max(len(c.name) for c in checks)
        for c in checks:
            click.echo(f"  [{c.status:>4}] {c.name:<{width}}  {c.detail}" + (f"\n{'':>{width + 11}}fix: {c.fix}"
                                                                            if c.fix else ""))
    if worst == STATUSES.index("fail"):
        raise SystemExit(1)
