"""Seeded fuzz of the malformed files operators hand to the commands: resolved-recipe documents (the job entry),
cluster profiles (``profiles``, ``launch --cluster``), run folders (``report``), GPU peak files (``plan
--gpu-peaks``) and layer-wise checkpoints (`load_checkpoint`).

Each file kind starts from a real file, made the way the product makes it (or, for the files operators write, the
documented example), and is damaged: emptied, truncated, bytes flipped, replaced by binary garbage, made too large,
parsed and re-written with the wrong type at the top or in a field, a key removed or added, hostile values (huge,
negative, NaN, infinite, strings for numbers), deep nesting, a folder where a file belongs, a file where a folder
belongs. Whatever the damage: a refusal is a non-zero exit with exactly one error line naming the file or the field
and saying what is allowed, no traceback, nothing written; a damage that leaves the file valid is accepted normally.
Root ignores file permissions, so an unreadable file is tried only when not running as root.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from nemo_muon.launchers.cli import main
from nemo_muon.recipes.execute import build_recipe
from nemo_muon.recipes.resolved import document_path, document_text, to_document, write_document

SEED = 20261205
BUDGET_S = 50.0
"""Whole-file bound on 2 CPU cores; each kind checks its share."""
ALLOWED = re.compile(r"\bmust\b|\bone of\b|\bis missing\b|\bnot a field\b|\bnot allowed\b|\bexpected\b|\bneeds\b"
                     r"|\bis empty\b|\brefused\b|\bis corrupt\b|\bhas no\b|\bis not a\b|\blacks or mangles\b"
                     r"|^Error: Invalid value for '--[a-z-]+': ")
"""Words of a message that says what is allowed (the house style is 'X must be ...; got V')."""
HOSTILE: tuple[Any, ...] = ("", "x" * 3000, "λ$(id)", "../x", -1, 0, 2.5, 10**400, 1e308, -1e-300, float("nan"),
                            float("inf"), True, None, [], {}, [1, 2, 3], {"a": 1}, "nope")
DEEP = "__NM_FUZZ_DEEP__"
"""A leaf set to this string is written as a list nested `depth` times (text, so any depth can be written)."""
UNKNOWN = "nm_fuzz_unknown"


# --- mutations ------------------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One damaged file: its bytes (None: a folder instead of the file; b"<absent>": no file), what was done, and
    the field names a refusal may name besides the file's path."""

    label: str
    content: bytes | None
    names: tuple[str, ...] = ()
    chmod: int | None = None


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(data, dict):
        for k, v in data.items():
            out += [(*prefix, k), *_paths(v, (*prefix, k))]
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += [(*prefix, i), *_paths(v, (*prefix, i))]
    return out


def _parent(data: Any, path: tuple) -> Any:
    for p in path[:-1]:
        data = data[p]
    return data


def _keys(data: Any) -> set[str]:
    return {str(p[-1]) for p in _paths(data) if isinstance(p[-1], str)}


def _structured(rng: random.Random, data: Any, dump: Callable[[Any], str], n: int) -> list[Case]:
    """``n`` random damages of parsed ``data``, each written back with ``dump``."""
    cases = []
    paths = _paths(data)
    leaves = [p for p in paths if not isinstance(_parent(data, p)[p[-1]], (dict, list))]
    dicts = [*([()] if isinstance(data, dict) else []), *(p for p in paths if isinstance(_parent(data, p)[p[-1]], dict))]
    for _ in range(n):
        d = copy.deepcopy(data)
        roll = rng.random()
        if roll < 0.15 and (keyed := [p for p in paths if isinstance(p[-1], str)]):
            path = rng.choice(keyed)
            del _parent(d, path)[path[-1]]
            label = f"delete {'.'.join(map(str, path))}"
        elif roll < 0.27:
            path = rng.choice(dicts)
            target = d
            for p in path:
                target = target[p]
            target[UNKNOWN] = rng.choice((1, "x", None))
            path = (*path, UNKNOWN)
            label = f"add {'.'.join(map(str, path))}"
        elif roll < 0.37:
            path = rng.choice(paths)
            value = rng.choice(("string", 7, [1], None))
            _parent(d, path)[path[-1]] = value
            label = f"set {'.'.join(map(str, path))}={value!r} (a node)"
        elif roll < 0.45:
            path = rng.choice(leaves)
            _parent(d, path)[path[-1]] = DEEP
            label = f"nest {'.'.join(map(str, path))}"
        else:
            path = rng.choice(leaves)
            value = rng.choice(HOSTILE)
            _parent(d, path)[path[-1]] = value
            label = f"set {'.'.join(map(str, path))}={str(value)[:20]!r}"
        text = dump(d)
        if DEEP in text:
            depth = rng.choice((40, 400, 5000, 100_000))
            text = text.replace(f'"{DEEP}"', "[" * depth + "]" * depth).replace(DEEP, "[" * depth + "]" * depth)
            label += f" (depth {depth})"
        names = tuple(str(p) for p in path if isinstance(p, str)) or ("(top level)",)
        cases.append(Case(label, text.encode("utf-8"), names))
    return cases


