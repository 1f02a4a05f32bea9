"""Remote hosts over SSH (paramiko): verified connections, a control shell, SFTP, and processes owned by pid.

`SshHost` logs in to one host with strict host-key checking (the host's key
must already be in a known_hosts file: paramiko's `RejectPolicy`, never
`AutoAddPolicy`) and keeps one long-lived `/bin/sh` on an exec channel for
short commands. A fresh exec channel per command costs a full remote login
shell (on a host whose `.bashrc` does work, hundreds of milliseconds); the
control shell answers in a few milliseconds, which keeps nemesis ops on time.
Each command runs in a subshell with stdin from /dev/null, and its end is
marked by a random token followed by its exit status.

`RemoteProcess` (a `lab.stack.process.Process`, not a `ManagedProcess`:
none of it is a local pid or a Popen) is started with
`setsid nohup ... &` (its own session, so a signal to the process group
reaches every child), its pid and kernel start time captured at once (the
guard against a recycled pid, read from `/proc/<pid>/stat`), stopped, killed,
paused and resumed by `kill -<SIG> -- -<pid>` on its host, and declared
healthy by a probe sent over the network from the lab. `RemoteFakeClock`
rewrites a remote libfaketime offset file over SFTP.
"""

from __future__ import annotations

import re
import secrets
import shlex
import signal
import socket
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
import paramiko

from lab.stack.faketime import FakeClock
from lab.stack.process import ProcessError, wait_until_healthy
from lab.stack.valkey import answers_ping

__all__ = [
    "RemoteError",
    "RemoteFakeClock",
    "RemoteLeaseServer",
    "RemoteProcess",
    "RemoteResult",
    "SshHost",
    "SshTarget",
    "parse_target",
    "remote_process",
]

_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+)$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


class RemoteError(RuntimeError):
    """A host cannot be reached, logged in to, or did not run a command as asked (one line, naming the host)."""


@dataclass(frozen=True)
class SshTarget:
    """Where and how to log in: host, port, user, private key file, known_hosts file."""

    host: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None  # None: the SSH agent and ~/.ssh/id_* keys
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    connect_timeout: float = 10.0

    @property
    def label(self) -> str:
        """`user@host:port`, for messages."""
        return f"{self.user}@{self.host}:{self.port}"

    def known_hosts_path(self) -> Path:
        """The known_hosts file this target is checked against."""
        return Path(self.known_hosts).expanduser() if self.known_hosts else Path.home() / ".ssh" / "known_hosts"


