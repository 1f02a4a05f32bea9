"""The suite's leak check (conftest.no_leaked_processes): a process a test leaves running fails that test, and a
short-lived helper that is still exiting when the test ends does not (CI once failed on dockerd's `runc --version`).
"""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
INNER = ["-p", "no:fencelab", "-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:randomly"]


def test_a_process_left_running_fails_the_test_and_a_helper_that_is_exiting_does_not(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner="""
import subprocess


def test_leaves_a_sleeper():
    subprocess.Popen(["sleep", "120"])


def test_a_helper_exits_a_moment_after_the_test():
    subprocess.Popen(["sleep", "1"])
""")
    # a subprocess: the inner session's own end-of-session check must not see this session's children
    result = pytester.runpytest_subprocess(*INNER, "-q")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*Failed: test leaked processes: *sleep 120*",
                                 "ERROR test_inner.py::test_leaves_a_sleeper - Failed: test leaked processes*"])
    assert "ERROR test_inner.py::test_a_helper_exits" not in result.stdout.str()