def _bytes_cases(rng: random.Random, valid: bytes, n: int, names: tuple[str, ...], *, huge: int) -> list[Case]:
    """Byte-level damage: empty, truncated, flipped bytes, garbage, not UTF-8, too large, a folder, absent."""
    cases = [Case("empty", b"", names), Case("binary garbage", bytes(rng.randrange(256) for _ in range(2048)), names),
             Case("not UTF-8", valid[:20] + b"\xff\xfe" + valid[20:], names),
             Case("too large", valid + b" " * huge, names), Case("a folder", None, names),
             Case("absent", b"<absent>", names)]
    if os.geteuid() != 0:  # root reads any file: an unreadable file cannot be made
        cases.append(Case("unreadable", valid, names, chmod=0))
    for _ in range(n):
        if rng.random() < 0.5:
            cut = rng.randrange(1, len(valid))
            cases.append(Case(f"truncated at byte {cut}", valid[:cut], names))
        else:
            data = bytearray(valid)
            spots = [rng.randrange(len(data)) for _ in range(rng.choice((1, 1, 3, 20)))]
            for i in spots:
                data[i] ^= rng.randrange(1, 256)
            cases.append(Case(f"bytes flipped at {spots[:5]}", bytes(data), names))
    return cases


def _write(path: Path, case: Case) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if case.content is None:
        path.mkdir(parents=True)
    elif case.content != b"<absent>":
        path.write_bytes(case.content)
        if case.chmod is not None:
            path.chmod(case.chmod)


# --- checks ---------------------------------------------------------------------------------------------------------

def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if not p.is_symlink()}


def _refusal_problem(code: int | None, err: str, output: str, crash: BaseException | None,
                     names: tuple[str, ...]) -> str | None:
    """Why a refusal is not one clear line naming the file or a field (None when it is)."""
    if crash is not None:
        return f"crashed: {type(crash).__name__}: {str(crash)[:300]}"
    if code == 0:
        return "refused nothing (exit 0) but wrote no report"  # callers only pass refusals here
    if "Traceback" in output or "Traceback" in err:
        return f"traceback in output: {output[-400:]!r}"
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("Usage: ", "Try '"))
             and not (ln.startswith("usage: ") or ln.startswith("  "))]
    if len(lines) != 1 or not re.match(r"^(Error|error): \S", lines[0]):
        return f"not one error line: {err[-600:]!r}"
    line = lines[0]
    if len(line) > 1200:
        return f"error line of {len(line)} characters: {line[:200]!r}"
    if not any(n and n in line for n in names):
        return f"names neither the file nor a field of {sorted(set(names))[:8]}: {line!r}"
    if not ALLOWED.search(line):
        return f"does not say what is allowed: {line!r}"
    return None


def _report(kind: str, failures: list[str], tried: int, start: float) -> None:
    elapsed = time.monotonic() - start
    assert tried >= 20, f"{kind}: only {tried} cases ran"
    assert not failures, f"{kind}: {len(failures)} of {tried} cases misbehaved:\n" + "\n".join(failures[:25])
    assert elapsed < BUDGET_S, f"{kind}: {tried} cases took {elapsed:.1f} s"


def _cli(args: list[str]) -> tuple[int, str, str, BaseException | None]:
    r = CliRunner().invoke(main, args)
    crash = r.exception if r.exception is not None and not isinstance(r.exception, SystemExit) else None
    return r.exit_code, r.stderr, r.output, crash