def parse_target(spec: str, *, user: str = "root", port: int = 22, key_file: str | None = None,
                 known_hosts: str | None = None, connect_timeout: float = 10.0) -> SshTarget:
    """`[user@]host[:port]` (IPv6 as `[addr]:port`) into an SshTarget, or ValueError naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--node must be [user@]host[:port], got {spec!r}")
    rest = spec.strip()
    if "@" in rest:
        user, rest = rest.split("@", 1)
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail and not tail.startswith(":"):
            raise ValueError(f"--node {spec!r}: expected [ipv6]:port")
        port_s = tail[1:] if tail else None
    elif rest.count(":") == 1:
        host, port_s = rest.split(":")
    else:
        host, port_s = rest, None  # a bare IPv6 address has several ':'
    if port_s is not None:
        if not port_s.isdigit():
            raise ValueError(f"--node {spec!r}: port must be a number, got {port_s!r}")
        port = int(port_s)
    if not _USER.match(user or ""):
        raise ValueError(f"--node {spec!r}: invalid user name {user!r}")
    if not host or not _HOST.match(host):
        raise ValueError(f"--node {spec!r}: invalid host {host!r}")
    if not 1 <= port <= 65535:
        raise ValueError(f"--node {spec!r}: port must be between 1 and 65535, got {port}")
    if key_file is not None and not Path(key_file).expanduser().is_file():
        raise ValueError(f"--ssh-key {key_file}: no such file")
    if not connect_timeout > 0:
        raise ValueError(f"connect timeout must be > 0 seconds, got {connect_timeout!r}")
    return SshTarget(host=host, port=port, user=user, key_file=str(Path(key_file).expanduser()) if key_file else None,
                     known_hosts=known_hosts, connect_timeout=float(connect_timeout))


@dataclass(frozen=True)
class RemoteResult:
    """What a remote command did: exit status and output (stdout and stderr together)."""

    rc: int
    out: str


class _ControlShell:
    """One `/bin/sh` on an exec channel, reading commands from stdin; each answer ends with a token line."""

    def __init__(self, transport: paramiko.Transport, label: str):
        self.label = label
        self.channel = transport.open_session(timeout=10.0)
        self.channel.exec_command("exec /bin/sh")
        self._buf = b""

    def run(self, command: str, timeout: float) -> RemoteResult:
        """Run `command` in a subshell; its output and exit status, or RemoteError after `timeout`."""
        token = secrets.token_hex(8)
        script = f"( {command}\n) </dev/null 2>&1; printf '\\n{token} %d\\n' $?\n"
        self.channel.sendall(script.encode())
        marker = f"\n{token} ".encode()
        deadline = time.monotonic() + timeout
        while True:
            at = self._buf.find(marker)
            if at >= 0:
                end = self._buf.find(b"\n", at + len(marker))
                if end >= 0:
                    out, rc = self._buf[:at], int(self._buf[at + len(marker):end])
                    self._buf = self._buf[end + 1:]
                    return RemoteResult(rc, out.decode(errors="replace"))
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteError(f"{self.label}: command timed out after {timeout:g}s: {command[:120]}")
            self.channel.settimeout(min(left, 1.0))
            try:
                chunk = self.channel.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                raise RemoteError(f"{self.label}: the control shell closed (connection lost?) during: {command[:120]}")
            self._buf += chunk

    def close(self) -> None:
        try:
            self.channel.close()
        except Exception:  # closing a dead channel: nothing to do
            pass


class SshHost:
    """One remote host: a verified paramiko connection, a control shell, and SFTP (thread-safe)."""

    def __init__(self, target: SshTarget):
        self.target = target
        self._client: paramiko.SSHClient | None = None
        self._shell: _ControlShell | None = None
        self._sftp_session: paramiko.SFTPClient | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"SshHost({self.target.label})"

    # -- connection ------------------------------------------------------------
    def connect(self) -> "SshHost":
        """Log in, refusing any host whose key is not in known_hosts (or differs from it)."""
        with self._lock:
            if self.connected:
                return self
            t = self.target
            kh = t.known_hosts_path()
            if not kh.is_file():
                raise RemoteError(f"{t.label}: known_hosts file {kh} does not exist; add the host's key first "
                                  f"(ssh-keyscan -p {t.port} {t.host} >> {kh}, after checking its fingerprint)")
            client = paramiko.SSHClient()
            try:
                client.load_host_keys(str(kh))
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"{t.label}: cannot read known_hosts file {kh}: {e}") from None
            client.set_missing_host_key_policy(paramiko.RejectPolicy())  # strict: an unknown host is refused
            try:
                client.connect(t.host, port=t.port, username=t.user, key_filename=t.key_file,
                               look_for_keys=t.key_file is None, allow_agent=t.key_file is None,
                               timeout=t.connect_timeout, banner_timeout=t.connect_timeout,
                               auth_timeout=t.connect_timeout)
            except paramiko.BadHostKeyException:
                client.close()
                raise RemoteError(f"{t.label}: host key does not match the one in {kh} "
                                  "(refusing to connect: a changed key may be an impostor)") from None
            except paramiko.AuthenticationException:
                client.close()
                how = f"key file {t.key_file}" if t.key_file else "the SSH agent and ~/.ssh keys"
                raise RemoteError(f"{t.label}: authentication failed with {how}") from None
            except paramiko.SSHException as e:
                client.close()
                if "not found in known_hosts" in str(e):
                    raise RemoteError(f"{t.label}: host key not found in {kh}; add it first "
                                      f"(ssh-keyscan -p {t.port} {t.host}, after checking its fingerprint)") from None
                raise RemoteError(f"{t.label}: SSH failed: {e}") from None
            except (OSError, EOFError) as e:
                client.close()
                raise RemoteError(f"{t.label}: cannot connect: {e}") from None
            self._client = client
            return self

    @property
    def connected(self) -> bool:
        """Is the SSH transport up?"""
        tr = self._client.get_transport() if self._client is not None else None
        return tr is not None and tr.is_active()

    def close(self) -> None:
        """Close the control shell, SFTP and the connection."""
        with self._lock:
            if self._shell is not None:
                self._shell.close()
            if self._sftp_session is not None:
                try:
                    self._sftp_session.close()
                except Exception:  # closing a dead session: nothing to do
                    pass
            if self._client is not None:
                self._client.close()
            self._shell = self._sftp_session = self._client = None

    # -- commands --------------------------------------------------------------
    def run(self, command: str, *, timeout: float = 30.0, check: bool = True) -> RemoteResult:
        """Run a short shell command on the host; with `check`, a non-zero exit is a RemoteError."""
        with self._lock:
            self.connect()
            try:
                if self._shell is None:
                    self._shell = _ControlShell(self._client.get_transport(), self.target.label)
                result = self._shell.run(command, timeout)
            except (RemoteError, paramiko.SSHException, OSError, EOFError) as e:
                if self._shell is not None:  # its state is unknown now: the next command gets a new shell
                    self._shell.close()
                    self._shell = None
                if isinstance(e, RemoteError):
                    raise
                raise RemoteError(f"{self.target.label}: {type(e).__name__}: {e}") from None
        if check and result.rc != 0:
            raise RemoteError(f"{self.target.label}: `{command[:120]}` failed (exit {result.rc}): "
                              f"{result.out.strip()[-400:]}")
        return result

    def connection_addresses(self) -> tuple[str, str]:
        """(the lab's address as the host sees it, the host's own address on that connection), from $SSH_CONNECTION."""
        words = self.run("echo $SSH_CONNECTION").out.split()
        if len(words) != 4:
            raise RemoteError(f"{self.target.label}: cannot read $SSH_CONNECTION (got {' '.join(words)!r})")
        return words[0], words[2]

    # -- files -----------------------------------------------------------------
    @contextmanager
    def _sftp(self, what: str):
        """An SFTP session (opened on first use) under the host lock; a failure is a RemoteError naming `what`
        and drops the session, so the next call opens a fresh one."""
        with self._lock:
            try:
                self.connect()
                if self._sftp_session is None:
                    self._sftp_session = self._client.open_sftp()
                yield self._sftp_session
            except (OSError, paramiko.SSHException, EOFError) as e:
                if not isinstance(e, FileNotFoundError) and self._sftp_session is not None:
                    self._sftp_session.close()
                    self._sftp_session = None
                raise RemoteError(f"{self.target.label}: cannot {what}: {e}") from None

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a remote file atomically (write a temporary file, chmod, rename over)."""
        data = data.encode() if isinstance(data, str) else data
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        with self._sftp(f"write {path}") as sftp:
            with sftp.open(tmp, "wb") as f:
                f.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)

    def read_file(self, path: str) -> bytes:
        """The contents of a remote file."""
        with self._sftp(f"read {path}") as sftp, sftp.open(path, "rb") as f:
            return f.read()

    def fetch_tree(self, remote_dir: str, local_dir: Path, *, subdirs: tuple[str, ...]) -> list[Path]:
        """Copy the regular files of `remote_dir/<subdir>` (one level) into `local_dir/<subdir>`; the copies."""
        got = []
        for sub in subdirs:
            src = f"{remote_dir}/{sub}"
            with self._sftp(f"copy {src}") as sftp:
                try:
                    entries = sftp.listdir_attr(src)
                except FileNotFoundError:
                    continue  # this node has no such directory (e.g. no audit logs on the Valkey node)
                for e in entries:
                    if stat.S_ISREG(e.st_mode or 0):
                        dst = Path(local_dir) / sub / e.filename
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        sftp.get(f"{src}/{e.filename}", str(dst))
                        got.append(dst)
        return got


