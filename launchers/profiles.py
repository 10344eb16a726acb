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
Command-line options override a profile's values. A malformed file raises ValueError naming the file, the key and
what is allowed. Torch-free.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXECUTORS: tuple[str, ...] = ("local", "slurm", "docker")
PROFILE_KEYS: tuple[str, ...] = ("executor", "system", "account", "partition", "time", "gpus_per_node", "image",
                                 "container", "mounts", "env")
PROFILES_ENV_VAR = "NEMO_MUON_PROFILES"
DEFAULT_PROFILES_PATH = Path("~/.config/nemo-muon/clusters.yaml")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(kw_only=True)
class ClusterProfile:
    """One cluster's launch defaults (None = not set: the recipe or the command line decides)."""

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


def profiles_path(explicit: str | Path | None = None) -> Path:
    """The profiles file in effect: explicit, else $NEMO_MUON_PROFILES, else ~/.config/nemo-muon/clusters.yaml."""
    raw = explicit or os.environ.get(PROFILES_ENV_VAR) or DEFAULT_PROFILES_PATH
    return Path(raw).expanduser()


def _err(path: Path, key: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"{path}: {key} must be {allowed}; got {value!r}")


def _parse_profile(path: Path, name: str, raw: Any) -> ClusterProfile:
    from nemo_muon.config.recipe import GPUS

    if not isinstance(raw, dict):
        raise _err(path, name, "a mapping of settings", raw)
    unknown = sorted(set(raw) - set(PROFILE_KEYS))
    if unknown:
        raise _err(path, f"{name}.{unknown[0]}", f"one of the keys {PROFILE_KEYS}", unknown[0])
    prof = ClusterProfile(name=name, source=path)
    for key in ("account", "partition", "time", "image"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise _err(path, f"{name}.{key}", "a non-empty string", value)
        setattr(prof, key, value)
    if (value := raw.get("executor")) is not None:
        if value not in EXECUTORS:
            raise _err(path, f"{name}.executor", f"one of {EXECUTORS}", value)
        prof.executor = value
    if (value := raw.get("system")) is not None:
        if value not in GPUS:
            raise _err(path, f"{name}.system", f"one of {GPUS}", value)
        prof.system = value
    if (value := raw.get("gpus_per_node")) is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _err(path, f"{name}.gpus_per_node", "an integer >= 1", value)
        prof.gpus_per_node = value
    if (value := raw.get("container")) is not None:
        if not isinstance(value, bool):
            raise _err(path, f"{name}.container", "true or false", value)
        prof.container = value
    mounts = raw.get("mounts", [])
    if not isinstance(mounts, list) or not all(isinstance(m, str) for m in mounts):
        raise _err(path, f"{name}.mounts", "a list of 'SRC:DST' strings", mounts)
    prof.mounts = list(mounts)
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float)) and
                                            not isinstance(v, bool) for k, v in env.items()):
        raise _err(path, f"{name}.env", "a mapping of NAME: value (strings or numbers)", env)
    prof.env = {k: str(v) for k, v in env.items()}
    return prof


def load_profiles(path: str | Path | None = None) -> dict[str, ClusterProfile]:
    """All profiles in the file (an empty dict when no file exists at the default location)."""
    import yaml

    file = profiles_path(path)
    if not file.exists():
        if path is not None or os.environ.get(PROFILES_ENV_VAR):
            raise ValueError(f"profiles file must exist; got {str(file)!r} (not found)")
        return {}
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{file}: must be valid YAML; got a parse error: {e}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _err(file, "(top level)", "a mapping of profile name -> settings", type(data).__name__)
    out = {}
    for name, raw in data.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise _err(file, "profile name", "letters, digits, '_', '.', '-'", name)
        out[name] = _parse_profile(file, name, raw)
    return out


def get_profile(name: str, path: str | Path | None = None) -> ClusterProfile:
    """One profile by name; ValueError lists the names the file has."""
    profiles = load_profiles(path)
    if name not in profiles:
        raise ValueError(f"--cluster must be one of {tuple(profiles)} (from {profiles_path(path)}); got {name!r}")
    return profiles[name]