@pytest.fixture()
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd inside tmp_path (so 'nothing written' covers the cwd too) and no rank variables from outside."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "NEMO_MUON_LAUNCH_ENV",
                 "NEMO_MUON_PROFILES"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _json_dump(data: Any) -> str:
    return json.dumps(data, indent=2)


def _yaml_dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=10_000)


# --- 1. resolved-recipe documents: python -m nemo_muon.launchers.run_recipe --recipe-file PATH ------------------------

def _job(path: Path) -> tuple[int | None, str, str, BaseException | None]:
    from nemo_muon.launchers.run_recipe import main as job_main

    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    crash: BaseException | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = job_main(["--recipe-file", str(path)])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # noqa: BLE001 - a crash is what this test looks for
            crash = e
    return code, err.getvalue(), out.getvalue() + err.getvalue(), crash


def test_fuzzed_recipe_documents_are_refused_in_one_line_or_run(workdir: Path, monkeypatch) -> None:
    import nemo_muon.recipes.execute as execute

    ran: list[Any] = []
    monkeypatch.setattr(execute, "run_resolved", lambda recipe: ran.append(recipe) or 0)  # training is not the subject
    rng = random.Random(SEED)
    root = workdir / "runs"
    overrides = [f"logging.root={root}", "trainer.max_steps=3", "scheduler.warmup_steps=1"]
    document = to_document(build_recipe("tiny_kimi_k2_muon", overrides), source="tiny_kimi_k2_muon",
                           overrides=overrides)
    valid = write_document(document_path(root / "tiny_kimi_k2_muon", document), document)
    valid_bytes = valid.read_bytes()
    assert valid_bytes == document_text(document).encode()
    names = (str(valid), *_keys(document))
    cases = [Case("as written", valid_bytes, names),
             *(Case(f"top level {type(v).__name__}", _json_dump(v).encode(), ("document",))
               for v in ([document], "recipe", 1, None)),
             *_bytes_cases(rng, valid_bytes, 16, names, huge=1 << 20),
             *_structured(rng, document, _json_dump, 40)]
    failures: list[str] = []
    start = time.monotonic()
    for i, case in enumerate(cases):
        path = workdir / "docs" / f"recipe-{i}.json"
        path.parent.mkdir(exist_ok=True)
        _write(path, case)
        before, ran_before = _snapshot(workdir), len(ran)
        code, err, output, crash = _job(path)
        if code == 0 and crash is None:
            if len(ran) != ran_before + 1 or "Traceback" in output:
                failures.append(f"{case.label}: accepted but did not run the recipe cleanly: {output[-300:]!r}")
            continue
        problem = _refusal_problem(code, err, output, crash, (str(path), *case.names))
        if problem is None and _snapshot(workdir) != before:
            problem = f"wrote {sorted(set(_snapshot(workdir)) - set(before))[:3]} while refusing"
        if problem is None and len(ran) != ran_before:
            problem = "refused but ran the recipe"
        if problem is not None:
            failures.append(f"{case.label}: {problem}")
    assert cases[0].label == "as written" and ran, "the valid document must run"
    _report("recipe documents", failures, len(cases), start)


# --- 2. cluster profiles: nemo-muon profiles / launch --cluster --------------------------------------------------------

PROFILES = """\
eos:
  executor: slurm
  system: gb300
  account: ops_acct
  partition: batch
  time: "04:00:00"
  gpus_per_node: 4
  image: nvcr.io/nvidia/nemo:26.02
  container: true
  mounts: ["/lustre/data:/data"]
  env: {NCCL_DEBUG: WARN, NCCL_IB_TIMEOUT: 22}
laptop:
  executor: local
  system: cpu
"""
"""The module docstring's example of launchers/profiles.py (operators write this file; nemo-muon only reads it)."""