# -- remote processes ------------------------------------------------------------
def _stat_fields(text: str) -> tuple[str, int] | None:
    """(state, start time in clock ticks) from a /proc/<pid>/stat line, or None."""
    _, sep, rest = text.strip().rpartition(")")  # the command name may hold spaces and ')'
    fields = rest.split()
    if not sep or len(fields) < 20:
        return None
    return fields[0], int(fields[19])


def _probe(kind: str, host: str, port: int) -> bool:
    """The health probe of a `kind` of process, sent from the lab over the network."""
    try:
        if kind == "valkey":
            return answers_ping(host, port)
        if kind == "store":
            r = httpx.get(f"http://{host}:{port}/", timeout=0.5)
            return r.status_code == 200 and "version" in r.json()
        if kind == "lease":
            return httpx.get(f"http://{host}:{port}/healthz", timeout=0.5).status_code == 200
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except Exception:  # any failure to answer is "not healthy" (the caller reports the log)
        return False


@dataclass
class RemoteProcess:
    """A program on a remote host, started in its own session and owned by pid (with a start-time guard).

    A `lab.stack.process.Process` of its own (like `ContainerProcess`), not a `ManagedProcess`: its pid is on
    another host, so every part of it (start, signals, liveness, logs) goes through the host's control shell.
    """

    name: str
    argv: list[str]
    log_path: PurePosixPath  # on the host
    ports: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] | None = None
    cwd: str | None = None  # on the host
    host: str = "127.0.0.1"  # where the lab reaches its ports
    pid: int | None = None  # on the host
    remote: SshHost | None = None
    node: str = ""  # the stack's label for the host (n1, n2, ...)
    kind: str = "tcp"  # which health probe: valkey, store, lease or tcp
    start_ticks: int | None = None  # /proc/<pid>/stat start time: a recycled pid is not ours
    local_log: Path | None = field(default=None, repr=False)  # where down() copied the log
    on_start: Any = field(default=None, repr=False, compare=False)  # called with self once a start has a pid

    def __post_init__(self) -> None:
        if self.remote is None:
            raise ValueError(f"{self.name}: a RemoteProcess needs its SshHost")
        self.log_path = PurePosixPath(str(self.log_path))

    # -- lifecycle ---------------------------------------------------------------
    def start(self, timeout: float = 30.0, wait: bool = True) -> "RemoteProcess":
        """Start the program on its host (log appended remotely); with `wait`, until its probe passes."""
        if self.alive():
            raise ProcessError(f"{self.name} is already running on {self.node} (pid {self.pid})")
        q = shlex.quote
        env = " ".join(q(f"{k}={v}") for k, v in sorted((self.env or {}).items()))
        argv = " ".join(q(a) for a in self.argv)
        log = q(str(self.log_path))
        cwd = q(str(self.cwd)) if self.cwd else q(str(self.log_path.parent))
        # the subshell exits at once, so the program is re-parented to the host's init, not kept by our shell;
        # setsid in a non-leader child does not fork, so $! is the program's own pid (nohup and env exec too)
        cmd = (f"mkdir -p {q(str(self.log_path.parent))} {cwd} && cd {cwd} && "
               f"( setsid nohup env {env} {argv} >> {log} 2>&1 < /dev/null & echo $!; cat /proc/$!/stat )")
        try:
            out = self.remote.run(cmd, timeout=15.0).out.splitlines()
            self.pid = int(out[0])
            parsed = _stat_fields(out[1]) if len(out) > 1 else None
        except (RemoteError, ValueError, IndexError) as e:
            raise ProcessError(f"{self.name}: cannot start on {self.node}: {e}") from None
        if parsed is None:
            raise ProcessError(f"{self.name} on {self.node} exited at once; log {self.log_path}:\n{self.log_tail()}")
        self.start_ticks = parsed[1]
        if self.on_start is not None:  # e.g. the stack re-saves state.json: a nemesis restart changes the pid
            self.on_start(self)
        if wait:
            self.wait_healthy(timeout)
        return self

    def _proc_state(self) -> str | None:
        """The kernel state letter of our pid (None when gone or recycled)."""
        if self.pid is None:
            return None
        r = self.remote.run(f"cat /proc/{int(self.pid)}/stat 2>/dev/null", check=False)
        parsed = _stat_fields(r.out) if r.rc == 0 else None
        if parsed is None or (self.start_ticks is not None and parsed[1] != self.start_ticks):
            return None
        return parsed[0]

    def alive(self) -> bool:
        """Is our process (this pid, this start time) running on its host and not a zombie?"""
        return self._proc_state() not in (None, "Z", "X", "x")

    def stopped(self) -> bool:
        """Is it alive but stopped (SIGSTOP)?"""
        return self._proc_state() in ("T", "t")

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Poll `healthy()` until it passes; fail with the remote log's tail if it dies or `timeout` passes."""
        # no exit code: its parent is the host's init
        wait_until_healthy(self, timeout, who=f"{self.name} on {self.node}", where=f"log {self.log_path}")

    def returncode(self) -> int | None:
        return None  # its parent is the host's init, which does not tell us

    def signal(self, sig: int) -> None:
        """Send `sig` to its process group on its host (only if the pid is still ours)."""
        if not self.alive():
            raise ProcessError(f"{self.name} is not running on {self.node}")
        self._kill_group(signal.Signals(sig).name.removeprefix("SIG"))

    def kill(self) -> None:
        """SIGKILL its process group now (the nemesis's crash) and wait until the pid is gone."""
        if self.alive():
            self._kill_group("KILL")
        self._reap(5.0)

    def pause(self) -> None:
        """SIGSTOP its process group."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT its process group."""
        self.signal(signal.SIGCONT)

    def _kill_group(self, *names: str) -> None:
        """`kill -s NAME -- -<pid>` for each name on the host (the POSIX form, which dash accepts too);
        a group already gone is fine, any other failure is a ProcessError."""
        cmd = "; ".join(f"kill -s {n} -- -{int(self.pid)} || exit $?" for n in names)
        r = self.remote.run(cmd, check=False)
        if r.rc != 0 and "No such process" not in r.out:
            raise ProcessError(f"{self.name} on {self.node}: `{cmd}` failed (exit {r.rc}): {r.out.strip()[-200:]}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGCONT + SIGTERM to its process group, then SIGKILL after `timeout`; always leaves it gone."""
        if self.alive():
            self._kill_group("CONT", "TERM")  # a paused process cannot handle SIGTERM
            if not self._reap(timeout):
                self._kill_group("KILL")
                if not self._reap(5.0):
                    raise ProcessError(f"{self.name} (pid {self.pid}) on {self.node} survived SIGKILL")

    def _reap(self, timeout: float) -> bool:
        """Poll until our pid is gone; True when it is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()

    def healthy(self) -> bool:
        """Its probe, over the network from the lab (Valkey PING, CouchDB welcome, /healthz 200, or TCP)."""
        return all(_probe(self.kind, self.host, p) for p in self.ports.values())

    # -- reporting -------------------------------------------------------------------
    def log_tail(self, lines: int = 20) -> str:
        try:
            return self.remote.run(f"tail -n {int(lines)} {shlex.quote(str(self.log_path))}", check=False).out
        except RemoteError as e:
            return f"(cannot read the remote log: {e})"

    def state(self) -> dict[str, Any]:
        """A JSON-able description; `from_state` (with the host) turns it back into a handle."""
        # "remote_pid", not "pid": a LocalStack reading this state by mistake finds no local pid to signal
        d = {"name": self.name, "argv": self.argv, "remote_pid": self.pid, "ports": self.ports, "host": self.host,
             "log": str(self.log_path)}
        d.update(kind=self.kind, node=self.node, start_ticks=self.start_ticks, env=self.env,
                 cwd=str(self.cwd) if self.cwd else None, backend="ssh")
        if isinstance(self, RemoteLeaseServer):
            d.update(url=self.url, valkey_url=self.valkey_url, store_url=self.store_url)
        return d

    @classmethod
    def from_state(cls, d: dict[str, Any], remote: SshHost | None = None) -> "RemoteProcess":
        """A handle on a process an earlier command started on `remote` (restartable: argv, env, cwd kept)."""
        kind = d.get("kind", "tcp")
        klass = RemoteLeaseServer if kind == "lease" else RemoteProcess
        return klass(name=d["name"], argv=list(d["argv"]), log_path=PurePosixPath(d["log"]),
                     ports=dict(d.get("ports", {})), env=d.get("env"), cwd=d.get("cwd"),
                     host=d.get("host", "127.0.0.1"), pid=d.get("remote_pid"), remote=remote, node=d.get("node", ""),
                     kind=kind, start_ticks=d.get("start_ticks"))


class RemoteLeaseServer(RemoteProcess):
    """A remote reference lease server: `serves_leases`, so nemesis.process_faults treats it as a server (ready when
    /healthz answers at all, even 503 while its Valkey is cut off), and `url` works."""

    serves_leases = True

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports['http']}"

    @property
    def valkey_url(self) -> str | None:
        return _option(self.argv, "--valkey-url")

    @property
    def store_url(self) -> str | None:
        return _option(self.argv, "--store-url")


def _option(argv: list[str], name: str) -> str | None:
    """The value after `name` in `argv`, or None."""
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def remote_process(kind: str, **kw: Any) -> RemoteProcess:
    """A RemoteProcess (a RemoteLeaseServer for kind `lease`)."""
    return (RemoteLeaseServer if kind == "lease" else RemoteProcess)(kind=kind, **kw)


class RemoteFakeClock(FakeClock):
    """A libfaketime offset file on a remote host, rewritten atomically over SFTP (same API as FakeClock)."""

    def __init__(self, remote: SshHost, path: str):
        self.remote = remote
        self.path = PurePosixPath(path)

    def offset(self) -> float:
        """The offset currently in force, in seconds."""
        return float(self.remote.read_file(str(self.path)).decode().strip() or 0)

    def _write(self, text: str) -> None:
        self.remote.write_file(str(self.path), text + "\n")
