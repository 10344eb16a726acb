"""The secret policy of every entry point: recognise secrets, mask them in anything shown, refuse them in overrides.

A secret is a variable whose *name* looks like a credential (`is_secret_name`) or whose *value* carries one
(`is_secret_value`: a password inside a URL or a scheme-less ``user:password@host`` such as an image reference, up to
the last '@' so a password holding '@' is masked whole; a well-known token format). Values are decided on what they
parse to, in one linear pass over their words (no regular expression that backtracks over a long value), and the
NeMo-Run command line on its Python values (`python_strings`: escapes, implicit concatenation, triple quotes and
``dict(...)`` resolved with `ast`, never evaluated). Its value is never printed and never written
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

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MASK = "****"
SHOWN_CHARS = 120
"""Longest user value an error message echoes (longer ones are cut, with their length stated)."""

_CONTAINED = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "APIKEY", "ACCESSKEY",
              "PRIVATEKEY", "SECRETKEY", "WEBHOOK")
_WORDS = frozenset({"PAT", "PASS", "CRED", "CREDS", "COOKIE", "DSN"})
_LAST_WORDS = frozenset({"PWD", "AUTH"})
_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("CONNECTION", "STRING")})
_NOT_TOKEN = re.compile(r"TOKENIZ|TOKENS\Z", re.ASCII)
_TOKEN_SHAPES = re.compile(
    r"\bhf_[A-Za-z0-9]{30,}|\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}|\bsk-[A-Za-z0-9_-]{20,}|\bglpat-[A-Za-z0-9_-]{20,}|\bnvapi-[A-Za-z0-9_-]{20,}"
    r"|-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----", re.ASCII
)
"""Hugging Face, GitHub, AWS access key ids, Slack, OpenAI/Anthropic, GitLab, NVIDIA API keys; PEM private keys.
Each starts with a literal prefix and scans forward only: linear in the text."""
_WORD = re.compile(r"\S+", re.ASCII)
_AUTHORITY_END = "/?#"
_USER_END = frozenset(":/?#@=")
_DIGEST = re.compile(r"[A-Za-z0-9_+.-]{1,32}:[0-9A-Fa-f]{32,}", re.ASCII)
"""What follows '@' in an image reference pinned by digest (``nemo:26.02@sha256:<hex>``): not a host."""


def _userinfo_starts(word: str, last_at: int) -> list[tuple[int, bool]]:
    """Where a ``user:password@`` may start in ``word``: after each ``://`` (a URL), and, without a scheme, at the
    start or after the first ``=`` (``--opt=user:pw@host``, an image ``user:pw@registry/...``). (start, has scheme)."""
    starts = []
    at = word.find("://")
    while 0 <= at < last_at:
        starts.append((at + 3, True))
        at = word.find("://", at + 3)
    if not starts:
        equals = word.find("=")
        starts += [(0, False)] + ([(equals + 1, False)] if 0 <= equals < last_at else [])
    return starts


def _password_span(word: str, start: int, last_at: int, scheme: bool) -> tuple[int, int] | None:
    """The password of the userinfo starting at ``start`` (it ends at the *last* '@' of the word, so a password
    holding '@' is masked whole); None when there is none: no ':' in the user part, or a port followed by a path
    (``host:8080/a@b``). Scans only the user part and the port's digits: linear over all starts of a word."""
    end = start
    while end < last_at and word[end] not in _USER_END:
        end += 1
    if end >= last_at or word[end] != ":" or (not scheme and end == start):
        return None
    digit = end + 1
    while digit < last_at and word[digit] in "0123456789":
        digit += 1
    if digit > end + 1 and word[digit] in _AUTHORITY_END:
        return None  # a port, then a path or query that holds an '@'
    return end + 1, last_at


