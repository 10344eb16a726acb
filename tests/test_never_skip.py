"""The never-skip guard (tests/never_skip.py): a skip under tests/container_stack or tests/megatron_cpu fails the
session and is named; skips elsewhere, xfails and passing runs are left alone; tests/conftest.py registers it."""

from __future__ import annotations

import pytest

from tests.never_skip import NEVER_SKIP_DIRS, PLUGIN_NAME, NeverSkip

pytest_plugins = ["pytester"]

CONFTEST = """
from tests.never_skip import NeverSkip

def pytest_configure(config):
    config.pluginmanager.register(NeverSkip(config.rootpath), "guard")
"""


def _sandbox(pytester: pytest.Pytester, files: dict[str, str]) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(CONFTEST)
    for path, text in files.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def test_skips_under_the_guarded_folders_fail_the_session_naming_each(pytester: pytest.Pytester) -> None:
    _sandbox(pytester, {
        "tests/megatron_cpu/test_in_body.py": "import pytest\ndef test_a():\n    pytest.skip('no gloo here')\n",
        "tests/megatron_cpu/test_marked.py": "import pytest\n@pytest.mark.skip(reason='later')\ndef test_b():\n    pass\n",
        "tests/container_stack/test_module.py": "import pytest\npytest.skip('no bridge', allow_module_level=True)\n",
        "tests/container_stack/test_fine.py": "def test_c():\n    assert True\n",
    })
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines([
        "*skipped where nothing may skip*",
        "tests/container_stack/test_module.py was skipped (Skipped: no bridge)*",  # at collection, so first
        "tests/megatron_cpu/test_in_body.py::test_a was skipped (Skipped: no gloo here): tests under "
        "tests/container_stack, tests/megatron_cpu, tests/newest_stack never skip*",
        "tests/megatron_cpu/test_marked.py::test_b was skipped (Skipped: later)*",
    ])


def test_skips_elsewhere_xfails_and_passing_guarded_tests_keep_the_session_green(pytester: pytest.Pytester) -> None:
    _sandbox(pytester, {
        "tests/test_elsewhere.py": "import pytest\ndef test_a():\n    pytest.skip('no slurm')\n",
        "tests/megatron_cpu_like/test_near.py": "import pytest\ndef test_b():\n    pytest.skip('not guarded')\n",
        "tests/megatron_cpu/test_xfail.py": "import pytest\n@pytest.mark.xfail(reason='known')\ndef test_c():\n"
                                            "    assert False\n",
        "tests/megatron_cpu/test_ok.py": "def test_d():\n    assert True\n",
    })
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert "skipped where nothing may skip" not in result.stdout.str()


def test_a_failing_session_keeps_its_failure_exit_code(pytester: pytest.Pytester) -> None:
    _sandbox(pytester, {"tests/megatron_cpu/test_x.py": "import pytest\ndef test_a():\n    pytest.skip('s')\n"
                                                        "def test_b():\n    assert False\n"})
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["tests/megatron_cpu/test_x.py::test_a was skipped (Skipped: s)*"])


def test_the_shared_conftest_registers_the_guard_for_both_folders(request: pytest.FixtureRequest) -> None:
    guard = request.config.pluginmanager.get_plugin(PLUGIN_NAME)
    assert isinstance(guard, NeverSkip)
    assert guard.dirs == tuple(request.config.rootpath.resolve() / d for d in NEVER_SKIP_DIRS)
    assert NEVER_SKIP_DIRS == ("tests/container_stack", "tests/megatron_cpu", "tests/newest_stack")
    assert guard.guarded("tests/megatron_cpu/test_shims.py::test_x")
    assert not guard.guarded("tests/test_slurm_e2e.py::test_y")
