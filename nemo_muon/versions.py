"""The one table of pinned versions per NGC container release (torch-free).

The Dockerfile, ``containers/build.sh``, the ``nemo-muon doctor`` command and the docs all read this table;
nothing else states these numbers. A release is the tag of ``nvcr.io/nvidia/nemo:<tag>`` ("Megatron-Bridge
26.02" is the NeMo Framework container 26.02). Sources: Megatron-Bridge ``docs/releases/software-versions.md``
and ``docs/releases/known-issues.md`` (project research notes, B §3). ``None`` means "not documented":
we never guess a version.

API::

    from nemo_muon.versions import CONTAINER_RELEASES, DEFAULT_RELEASE, get_release, current_release
    rel = get_release("26.02")
    rel.megatron_core                  # "0.16.0"
    rel.expected_distributions()       # {"megatron-bridge": "0.3.0", "megatron-core": "0.16.0", ...}
    version_matches("0.16.0", "0.16.0rc0+abc")   # True: pre-release and local suffixes are tolerated

Command line (used by the container build)::

    python -m nemo_muon.versions list
    python -m nemo_muon.versions markdown          # the table of containers/README.md
    python -m nemo_muon.versions show 26.02 [--json]
    python -m nemo_muon.versions extras 26.02      # pinned requirements installed only if the base lacks them
    python -m nemo_muon.versions minimums          # name>=version: a base's older version is replaced by the pin
    python -m nemo_muon.versions image 26.02       # the base image of that release
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nemo_muon._validation import check_choice, fail

# Distributions the NGC base image provides and the container build must never install or replace.
BASE_OWNED_DISTRIBUTIONS: tuple[str, ...] = (
    "torch",
    "transformer-engine",
    "megatron-core",
    "megatron-bridge",
    "nemo-toolkit",
    "nemo-run",
)

# Pinned requirements of nemo-muon that an NGC base may lack. The container build installs each one with
# ``--no-deps`` only if the base has no distribution of that name (a base's own version is kept and reported).
# emerging-optimizers is what Megatron-Core's Muon needs (it checks the installed metadata, >= 0.2); absl-py
# is its one dependency that is not already a dependency of the base's torch stack.
_EXTRAS_026: tuple[str, ...] = ("emerging-optimizers==0.3.0", "absl-py==2.5.1")

# Distributions nemo-muon's own code needs at a minimum version. The image keeps a base's version at or above it and
# replaces an older one with the pin of `extra_requirements` (`install_into_base.py --minimums`); doctor and the stack
# rules (nemo_muon.megatron.shared.stack) name an older one. emerging-optimizers: nemo_muon.optim.coefficients imports
# orthogonalized_optimizers.muon_utils.get_coefficient_iterator, which arrived in 0.2.0 (v0.1.0's muon_utils has
# only newton_schulz and newton_schulz_tp; tags read with git, research notes H).
MINIMUM_VERSIONS: dict[str, str] = {"emerging-optimizers": "0.2.0"}

_REQ_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([0-9][0-9A-Za-z.+!-]*)$")


def normalize_name(name: str) -> str:
    """PEP 503 normalized distribution name (``Transformer_Engine`` -> ``transformer-engine``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(requirement: str) -> tuple[str, str]:
    """Split an exact pin ``name[extra]==version`` into (normalized name, version); raise on anything else."""
    m = _REQ_RE.match(requirement.strip())
    if not m:
        raise fail("requirement", requirement, "an exact pin 'name==version' or 'name[extra]==version'")
    return normalize_name(m.group(1)), m.group(3)


def release_numbers(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string (``"0.16.0rc0+abc"`` -> ``(0, 16, 0)``); raises on others."""
    m = re.match(r"^v?(\d+(?:\.\d+)*)", version.strip())
    if not m:
        raise fail("version", version, "a version starting with digits, e.g. '0.16.0' or '2.10.0a0+git'")
    return tuple(int(p) for p in m.group(1).split("."))


def version_matches(expected: str, installed: str) -> bool:
    """True if ``installed`` has the release numbers of ``expected`` as its prefix.

    ``expected`` may be shorter (``"2.12"`` matches ``"2.12.0"``); pre-release and local suffixes of the
    installed version are tolerated (NGC builds report e.g. ``"2.10.0a0+3a5e"`` or ``"0.16.0rc0"``).
    """
    want, have = release_numbers(expected), release_numbers(installed)
    return have[: len(want)] == want


@dataclass(frozen=True, kw_only=True)
class ContainerRelease:
    """The software stack of one ``nvcr.io/nvidia/nemo`` release and what nemo-muon adds on top of it."""

    tag: str  # "26.02": the container tag, YY.MM[.patch]
    base_image: str  # the image our Dockerfile builds FROM for this release
    megatron_bridge: str
    megatron_core: str
    transformer_engine: str
    nemo_run: str
    nemo: str | None  # NeMo toolkit (the `nemo llm` collection); None: not in the container (26.04 onwards)
    pytorch: str | None
    cuda: str | None
    python: str | None
    emerging_optimizers: str | None = None  # what the container ships (Bridge's uv.lock); None = not documented
    extra_requirements: tuple[str, ...] = ()  # installed --no-deps only where the base lacks them
    source: str = "Megatron-Bridge docs/releases/software-versions.md"
    notes: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d{2}\.\d{2}(\.\d{2})?", self.tag):
            raise fail("ContainerRelease.tag", self.tag, "a container tag 'YY.MM' or 'YY.MM.NN'")
        if not self.base_image.endswith(":" + self.tag):
            raise fail("ContainerRelease.base_image", self.base_image, f"an image reference ending in ':{self.tag}'")
        optional = ("nemo", "pytorch", "cuda", "python", "emerging_optimizers")
        for name in ("megatron_bridge", "megatron_core", "transformer_engine", "nemo_run", *optional):
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            if not isinstance(value, str) or not re.match(r"^\d+(\.\d+)*$", value):
                raise fail(f"ContainerRelease.{name}", value, "a version string of digits and dots, e.g. '0.16.0'")
        for req in self.extra_requirements:
            dist, _ = parse_pin(req)
            if dist in BASE_OWNED_DISTRIBUTIONS:
                raise fail("ContainerRelease.extra_requirements", req, f"a package the base lacks, not one of {BASE_OWNED_DISTRIBUTIONS}")

    def expected_distributions(self) -> dict[str, str]:
        """Distribution name -> documented version for every pip-visible component (undocumented ones left out)."""
        out = {
            "megatron-bridge": self.megatron_bridge,
            "megatron-core": self.megatron_core,
            "transformer-engine": self.transformer_engine,
            "nemo-run": self.nemo_run,
            "nemo-toolkit": self.nemo,
            "torch": self.pytorch,
        }
        return {k: v for k, v in out.items() if v is not None}

    def image_distributions(self) -> dict[str, str]:
        """What the nemo-muon image of this release runs with: the documented stack, emerging-optimizers as the base
        ships it where that meets `MINIMUM_VERSIONS` (else our pin replaces it), and the extras the base lacks."""
        out = dict(self.expected_distributions())
        shipped = {"emerging-optimizers": self.emerging_optimizers}
        for name, version in self.extra_pins().items():
            base = shipped.get(name)
            minimum = MINIMUM_VERSIONS.get(name)
            keep = base is not None and (minimum is None or release_numbers(base) >= release_numbers(minimum))
            out[name] = base if keep else version
        return out

    def extra_pins(self) -> dict[str, str]:
        """Normalized name -> pinned version of :attr:`extra_requirements`."""
        return dict(parse_pin(r) for r in self.extra_requirements)

    def as_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready) of every field."""
        d = dataclasses.asdict(self)
        d["extra_requirements"] = list(self.extra_requirements)
        return d


_NGC = "nvcr.io/nvidia/nemo"
_SOFTWARE_VERSIONS_026 = "Megatron-Bridge docs/releases/software-versions.md"

_RELEASE_26_02 = ContainerRelease(
    tag="26.02",
    base_image=f"{_NGC}:26.02",
    megatron_bridge="0.3.0",
    megatron_core="0.16.0",
    transformer_engine="2.12",
    nemo="2.7.0",
    nemo_run="0.8.0",
    pytorch="2.10",
    cuda="13.0",
    python="3.12",
    emerging_optimizers="0.1.0",
    extra_requirements=_EXTRAS_026,
    source=f"{_SOFTWARE_VERSIONS_026} (26.02 row); emerging-optimizers: Bridge's uv.lock at v0.3.0",
    notes="The stack of NVIDIA's Muon announcement. DeepEP is not supported in this container (known issue).",
)

_SOFTWARE_VERSIONS = "Megatron-Bridge docs/releases/software-versions.md"
_BRIDGE_LOCK = "Bridge's uv.lock at the release tag"

CONTAINER_RELEASES: dict[str, ContainerRelease] = {
    r.tag: r
    for r in (
        _RELEASE_26_02,
        # Patch release: only the Bridge version is documented, the other components are those of 26.02.
        dataclasses.replace(
            _RELEASE_26_02,
            tag="26.02.01",
            base_image=f"{_NGC}:26.02.01",
            megatron_bridge="0.3.1",
            source="Megatron-Bridge docs/releases/known-issues.md ('Fixed in 26.02.01 (r0.3.1)')",
            notes="Patch release of 26.02: only the Bridge version (r0.3.1) is documented; the other components are "
            "those of 26.02. Bridge's published Kimi K2 Muon numbers (GB300, MXFP8) were measured on it.",
        ),
        ContainerRelease(
            tag="26.04",
            base_image=f"{_NGC}:26.04",
            megatron_bridge="0.4.0",
            megatron_core="0.17.0",
            transformer_engine="2.14",
            nemo=None,
            nemo_run="0.9.0",
            pytorch="2.11",
            cuda="13.1.1",
            python="3.12",
            emerging_optimizers="0.1.0",
            extra_requirements=_EXTRAS_026,
            source=f"{_SOFTWARE_VERSIONS} (26.04 row); emerging-optimizers: {_BRIDGE_LOCK} v0.4.0; no NeMo toolkit: "
            "docker/Dockerfile.fw_final and docker/common/fw_pyproject.toml install none (research H 1.5)",
            notes="First release without the NeMo toolkit (no `nemo llm` unless nemo-muon provides it). Bridge 0.4 "
            "adds OptimizerConfig.provide(); Megatron-Core 0.17 still builds Muon with the 0.16 layer-wise assembly.",
        ),
        ContainerRelease(
            tag="26.06",
            base_image=f"{_NGC}:26.06",
            megatron_bridge="0.5.0",
            megatron_core="0.18.0",
            transformer_engine="2.16",
            nemo=None,
            nemo_run="0.10.0",
            pytorch="2.12",
            cuda="13.2.1",
            python="3.12",
            emerging_optimizers="0.2.0",
            extra_requirements=_EXTRAS_026,
            source=f"{_SOFTWARE_VERSIONS} (26.06 row); emerging-optimizers: {_BRIDGE_LOCK} v0.5.0",
            notes="Megatron-Core >= 0.18 has the emerging-optimizer registry (optimizer/emerging_optimizers.py) and "
            "renames muon_use_nesterov to muon_nesterov.",
        ),
        ContainerRelease(
            tag="26.08",
            base_image=f"{_NGC}:26.08",
            megatron_bridge="0.6.0",
            megatron_core="0.19.0",
            transformer_engine="2.17.1",
            nemo=None,
            nemo_run="0.10.0",
            pytorch=None,
            cuda=None,
            python="3.12",
            emerging_optimizers="0.2.0",
            extra_requirements=_EXTRAS_026,
            source="Megatron-Bridge GitHub release v0.6.0 ('NeMo Framework 26.08'); Megatron-Core: the v0.6.0 "
            f"submodule's package_info (0.19.0); TE, NeMo-Run, emerging-optimizers: {_BRIDGE_LOCK} v0.6.0 (research "
            "H 1.5; software-versions.md has no 26.08 row yet)",
            notes="Newest release. Base image NGC PyTorch 26.06 (PyTorch and CUDA versions not documented). The GB300 "
            "perf configs ship in the wheel as megatron.bridge.perf_recipes.",
        ),
    )
}

DEFAULT_RELEASE = "26.02"

# The environment variable the container image sets to the release it was built on (read by `nemo-muon doctor`).
RELEASE_ENV_VAR = "NEMO_MUON_RELEASE"


@dataclass(frozen=True)
class StackRow:
    """One line of the container-stack test environment's table: what the container has, what we install, why."""

    distribution: str
    container: str
    ours: str | None
    """The exact version in the lock file; None = not installed."""
    why: str


CONTAINER_STACK_RELEASE = "26.02"
CONTAINER_STACK_LOCK = "requirements/container-stack-26.02.txt"
CONTAINER_STACK: tuple[StackRow, ...] = (
    StackRow("torch", "2.10 (NGC build, CUDA 13.0)", "2.10.0", "PyPI's build of the same release (CUDA 12.8 "
             "wheels); runs on the CPU"),
    StackRow("megatron-core", "0.16.0", "0.16.0", "same"),
    StackRow("megatron-bridge", "0.3.0", "0.3.0", "same; installed without its GPU-only dependencies"),
    StackRow("nemo-toolkit", "2.7.0", "2.7.0", "same (with what its LLM collection imports)"),
    StackRow("nemo-run", "0.8.0", "0.8.0", "same"),
    StackRow("numpy", "< 2", "1.26.4", "the last 1.x on PyPI for Python 3.12"),
    StackRow("transformers", "4.57 (NeMo 2.7's ~=4.57.0)", "4.57.6", "newest 4.57"),
    StackRow("emerging-optimizers", "0.1.0 (Bridge's uv.lock)", "0.3.0", "the only release on PyPI, and what "
             "the nemo-muon image installs over 0.1.0 (which lacks what nemo-muon's Muon imports); Megatron-Core "
             "0.16's own Muon cannot use it (nemo_muon.megatron.shared.stack refuses that combination)"),
    StackRow("transformer-engine", "2.12", None, "no CPU build: tests answer Bridge's two unguarded imports with "
             "tests/megatron_cpu/te_stub.py and use Megatron's local (no-TE) layer spec"),
    StackRow("apex, mamba-ssm, causal-conv1d, flash-linear-attention, nvidia-resiliency-ext, timm, open-clip-torch, "
             "mlflow, qwen-vl-utils", "in the container", None, "GPU-only builds or not imported by the configs, "
             "the recipes or the local spec (megatron-bridge is installed --no-deps)"),
)
"""The container-stack test environment (``make test`` builds it as .venv-ngc from :data:`CONTAINER_STACK_LOCK`)."""


def container_stack_markdown() -> str:
    """The table of docs/container_stack.md (a test keeps the two equal and the lock file in agreement)."""
    lines = [f"| distribution | nemo:{CONTAINER_STACK_RELEASE} | container-stack env | why |", "|---|---|---|---|"]
    for row in CONTAINER_STACK:
        lines.append(f"| {row.distribution} | {row.container} | {row.ours or 'not installed'} | {row.why} |")
    return "\n".join(lines) + "\n"


def list_releases() -> list[str]:
    """Every known release tag, oldest first."""
    return list(CONTAINER_RELEASES)


def get_release(tag: str) -> ContainerRelease:
    """The release with this tag; a ValueError lists the known tags."""
    check_choice("container release", tag, CONTAINER_RELEASES)
    return CONTAINER_RELEASES[tag]


def current_release() -> ContainerRelease:
    """The release this container was built for (``$NEMO_MUON_RELEASE``), else :data:`DEFAULT_RELEASE`."""
    tag = os.environ.get(RELEASE_ENV_VAR, "").strip() or DEFAULT_RELEASE
    return get_release(tag)


def installed_release(distributions: Mapping[str, str | None]) -> ContainerRelease | None:
    """The release whose stack ``distributions`` (name -> installed version, None = absent) is: the one whose
    Megatron-Bridge and Megatron-Core minors are the installed ones (Bridge's whole version decides between a release
    and its patch release, e.g. 0.3.1 -> 26.02.01), the newest of them otherwise; None without Megatron-Bridge, or
    when no release ships the installed pair."""
    bridge, core = distributions.get("megatron-bridge"), distributions.get("megatron-core")
    if not bridge:
        return None

    def minor(version: str | None) -> tuple[int, ...] | None:
        return None if version is None else release_numbers(version)[:2]

    same = [r for r in CONTAINER_RELEASES.values() if minor(r.megatron_bridge) == minor(bridge)
            and (core is None or minor(r.megatron_core) == minor(core))]
    exact = [r for r in same if version_matches(r.megatron_bridge, bridge)]
    return (exact or same or [None])[-1]


def releases_markdown_table() -> str:
    """The releases as a markdown table (containers/README.md embeds it; a test keeps the two equal)."""
    cols = [("release", "tag"), ("Megatron-Bridge", "megatron_bridge"), ("Megatron-Core", "megatron_core"),
            ("TE", "transformer_engine"), ("NeMo", "nemo"), ("NeMo-Run", "nemo_run"), ("PyTorch", "pytorch"),
            ("CUDA", "cuda"), ("Python", "python")]
    lines = ["| " + " | ".join(h for h, _ in cols) + " | added if missing |",
             "|" + "---|" * (len(cols) + 1)]
    for rel in CONTAINER_RELEASES.values():
        cells = [getattr(rel, f) or ("none" if f == "nemo" else "n/d") for _, f in cols]
        cells[0] = f"`{rel.tag}`" + (" (default)" if rel.tag == DEFAULT_RELEASE else "")
        lines.append("| " + " | ".join(cells) + " | " + ", ".join(rel.extra_requirements) + " |")
    return "\n".join(lines) + ("\n\nn/d: not documented in the release notes (never guessed). NeMo none: the release "
                                "installs no NeMo toolkit.\n")


def _main(argv: Sequence[str]) -> int:
    usage = ("usage: python -m nemo_muon.versions {list | markdown | minimums | show TAG [--json] | extras TAG | "
             "image TAG}")
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    cmd, rest = argv[0], list(argv[1:])
    try:
        if cmd == "list" and not rest:
            print("\n".join(list_releases()))
        elif cmd == "minimums" and not rest:
            print("\n".join(f"{name}>={version}" for name, version in MINIMUM_VERSIONS.items()))
        elif cmd == "markdown" and not rest:
            print(releases_markdown_table(), end="")
        elif cmd in ("show", "extras", "image") and rest:
            rel = get_release(rest[0])
            if cmd == "image" and len(rest) == 1:
                print(rel.base_image)
            elif cmd == "extras" and len(rest) == 1:
                print("\n".join(rel.extra_requirements))
            elif cmd == "show" and rest[1:] in ([], ["--json"]):
                if rest[1:]:
                    print(json.dumps(rel.as_dict(), indent=2))
                else:
                    for k, v in rel.as_dict().items():
                        print(f"{k:20s} {v if v is not None else '(not documented)'}")
            else:
                print(usage, file=sys.stderr)
                return 2
        else:
            print(usage, file=sys.stderr)
            return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