def _credential_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every password carried in ``text``: ``scheme://user:password@host`` and, without a scheme,
    ``user:password@host`` at the start of a word or after ``=``. One pass over the words: linear in the text."""
    spans: list[tuple[int, int]] = []
    for match in _WORD.finditer(text):
        word, base = match.group(), match.start()
        last_at = word.rfind("@")
        if last_at <= 0 or _DIGEST.match(word, last_at + 1):  # none, or an image pinned by digest
            continue
        for start, scheme in _userinfo_starts(word, last_at):
            span = _password_span(word, start, last_at, scheme)
            if span is not None:
                spans.append((base + span[0], base + span[1]))
                break  # the password runs to the last '@': one span covers the word's userinfo
    return spans


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name, flags=re.ASCII)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.upper(), flags=re.ASCII) if w]


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
    """True for values carrying a credential: ``scheme://user:password@host`` (a password may hold '@'),
    ``user:password@host`` without a scheme (an image reference, ``--opt=user:pw@host``), or a well-known token
    format. Decided by parsing the words of the value, in one linear pass."""
    return bool(_credential_spans(value) or _TOKEN_SHAPES.search(value))


def is_secret(name: str, value: str | None = None) -> bool:
    """A variable whose name or value looks secret."""
    return is_secret_name(name) or (value is not None and is_secret_value(str(value)))


def redact(text: str) -> str:
    """``text`` with URL and ``user:password@`` passwords and well-known tokens replaced by ****."""
    pieces, done = [], 0
    for start, end in _credential_spans(text):
        pieces += [text[done:start], MASK]
        done = end
    return _TOKEN_SHAPES.sub(MASK, "".join(pieces) + text[done:])


def shown_redacted(value: Any, limit: int = SHOWN_CHARS) -> str:
    """What an error message may echo of a user value: its repr, credentials redacted, cut to ``limit`` chars."""
    try:
        text = redact(repr(value))
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"<an integer of {value.bit_length()} bits>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@dataclass(frozen=True)
class PythonStrings:
    """What a Python-syntax value (NeMo-Run's ``key=value``) holds, parsed with `ast`, never evaluated."""

    names: tuple[str, ...]
    """Strings in a name position: dict keys, keyword names, the first item of each ``dict([(k, v), ...])`` pair,
    and every name written literally before ':' or '=' anywhere in the text."""
    values: tuple[str, ...]
    """Every string it holds, escapes decoded, concatenations (implicit, ``+``, f-strings of literals) joined."""
    computed: bool
    """True when it parses but is not plain literal data (calls other than ``dict``, comprehensions, operators,
    conditions): what it would evaluate to cannot be seen without running it."""


_LITERAL_NAME = re.compile(r"""['"]?(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*+)['"]?\s*+[:=]""", re.ASCII)
"""A name written literally before ':' or '=' (``{'HF_TOKEN': ...``, ``HF_TOKEN=...``): starts only at the first
character of a name and never backtracks into it, so it is linear (without both, a 100 KB value took minutes)."""
_LITERAL_NODES = (ast.Expression, ast.Constant, ast.Dict, ast.List, ast.Tuple, ast.Set, ast.Name, ast.Load,
                  ast.keyword, ast.UnaryOp, ast.UAdd, ast.USub)


def _folded(node: ast.AST) -> str | None:
    """The string a node of literals spells (``'a' + 'b'``, ``f'{"a"}b'``), or None."""
    stack, parts = [node], []
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            parts.append(item.value)
        elif isinstance(item, ast.BinOp) and isinstance(item.op, ast.Add):
            stack += [item.right, item.left]
        elif isinstance(item, (ast.JoinedStr, ast.FormattedValue)):
            stack += reversed(item.values) if isinstance(item, ast.JoinedStr) else [item.value]
        else:
            return None
    return "".join(parts)


def _pair_names(call: ast.Call) -> list[ast.AST]:
    """The key nodes of ``dict([(k, v), ...])`` / ``dict(((k, v),))``."""
    keys = []
    for arg in call.args:
        if isinstance(arg, (ast.List, ast.Tuple, ast.Set)):
            keys += [pair.elts[0] for pair in arg.elts if isinstance(pair, (ast.List, ast.Tuple)) and pair.elts]
    return keys


def _token_strings(text: str) -> list[str]:
    """The string literals of text that does not parse as a whole (adjacent ones joined), as far as it tokenizes."""
    found: list[str] = []
    joined: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING:
                try:
                    joined.append(str(ast.literal_eval(tok.string)))
                except (ValueError, SyntaxError):
                    joined.append(tok.string)
                continue
            if joined and tok.type not in (tokenize.NL, tokenize.COMMENT):
                found.append("".join(joined))
                joined = []
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass
    return found + (["".join(joined)] if joined else [])


def python_strings(text: str) -> PythonStrings:
    """The strings a Python-syntax command-line value holds, and where (`PythonStrings`); text that does not parse
    gives every string literal it has, each as a possible name too."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        strings = tuple(_token_strings(text))
        return PythonStrings(names=(*strings, *_LITERAL_NAME.findall(text)), values=strings, computed=False)
    names: list[str] = []
    values: list[str] = []
    computed = False
    for node in ast.walk(tree):
        key_nodes: list[ast.AST] = []
        if isinstance(node, ast.Dict):
            key_nodes = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Call):
            names += [kw.arg for kw in node.keywords if kw.arg]
            dict_call = isinstance(node.func, ast.Name) and node.func.id == "dict"
            key_nodes = _pair_names(node) if dict_call else []
            computed = computed or not dict_call
        elif isinstance(node, (ast.BinOp, ast.JoinedStr)):
            computed = True
            if (folded := _folded(node)) is not None:
                values.append(folded)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            values.append(node.value)
        elif not isinstance(node, (*_LITERAL_NODES, ast.FormattedValue)):
            computed = True
        names += [folded for k in key_nodes if (folded := _folded(k)) is not None]
    names += _LITERAL_NAME.findall(text)  # after the parsed ones: a refusal names what the value spells
    return PythonStrings(names=tuple(names), values=tuple(values), computed=computed)


def _cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """A key or name as a message may quote it: at most ``limit`` characters, the cut stated."""
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
    name = _cut(name or (rest if head == "env" else "")) or None
    key = _cut(key)
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
    name = _cut(name)
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