def test_fuzzed_profiles_are_refused_in_one_line_or_accepted(workdir: Path) -> None:
    rng = random.Random(SEED + 1)
    valid = PROFILES.encode()
    data = yaml.safe_load(PROFILES)
    names = tuple(_keys(data))
    cases = [Case("as written", valid, names),
             *(Case(f"top level {type(v).__name__}", _yaml_dump(v).encode(), ("(top level)",))
               for v in ([data], "eos", 1)),
             *_bytes_cases(rng, valid, 14, names, huge=256 * 1024),
             *_structured(rng, data, _yaml_dump, 36)]
    failures: list[str] = []
    start = time.monotonic()
    for i, case in enumerate(cases):
        path = workdir / "profiles" / f"clusters-{i}.yaml"
        path.parent.mkdir(exist_ok=True)
        _write(path, case)
        for command in (["profiles", "--profiles", str(path)],
                        ["launch", "--recipe", "kimi_k2_muon", "--profiles", str(path), "--cluster", "eos",
                         "--dry-run", f"logging.root={workdir / 'runs'}"]):
            before = _snapshot(workdir)
            code, err, output, crash = _cli(command)
            if code == 0 and crash is None:
                continue  # still a valid file (a launch may also refuse the recipe for a valid profile: checked below)
            # the launch's own refusals of a valid profile name the profile's field or the recipe's
            problem = _refusal_problem(code, err, output, crash, (str(path), *case.names, "--cluster", "system"))
            if problem is None and _snapshot(workdir) != before:
                problem = "wrote files while refusing"
            if problem is not None:
                failures.append(f"{case.label} [{command[0]}]: {problem}")
    _report("profiles", failures, len(cases), start)


def test_a_valid_profiles_file_is_accepted_by_both_commands(workdir: Path) -> None:
    path = workdir / "clusters.yaml"
    path.write_text(PROFILES)
    assert _cli(["profiles", "--profiles", str(path)])[0] == 0
    code, _, output, _ = _cli(["launch", "--recipe", "kimi_k2_muon", "--profiles", str(path), "--cluster", "eos",
                               "--dry-run", f"logging.root={workdir / 'runs'}"])
    assert code == 0, output


# --- 3. run folders: nemo-muon report ------------------------------------------------------------------------------

def _run_folder(folder: Path) -> Path:
    """A run folder as training leaves it (the cheap way of tests/test_cli_report.py): metrics.jsonl and
    launch.json."""
    from nemo_muon.launchers.run_recipe import launch_record

    folder.mkdir(parents=True)
    rows = [{"event": "run", "recipe": "tiny_kimi_k2_muon", "optimizer": "muon", "world_size": 2}]
    rows += [{"event": "train", "step": i, "loss": 5.0 - 0.5 * i, "lr": 1e-3, "grad_norm": 1.0, "tokens": 256.0 * i,
              "step_time_s": 0.5, "optimizer_time_s": 0.1, "tokens_per_s": 1000.0, "elapsed_s": 0.5 * i,
              "skipped": False, "skipped_steps": 0} for i in range(1, 5)]
    rows += [{"event": "val", "step": 4, "val_loss": 3.1, "elapsed_s": 2.1}, {"event": "stop", "step": 4,
                                                                              "reason": "max_steps"}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "launch.json").write_text(json.dumps(launch_record("tiny_kimi_k2_muon", [], {}), indent=2) + "\n")
    return folder


def _jsonl_dump(rows: Any) -> str:
    if isinstance(rows, list):
        return "".join(json.dumps(r) + "\n" for r in rows)
    return json.dumps(rows) + "\n"


def test_fuzzed_run_folders_are_refused_in_one_line_or_reported(workdir: Path) -> None:
    rng = random.Random(SEED + 2)
    template = _run_folder(workdir / "template" / "run")
    valid = (template / "metrics.jsonl").read_bytes()
    rows = [json.loads(line) for line in valid.decode().splitlines()]
    names = ("metrics.jsonl", *_keys(rows))
    cases = [Case("as written", valid, names), *_bytes_cases(rng, valid, 6, names, huge=0),
             *_structured(rng, rows, _jsonl_dump, 14)]
    cases = [c for c in cases if c.label != "too large"]  # metrics.jsonl has no size limit: a long run is large
    failures: list[str] = []
    start = time.monotonic()
    for i, case in enumerate([*cases, Case("the run folder is a file", b"<folder-is-file>", names)]):
        run = workdir / "cases" / f"run{i}"
        shutil.copytree(template, run)
        if case.content == b"<folder-is-file>":
            shutil.rmtree(run)
            run.write_bytes(valid)
        else:
            _write(run / "metrics.jsonl", case)
        out = workdir / "out" / f"case{i}"
        before = _snapshot(workdir)
        code, err, output, crash = _cli(["report", str(run), "--out", str(out), "--json"])
        if code == 0 and crash is None:
            try:
                report = json.loads(output)
            except ValueError:
                failures.append(f"{case.label}: accepted but printed no JSON object: {output[-300:]!r}")
                continue
            if not Path(report["report"]).is_file() or len(report["runs"]) != 1:
                failures.append(f"{case.label}: accepted but wrote no report.md: {output[-300:]!r}")
            continue
        problem = _refusal_problem(code, err, output, crash, (str(run), *case.names))
        if problem is None and (_snapshot(workdir) != before or out.exists()):
            problem = "wrote files while refusing"
        if problem is not None:
            failures.append(f"{case.label}: {problem}")
    _report("run folders", failures, len(cases), start)


