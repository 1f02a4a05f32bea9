"""One container of the Compose stack, owned like a process: `ContainerProcess`.

A Compose service's container is a `lab.stack.process.Process` whose kill /
pause / resume / start / stop go through the Docker SDK (`containers.get`,
`kill(signal=...)`, `pause()`, `unpause()`, `start()`, `stop(timeout=...)`,
`restart(timeout=...)`, `reload()` + `status`, `get_archive(path=...)`)
instead of host pids, so the nemeses that take a stack's processes drive
containers; the Valkey container also carries the stack's persistence mode and
its data directory (`valkey-crash` moves its files with `get_archive` /
`put_archive`).
"""

from __future__ import annotations

import io
import math
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.stack.container_probes import default_probe
from lab.stack.docker_api import api_errors, one_line
from lab.stack.errors import StackError
from lab.stack.process import ProcessError, wait_until_healthy

__all__ = ["LIVE_STATUSES", "ContainerProcess"]

LIVE_STATUSES = ("running", "paused")


@dataclass
class ContainerProcess:
    """A Compose service's container, a `lab.stack.process.Process` driven through the Docker SDK.

    Not a ManagedProcess subclass: every part of it (start, stop, kill, pause, health, logs, state) goes through
    Docker, none through a host pid. `pid` only records the container's main process (`State.Pid`) for the op log.
    """

    name: str
    log_path: Path
    host: str = "127.0.0.1"  # where its published ports answer
    pid: int | None = None
    service: str = ""
    container_id: str = ""
    container_port: str = ""
    client: Any = field(default=None, repr=False, compare=False)
    client_factory: Callable[[], Any] | None = field(default=None, repr=False, compare=False)  # connects lazily
    probe: Callable[["ContainerProcess"], bool] | None = field(default=None, repr=False, compare=False)
    persistence: str | None = None  # Valkey's mode (StackOptions.persistence), for valkey-crash's record
    data_dir: str = ""  # the service's data directory inside the container (Valkey: /data)
    _container: Any = field(default=None, repr=False, compare=False)

    # -- the SDK object ----------------------------------------------------------------
    def container(self) -> Any:
        """The SDK Container, fetched once (`containers.get`) and then `reload()`ed; ProcessError if gone."""
        if self.client is None:
            if self.client_factory is None:
                raise ProcessError(f"{self.name}: no Docker client bound (load the stack first)")
            try:
                self.client = self.client_factory()
            except StackError as e:
                raise ProcessError(f"{self.name}: {e}") from None
        try:
            if self._container is None:
                self._container = self.client.containers.get(self.container_id or self.name)
            else:
                self._container.reload()
        except api_errors() as e:
            self._container = None
            raise ProcessError(f"{self.name}: container {self.container_id[:12] or self.name}: {one_line(e)}") from None
        pid = (getattr(self._container, "attrs", None) or {}).get("State", {}).get("Pid")
        self.pid = pid or None
        return self._container

    def status(self) -> str:
        """Docker's status of the container (`running`, `paused`, `exited`, ...), `missing` when it is gone."""
        try:
            return self.container().status
        except ProcessError:
            return "missing"

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """One SDK call, its failure as a one-line ProcessError."""
        try:
            return fn(**kwargs)
        except api_errors() as e:
            raise ProcessError(f"{self.name}: docker {what} failed: {one_line(e)}") from None

    def _wait_status(self, wanted: tuple[str, ...], timeout: float) -> bool:
        """Poll `reload()` until the status is one of `wanted`; True when it got there."""
        deadline = time.monotonic() + timeout
        while True:
            if self.status() in wanted:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    # -- ManagedProcess's surface -------------------------------------------------------
    def alive(self) -> bool:
        """Is the container running (paused counts: it holds its sockets, like a SIGSTOPped process)?"""
        return self.status() in LIVE_STATUSES

    def paused(self) -> bool:
        """Is the container paused (the cgroup freezer, `docker pause`)?"""
        return self.status() == "paused"

    def healthy(self) -> bool:
        """Running, not paused, and its probe passes over the published port."""
        return self.status() == "running" and (self.probe or default_probe)(self)

    def start(self, timeout: float = 60.0, wait: bool = True) -> "ContainerProcess":
        """`container.start()` (same container, volumes and command); wait until healthy unless `wait=False`."""
        if self.alive():
            raise ProcessError(f"{self.name} is already running (container {self.container_id[:12]})")
        c = self.container()
        self._call("start", c.start)
        self.container()  # reload: the new State.Pid, for the record
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Poll `healthy()`; fail with the container's last log lines if it stops or `timeout` passes."""
        wait_until_healthy(self, timeout, who=f"{self.name} (container {self.container_id[:12]})",
                           where="its last log lines", exit_text=lambda p: f"exit {p.returncode()}", poll=0.1,
                           stop_when_late=False)

    def kill(self) -> None:
        """SIGKILL the container now (the nemesis's crash) and wait until Docker reports it exited."""
        if not self.alive():
            return
        c = self._container
        try:
            c.kill(signal="SIGKILL")
        except api_errors() as e:
            if self.status() != "paused":  # older engines refuse to kill a paused container
                raise ProcessError(f"{self.name}: docker kill failed: {one_line(e)}") from None
            self._call("unpause", c.unpause)
            self._call("kill", c.kill, signal="SIGKILL")
        if not self._wait_status(("exited", "dead", "missing"), 10.0):
            raise ProcessError(f"{self.name}: still {self.status()} 10 s after SIGKILL")

    def signal(self, sig: int | str) -> None:
        """Send `sig` to the container's main process (`container.kill(signal=...)`)."""
        if not self.alive():
            raise ProcessError(f"{self.name} is not running")
        self._call("kill", self._container.kill, signal=sig)

    def pause(self) -> None:
        """`container.pause()`: freeze every process in the container."""
        if self.status() != "running":
            raise ProcessError(f"{self.name} is not running (status {self.status()})")
        self._call("pause", self._container.pause)

    def resume(self) -> None:
        """`container.unpause()`."""
        if self.status() != "paused":
            raise ProcessError(f"{self.name} is not paused (status {self.status()})")
        self._call("unpause", self._container.unpause)

    def restart(self, timeout: float = 10.0, wait: bool = True) -> "ContainerProcess":
        """`container.restart(timeout=...)` (SIGTERM, SIGKILL after `timeout` s), then wait until healthy."""
        c = self.container()
        if c.status == "paused":
            self._call("unpause", c.unpause)
        self._call("restart", c.restart, timeout=math.ceil(timeout))
        if wait:
            self.wait_healthy()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """`container.stop(timeout=...)`: SIGTERM, SIGKILL after `timeout` s (a paused one is unpaused first)."""
        if not self.alive():
            return
        c = self._container
        if c.status == "paused":
            self._call("unpause", c.unpause)  # a frozen process cannot handle SIGTERM
        self._call("stop", c.stop, timeout=math.ceil(timeout))
        if not self._wait_status(("exited", "dead", "missing"), timeout + 5.0):
            raise ProcessError(f"{self.name}: still {self.status()} after docker stop")

    def returncode(self) -> int | None:
        """The exit code of a stopped container, None while it runs."""
        try:
            c = self.container()
        except ProcessError:
            return None
        if c.status in LIVE_STATUSES:
            return None
        return (getattr(c, "attrs", None) or {}).get("State", {}).get("ExitCode")

    # -- ports and logs -------------------------------------------------------------------
    def host_port(self, container_port: str | None = None) -> int | None:
        """The 127.0.0.1 host port Docker published for `container_port` (default: the service's own)."""
        try:
            ports = self.container().ports or {}
        except ProcessError:
            return None
        for binding in ports.get(container_port or self.container_port) or []:
            if binding.get("HostIp") in ("127.0.0.1", "", None) and binding.get("HostPort"):
                return int(binding["HostPort"])
        return None

    @property
    def port(self) -> int | None:
        """The published host port of the service's own port (read live: a restart may publish a new one)."""
        return self.host_port()

    def data_files(self) -> dict[str, int]:
        """The files under `data_dir` in the container (relative path -> size), via `container.get_archive`."""
        if not self.data_dir:
            raise ProcessError(f"{self.name}: no data directory is known for this container")
        stream, _ = self._call("get_archive", self.container().get_archive, path=self.data_dir)
        # the SDK hands out a tar stream; tarfile reads it (held in memory: Valkey's files are small here)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            files = {m.name.split("/", 1)[1]: m.size for m in tar if m.isfile() and "/" in m.name}
        return dict(sorted(files.items()))

    def take_file(self, path: str, dest: Path) -> int:
        """Move the file `path` out of the running container to `dest` on the host (copied with
        `get_archive`, then removed in the container with `rm`); its size in bytes."""
        c = self.container()
        stream, _ = self._call("get_archive", c.get_archive, path=path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = next((m for m in tar if m.isfile()), None)
            if member is None:
                raise ProcessError(f"{self.name}: {path} is not a file in the container")
            data = tar.extractfile(member).read()
        dest.write_bytes(data)
        res = self._call("exec", c.exec_run, cmd=["rm", "-f", "--", path])
        if res.exit_code != 0:
            raise ProcessError(f"{self.name}: cannot remove {path} in the container: {res.output.decode(errors='replace').strip()}")
        return len(data)

    def put_files(self, directory: str, files: dict[str, bytes]) -> list[str]:
        """Write `files` (paths relative to `directory`, in the container, running or not) with
        `put_archive`, owned like `directory` itself (Valkey may run as a user of its own); the paths."""
        c = self.container()
        stream, _ = self._call("get_archive", c.get_archive, path=directory)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            top = next(iter(tar), None)
            uid, gid = (top.uid, top.gid) if top is not None else (0, 0)
        buf = io.BytesIO()
        now = time.time()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel, data in files.items():
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, uid, gid, now
                tar.addfile(info, io.BytesIO(data))
        if not self._call("put_archive", c.put_archive, path=directory, data=buf.getvalue()):
            raise ProcessError(f"{self.name}: docker put_archive into {directory} was refused")
        return list(files)

    def logs(self) -> bytes:
        """Everything the container printed (`container.logs()`)."""
        return self._call("logs", self.container().logs)

    def log_tail(self, lines: int = 20) -> str:
        """The container's last `lines` log lines (for error messages)."""
        try:
            return self._call("logs", self.container().logs, tail=lines).decode(errors="replace").rstrip()
        except ProcessError as e:
            return f"(no log: {e})"

    # -- state ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What `from_state` needs to find this container again (no pid: it is not ours to signal)."""
        return {"name": self.name, "kind": type(self).__name__, "service": self.service,
                "container_id": self.container_id, "container_port": self.container_port,
                "log": str(self.log_path), "persistence": self.persistence, "data_dir": self.data_dir}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "ContainerProcess":
        """A handle on a container recorded by an earlier command (bind a client before use)."""
        return cls(name=d["name"], log_path=Path(d["log"]), service=d.get("service", d["name"]),
                   container_id=d["container_id"], container_port=d.get("container_port", ""),
                   persistence=d.get("persistence"), data_dir=d.get("data_dir", ""))

