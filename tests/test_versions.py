"""The versions table: documented numbers, validation, the torch-free CLI, and agreement with pyproject's pins."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nemo_muon import versions
from nemo_muon.versions import (
    BASE_OWNED_DISTRIBUTIONS,
    CONTAINER_RELEASES,
    DEFAULT_RELEASE,
    ContainerRelease,
    current_release,
    get_release,
    parse_pin,
    version_matches,
)

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_pins(section: str) -> dict[str, str]:
    """The exact pins of an optional-dependency section of pyproject (the ``gpu`` extra is pinned to a release)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(parse_pin(r.split(";")[0].strip()) for r in project["optional-dependencies"][section])


def test_26_02_is_the_documented_megatron_bridge_stack():
    rel = get_release("26.02")
    assert DEFAULT_RELEASE == "26.02"
    assert rel.base_image == "nvcr.io/nvidia/nemo:26.02"
    got = (rel.megatron_bridge, rel.megatron_core, rel.transformer_engine, rel.nemo, rel.nemo_run, rel.pytorch,
           rel.cuda, rel.python)
    assert got == ("0.3.0", "0.16.0", "2.12", "2.7.0", "0.8.0", "2.10", "13.0", "3.12")
    assert get_release("26.02.01").megatron_bridge == "0.3.1"


def test_newer_releases_are_ordered_and_newer():
    tags = versions.list_releases()
    assert tags[0] == "26.02" and len(tags) >= 3
    bridges = [tuple(int(p) for p in get_release(t).megatron_bridge.split(".")) for t in tags]
    cores = [tuple(int(p) for p in get_release(t).megatron_core.split(".")) for t in tags]
    assert bridges == sorted(bridges) and bridges[-1] > bridges[0]
    assert cores == sorted(cores) and cores[-1] >= (0, 18)


def test_expected_distributions_leave_out_undocumented_components():
    newest = get_release(versions.list_releases()[-1])
    assert newest.nemo is None and "nemo-toolkit" not in newest.expected_distributions()
    assert get_release("26.02").expected_distributions() == {
        "megatron-bridge": "0.3.0", "megatron-core": "0.16.0", "transformer-engine": "2.12", "nemo-run": "0.8.0",
        "nemo-toolkit": "2.7.0", "torch": "2.10",
    }


def test_unknown_release_error_lists_the_known_tags():
    with pytest.raises(ValueError, match=r"container release must be one of \('26.02', '26.02.01'.*got '25.11'"):
        get_release("25.11")


def test_current_release_follows_the_image_environment(monkeypatch):
    monkeypatch.delenv(versions.RELEASE_ENV_VAR, raising=False)
    assert current_release().tag == DEFAULT_RELEASE
    monkeypatch.setenv(versions.RELEASE_ENV_VAR, "26.02.01")
    assert current_release().megatron_bridge == "0.3.1"
    monkeypatch.setenv(versions.RELEASE_ENV_VAR, "nope")
    with pytest.raises(ValueError, match="got 'nope'"):
        current_release()


@pytest.mark.parametrize(
    ("expected", "installed", "ok"),
    [("2.12", "2.12.0", True), ("0.16.0", "0.16.0rc0", True), ("2.10", "2.10.0a0+git3a5e", True),
     ("0.16.0", "0.16.1", False), ("0.16", "0.17.0", False), ("2.12.0", "2.12", False), ("3.12", "3.12.4", True)],
)
def test_version_matches_is_a_release_prefix(expected, installed, ok):
    assert version_matches(expected, installed) is ok


def _release(**over):
    base = dict(tag="26.02", base_image="nvcr.io/nvidia/nemo:26.02", megatron_bridge="0.3.0", megatron_core="0.16.0",
                transformer_engine="2.12", nemo="2.7.0", nemo_run="0.8.0", pytorch="2.10", cuda="13.0", python="3.12")
    return ContainerRelease(**{**base, **over})


