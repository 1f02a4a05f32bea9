"""A killed pytest leaves none of its session fixtures' processes behind (SIGTERM tears down, SIGKILL kills)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_until

INNER = '''
import os, time
def test_holds_the_session_valkey(valkey_process, tmp_path_factory):
    (tmp_path_factory.getbasetemp().parent.parent / "valkey.pid").write_text(str(valkey_process.pid))
    time.sleep(120)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_pytest_leaves_no_session_valkey(tmp_path, sig):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), suite / "conftest.py")
    (suite / "test_inner.py").write_text(INNER)
    base = tmp_path / "base" / "a" / "b"  # the inner test writes its pid file two levels above its basetemp
    base.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(base),
                             str(suite / "test_inner.py")], cwd=Path(__file__).parent.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "base" / "valkey.pid"
    valkey = None
    try:
        # written after it is created: wait for its content, not only the file
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=60,
                   what="the inner session's Valkey")
        valkey = psutil.Process(int(pid_file.read_text()))
        assert valkey.is_running()
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        # SIGTERM: pytest ends as on Ctrl-C (exit 2, "interrupted": the handler ran and the fixtures were torn
        # down), not killed by the signal (-15); SIGKILL: the kernel's PR_SET_PDEATHSIG is all that is left
        assert code == (2 if sig == signal.SIGTERM else -signal.SIGKILL), code
        gone, alive = psutil.wait_procs([valkey], timeout=20)
        assert not alive, f"the session Valkey outlived pytest killed by {sig.name}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if valkey is not None and valkey.is_running():  # the failure case: stop the orphan, ours by pid
            valkey.kill()
