"""The Compose stack: the system under test in Docker containers, with LocalStack's surface.

`ComposeStack.up(opts)` writes the stack's inputs into its state directory
(the principals file with key hashes only, for the containers; the API keys in
`credentials.json` and the CouchDB admin in `store-admin.json`, both 0600 and
host-only; the clock offset files), records the Compose project in
`state.json`, runs `docker compose up` on `compose/docker-compose.yml`, finds
each service's container by its Compose labels and waits until it answers.
`down()` (from any later command) runs `docker compose down -v` on the same
project, so it removes exactly the containers, networks and volumes `up` made.

Each service is a `ContainerProcess` (a `lab.stack.process.Process`, not a ManagedProcess) whose kill / pause /
resume / start / stop go through the Docker SDK (`docker.from_env()`,
`containers.get`, `kill(signal=...)`, `pause()`, `unpause()`, `start()`,
`stop(timeout=...)`, `restart(timeout=...)`, `reload()` + `status`,
`get_archive(path=...)`) instead of host pids, so the nemeses that take a
stack's processes drive containers; the Valkey container also carries the
stack's persistence mode and its live published port (`valkey-crash`).
Toxiproxy is published on 127.0.0.1 and `info["topology"]` describes its
proxies (from `compose/toxiproxy.json`), so the network nemeses work as on the
local stack; the clock nemesis rewrites `clocks/<name>.rc` in the directory
the containers mount.

Layout of a compose stack's state directory (`$FENCELAB_HOME/stacks/<name>/`):
    state.json          backend "compose", project, compose file, services, urls
    principals/principals.json   key hashes (mounted read-only into the lease servers)
    credentials.json    the demo API keys (0600, never leaves the host)
    store-admin.json    the CouchDB admin of this stack (0600)
    audit/ clocks/ logs/         mounted audit logs, offset files, container logs saved at `down`
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from lab import paths
from lab.stack.base import StackFiles
from lab.stack.faketime import FakeClock
from lab.stack.images import ImageSet, ensure_images
from lab.stack.local import StackError, StackOptions, stack_dir, write_private_json
from lab.stack.process import ManagedProcess, ProcessError
from lab.stack.topology import Topology, link_name, standard_links

__all__ = [
    "BACKEND",
    "COMPOSE_FILE",
    "ComposeStack",
    "ContainerProcess",
    "compose_command",
    "compose_limits",
    "connect_docker",
    "load_proxies",
    "project_name",
    "stack_backend",
]

BACKEND = "compose"
COMPOSE_FILE = paths.REPO_ROOT / "compose" / "docker-compose.yml"
# the container port each service answers on (its health probe uses the host side of it)
SERVICE_PORTS = {"valkey": "6379/tcp", "store": "5984/tcp", "toxiproxy": "8474/tcp"}
VALKEY_DATA_DIR = "/data"  # the valkey-data volume's mount point in compose/docker-compose.yml
LEASE_PORT = "8080/tcp"
LIVE_STATUSES = ("running", "paused")
PERSISTENCE_ENV = {  # StackOptions.persistence -> (VALKEY_APPENDONLY, VALKEY_APPENDFSYNC)
    "none": ("no", "everysec"),
    "everysec": ("yes", "everysec"),
    "always": ("yes", "always"),
}
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


# -- the Docker SDK, the Compose CLI -------------------------------------------------
def _docker_module() -> Any:
    """The `docker` package, or a StackError saying how to install it."""
    try:
        import docker
    except ImportError:
        raise StackError("the compose backend needs the `docker` Python package: "
                         ".tools/venv/bin/pip install 'docker>=7.1'") from None
    return docker


def _one_line(text: Any) -> str:
    """`text` squeezed onto one line (Docker's errors span several)."""
    return " ".join(str(text).split())


def _api_errors() -> tuple[type[BaseException], ...]:
    """What a Docker SDK call raises when the engine refuses or is gone."""
    import requests

    return (_docker_module().errors.DockerException, requests.exceptions.RequestException)


def connect_docker(factory: Callable[[], Any] | None = None) -> Any:
    """A Docker client (`docker.from_env()` by default), or one StackError line when no engine answers."""
    docker = _docker_module()
    try:
        return (factory or docker.from_env)()
    except docker.errors.DockerException as e:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        raise StackError(f"cannot reach a Docker engine at {where} ({_one_line(e)}): "
                         "the compose backend needs a running Docker engine") from None


def compose_command(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[str]:
    """`docker compose` (the v2 plugin) when it answers, else Debian's `docker-compose`; StackError if neither."""
    if shutil.which("docker"):
        try:
            r = run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                return ["docker", "compose"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    exe = shutil.which("docker-compose")
    if exe:
        return [exe]
    raise StackError("neither `docker compose` nor `docker-compose` is installed: install Docker's compose "
                     "plugin, or Debian's docker-compose (scripts/install.sh compose-tools)")


def is_compose_v2(cmd: Sequence[str]) -> bool:
    """Is this the v2 plugin (which knows `up --wait`)?"""
    return list(cmd[:2]) == ["docker", "compose"]


OWNER_LABEL = "org.fencelab.owner"  # "pid:start time" of the lab process whose run owns the project
PROJECT_LABEL = "com.docker.compose.project"


def owner_id(pid: int | None = None) -> str:
    """This process (or `pid`) as an owner label: its pid and start time (a reused pid is not the owner)."""
    import psutil

    p = psutil.Process(pid)
    return f"{p.pid}:{p.create_time():.2f}"


def owner_alive(owner: str) -> bool:
    """Is the process an owner label names still running (same pid, same start time)?"""
    import psutil

    try:
        pid, started = owner.split(":", 1)
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 0.5
    except (ValueError, psutil.Error):
        return False


def reap_orphans(client: Any) -> dict[str, dict[str, int]]:
    """Remove the Compose projects of runs whose lab process died before its `down` (SIGKILL, power loss):
    containers labelled with an owner that is no longer running, then their project's networks and volumes.
    Only resources carrying `org.fencelab.owner` with a dead owner are touched: `fencelab up` stacks (no owner)
    and other projects never are. Returns project -> counts removed."""
    dead: set[str] = set()
    for c in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
        labels = c.labels or {}
        owner, project = labels.get(OWNER_LABEL, ""), labels.get(PROJECT_LABEL, "")
        if owner and project.startswith("fencelab-") and not owner_alive(owner):
            dead.add(project)
    out: dict[str, dict[str, int]] = {}
    for project in sorted(dead):
        flt = {"label": f"{PROJECT_LABEL}={project}"}
        counts = {"containers": 0, "networks": 0, "volumes": 0}
        for c in client.containers.list(all=True, filters=flt):
            c.remove(force=True, v=True)
            counts["containers"] += 1
        for n in client.networks.list(filters=flt):
            n.remove()
            counts["networks"] += 1
        for v in client.volumes.list(filters=flt):
            v.remove(force=True)
            counts["volumes"] += 1
        out[project] = counts
    return out


def project_name(stack_name: str) -> str:
    """The Compose project of a stack: lower-case letters, digits, `-` and `_` (Compose's rule)."""
    return "fencelab-" + re.sub(r"[^a-z0-9_-]", "-", stack_name.lower())


# -- the Toxiproxy configuration ----------------------------------------------------
def load_proxies(path: Path) -> dict[str, dict[str, Any]]:
    """The proxies of `toxiproxy.json` by name, checked: `<from>_<to>` names, `host:port` addresses."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise StackError(f"cannot read the Toxiproxy config {path}: {e}") from None
    if not isinstance(data, list):
        raise StackError(f"{path}: expected a JSON list of proxies, got {type(data).__name__}")
    proxies: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(data):
        name = p.get("name") if isinstance(p, dict) else None
        if not isinstance(name, str) or name.count("_") != 1:
            raise StackError(f"{path}: proxy {i} needs a name '<from>_<to>', got {name!r}")
        frm, to = name.split("_")
        try:
            link_name(frm, to)
        except ValueError as e:
            raise StackError(f"{path}: proxy {name!r}: {e}") from None
        for key in ("listen", "upstream"):
            if not isinstance(p.get(key), str) or not re.fullmatch(r"[\w.\-\[\]:]+:\d{1,5}", p[key]):
                raise StackError(f"{path}: proxy {name!r} needs '{key}' as 'host:port', got {p.get(key)!r}")
        if name in proxies:
            raise StackError(f"{path}: proxy {name!r} is defined twice")
        proxies[name] = dict(p, frm=frm, to=to)
    return proxies


def compose_limits(proxies: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(servers, client groups) the Compose stack can run: those whose every link has a proxy."""
    servers = 0
    while f"lease-{servers + 1}_valkey" in proxies and f"lease-{servers + 1}_store" in proxies:
        servers += 1
    clients = 0
    while servers and all(f"c{clients + 1}_lease-{s}" in proxies for s in range(1, servers + 1)):
        clients += 1
    return servers, clients


def _port_of(address: str) -> int:
    """The port of 'host:port'."""
    return int(address.rsplit(":", 1)[1])


# -- health probes over the published ports -------------------------------------------------
def _http_ok(url: str, statuses: tuple[int, ...] = (200,)) -> bool:
    """Does GET `url` answer one of `statuses`?"""
    try:
        return httpx.get(url, timeout=1.0).status_code in statuses
    except httpx.HTTPError:
        return False


def _welcome_ok(url: str) -> bool:
    """Does GET `url` answer a CouchDB welcome document (a JSON object with `version`)?"""
    try:
        r = httpx.get(url, timeout=1.0)
        return r.status_code == 200 and "version" in r.json()
    except (httpx.HTTPError, ValueError):
        return False


def _valkey_ok(port: int) -> bool:
    """Does Valkey answer PING (not merely accept: it loads its AOF before serving)?"""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0, socket_connect_timeout=1.0,
                    retry=Retry(NoBackoff(), 0))
    try:
        return bool(c.ping())
    except Exception:
        return False
    finally:
        c.close()


def default_probe(proc: "ContainerProcess") -> bool:
    """The service's own health probe through its published port, as the local stack's owners do."""
    port = proc.host_port()
    if port is None:
        return False
    if proc.service == "valkey":
        return _valkey_ok(port)
    if proc.service == "store":  # the welcome document: Apache CouchDB and pouchdb-server both serve it
        return _welcome_ok(f"http://127.0.0.1:{port}/")
    if proc.service == "toxiproxy":
        return _http_ok(f"http://127.0.0.1:{port}/version")
    return _http_ok(f"http://127.0.0.1:{port}/healthz")


def stack_backend(name: str = "default", home: Path | None = None, root: Path | None = None) -> str | None:
    """Which backend started the stack (`compose` or `local`), from its state.json; None when it is not up."""
    state = (Path(root) if root is not None else stack_dir(name, home)) / "state.json"
    try:
        data = json.loads(state.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StackError(f"cannot read {state}: {e}") from None
    return data.get("backend", "local")


# -- one container ------------------------------------------------------------------------
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
        except _api_errors() as e:
            self._container = None
            raise ProcessError(f"{self.name}: container {self.container_id[:12] or self.name}: {_one_line(e)}") from None
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
        except _api_errors() as e:
            raise ProcessError(f"{self.name}: docker {what} failed: {_one_line(e)}") from None

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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ProcessError(f"{self.name} (container {self.container_id[:12]}) exited during start-up "
                                   f"(exit {self.returncode()}); its last log lines:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.1)
        raise ProcessError(f"{self.name} (container {self.container_id[:12]}) not healthy after {timeout:.0f}s; "
                           f"its last log lines:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the container now (the nemesis's crash) and wait until Docker reports it exited."""
        if not self.alive():
            return
        c = self._container
        try:
            c.kill(signal="SIGKILL")
        except _api_errors() as e:
            if self.status() != "paused":  # older engines refuse to kill a paused container
                raise ProcessError(f"{self.name}: docker kill failed: {_one_line(e)}") from None
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


# -- the stack --------------------------------------------------------------------------
@dataclass
class ComposeStack(StackFiles):
    """A named Compose stack: its project, containers and state directory (LocalStack's surface).

    `docker_factory`, `run` and `compose_cmd` default to `docker.from_env`,
    `subprocess.run` and the detected Compose CLI; tests replace them.
    """

    name: str = "default"
    home: Path | None = None
    root: Path | None = None
    compose_file: Path = COMPOSE_FILE
    build: bool = True  # `up --build` with the official images: (re)build the lease server and Valkey images
    images: str = "auto"  # official, local (built from local parts: lab/stack/images.py), or auto: official if they can be had
    image_set: Callable[[Path], ImageSet] | None = None  # decides and builds the images (tests replace it)
    start_engine: bool = False  # start dockerd (root) when no engine answers; `down` stops only that one
    die_with_owner: bool = False  # a run's stack: labelled with this process, reaped by a later run if it dies
    timeout_s: float = 900.0  # the whole `compose up` (pulls, builds, health waits)
    health_timeout_s: float = 120.0  # per service, after `compose up` returned
    docker_factory: Callable[[], Any] | None = None
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run
    compose_cmd: list[str] | None = None
    probe: Callable[[ContainerProcess], bool] | None = None
    http: httpx.Client | None = None  # for the store's system databases (a MockTransport in tests)
    processes: list[ContainerProcess] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    _client: Any = field(default=None, repr=False)

    # -- paths ---------------------------------------------------------------------------

    @property
    def store_admin_file(self) -> Path:
        return self.dir / "store-admin.json"

    @property
    def project(self) -> str:
        return self.info.get("project") or project_name(self.name)

    @property
    def toxiproxy_config(self) -> Path:
        return Path(self.compose_file).parent / "toxiproxy.json"

    # -- engine and CLI ------------------------------------------------------------------
    def docker(self) -> Any:
        """The Docker client (connected once); one StackError line when no engine answers."""
        if self._client is None:
            self._client = connect_docker(self.docker_factory)
        return self._client

    def compose(self) -> list[str]:
        """The Compose CLI argv prefix (detected once)."""
        if self.compose_cmd is None:
            self.compose_cmd = compose_command(self.run)
        return self.compose_cmd

    def compose_files(self) -> list[Path]:
        """The Compose files of this stack: the main file, plus the local-images override when those are used."""
        return [Path(f) for f in self.info.get("compose_files", [])] or [Path(self.compose_file)]

    def _compose_argv(self, *args: str) -> list[str]:
        """A full Compose command line for this stack's files and project."""
        files = [a for f in self.compose_files() for a in ("-f", str(f.resolve()))]
        return [*self.compose(), *files, "-p", self.project, *args]

    def _run_compose(self, args: list[str], env: dict[str, str]) -> None:
        """Run one Compose command (output appended to logs/compose.log); StackError naming it if it fails."""
        argv = self._compose_argv(*args)
        shown = " ".join(["compose", *args])
        log = self.dir / "logs" / "compose.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            r = self.run(argv, env=env, cwd=str(Path(self.compose_file).resolve().parent),
                         capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise StackError(f"`{shown}` did not finish in {self.timeout_s:.0f}s (output in {log})") from None
        except OSError as e:
            raise StackError(f"cannot run {argv[0]}: {e.strerror or e}") from None
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"$ {' '.join(argv)}\n{r.stdout or ''}{r.stderr or ''}\n")
        if r.returncode != 0:
            lines = [ln for ln in (r.stderr or r.stdout or "").splitlines() if ln.strip()]
            last = lines[-1].strip() if lines else "no output"
            raise StackError(f"`{shown}` failed (exit {r.returncode}): {last} (full output in {log})")

    def _compose_env(self) -> dict[str, str]:
        """The variables docker-compose.yml interpolates, from this stack's options and files."""
        opts = self.info.get("options", {})
        appendonly, fsync = PERSISTENCE_ENV[opts.get("persistence", "none")]
        try:
            admin = json.loads(self.store_admin_file.read_text())
        except (OSError, ValueError):
            admin = {"user": "unset", "password": "unset"}  # `down` of a half-written stack only needs the project
        env = dict(os.environ)
        env.update({
            "FENCELAB_STATE_DIR": str(self.dir.resolve()),
            "FENCELAB_UID": str(os.getuid()),
            "FENCELAB_GID": str(os.getgid()),
            "FENCELAB_FAKETIME": "1" if opts.get("fake_clocks") else "0",
            "VALKEY_APPENDONLY": appendonly,
            "VALKEY_APPENDFSYNC": fsync,
            "COUCHDB_USER": admin["user"],
            "COUCHDB_PASSWORD": admin["password"],
            "FENCELAB_OWNER": self.info.get("owner") or "",
        })
        return env

    # -- up ---------------------------------------------------------------------------------
    def check(self, opts: StackOptions) -> dict[str, dict[str, Any]]:
        """Validate `opts` against the Compose files (no Docker needed); the Toxiproxy proxies by name."""
        opts.validate()
        if not Path(self.compose_file).is_file():
            raise StackError(f"compose file {self.compose_file} not found (run from a fencelab checkout, "
                             "or pass the compose file)")
        proxies = load_proxies(self.toxiproxy_config)
        servers, clients = compose_limits(proxies)
        if opts.servers > servers:
            raise StackError(f"--servers {opts.servers}: the compose stack defines lease-1..lease-{servers} "
                             f"(add services to {self.compose_file} and proxies to {self.toxiproxy_config} for more)")
        if opts.client_groups > clients:
            raise StackError(f"{opts.client_groups} client groups: {self.toxiproxy_config} has client links "
                             f"for c1..c{clients} only")
        return proxies

    def up(self, opts: StackOptions | None = None) -> dict[str, Any]:
        """Validate, reach Docker, write the inputs, `compose up`, wait until healthy; on failure `down()`."""
        opts = opts or StackOptions()
        proxies = self.check(opts)
        engine = None
        if self.start_engine and self.docker_factory is None:
            from lab.stack.dockerd import ensure_engine

            engine = ensure_engine(self.dir / "logs")
        try:
            self.docker()  # no engine: one line, before anything is written or started
        except StackError:
            if engine is not None:
                engine.stop()
            raise
        self.compose()
        try:
            reaped = reap_orphans(self.docker())
        except _api_errors() as e:  # leftovers of a dead run stay (and are reported); this run still goes on
            reaped = {"error": _one_line(e)}
        if self.load_state():
            if any(p.alive() for p in self._bound()):
                raise StackError(f"stack {self.name!r} is already up; run `fencelab down --name {self.name}` first")
            self.down()  # a stale project (an earlier up that died): remove its containers and volumes first
        self.processes = []
        opts = StackOptions(**{**vars(opts), "toxiproxy": True,  # every link goes through Toxiproxy here
                               # the lease servers' --store-url is in the compose file: the store always runs (the
                               # recovery rule keeps its epoch there even when the workload writes no documents)
                               "store": True, "recovery_store": False})
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            chosen = (self.image_set or (lambda log: ensure_images(log, prefer=self.images)))(
                self.dir / "logs" / "images.log")
        except BaseException:
            if engine is not None:
                engine.stop(timeout=30.0)
            raise
        self.info = {"name": self.name, "backend": BACKEND, "dir": str(self.dir), "project": project_name(self.name),
                     "compose_file": str(Path(self.compose_file).resolve()), "options": vars(opts),
                     "compose_files": [str(Path(f).resolve()) for f in chosen.compose_files]
                     + ([str(self._write_mutant_override(opts))] if opts.mutant else []),
                     "images": {"kind": chosen.kind, "reason": chosen.reason, "build_seconds": chosen.seconds},
                     "services": self._services(opts), "credentials": str(self.credentials_file),
                     "store_admin": str(self.store_admin_file),
                     "engine": engine.state() if engine is not None else None,  # dockerd, if the lab started it
                     "owner": owner_id() if self.die_with_owner else "", "reaped": reaped}
        self._write_inputs(opts)
        self.save_state()  # before anything starts: `down` always finds the project
        try:
            self._start_all(opts, proxies)
        except BaseException as e:
            self._cleanup_after(e)
            raise
        self.save_state()
        return self.status()

    def _write_mutant_override(self, opts: StackOptions) -> Path:
        """A Compose file laid over the others that plants `opts.mutant` in every lease server (lab runs only)."""
        import yaml  # the main file's lease-server commands, to append the planted-bug flags to

        main = yaml.safe_load(Path(self.compose_file).read_text())
        services = {}
        for name, svc in main.get("services", {}).items():
            if name.startswith("lease-"):
                services[name] = {"command": [*svc["command"], "--allow-mutants", "--mutant", opts.mutant]}
        path = self.dir / "compose.mutant.yml"
        self.dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"version": main.get("version", "3.8"), "services": services}, indent=1)
                        if "version" in main else json.dumps({"services": services}, indent=1))
        return path

    def _cleanup_after(self, error: BaseException) -> None:
        """`down()` after a failed `up`; if that fails too, one StackError naming both."""
        try:
            self.down()
        except (StackError, ProcessError) as cleanup:
            raise StackError(f"{_one_line(error)}; cleaning up also failed: {cleanup}") from error

    def _services(self, opts: StackOptions) -> list[str]:
        """The services `up` starts, backends first."""
        return ["valkey", *(["store"] if opts.store else []), "toxiproxy",
                *[f"lease-{i}" for i in range(1, opts.servers + 1)]]

    def _write_inputs(self, opts: StackOptions) -> None:
        """The principals file (hashes only), the host-only credentials, the store admin, clocks and audit dirs."""
        from lab.server.auth import provision_demo_principals, write_principals_file

        for sub in ("principals", "audit", "clocks", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        records, credentials = provision_demo_principals()
        write_principals_file(records, self.dir / "principals" / "principals.json")
        write_private_json(self.credentials_file, credentials)
        write_private_json(self.store_admin_file, {"user": "fencelab", "password": secrets.token_urlsafe(24)})
        if opts.fake_clocks:
            names = ["valkey", *[f"lease-{i}" for i in range(1, opts.servers + 1)]]
            self.info["clocks"] = {n: str(self.dir / "clocks" / f"{n}.rc") for n in names}
            for path in self.info["clocks"].values():
                FakeClock(Path(path)).reset()

    def _start_all(self, opts: StackOptions, proxies: dict[str, dict[str, Any]]) -> None:
        """`compose up`, attach every container, wait for health, then describe the stack."""
        services = self.info["services"]
        build = self.build and self.info.get("images", {}).get("kind", "official") == "official"
        args = ["up", "-d", "--remove-orphans", *(["--build"] if build else []),
                *(["--wait"] if is_compose_v2(self.compose()) else []), *services]
        self._run_compose(args, self._compose_env())
        for service in services:
            self.processes.append(self._attach(service))
            self.save_state()
        for proc in self.processes:
            proc.wait_healthy(self.health_timeout_s)
        self._describe(opts, proxies)
        if opts.store:
            self._init_store()

    def _attach(self, service: str) -> ContainerProcess:
        """The one container of `service` in this project (found by its Compose labels)."""
        found = self.docker().containers.list(
            all=True, filters={"label": [f"{PROJECT_LABEL}={self.project}", f"{SERVICE_LABEL}={service}"]})
        if len(found) != 1:
            raise StackError(f"compose project {self.project}: expected one container for {service}, found {len(found)}")
        port = SERVICE_PORTS.get(service, LEASE_PORT)
        valkey = service == "valkey"
        persistence = self.info.get("options", {}).get("persistence", "none") if valkey else None
        return ContainerProcess(name=service, log_path=self.dir / "logs" / f"{service}.log",
                                service=service, container_id=found[0].id, container_port=port,
                                client=self.docker(), probe=self.probe, persistence=persistence,
                                data_dir=VALKEY_DATA_DIR if valkey else "")

    def _describe(self, opts: StackOptions, proxies: dict[str, dict[str, Any]]) -> None:
        """URLs on 127.0.0.1 and the Toxiproxy topology, as LocalStack records them."""
        def url(service: str, scheme: str, suffix: str = "") -> str:
            port = self.process(service).host_port()
            if port is None:
                raise StackError(f"{service}: port {self.process(service).container_port} is not published on 127.0.0.1")
            return f"{scheme}://127.0.0.1:{port}{suffix}"

        servers = [f"lease-{i}" for i in range(1, opts.servers + 1)]
        self.info["valkey"] = url("valkey", "redis", "/0")
        self.info["store"] = url("store", "http") if opts.store else None
        self.info["toxiproxy"] = url("toxiproxy", "http")
        self.info["lease_servers"] = [url(s, "http") for s in servers]
        toxiproxy = self.process("toxiproxy")
        desc = {}
        for frm, to in standard_links(opts.client_groups, servers, store=opts.store):
            p = proxies[f"{frm}_{to}"]
            if frm.startswith("c"):  # a client link: what the lab dials is the published port
                host_port = toxiproxy.host_port(f"{_port_of(p['listen'])}/tcp")
                if host_port is None:
                    raise StackError(f"toxiproxy: the listen port of proxy {frm}_{to} ({p['listen']}) is not published")
                listen = f"127.0.0.1:{host_port}"
            else:  # a backend link: what the lease server dials inside the Compose network
                listen = f"toxiproxy:{_port_of(p['listen'])}"
            desc[f"{frm}_{to}"] = {"from": frm, "to": to, "listen": listen, "upstream": p["upstream"]}
        self.info["topology"] = Topology.from_description(None, desc).describe()
        self.info["client_nodes"] = [f"http://{desc[f'c{g}_{s}']['listen']}"
                                     for g in range(1, opts.client_groups + 1) for s in servers]

    def _init_store(self) -> None:
        """Create CouchDB's system databases (`_users`, `_replicator`): a single node's manual set-up."""
        admin = json.loads(self.store_admin_file.read_text())
        http = self.http or httpx.Client(timeout=10.0)
        try:
            for db in ("_users", "_replicator"):
                try:
                    r = http.put(f"{self.info['store']}/{db}", auth=(admin["user"], admin["password"]))
                except httpx.HTTPError as e:
                    raise StackError(f"store: cannot create {db}: {e}") from None
                if r.status_code not in (201, 202, 412):
                    raise StackError(f"store: creating {db} answered HTTP {r.status_code}: {r.text[:200]}")
        finally:
            if self.http is None:
                http.close()

    def store_url(self, *, with_credentials: bool = False) -> str | None:
        """The store's URL on 127.0.0.1; with the admin in it when asked (never print that one)."""
        url = self.info.get("store")
        if not url or not with_credentials:
            return url
        admin = json.loads(self.store_admin_file.read_text())
        return url.replace("http://", f"http://{admin['user']}:{admin['password']}@", 1)

    # -- state --------------------------------------------------------------------------------
    def save_state(self) -> None:
        write_private_json(self.state_file, dict(self.info, processes=[p.state() for p in self.processes]))

    def load_state(self) -> dict[str, Any] | None:
        """Read state.json (if any) into container handles (bound to Docker when first used)."""
        data = self.read_state_file()
        if data is None:
            return None
        if data.get("backend") != BACKEND:
            raise StackError(f"stack {self.name!r} in {self.dir} belongs to the local backend: take it down with "
                             f"`fencelab down --name {self.name}` or pick another name")
        self.processes = [ContainerProcess.from_state(d) for d in data.get("processes", [])]
        for p in self.processes:
            p.client_factory, p.probe = self.docker, self.probe
        self.info = {k: v for k, v in data.items() if k != "processes"}
        if self.info.get("compose_file"):
            self.compose_file = Path(self.info["compose_file"])
        return data

    def _bound(self) -> list[ContainerProcess]:
        """The processes, each bound to this stack's Docker client (StackError when no engine answers)."""
        if self.processes:
            client = self.docker()
            for p in self.processes:
                p.client = p.client or client
        return self.processes

    def status(self) -> dict[str, Any]:
        """What `fencelab status --json` prints (no secrets: the store URL carries no password)."""
        try:
            procs = [self._process_status(p) for p in self._bound()]
            error = None
        except StackError as e:
            procs, error = [], str(e)
        out = {
            "name": self.name,
            "backend": BACKEND,
            "project": self.project,
            "up": bool(procs) and all(p["alive"] for p in procs),
            "lease_servers": self.info.get("lease_servers", []),
            "valkey": self.info.get("valkey"),
            "store": self.info.get("store"),
            "toxiproxy": self.info.get("toxiproxy"),
            "client_nodes": self.info.get("client_nodes", self.info.get("lease_servers", [])),
            "topology": self.info.get("topology"),
            "clocks": self.info.get("clocks", {}),
            "credentials": str(self.credentials_file),
            "store_admin": str(self.store_admin_file),
            "dir": str(self.dir),
            "processes": procs,
        }
        if error:
            out["error"] = error
        return out

    @staticmethod
    def _process_status(p: ContainerProcess) -> dict[str, Any]:
        """One container in `status()`: LocalStack's keys (name, pid, alive, ports, log) plus Docker's view."""
        status = p.status()
        return {"name": p.name, "pid": p.pid, "alive": status in LIVE_STATUSES, "status": status,
                "ports": {p.container_port: p.host_port()}, "container": p.container_id[:12],
                "log": f"docker logs {p.container_id[:12]}"}

    def process(self, name: str) -> ContainerProcess:
        """The container of service `name` (e.g. `valkey`, `lease-2`, `store`), bound to Docker."""
        for p in self._bound():
            if p.name == name:
                return p
        raise StackError(f"stack {self.name!r} has no process {name!r}; it has {[p.name for p in self.processes]}")

    # -- down ---------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Save each container's log, `compose down -v --remove-orphans` the project, remove state.json."""
        if not self.info:
            self.load_state()
        if not self.info:
            return []
        self.docker()
        self._save_logs()
        try:
            self._run_compose(["down", "-v", "--remove-orphans"], self._compose_env())
        finally:
            if self.info.get("engine"):  # the dockerd this stack started (by pid; an engine it found stays)
                ManagedProcess.from_state(self.info["engine"]).stop(timeout=30.0)
                if self._client is not None:
                    self._client.close()
                    self._client = None
        stopped = list(self.info.get("services", []))
        self.processes, self.info = [], {}
        if self.state_file.exists():
            self.state_file.unlink()
        return stopped

    def _save_logs(self) -> None:
        """Write every container's output to logs/<service>.log before the containers go (best effort)."""
        for p in self._bound():
            try:
                p.log_path.parent.mkdir(parents=True, exist_ok=True)
                p.log_path.write_bytes(p.logs())
            except (ProcessError, OSError):
                pass  # a container that is already gone has no log to keep