# --- 4. nemo-muon plan --gpu-peaks FILE ------------------------------------------------------------------------------

PEAKS = "lab_gpu: {bf16: 1000, fp8: 2000, source: our sheet}\nlab_gpu_2: {bf16: 500.5, fp8: 1001}\n"
"""The format of `nemo_muon.accounting.gpu_peaks.load_gpu_peaks` (operators write it)."""


def test_fuzzed_gpu_peak_files_are_refused_in_one_line_or_planned(workdir: Path, monkeypatch) -> None:
    from nemo_muon.accounting import gpu_peaks

    monkeypatch.setattr(gpu_peaks, "_PEAKS", dict(gpu_peaks._PEAKS))  # what a fuzzed file registers stays here
    rng = random.Random(SEED + 3)
    valid = PEAKS.encode()
    data = yaml.safe_load(PEAKS)
    names = ("lab_gpu", "lab_gpu_2", "bf16", "fp8", "source", "--gpu")
    cases = [Case("as written", valid, names),
             *(Case(f"top level {type(v).__name__}", _yaml_dump(v).encode(), ("(top level)",))
               for v in ([data], "lab_gpu", 1)),
             *_bytes_cases(rng, valid, 14, names, huge=256 * 1024),
             *_structured(rng, data, _yaml_dump, 36)]
    cases = [c for c in cases if c.label != "absent"]  # click refuses a missing --gpu-peaks file itself
    failures: list[str] = []
    start = time.monotonic()
    for i, case in enumerate(cases):
        path = workdir / "peaks" / f"peaks-{i}.yaml"
        path.parent.mkdir(exist_ok=True)
        _write(path, case)
        before = _snapshot(workdir)
        code, err, output, crash = _cli(["plan", "--recipe", "tiny_kimi_k2_muon", "--gpu-peaks", str(path),
                                         "--gpu", "lab_gpu", "--step-time", "0.5", "--json"])
        if code == 0 and crash is None:
            try:
                planned = json.loads(output)
            except ValueError:
                failures.append(f"{case.label}: accepted but printed no JSON object: {output[-300:]!r}")
                continue
            ns_time = planned.get("ns_time_per_step_s_at_peak")  # priced with --gpu lab_gpu's bf16 peak
            if not (isinstance(ns_time, float) and math.isfinite(ns_time) and ns_time > 0):
                failures.append(f"{case.label}: accepted a peak giving an NS time of {ns_time!r} s")
            continue
        problem = _refusal_problem(code, err, output, crash, (str(path), *case.names))
        if problem is None and _snapshot(workdir) != before:
            problem = "wrote files while refusing"
        if problem is not None:
            failures.append(f"{case.label}: {problem}")
    _report("gpu peak files", failures, len(cases), start)


# --- 5. layer-wise checkpoints: load_checkpoint -----------------------------------------------------------------------

