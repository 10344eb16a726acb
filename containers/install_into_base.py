"""Install nemo-muon into an NGC base image without touching the base's own packages (stdlib only).

Run by the Dockerfile's runtime stage::

    python3 install_into_base.py --wheel-dir /tmp/nemo-muon-wheels --requirements extras.txt \
        [--minimums minimums.txt]

1. installs the nemo-muon wheel with ``--no-deps`` (torch, Transformer Engine, Megatron-Core, NeMo come from the base);
2. installs each pinned requirement of ``extras.txt`` (``python -m nemo_muon.versions extras <release>``) with
   ``--no-deps``, only if the base has no distribution of that name, or has one older than its line in
   ``minimums.txt`` (``python -m nemo_muon.versions minimums``: ``name>=version``, what nemo-muon's code needs); a
   base's own version is otherwise kept and reported, and a replaced one is reported with the reason;
3. compares every installed distribution before and after, and exits 1 if any base package was changed (other than
   a replacement of step 2) or removed, or anything unexpected was added.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

_SNAPSHOT = (
    "import importlib.metadata as m, json, re\n"
    "print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version for d in m.distributions()}))"
)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """Normalized distribution name -> version, read by a fresh interpreter (no stale metadata cache; ``-P``: the
    working directory is not on sys.path, so a source checkout there is not mistaken for an installed package)."""
    out = subprocess.run([sys.executable, "-P", "-c", _SNAPSHOT], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _matched_lines(path: Path, pattern: str, what: str) -> list[tuple[str, re.Match[str]]]:
    """(line, match) for each non-blank, non-comment line of ``path``; a line that does not match is an error."""
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(pattern, line)
        if not m:
            raise SystemExit(f"install_into_base: {path}: {what}; got {line!r}")
        out.append((line, m))
    return out


def read_pins(path: Path) -> list[tuple[str, str, str]]:
    """(requirement line, normalized name, version) for each ``name==version`` line; other lines are errors."""
    pattern = r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)"
    return [(line, _normalize(m.group(1)), m.group(3))
            for line, m in _matched_lines(path, pattern, "requirement must be an exact pin 'name==version'")]


def read_minimums(path: Path | None) -> dict[str, str]:
    """Normalized name -> minimum version of each ``name>=version`` line (none without a file)."""
    if path is None:
        return {}
    pattern = r"([A-Za-z0-9][A-Za-z0-9._-]*)>=([0-9][0-9A-Za-z.+!-]*)"
    return {_normalize(m.group(1)): m.group(2)
            for _, m in _matched_lines(path, pattern, "a minimum must read 'name>=version'")}


def release_numbers(version: str) -> tuple[int, ...]:
    """The leading numbers of a version (``"0.2.0rc1+abc"`` -> ``(0, 2, 0)``)."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-dir", type=Path, required=True)
    ap.add_argument("--requirements", type=Path, required=True)
    ap.add_argument("--minimums", type=Path, default=None)
    args = ap.parse_args(argv)
    minimums = read_minimums(args.minimums)

    wheels = sorted(args.wheel_dir.glob("nemo_muon-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"install_into_base: expected exactly one nemo_muon-*.whl in {args.wheel_dir}; found {wheels}")
    before = installed()
    to_install = [str(wheels[0])]
    expected_new = {"nemo-muon"}
    replaced: set[str] = set()
    for line, name, version in read_pins(args.requirements):
        minimum = minimums.get(name)
        if name in before and minimum is not None and release_numbers(before[name]) < release_numbers(minimum):
            print(f"install_into_base: base provides {name} {before[name]}, older than the {minimum} nemo-muon needs: "
                  f"replaced by {version}")
            to_install.append(line)
            replaced.add(name)
        elif name in before:
            note = "" if before[name] == version else f" (the table pins {version}; the base's version is kept)"
            print(f"install_into_base: base provides {name} {before[name]}{note}")
        else:
            to_install.append(line)
            expected_new.add(name)
    print(f"install_into_base: pip install --no-deps {' '.join(to_install)}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--quiet", *to_install], check=True
    )
    after = installed()

    changed = {k: (v, after.get(k)) for k, v in before.items()
               if after.get(k) != v and k != "nemo-muon" and k not in replaced}
    added = set(after) - set(before)
    if changed or not added <= expected_new or "nemo-muon" not in after:
        print(f"install_into_base: base packages changed {changed}; added {sorted(added)}, allowed {sorted(expected_new)}",
              file=sys.stderr)
        return 1
    swapped = "".join(f"; replaced {k} {before[k]} -> {after[k]}" for k in sorted(replaced))
    print(f"install_into_base: added {', '.join(f'{k} {after[k]}' for k in sorted(added))}{swapped}; "
          f"{len(before) - len(replaced)} base distributions unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
