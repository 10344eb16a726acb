"""Checks of single launch options shared by the launch plan (``job``) and the cluster profiles (``profiles``):
``LaunchError`` and the ``--mount`` / ``--env`` parsers. Torch-free.
"""

from __future__ import annotations

import re

from nemo_muon._validation import shown
from nemo_muon.config.limits import ENV_NAME
from nemo_muon.secret_policy import env_value_refusal, is_secret, shown_redacted

_MOUNT_PART = re.compile(r"/[^,:\s]*\Z", re.ASCII)
_MOUNT_FLAGS = ("ro", "rw")


class LaunchError(ValueError):
    """Bad launch input (the CLI reports it as a usage error, exit code 2)."""


def parse_mount(text: str) -> str:
    """Check ``SRC:DST[:ro|rw]`` with absolute paths and no commas/whitespace; returns it unchanged."""
    parts = text.split(":")
    ok = 2 <= len(parts) <= 3 and all(_MOUNT_PART.fullmatch(p) for p in parts[:2])
    if ok and len(parts) == 3:
        ok = parts[2] in _MOUNT_FLAGS
    if not ok:
        raise LaunchError(f"--mount must be SRC:DST or SRC:DST:ro|rw with absolute paths (no ',' or spaces); "
                          f"got {shown(text)}")
    return text


def parse_env(items: list[str], environ: dict[str, str]) -> dict[str, str]:
    """``NAME=value`` pairs, and bare ``NAME`` forwarded from ``environ`` (must be set there). A ``NAME=value`` whose
    name or value is a secret is refused (`secret_policy.env_value_refusal`): pass such a variable by name."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not ENV_NAME.match(name):
            given = f"{name}=****" if sep and is_secret(name, value) else item
            raise LaunchError(f"--env must be NAME=value or NAME with NAME matching [A-Za-z_][A-Za-z0-9_]* (ASCII, "
                              f"at most 255 characters); got {shown_redacted(given)}")
        if sep and is_secret(name, value):
            raise LaunchError(env_value_refusal(name, "--env "))
        if not sep:
            if name not in environ:
                raise LaunchError(f"--env {name} forwards a variable from your environment, but {name} is not set")
            value = environ[name]
        out[name] = value
    return out
