"""Secret-looking environment variables: recognise them, and mask their values in anything printed or logged.

A secret's value is never written into a generated script or printed command line: the launchers forward it
from the submitting process's environment instead (sbatch --export / docker -e NAME / the child env).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MASK = "****"
_SECRET_NAME = re.compile(r"(_TOKEN$|_KEY$|PASSWORD|PASSWD|SECRET|^HF_TOKEN$|^WANDB_API_KEY$)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True for names such as HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, *_TOKEN, *_KEY."""
    return bool(_SECRET_NAME.search(name))


def split_secrets(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, secret) parts of an environment mapping."""
    plain = {k: v for k, v in env.items() if not is_secret_name(k)}
    secret = {k: v for k, v in env.items() if is_secret_name(k)}
    return plain, secret


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy with every secret-looking value replaced by ****."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def mask_text(text: str, secret_values: Iterable[str]) -> str:
    """Replace every occurrence of each secret value (longest first) in text by ****."""
    for value in sorted({v for v in secret_values if v}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def secret_values(environ: Mapping[str, str], env_items: Iterable[str] = ()) -> list[str]:
    """Values to mask: secret-looking variables of ``environ`` and of ``NAME=value`` items from the command line."""
    values = [v for k, v in environ.items() if is_secret_name(k)]
    for item in env_items:
        name, sep, value = item.partition("=")
        if sep and is_secret_name(name):
            values.append(value)
    return values
