"""A preflight's report: ``preflight.json`` (versions, devices, topology, every check and figure) and ``preflight.md``.

Written by rank 0 after every rank returned the same figures; the exit line is the first failing check's verdict,
or that all passed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from nemo_muon.preflight.checks import Check, first_failure
from nemo_muon.preflight.request import PreflightRequest

JSON_NAME, MARKDOWN_NAME = "preflight.json", "preflight.md"
FORMAT = "nemo-muon-preflight/1"


def document(request: PreflightRequest, figures: Any, checks: list[Check], versions: dict[str, str | None]) -> dict:
    """The report as plain JSON data."""
    failed = first_failure(checks)
    return {
        "format": FORMAT,
        "passed": failed is None,
        "first_failure": failed.verdict() if failed else None,
        "request": {f.name: getattr(request, f.name) for f in dataclasses.fields(request) if f.name != "resolved"}
        | {"overrides": list(request.overrides)},
        "versions": versions,
        "topology": {**request.layout.topology(), "devices": figures.devices},
        "paths": figures.paths,
        "checks": [dataclasses.asdict(c) | {"verdict": c.verdict()} for c in checks],
        "figures": {"losses": figures.losses, "optimizer_step_s": figures.step_s, "skipped": figures.skipped,
                    "step_time_ratio": figures.step_time_ratio(), "nonfinite": figures.nonfinite,
                    "masters_first_step": figures.master_worst, "masters_last_step": figures.master_worst_last,
                    "single_process_first_step": figures.single_process,
                    "single_process_first_step_reference": figures.single_process_reference,
                    "reshard_layouts": None if figures.reshard is None else
                    [layout.topology() for layout in figures.reshard],
                    "reshard_next_step": None if figures.resharded is None else
                    {"loss_relative": figures.resharded.loss_diff, "masters": figures.resharded.master_worst},
                    "parameters": figures.matrices},
    }


def markdown(doc: dict) -> str:
    """The short human-readable report."""
    req, topo = doc["request"], doc["topology"]
    lines = [f"# preflight of `{req['recipe']}`: {'PASSED' if doc['passed'] else 'FAILED'}", "",
             f"{topo['world_size']} ranks (PP {topo['pipeline_parallel']}, EP {topo['expert_parallel']}, DP "
             f"{topo['data_parallel']}, expert DP {topo['expert_data_parallel']}) on "
             f"{', '.join(sorted(set(topo['devices'])))}; {req['steps']} steps, saved after step "
             f"{req['save_at'] if req['save_at'] is not None else req['steps'] // 2}"
             + (f"; overrides {' '.join(req['overrides'])}" if req["overrides"] else ""), "",
             *(f"- {role}: {path}" for role, path in doc["paths"].items()), "",
             "| check | verdict | figure | tolerance |", "|---|---|---|---|",
             *(f"| {c['name']} | {_word(c)} | {_cell(c['figure'])} | "
               f"{_cell(c['tolerance'])} |" for c in doc["checks"]), "",
             "versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items() if v), ""]
    return "\n".join(lines)


def _word(check: dict) -> str:
    return "not run" if not check.get("ran", True) else "pass" if check["passed"] else "**FAIL**"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def write_reports(out_dir: str, doc: dict) -> tuple[Path, Path]:
    """``preflight.json`` and ``preflight.md`` under ``out_dir`` (created), each written whole or not at all."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in ((JSON_NAME, json.dumps(doc, indent=2, sort_keys=False) + "\n"), (MARKDOWN_NAME, markdown(doc))):
        target = folder / name
        partial = target.with_suffix(target.suffix + ".partial")
        partial.write_text(text)
        os.replace(partial, target)
        written.append(target)
    return written[0], written[1]


def exit_line(doc: dict) -> str:
    """What the command prints last: the first failing check, or that every check passed."""
    if doc["passed"]:
        not_run = [c["name"] for c in doc["checks"] if not c.get("ran", True)]
        ran = len(doc["checks"]) - len(not_run)
        return (f"preflight passed: {ran} checks of {doc['request']['recipe']}"
                + (f" (not run: {', '.join(not_run)})" if not_run else ""))
    return f"preflight failed: {doc['first_failure']}"
