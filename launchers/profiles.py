"""Cluster profiles: what ops teams keep in a YAML file and pick with ``--cluster NAME``.

File format (a mapping of profile name -> settings; every key optional)::

    eos-gb300:
      executor: slurm            # local | slurm | docker
      system: gb300              # the GPU the cluster has; a recipe for another GPU is refused
      account: my_account
      partition: batch
      time: "04:00:00"
      gpus_per_node: 4
      image: nvcr.io/nvidia/nemo:26.02
      container: true            # false = --no-container (no pyxis)
      mounts: ["/lustre/data:/data"]
      env: {NCCL_DEBUG: WARN}

The file is ``--profiles FILE``, else ``$NEMO_MUON_PROFILES``, else ``~/.config/nemo-muon/clusters.yaml``.
Command-line options override a profile's values. The file is read with `nemo_muon.launchers.bounded_yaml` (at most
256 KiB, UTF-8, no aliases, no duplicate profile names or keys) and every value is checked here: account and
partition as Slurm writes them unquoted (``[A-Za-z0-9_.:@+-/]``, so ``$(...)`` is refused), time as a Slurm time
limit, image as an image reference or path, gpus_per_node as an integer 1..`MAX_GPUS_PER_NODE` (at most the
system's GPUs per node when ``system`` is set), mounts as ``SRC:DST[:ro|rw]``, env names as shell identifiers with
string or finite-number values, none of them a secret (a credential's name or value is refused: pass it by name with
``--env NAME`` from the launching shell, or mount a secrets file; `secret_policy.env_value_refusal`). A malformed file raises ValueError naming the file, the field, the value (cut to
120 characters, credentials and secret env values masked) and what is allowed. Torch-free.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_muon.launchers.bounded_yaml import MAX_MESSAGE, cut, load_yaml_file
from nemo_muon.launchers.launch_input import parse_mount
from nemo_muon.launchers.slurm import SAFE_VALUE, TIME_LIMIT

from nemo_muon.config.limits import ENV_NAME, GPUS_PER_NODE
from nemo_muon.secret_policy import MASK, env_value_refusal, is_secret, is_secret_name, is_secret_value, shown_redacted

EXECUTORS: tuple[str, ...] = ("local", "slurm", "docker")
PROFILE_KEYS: tuple[str, ...] = ("executor", "system", "account", "partition", "time", "gpus_per_node", "image",
                                 "container", "mounts", "env")
PROFILES_ENV_VAR = "NEMO_MUON_PROFILES"
DEFAULT_PROFILES_PATH = Path("~/.config/nemo-muon/clusters.yaml")
MAX_GPUS_PER_NODE = 256
"""Upper bound of gpus_per_node when the profile names no GPU system (training processes per node on gpu=cpu
recipes; the recipe's own check, system.gpus_per_node, has the same bound)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)
_IMAGE = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_.:/@#+-]{0,511}", re.ASCII)
_MOUNT = "'SRC:DST' or 'SRC:DST:ro|rw' with absolute paths (no ',' or whitespace)"
_STRING_RULES: dict[str, tuple[re.Pattern[str], str]] = {
    "account": (SAFE_VALUE, "a Slurm account of [A-Za-z0-9_.:@+-/] (no spaces or shell characters)"),
    "partition": (SAFE_VALUE, "a Slurm partition of [A-Za-z0-9_.:@+-/] (no spaces or shell characters)"),
    "time": (TIME_LIMIT, "a Slurm time limit [D-]HH:MM:SS (or MM, MM:SS, D-HH)"),
    "image": (_IMAGE, "an image reference or path of [A-Za-z0-9_.:/@#+-] (e.g. nvcr.io/nvidia/nemo:26.02)"),
}


@dataclass(kw_only=True)
class ClusterProfile:
    """One cluster's launch defaults (None = not set: the recipe or the command line decides); validated at
    construction, errors naming ``source`` (the profiles file) and ``<name>.<field>``."""

    name: str
    source: Path
    executor: str | None = None
    system: str | None = None
    account: str | None = None
    partition: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    image: str | None = None
    container: bool | None = None
    mounts: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def _fail(self, key: str, allowed: str, value: Any, *, masked: bool = False) -> ValueError:
        return _err(self.source, f"{self.name}.{key}", allowed, value, masked=masked)

    def validate(self) -> None:
        """Raise ValueError on the first field outside the rules of the module docstring."""
        from nemo_muon.config.recipe import GPUS

        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise _err(self.source, "profile name", "1-64 letters, digits, '_', '.', '-' (starting with a letter or "
                       "digit)", self.name)
        for key, (rule, allowed) in _STRING_RULES.items():
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not rule.fullmatch(value)):
                raise self._fail(key, allowed, value)
            if isinstance(value, str) and is_secret_value(value):
                raise self._fail(key, "free of credentials (no 'user:password' before an '@', no tokens)", value)
        if self.executor is not None and self.executor not in EXECUTORS:
            raise self._fail("executor", f"one of {EXECUTORS}", self.executor)
        if self.system is not None and self.system not in GPUS:
            raise self._fail("system", f"one of {GPUS}", self.system)
        if self.gpus_per_node is not None:
            limit = _gpus_limit(self.system)
            value = self.gpus_per_node
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                on = f" on {self.system}" if self.system else ""
                raise self._fail("gpus_per_node", f"an integer from 1 to {limit}{on}", value)
        if self.container is not None and not isinstance(self.container, bool):
            raise self._fail("container", "true or false", self.container)
        if not isinstance(self.mounts, list):
            raise self._fail("mounts", f"a list of {_MOUNT} strings", self.mounts)
        for i, mount in enumerate(self.mounts):
            if not isinstance(mount, str) or not _valid_mount(mount):
                raise self._fail(f"mounts[{i}]", _MOUNT, mount)
        if not isinstance(self.env, dict):
            raise self._fail("env", "a mapping of NAME: value (strings or numbers)", self.env)
        for key, value in self.env.items():
            if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
                raise self._fail("env name", "an environment variable name [A-Za-z_][A-Za-z0-9_]*", key)
            if not isinstance(value, str) or "\0" in value:
                raise self._fail(f"env.{key}", "a string or a finite number (no NUL characters)", value,
                                 masked=is_secret_name(key))
            if is_secret(key, value):  # a file on disk, often shared: never a place for a credential
                raise ValueError(f"{self.source}: {env_value_refusal(key, f'{self.name}.env.')}")


