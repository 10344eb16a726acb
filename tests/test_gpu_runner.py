"""The lent-GPU runner (bench/gpu/README.md), checked without a GPU and without network.

scripts/gpu_wheels.sh fills .whl with what the GPU image lacks (WHEELS, versions from requirements/cpu-dev.txt) and
names what the image already has that we rely on (IMAGE_HAS); bench/gpu/run_all.sh installs .whl there and runs every
bench/gpu script under its own timeout. Here: both parse, every script is run, the timeouts fit the device call, every
package the scripts, the package and the wheels need is carried or in the image, and run_all.sh's control flow (ok /
failed / timed out, summary, logs) with stand-in steps.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
WHEELS_SH = ROOT / "scripts" / "gpu_wheels.sh"
RUN_ALL = ROOT / "bench" / "gpu" / "run_all.sh"
CPU_DEV = ROOT / "requirements" / "cpu-dev.txt"
DEVICE_CALL_S = 9 * 60
"""What run_all.sh must end inside: the device tool's 10-minute command limit, less a minute for the install."""
FILES_BACK = 8
"""The device tool returns at most 8 files from $OUT."""
CONTAINER_ONLY = {"nemo_muon/megatron/nemo2.py", "recipes/nemo_run_registration.py"}
"""Modules that import NeMo / NeMo-Run at module level: only NeMo's container imports them, never bench/gpu."""
IMPORT_NAMES = {"yaml": "pyyaml", "megatron": "megatron-core", "emerging_optimizers": "emerging-optimizers"}
"""Import name -> distribution where the environment running the test may not have it installed."""


def _shell_list(name: str) -> list[str]:
    match = re.search(rf'^{name}="([^"]*)"', WHEELS_SH.read_text(), re.M)
    assert match, f"{WHEELS_SH.name} has no {name}=\"...\" line"
    return match.group(1).split()


def _steps() -> list[tuple[str, int, str]]:
    match = re.search(r'^STEPS="(.*?)"$', RUN_ALL.read_text(), re.M | re.S)
    assert match, "run_all.sh has no STEPS=\"...\" block"
    steps = []
    for line in match.group(1).splitlines():
        name, limit, cmd = line.split("|", 2)
        steps.append((name, int(limit), cmd))
    return steps


def _pins() -> dict[str, str]:
    pins = {}
    for line in CPU_DEV.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


@pytest.mark.parametrize("script", [WHEELS_SH, RUN_ALL], ids=lambda p: p.name)
def test_scripts_parse(script: Path) -> None:
    run = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_run_all_runs_every_bench_gpu_script_once_and_its_files_come_back() -> None:
    steps = _steps()
    scripts = sorted(p.stem for p in (ROOT / "bench" / "gpu").glob("*.py"))
    assert sorted(name for name, _, _ in steps) == scripts
    for name, _, cmd in steps:
        assert f"bench/gpu/{name}.py" in cmd, f"step {name} does not run bench/gpu/{name}.py"
    assert len(steps) + 1 <= FILES_BACK, "one log per step + summary.txt (the install and the machine first) must come " \
        "back from $OUT"


def test_run_all_timeouts_end_inside_the_device_call_as_the_readme_says() -> None:
    steps = _steps()
    kill_grace = int(re.search(r"timeout -k (\d+)", RUN_ALL.read_text()).group(1))
    assert sum(limit + kill_grace for _, limit, _ in steps) <= DEVICE_CALL_S - 60
    readme = (ROOT / "bench" / "gpu" / "README.md").read_text()
    assert f"The timeouts sum to {sum(limit for _, limit, _ in steps)} s" in readme
    for name, limit, _ in steps:
        assert re.search(rf"^\| \d \| `{name}\.py[` ].*\| {limit} s \|", readme, re.M), f"README's row for {name}"


def test_wheel_versions_are_cpu_devs_pins_read_by_the_script() -> None:
    pins = _pins()
    wheels = _shell_list("WHEELS")
    assert wheels, "WHEELS is empty"
    pinned = re.search(r"^pinned\(\) \{.*?^\}", WHEELS_SH.read_text(), re.M | re.S).group(0)
    for name in [*wheels, "nonexistent-package"]:
        run = subprocess.run(["bash", "-c", f'{pinned}\npinned "$1"', "_", name], cwd=ROOT, capture_output=True,
                             text=True, timeout=30)
        if name == "nonexistent-package":
            assert run.returncode == 1 and "no '==' line" in run.stderr
        else:
            assert run.returncode == 0, run.stderr
            assert run.stdout.strip() == pins[canonicalize_name(name)], name


