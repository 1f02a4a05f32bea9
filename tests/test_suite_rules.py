"""The suite's own rules: a per-test timeout, root tests gated by a probe, and no skipped root test in CI.

Each rule is run for real: a tiny test file in a temporary directory, under a
child pytest that loads this suite's conftest as a plugin.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def child_pytest(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(source))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    root: needs root\n")
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
                           "-p", "no:valkey", "-rA", "-q", str(tmp_path / "test_probe.py")],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=240)


SKIPPED_ROOT_TEST = """
    import pytest

    @pytest.mark.root
    @pytest.mark.skipif(True, reason="pretend sshd is missing")
    def test_needs_root():
        pass

    @pytest.mark.skipif(True, reason="an ordinary skip")
    def test_not_root():
        pass
"""


def test_a_skipped_root_test_fails_under_ci_and_only_skips_elsewhere(tmp_path):
    local = child_pytest(tmp_path, SKIPPED_ROOT_TEST)
    assert local.returncode == 0 and "2 skipped" in local.stdout, local.stdout + local.stderr
    ci = child_pytest(tmp_path, SKIPPED_ROOT_TEST, CI="true")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    # a skip in setup turned into a failure is reported as an error: either way the run fails
    assert "1 skipped, 1 error" in ci.stdout and "CI=true: a root test may not be skipped" in ci.stdout


def test_root_tests_run_only_where_the_probe_passes(tmp_path):
    import conftest

    r = child_pytest(tmp_path, """
        import pytest

        @pytest.mark.root
        def test_needs_root():
            pass
    """)
    missing = conftest.root_probe()
    if missing is None:  # this machine can: the test ran
        assert "1 passed" in r.stdout, r.stdout + r.stderr
    else:
        assert "1 skipped" in r.stdout and missing in r.stdout, r.stdout + r.stderr


def test_every_test_has_a_timeout(pytestconfig, tmp_path):
    assert float(pytestconfig.getini("timeout")) == 300
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\n")
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path / "test_hang.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Timeout" in r.stdout, r.stdout + r.stderr