def test_fuzzed_checkpoints_are_refused_with_one_line_naming_the_file(workdir: Path) -> None:
    import hashlib

    import torch

    from nemo_muon.config.optimizer import MuonConfig
    from nemo_muon.layerwise.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from nemo_muon.layerwise.optimizer import WholeTensorOptimizer
    from tests.test_layerwise_optimizer import make_model, train

    def opt_of(model: torch.nn.Module) -> WholeTensorOptimizer:
        return WholeTensorOptimizer(model, MuonConfig(lr=2e-2, weight_decay=0.1), dp_group=None, bucket_size_mb=0.002)

    rng = random.Random(SEED + 4)
    model = make_model()
    opt = opt_of(model)
    train(model, opt, 1)
    ckpt = save_checkpoint(workdir / "saved", 1, model, opt, {"step": 1})
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    manifest = json.loads((ckpt / "manifest.json").read_text())
    files = sorted(manifest["files"])
    assert files == ["extra.pt", "model.pt", "optim_rank0.pt"]

    # (file, case, rehash): rehash = the manifest's SHA-256 of the file is updated, so the damage reaches torch.load
    cases: list[tuple[str, Case, bool]] = [("manifest.json", c, False) for c in (
        *_bytes_cases(rng, (ckpt / "manifest.json").read_bytes(), 8, ("manifest.json",), huge=0),
        *(Case(f"top level {type(v).__name__}", _json_dump(v).encode(), ("manifest.json",)) for v in ([1], "x", 2)),
        *_structured(rng, manifest, _json_dump, 30))]
    for name in files:
        valid = (ckpt / name).read_bytes()
        cases += [(name, c, False) for c in _bytes_cases(rng, valid, 3, (name,), huge=1000)]
        cases += [(name, c, True) for c in _bytes_cases(rng, valid, 2, (name,), huge=0) if c.content
                  and c.content != b"<absent>"]
        obj = torch.load(ckpt / name, weights_only=True)
        wrong: list[Any] = [[1, 2], "model", {}]
        if isinstance(obj, dict) and obj:
            key = rng.choice(sorted(obj))
            wrong += [{k: v for k, v in obj.items() if k != key}, {**obj, key: "x"}, {**obj, key: torch.zeros(3)},
                      {**obj, key: torch.zeros(2, dtype=torch.float64)}]
        for value in wrong:
            buffer = io.BytesIO()
            torch.save(value, buffer)
            cases.append((name, Case(f"torch file holding {str(value)[:40]!r}", buffer.getvalue(), (name,)), True))
    cases.append(("<folder>", Case("the checkpoint folder is a file", b"x", ()), False))

    failures: list[str] = []
    start = time.monotonic()
    for i, (name, case, rehash) in enumerate(cases):
        bad = workdir / "cases" / f"c{i}" / ckpt.name
        shutil.copytree(ckpt, bad)
        if name == "<folder>":
            shutil.rmtree(bad)
            bad.write_bytes(b"x")
        else:
            _write(bad / name, case)
            if rehash and case.content:
                m = json.loads((bad / "manifest.json").read_text())
                m["files"][name] = hashlib.sha256(case.content).hexdigest()
                (bad / "manifest.json").write_text(json.dumps(m))
        fresh = make_model(seed=5)
        before = _snapshot(workdir)
        label = f"{name}: {case.label}{' (rehashed)' if rehash else ''}"
        try:
            extra = load_checkpoint(bad, fresh, opt_of(fresh))
        except CheckpointError as e:
            message = str(e)
            problem = None
            if "\n" in message.strip() or "Traceback" in message:
                problem = f"not one line: {message[:400]!r}"
            elif str(bad) not in message and (name == "<folder>" or name not in message):
                problem = f"does not name the file: {message[:300]!r}"
            elif len(message) > 1500:
                problem = f"message of {len(message)} characters: {message[:200]!r}"
            elif _snapshot(workdir) != before:
                problem = "wrote files while refusing"
            if problem is not None:
                failures.append(f"{label}: {problem}")
            continue
        except Exception as e:  # noqa: BLE001 - anything but CheckpointError is the failure looked for
            failures.append(f"{label}: crashed: {type(e).__name__}: {str(e)[:300]}")
            continue
        # accepted: then it loaded exactly the saved weights, and an extra dict (the caller's data: any plain dict)
        if not all(torch.equal(p, saved[n]) for n, p in fresh.named_parameters()):
            failures.append(f"{label}: accepted but loaded other weights")
        if not isinstance(extra, dict) or (name != "extra.pt" and extra != {"step": 1}):
            failures.append(f"{label}: accepted but returned the extra {str(extra)[:100]}")
    _report("checkpoints", failures, len(cases), start)