@pytest.mark.parametrize(
    ("over", "message"),
    [({"tag": "26.2"}, "ContainerRelease.tag must be a container tag"),
     ({"base_image": "nvcr.io/nvidia/nemo:26.04"}, "ContainerRelease.base_image must be an image reference ending in ':26.02'"),
     ({"megatron_core": "main"}, "ContainerRelease.megatron_core must be a version string"),
     ({"megatron_bridge": None}, "ContainerRelease.megatron_bridge must be a version string"),
     ({"extra_requirements": ("torch==2.10.0",)}, "must be a package the base lacks"),
     ({"extra_requirements": ("Megatron_Core==0.16.0",)}, "must be a package the base lacks"),
     ({"extra_requirements": ("absl-py>=2",)}, "requirement must be an exact pin")],
)
def test_invalid_release_is_rejected_with_the_field_named(over, message):
    with pytest.raises(ValueError, match=message):
        _release(**over)


def test_every_release_installs_only_what_the_base_lacks():
    owned = set(BASE_OWNED_DISTRIBUTIONS)
    for rel in CONTAINER_RELEASES.values():
        assert rel.extra_requirements, rel.tag
        assert not set(rel.extra_pins()) & owned, rel.tag


def test_pyproject_gpu_extra_pins_the_default_release():
    gpu = _pyproject_pins("gpu")
    rel = get_release(DEFAULT_RELEASE)
    assert gpu["megatron-bridge"] == rel.megatron_bridge
    assert version_matches(rel.transformer_engine, gpu["transformer-engine"])
    for name, pinned in gpu.items():
        assert name in rel.expected_distributions(), f"gpu extra {name} is not in the {rel.tag} table"
        assert version_matches(rel.expected_distributions()[name], pinned), (name, pinned)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "nemo_muon.versions", *args], capture_output=True, text=True, timeout=60)


def test_cli_prints_extras_and_image_without_importing_torch():
    code = ("import sys, nemo_muon.versions as v; assert 'torch' not in sys.modules, 'torch imported';"
            "print(v.get_release('26.02').base_image)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "nvcr.io/nvidia/nemo:26.02"
    r = _cli("extras", "26.02")
    assert r.returncode == 0 and r.stdout.split() == list(get_release("26.02").extra_requirements)
    assert _cli("image", "26.06").stdout.strip() == get_release("26.06").base_image
    assert '"megatron_bridge": "0.3.1"' in _cli("show", "26.02.01", "--json").stdout


def test_cli_rejects_unknown_release_and_bad_usage():
    r = _cli("extras", "99.99")
    assert r.returncode == 2 and "container release must be one of" in r.stderr and "'99.99'" in r.stderr
    assert _cli("frobnicate").returncode == 2
    assert _cli("show", "26.02", "--yaml").returncode == 2


# ---------------------------------------------------------------- the container-stack test environment

def _lock_pins() -> dict[str, str]:
    from pathlib import Path

    from nemo_muon.versions import CONTAINER_STACK_LOCK, normalize_name

    pins = {}
    for line in (Path(__file__).resolve().parent.parent / CONTAINER_STACK_LOCK).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[normalize_name(name)] = version.strip()
    return pins


def test_container_stack_table_agrees_with_the_lock_file():
    from nemo_muon.versions import CONTAINER_STACK, normalize_name

    pins = _lock_pins()
    for row in CONTAINER_STACK:
        for dist in (normalize_name(d.strip()) for d in row.distribution.split(",")):
            if row.ours is None:
                assert dist not in pins, f"{dist} is documented as not installed but the lock pins {pins[dist]}"
            else:
                assert pins.get(dist) == row.ours, f"{dist}: table says {row.ours}, lock pins {pins.get(dist)}"


def test_container_stack_matches_the_release_where_it_says_same():
    from nemo_muon.versions import CONTAINER_STACK, CONTAINER_STACK_RELEASE, get_release

    documented = get_release(CONTAINER_STACK_RELEASE).expected_distributions()
    for row in CONTAINER_STACK:
        if row.why.startswith("same"):
            assert documented[row.distribution] == row.ours == row.container


def test_container_stack_doc_embeds_the_table():
    from pathlib import Path

    from nemo_muon.versions import container_stack_markdown

    doc = (Path(__file__).resolve().parent.parent / "docs" / "container_stack.md").read_text()
    assert container_stack_markdown() in doc
