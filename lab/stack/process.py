"""One owner object per external process the lab starts.

A `ManagedProcess` knows its argv, pid, ports and log file; it starts the
program in its own session (so a stop reaches any children too), waits until a
health probe passes, and stops it by pid. Its `state()` is a plain dict that a
later command (`fencelab down`) turns back into a handle with `from_state`;
the recorded process start time guards against killing a recycled pid.
"""

from __future__ import annotations

import ctypes
import functools
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx
import psutil


class ProcessError(RuntimeError):
    """A managed process failed to start, become healthy, or stop."""


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (source ports of outgoing connections)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now, below the kernel's ephemeral range.

    A port the kernel hands out for bind(0) comes from the ephemeral range, where any outgoing connection may
    take it as its source port before the program we start binds it (etcd failed start-up so in CI); a port
    below that range is never taken that way. Drawn at random (not seeded: ports are not part of a run's
    replay), checked by binding it, and never one this process handed out before (a port drawn for a process
    that has not started yet is free to bind, so a second draw could return it); the kernel's pick is the
    fallback."""
    low, high = 10000, min(_ephemeral_low(), 65536)
    for _ in range(50):
        port = low + secrets.randbelow(max(high - low, 1))
        if port in _HANDED_OUT:  # drawn for a process that has not bound it yet (etcd-3 met its own proxy so)
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_HANDED_OUT: set[int] = set()  # every port free_port returned in this process: never handed out twice


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Does something accept TCP connections on host:port?"""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def probe_get(url: str, timeout: float = 0.5) -> httpx.Response | None:
    """GET `url` for a health probe, or None when nothing answers. The port is tried first (a refused connection
    costs microseconds) and the GET goes through one shared client without keep-alive: `httpx.get` builds a client
    and its SSL context per call, 20 ms of CPU, which a poll every few ms would pay again and again."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "http" and not port_open(parts.hostname or "127.0.0.1", parts.port or 80, timeout):
        return None
    try:
        return _probe_client().get(url, timeout=timeout)
    except httpx.HTTPError:
        return None


def http_status(url: str, timeout: float = 0.5) -> int | None:
    """The status of GET `url` (`probe_get`), or None when nothing answers."""
    r = probe_get(url, timeout)
    return None if r is None else r.status_code


@functools.cache
def _probe_client() -> httpx.Client:
    """The one HTTP client of the health probes (httpx's Client is thread-safe; no connection is kept)."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


# prctl looked up once, in the parent: between fork and exec the child may only call it (a dlopen there could
# deadlock on a lock another thread of the lab held at the fork)
_PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl


def die_with_parent() -> None:
    """In a child (before exec, or a forked worker): ask Linux to SIGKILL us when the lab process dies (prctl
    PR_SET_PDEATHSIG)."""
    _PRCTL(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def wait_until_healthy(proc: Any, timeout: float, *, who: str, where: str, exit_text: Any = None,
                       poll: float = 0.05, stop_when_late: bool = True) -> None:
    """Poll `proc.healthy()` until it passes (every `Process`'s start-up wait: a host pid, an SSH node's, a
    container); ProcessError naming `who`, `where` its log is and the log's tail when it dies first or `timeout`
    passes (then stopped first, with `stop_when_late`); `exit_text(proc)` says how a dead one ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            code = f" ({exit_text(proc)})" if exit_text is not None else ""
            raise ProcessError(f"{who} exited during start-up{code}; {where}:\n{proc.log_tail()}")
        if proc.healthy():
            return
        time.sleep(poll)
    if stop_when_late:
        proc.stop()
    raise ProcessError(f"{who} not healthy after {timeout:.0f}s; {where}:\n{proc.log_tail()}")


@runtime_checkable
class Process(Protocol):
    """What the lab and its nemeses use of a process it owns, wherever it runs: a pid on this host
    (`ManagedProcess` and its subclasses, `RemoteProcess` over SSH) or a container (`ContainerProcess`)."""

    name: str
    pid: int | None
    log_path: Any

    def alive(self) -> bool: ...

    def healthy(self) -> bool: ...

    def start(self, timeout: float = 30.0, wait: bool = True) -> Any: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def kill(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def log_tail(self, lines: int = 20) -> str: ...


@dataclass
class ManagedProcess:
    """An external program owned by the lab: started, health-checked and stopped by pid."""

    name: str
    argv: list[str]
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] | None = None
    cwd: Path | None = None
    host: str = "127.0.0.1"
    die_with_parent: bool = False  # SIGKILL it if the lab process dies (a run's own stack), not for `fencelab up`
    pid: int | None = None
    create_time: float | None = None
    _popen: subprocess.Popen | None = field(default=None, repr=False)
    _log_file: Any = field(default=None, repr=False)

    # -- lifecycle -------------------------------------------------------
    def start(self, timeout: float = 30.0, *, wait: bool = True) -> "ManagedProcess":
        """Spawn the program (log to log_path) and, with `wait`, block until it is healthy."""
        if self.alive():
            raise ProcessError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab", buffering=0)
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        try:
            self._popen = subprocess.Popen(
                self.argv,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.cwd) if self.cwd else None,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )
        except OSError as e:
            self._close_log()
            raise ProcessError(f"{self.name}: cannot run {self.argv[0]}: {e}") from e
        self.pid = self._popen.pid
        try:
            self.create_time = psutil.Process(self.pid).create_time()
        except psutil.Error:
            self.create_time = None
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Poll `healthy()` until it passes; fail with the log's tail if the process dies or times out."""
        wait_until_healthy(self, timeout, who=self.name, where=f"log {self.log_path}", exit_text=exit_status,
                           poll=0.01)  # a probe costs little (`http_status`): notice readiness within 10 ms

    def healthy(self) -> bool:
        """Default probe: every declared port accepts TCP connections."""
        return all(port_open(self.host, p) for p in self.ports.values())

    def alive(self) -> bool:
        """Is our process (this pid, this start time) still running and not a zombie?"""
        if self.pid is None:
            return False
        if self._popen is not None and self._popen.poll() is not None:
            return False
        try:
            p = psutil.Process(self.pid)
            if self.create_time is not None and abs(p.create_time() - self.create_time) > 0.01:
                return False  # the pid was recycled by another program: not ours
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def signal(self, sig: int) -> None:
        """Send `sig` to our process group (only if the pid is still ours)."""
        if not self.alive():
            raise ProcessError(f"{self.name} is not running")
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL now (the nemesis's crash); the owner can start() it again."""
        if self.alive():
            self.signal(signal.SIGKILL)
        self._reap(5.0)
        self._close_log()

    def pause(self) -> None:
        """SIGSTOP the process group."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process group."""
        self.signal(signal.SIGCONT)

    def terminate(self) -> None:
        """Ask the process group to exit (SIGCONT, then SIGTERM) without waiting: a stack's `down` asks every
        process first and then waits for each in `stop`, so their shutdowns overlap instead of adding up."""
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; always leaves the process gone."""
        if self.alive():
            self.terminate()
            if not self._reap(timeout):
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._reap(5.0)
        self._close_log()

    def _reap(self, timeout: float) -> bool:
        """Wait for our pid to exit; True when it is gone."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._popen is not None:
                try:
                    self._popen.wait(timeout=0.05)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- reporting -------------------------------------------------------
    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def state(self) -> dict[str, Any]:
        """A JSON-able description from which `from_state` can find and stop this process."""
        return {
            "name": self.name,
            "kind": type(self).__name__,
            "argv": self.argv,
            "pid": self.pid,
            "create_time": self.create_time,
            "ports": self.ports,
            "host": self.host,
            "log": str(self.log_path),
        }

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "ManagedProcess":
        """A handle on a process started by an earlier command (stop/kill by pid only)."""
        return ManagedProcess(
            name=d["name"], argv=list(d["argv"]), log_path=Path(d["log"]), ports=dict(d.get("ports", {})),
            host=d.get("host", "127.0.0.1"), pid=d.get("pid"), create_time=d.get("create_time"),
        )


def exit_status(proc: Any, wait_s: float = 5.0) -> str:
    """How a process that is no longer alive ended: `exit 3`, `killed by SIGKILL`. A process whose main thread
    ended while its other threads still exit looks dead (a zombie leader) before it can be reaped: wait for it."""
    popen = getattr(proc, "_popen", None)
    code = proc.returncode()
    if code is None and popen is not None:
        try:
            code = popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
    if code is None:
        return f"exit status unknown: pid {proc.pid} is no longer running as started"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"
