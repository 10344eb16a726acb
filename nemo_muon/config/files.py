"""The one way every command reads and writes the files it is pointed at: bounded, by kind, never through a link.

Reading (`read_file`, `read_text`): the path must name a *regular* file (a symlink to one is followed); a FIFO, a
device (``/dev/zero``), a socket or a folder is refused by its kind before it is opened for reading, so nothing
blocks on a pipe nobody writes or reads forever from a device. The file is opened non-blocking, checked again on
the open descriptor (a path swapped for a FIFO in between is still refused) and read up to ``max_bytes``: a larger
file is refused, never read whole. JSON (`load_json`) is parsed with bounded numbers (`MAX_JSON_DIGITS`) and bounded
nesting (Python's recursion limit), each failure one ValueError naming the file.

Writing (`write_file`): never through a symbolic link at the target (a planted link, even a dangling one, is
refused by name) and atomically inside the target's own folder: a fresh temporary file there (created exclusively,
so a planted link at that name is not followed either), fsynced, then renamed over the target. Readers see the old
file or the new one, never a part. `make_folder` creates a folder and refuses one that cannot be (a regular file on
the way) in one line.

Every error is one ValueError naming what the file is for (``what``: ``--recipe-file``, ``report.md``, ...), the
path (shortened, `nemo_muon._validation.shown`) and what is allowed. Torch-free.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from nemo_muon._validation import shown

MAX_JSON_DIGITS = 40
"""Longest integer a JSON file we read may hold (digits): steps, sizes and offsets have at most 20; longer ones
(``10**400``, 5000 digits) are refused instead of reaching float conversions or Python's 4300-digit limit."""
MAX_JSON_DEPTH = 100
"""Deepest nesting of lists and objects a JSON file we read may have (ours use 4): deeper ones would reach Python's
recursion limit in whatever compares or prints them next."""
_READ_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
    return next((text for test, text in kinds if test(mode)), "not a regular file")


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def read_file(path: str | os.PathLike[str], *, max_bytes: int, what: str) -> bytes:
    """The bytes of regular file ``path``, at most ``max_bytes`` of them; ValueError (one line) for anything else:
    missing, unreadable, a FIFO / device / socket / folder (refused before it is opened), or larger."""
    path = Path(path)
    name = shown(str(path))
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        reason = _reason(e) if isinstance(e, OSError) else "not a valid path"
        raise ValueError(f"{what} must be a readable regular file; got {name} ({reason})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what} must be a regular file; got {name}, {_kind(mode)}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ValueError(f"{what} must be a readable regular file; got {name} ({_reason(e)})") from None
    try:
        opened = os.fstat(fd).st_mode
        if not stat.S_ISREG(opened):  # replaced between the check and the open
            raise ValueError(f"{what} must be a regular file; got {name}, {_kind(opened)}")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ValueError(f"{what} must be a readable regular file; got {name} ({_reason(e)})") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ValueError(f"{what} must be at most {max_bytes} bytes; got {name}, a larger file")
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], *, max_bytes: int, what: str, errors: str = "strict") -> str:
    """`read_file` decoded as UTF-8 (``errors="replace"`` for logs); a file that is not UTF-8 is one ValueError."""
    data = read_file(path, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} must be UTF-8 text; got {shown(str(path))} with byte {data[e.start]:#04x} at "
                         f"offset {e.start}") from None


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_DIGITS:
        raise ValueError(f"integers of at most {MAX_JSON_DIGITS} digits; got one of {len(text)} characters")
    return int(text)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether lists / objects nest deeper than ``limit`` in ``value`` (iterative: any depth is measured)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def load_json(text: str, *, what: str) -> Any:
    """``text`` parsed as JSON, integers of at most `MAX_JSON_DIGITS` digits, nesting at most `MAX_JSON_DEPTH`;
    ValueError naming ``what`` for anything else (never a RecursionError or an integer-conversion error)."""
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"{what} must be JSON nested at most {MAX_JSON_DEPTH} levels deep; got nesting too deep to "
                         "parse") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} must be valid JSON; got {e.msg} at line {e.lineno}, column {e.colno}") from None
    except ValueError as e:
        raise ValueError(f"{what} must be JSON with {e}") from None
    if _too_deep(value, MAX_JSON_DEPTH):
        raise ValueError(f"{what} must be JSON nested at most {MAX_JSON_DEPTH} levels deep; got deeper nesting")
    return value


def make_folder(path: str | os.PathLike[str], *, what: str) -> Path:
    """Create folder ``path`` (and its parents) unless it exists; ValueError when it cannot be a folder (a regular
    file, a dangling link or a file on the way) or cannot be created."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{what} must be a folder; got {shown(str(path))}, which exists and is not one") from None
    except NotADirectoryError:
        raise ValueError(f"{what} must be a folder; got {shown(str(path))}, below a regular file") from None
    except OSError as e:
        raise ValueError(f"{what} must be a folder we can create; got {shown(str(path))} ({_reason(e)})") from None
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(path: str | os.PathLike[str], data: str | bytes, *, what: str) -> Path:
    """Write ``data`` (str: UTF-8) to ``path`` atomically, inside its folder, never through a symbolic link at
    ``path``; returns ``path``. ValueError (one line) when the target is a link or the write fails."""
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{what} must not be a symbolic link (nemo-muon never writes through one); got "
                         f"{shown(str(path))} -> {shown(os.readlink(path))}: remove the link or write elsewhere")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise ValueError(f"{what} must be written into an existing, writable folder; got {shown(str(path))} "
                         f"({_reason(e)})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; the file gets the mode open() would give it
        os.replace(tmp, path)  # replaces a link planted meanwhile, never writes through it
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ValueError(f"{what} could not be written; got {shown(str(path))} ({_reason(e)})") from None
    return path