def _third_party_imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = []
    for node in tree.body if module_level_only else [tree]:
        nodes.extend(ast.walk(node) if not module_level_only or isinstance(node, ast.If | ast.Try) else [node])
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("__future__", "nemo_muon", "tests")}


@functools.cache
def _distribution(import_name: str) -> str:
    found = md.packages_distributions().get(import_name)
    return canonicalize_name(found[0] if found else IMPORT_NAMES.get(import_name, import_name))


def test_every_package_needed_there_is_carried_or_in_the_gpu_image() -> None:
    carried = {canonicalize_name(n) for n in _shell_list("WHEELS")} | {"nemo-muon"}
    image = {canonicalize_name(n) for n in _shell_list("IMAGE_HAS")}
    assert not carried & image, f"both carried and in the image: {carried & image}"
    needs: dict[str, str] = {}
    for script in (ROOT / "bench" / "gpu").glob("*.py"):  # every import: the scripts run whole
        for name in _third_party_imports(script, module_level_only=False):
            needs[_distribution(name)] = str(script.relative_to(ROOT))
    for folder in ("nemo_muon", "launchers", "recipes"):  # module level: what importing the package needs
        for module in (ROOT / folder).rglob("*.py"):
            rel = str(module.relative_to(ROOT))
            if rel not in CONTAINER_ONLY:
                for name in _third_party_imports(module, module_level_only=True):
                    needs[_distribution(name)] = rel
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"]:
        needs[canonicalize_name(Requirement(req).name)] = "pyproject.toml dependencies"
    pins, read_all = _pins(), True
    for wheel in _shell_list("WHEELS"):  # their Requires-Dist, extras skipped (megatron-core's extra == "dev", ...)
        try:
            installed_pin = md.version(wheel) == pins[canonicalize_name(wheel)]
        except md.PackageNotFoundError:
            installed_pin = False
        if not installed_pin:  # another environment (the container stack's): the pinned wheel's metadata is not here
            read_all = False
            continue
        for line in md.requires(wheel) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                needs[canonicalize_name(req.name)] = f"{wheel}'s Requires-Dist"
    missing = {dist: who for dist, who in needs.items() if dist not in carried | image}
    assert not missing, f"needed on the GPU machine but neither in WHEELS nor IMAGE_HAS: {missing}"
    if read_all:
        assert image <= set(needs), f"IMAGE_HAS names what nothing here needs: {image - set(needs)}"


def _run_all(tmp_path: Path, steps: str | None, script: Path = RUN_ALL) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": "python3-not-there"}
    if steps is None:
        env.pop("GPU_RUN_STEPS", None)
    else:
        env["GPU_RUN_STEPS"] = steps
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def test_run_all_goes_on_after_failures_and_timeouts_and_summarizes(tmp_path: Path) -> None:
    run = _run_all(tmp_path, "fine|5|echo hello\nbroken|5|echo oops; exit 3\nslow|1|sleep 20\nlast|5|true")
    assert run.returncode == 1, run.stdout + run.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["fine", "broken", "slow", "last"]
    assert "ok" in summary[0] and "failed rc=3" in summary[1] and "timed out after 1s" in summary[2]
    assert summary[3].split()[1] == "ok"
    assert (tmp_path / "out" / "fine.log").read_text() == "hello\n"
    assert (tmp_path / "out" / "broken.log").read_text() == "oops\n"
    assert _run_all(tmp_path, "a|5|true\nb|5|true").returncode == 0


def test_run_all_without_wheels_stops_before_any_script_and_says_what_to_do(tmp_path: Path) -> None:
    copy = tmp_path / "repo" / "bench" / "gpu" / "run_all.sh"
    copy.parent.mkdir(parents=True)
    shutil.copy(RUN_ALL, copy)
    run = _run_all(tmp_path, None, script=copy)
    assert run.returncode == 2
    assert "run scripts/gpu_wheels.sh" in run.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["summary.txt"]
    assert "run scripts/gpu_wheels.sh" in (tmp_path / "out" / "summary.txt").read_text()