def profiles_path(explicit: str | Path | None = None) -> Path:
    """The profiles file in effect: explicit, else $NEMO_MUON_PROFILES, else ~/.config/nemo-muon/clusters.yaml."""
    raw = explicit or os.environ.get(PROFILES_ENV_VAR) or DEFAULT_PROFILES_PATH
    return Path(raw).expanduser()


def _err(path: Path, key: str, allowed: str, value: Any, *, masked: bool = False) -> ValueError:
    got = MASK if masked else shown_redacted(value)
    return ValueError(cut(f"{path}: {key} must be {allowed}; got {got}", MAX_MESSAGE))


def _gpus_limit(system: str | None) -> int:
    if system is None:
        return MAX_GPUS_PER_NODE
    return GPUS_PER_NODE.get(system, MAX_GPUS_PER_NODE)


def _valid_mount(text: str) -> bool:
    try:
        parse_mount(text)
    except ValueError:
        return False
    return True


def _env_strings(env: Any) -> Any:
    """YAML env values as strings: finite numbers are written out, anything else is left for `validate` to refuse."""
    if not isinstance(env, dict):
        return env
    out = {}
    for key, value in env.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        out[key] = str(value) if number and (isinstance(value, int) or math.isfinite(value)) else value
    return out


def _parse_profile(path: Path, name: str, raw: Any) -> ClusterProfile:
    if not isinstance(raw, dict):
        raise _err(path, name, "a mapping of settings", raw)
    unknown = sorted((k for k in raw if k not in PROFILE_KEYS), key=str)
    if unknown:
        raise _err(path, f"{name}.{cut(str(unknown[0]), 60)}", f"one of the keys {PROFILE_KEYS}", unknown[0])
    settings = {**raw, "mounts": raw.get("mounts", []), "env": _env_strings(raw.get("env", {}))}
    return ClusterProfile(name=name, source=path, **settings)


def load_profiles(path: str | Path | None = None) -> dict[str, ClusterProfile]:
    """All profiles in the file (an empty dict when no file exists at the default location)."""
    file = profiles_path(path)
    if not file.exists():
        if path is not None or os.environ.get(PROFILES_ENV_VAR):
            raise ValueError(cut(f"profiles file must exist; got {str(file)!r} (not found)", MAX_MESSAGE))
        return {}
    data = load_yaml_file(file)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _err(file, "(top level)", "a mapping of profile name -> settings", type(data).__name__)
    out = {}
    for name, raw in data.items():
        out[name] = _parse_profile(file, name, raw)
    return out


def get_profile(name: str, path: str | Path | None = None) -> ClusterProfile:
    """One profile by name; ValueError lists the names the file has."""
    profiles = load_profiles(path)
    if name not in profiles:
        raise ValueError(cut(f"--cluster must be one of {tuple(profiles)} (from {profiles_path(path)}); got {shown_redacted(name)}",
                             MAX_MESSAGE))
    return profiles[name]
