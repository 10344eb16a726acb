"""The guard that the container-stack and Megatron CPU runs never skip (docs/container_stack.md: "No test skips
here"): a skipped test, or a test module skipped at collection, under `NEVER_SKIP_DIRS` fails the session, naming
each one and its skip reason. `tests/conftest.py` registers it for every run."""

from __future__ import annotations

from pathlib import Path

import pytest

NEVER_SKIP_DIRS: tuple[str, ...] = ("tests/container_stack", "tests/megatron_cpu", "tests/newest_stack")
"""Folders (relative to the rootdir) whose tests must run whenever they are collected."""
PLUGIN_NAME = "nemo_muon_never_skip"


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


class NeverSkip:
    """Records skips under ``dirs`` (relative to ``rootpath``) and turns a passing session into a failing one."""

    def __init__(self, rootpath: Path, dirs: tuple[str, ...] = NEVER_SKIP_DIRS) -> None:
        self.rootpath = rootpath.resolve()
        self.dirs = tuple(self.rootpath / d for d in dirs)
        self.skipped: list[tuple[str, str]] = []

    def guarded(self, nodeid: str) -> bool:
        """Whether the node's file lies under one of the never-skip folders."""
        path = (self.rootpath / nodeid.split("::", 1)[0]).resolve()
        return any(path.is_relative_to(d) for d in self.dirs)

    def _record(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail") and self.guarded(report.nodeid):
            self.skipped.append((report.nodeid, _reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A test skipped at setup (marker) or in its body (`pytest.skip`)."""
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A module skipped at collection (`pytest.skip(allow_module_level=True)`, `pytest.importorskip`)."""
        self._record(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A session that would pass fails when anything guarded was skipped."""
        if self.skipped and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Name every guarded skip and what is allowed."""
        if not self.skipped:
            return
        dirs = ", ".join(str(d.relative_to(self.rootpath)) for d in self.dirs)
        terminalreporter.section("skipped where nothing may skip", sep="=", red=True)
        for nodeid, reason in self.skipped:
            terminalreporter.write_line(f"{nodeid} was skipped ({reason}): tests under {dirs} never skip; make it "
                                        "run here or move it out of these folders")
