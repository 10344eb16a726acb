"""The secret policy of every entry point: recognise secrets, mask them in anything shown, refuse them in overrides.

A secret is a variable whose *name* looks like a credential (`is_secret_name`) or whose *value* carries one
(`is_secret_value`: a password inside a URL, a well-known token format). Its value is never printed and never written
into a file the project or NeMo-Run writes (scripts, ``launch.json``, NeMo-Run's experiment configs): it travels only
through the submitting process's environment, by name (``sbatch --export=ALL``, ``docker run -e NAME``, the child
environment of a local run). Overrides (``env.HF_TOKEN=...``) are printed by ``--dryrun`` and written into job files,
so one carrying a secret is refused (`check_override`), with the same message on every entry point.

Name rule, on the words of the name (split at ``_ - .`` and camelCase, upper-cased):

* a word containing TOKEN (not TOKENIZER*, not the count TOKENS), SECRET, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL,
  APIKEY, ACCESSKEY, PRIVATEKEY, SECRETKEY or WEBHOOK;
* the word PAT, PASS, CRED, CREDS, COOKIE or DSN anywhere; PWD or AUTH as the last word of a longer name (``PWD``
  alone is the shell's folder, ``SSH_AUTH_SOCK`` a socket path);
* KEY/KEYS as the last word or before ID (``SSH_KEY``, ``AWS_ACCESS_KEY_ID``), and the pairs API KEY, ACCESS KEY,
  PRIVATE KEY, CONNECTION STRING anywhere. ``KEY_LENGTH``, ``KEY_FILE``, ``KEYBOARD`` are not secrets.

False positives only cost a detour (the value is forwarded by name instead of written), so the rule errs that way.
Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "****"
SHOWN_CHARS = 120
"""Longest user value an error message echoes (longer ones are cut, with their length stated)."""

_CONTAINED = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "APIKEY", "ACCESSKEY",
              "PRIVATEKEY", "SECRETKEY", "WEBHOOK")
_WORDS = frozenset({"PAT", "PASS", "CRED", "CREDS", "COOKIE", "DSN"})
_LAST_WORDS = frozenset({"PWD", "AUTH"})
_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("CONNECTION", "STRING")})
_NOT_TOKEN = re.compile(r"TOKENIZ|TOKENS$")
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)(?P<pw>[^\s/?#@]+)(?=@)")
_TOKEN_SHAPES = re.compile(
    r"\bhf_[A-Za-z0-9]{30,}|\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}|\bsk-[A-Za-z0-9_-]{20,}|\bglpat-[A-Za-z0-9_-]{20,}|\bnvapi-[A-Za-z0-9_-]{20,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)
"""Hugging Face, GitHub, AWS access key ids, Slack, OpenAI/Anthropic, GitLab, NVIDIA API keys; PEM private keys."""


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if w]


def is_secret_name(name: str) -> bool:
    """True for HF_TOKEN, WANDB_API_KEY, AWS_ACCESS_KEY_ID, GITHUB_PAT, DB_PASSWORD, MYSQL_PWD, ...; false for HF_HOME,
    TOKENIZERS_PARALLELISM, KEY_LENGTH, PATH, PWD (the rule is in the module docstring)."""
    words = _words(name)
    for i, word in enumerate(words):
        if any(part in word for part in _CONTAINED if part != "TOKEN"):
            return True
        if "TOKEN" in word and not _NOT_TOKEN.search(word):
            return True
        if word in _WORDS or (word in _LAST_WORDS and i == len(words) - 1 and i > 0):
            return True
        if word in ("KEY", "KEYS") and (i == len(words) - 1 or words[i + 1] == "ID"):
            return True
        if i and (words[i - 1], word) in _PAIRS:
            return True
    return False


def is_secret_value(value: str) -> bool:
    """True for values carrying a credential: ``scheme://user:password@host``, or a well-known token format."""
    return bool(_URL_PASSWORD.search(value) or _TOKEN_SHAPES.search(value))


def is_secret(name: str, value: str | None = None) -> bool:
    """A variable whose name or value looks secret."""
    return is_secret_name(name) or (value is not None and is_secret_value(str(value)))


def redact(text: str) -> str:
    """``text`` with URL passwords and well-known tokens replaced by ****."""
    return _TOKEN_SHAPES.sub(MASK, _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text))


def shown_redacted(value: Any, limit: int = SHOWN_CHARS) -> str:
    """What an error message may echo of a user value: its repr, credentials redacted, cut to ``limit`` chars."""
    try:
        text = redact(repr(value))
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"<an integer of {value.bit_length()} bits>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def split_secrets(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, secret) parts of an environment mapping."""
    plain = {k: v for k, v in env.items() if not is_secret(k, v)}
    secret = {k: v for k, v in env.items() if is_secret(k, v)}
    return plain, secret


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy with every secret value replaced by ****."""
    return {k: (MASK if is_secret(k, v) else v) for k, v in env.items()}


def mask_text(text: str, secret_values: Iterable[str]) -> str:
    """Replace every occurrence of each secret value (longest first) in text by ****, then `redact` the rest."""
    for value in sorted({v for v in secret_values if v}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return redact(text)


def secret_values(environ: Mapping[str, str], env_items: Iterable[str] = ()) -> list[str]:
    """Values to mask: secret variables of ``environ`` and of ``NAME=value`` items from the command line."""
    values = [v for k, v in environ.items() if is_secret(k, v)]
    for item in env_items:
        name, sep, value = item.partition("=")
        if sep and is_secret(name, value):
            values.append(value)
    return values


def override_refusal(key: str, name: str | None = None) -> str:
    """The one message every entry point gives for an override ``key=value`` that names or carries a secret;
    ``name`` is the variable it sets (default: ``NAME`` of ``env.NAME``)."""
    head, _, rest = key.partition(".")
    name = name or (rest if head == "env" else None)
    if name:
        fix = (f"export {name} in the shell you launch from and pass it by name: `nemo-muon launch --env {name}`; "
               f"`nemo llm pretrain` jobs inherit the launching environment, so leave {name} off the command line")
    else:
        fix = "put the credential in an exported environment variable the job reads instead"
    return (f"override {key}=**** is refused: {key} must not carry a secret (overrides are printed by --dryrun and "
            f"written into job files); {fix}")


def env_value_refusal(name: str, where: str) -> str:
    """The message for a secret given as a value where values are written down: ``--env NAME=value`` (the shell's
    history, the process list) or a cluster profile's ``env`` (a file on disk, often shared); ``where`` names the
    place as the prefix of the name, e.g. ``"--env "`` or ``"clusters.yaml: eos.env."``."""
    return (f"{where}{name}=**** is refused: a secret value must not be written on the command line or in a "
            f"profile; export {name} in the shell you launch from and pass it by name (`nemo-muon launch --env "
            f"{name}`: forwarded through the job's environment, never written into a file or command we generate), "
            f"or keep it in a secrets file your executor mounts (e.g. --mount /path/to/secrets:/secrets:ro) and read "
            f"it from there in the job")


def check_env_value(name: str, value: str, where: str) -> None:
    """Raise ValueError (`env_value_refusal`) when the variable ``name=value`` names or carries a secret."""
    if is_secret(name, value):
        raise ValueError(env_value_refusal(name, where))


def check_override(key: str, value: Any) -> None:
    """Raise ValueError (`override_refusal`) if the override ``key=value`` names or carries a secret."""
    head, _, name = key.partition(".")
    if (head == "env" and is_secret_name(name)) or (isinstance(value, str) and is_secret_value(value)):
        raise ValueError(override_refusal(key))
