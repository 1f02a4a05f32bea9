"""The Swarm stack: the Compose picture deployed as a Docker Swarm stack across nodes (`--backend swarm`).

`SwarmStack.up(SwarmOptions)` talks to the Swarm manager that `--swarm`, else the placement file, else DOCKER_HOST
names, checks it is one and that every node the placement names is in the Swarm, gets the images onto every node
that may run a service (`docker save` from a node that has them, `docker load` into the others: no registry), and
generates the one stack file Swarm accepts from `compose/docker-compose.yml` (plus the local-images override and the planted bug). What
Swarm does with a Compose file as it stands, each seen here, and what the generated file does instead:

    interpolation: `${VAR:?message}` with a `-` in the message is read as `${VAR-default}`, and two `-c` files
        concatenate healthcheck lists          -> the lab merges and interpolates itself and writes literal values
    ports on 127.0.0.1 (ingress needs IPVS, which a kernel may lack) -> host-mode ports on the node's address
    service VIPs time out without IPVS        -> `endpoint_mode: dnsrr`
    build, restart, depends_on, network_mode  -> dropped (ignored by Swarm; the images are built beforehand)
    the clocks/ bind mount (a real node lacks the lab's files) -> the task's own tmpfs (`TaskClock` writes it)
    where a service runs                       -> `node.hostname == <node>` from the placement, or its node label
                                                  constraint (`node.labels.zone==a`) and no node without an engine

Each service's container is a `SwarmTask`: a `ContainerProcess` driven through the engine of the node it runs on
(the placement names each node's engine), so kill and pause act underneath Swarm: `docker kill` on the node, after
which Swarm starts a replacement task (the lab's `start` awaits that one, rebinds to it and records it: old and
new container, node, seconds), and pause/unpause on the node (Swarm does nothing for minutes). A task's fake clock
is a `TaskClock`: its offset file inside its container, written by `docker exec` through the node's engine.
Partitions cut the
links through Toxiproxy, as on the compose stack: Swarm's own control traffic (2377, 7946, VXLAN) is never touched,
so a partition never becomes a Swarm restart. `down()` brings every task's log back (the service logs through the
manager, all its tasks), removes the stack's services and networks, then its volumes on every node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab import paths
from lab.stack.base import ProcessRow, StackStatus
from lab.stack.compose import ComposeStack, compose_limits, load_proxies, project_name
from lab.stack.container import ContainerProcess
from lab.stack.docker_api import api_errors, docker_module, one_line
from lab.stack.errors import StackError
from lab.stack.images import LOCAL, LOCAL_OVERRIDE
from lab.stack.local import StackOptions
from lab.stack.process import ProcessError

__all__ = ["BACKEND", "PLACEMENT_KEYS", "SwarmOptions", "SwarmStack", "SwarmTask", "TaskClock", "copy_images", "docker_cli",
           "engine_problem", "load_placement", "stack_file"]

BACKEND = "swarm"
STACK_LABEL = "com.docker.stack.namespace"
PLACEMENT_KEYS = ("manager", "engines", "place")
SERVICES = ("valkey", "store", "toxiproxy")
# host-mode published ports: each service's own, so two on one node never clash (the client links keep theirs)
PUBLISHED = {"valkey": 16379, "store": 15984, "toxiproxy": 18474}
LEASE_PUBLISHED = 18080  # lease-N publishes 18080 + N
CLOCKS_DIR = "/fencelab/clocks"  # where a container's libfaketime offset file lives (compose/docker-compose.yml)
ENGINE_SCHEMES = ("unix", "tcp", "ssh", "http", "https", "npipe")  # what `docker -H` and the SDK take
DROPPED_KEYS = ("build", "restart", "depends_on", "network_mode", "privileged", "container_name")
# 1 s checks: a task counts as up soon after it starts; 120 retries: a pause shorter than about 2 minutes never
# makes Swarm replace the paused task (a failing check on a paused container fails at once)
HEALTH = {"interval": "1s", "timeout": "3s", "retries": 120, "start_period": "2s"}


# -- the placement file ----------------------------------------------------------------------------------------
def engine_problem(url: Any) -> str | None:
    """Why `url` is not a Docker engine URL (None: it is one): a scheme `docker -H` takes and somewhere after it."""
    scheme, sep, rest = url.partition("://") if isinstance(url, str) else ("", "", "")
    if not sep or scheme not in ENGINE_SCHEMES or not rest.strip("/") or any(c.isspace() for c in url):
        return (f"{url!r} is not a Docker engine URL (unix:///var/run/docker.sock, tcp://host:2375, "
                "ssh://host)")
    return None


def load_placement(path: Any) -> dict[str, Any]:
    """`--hosts FILE` of `--backend swarm`: the manager, each node's engine, where each service runs (TOML);
    StackError naming the key (docs/beyond-one-machine.md)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise StackError(f"--hosts {path}: cannot read it ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise StackError(f"--hosts {path}: not TOML ({e})") from None
    unknown = sorted(set(data) - set(PLACEMENT_KEYS))
    if unknown:
        raise StackError(f"--hosts {path}: unknown key {unknown[0]!r}; a Swarm placement has "
                         f"{', '.join(PLACEMENT_KEYS)}")
    engines, place = data.get("engines"), data.get("place", {})
    if not isinstance(engines, dict) or not engines or not all(isinstance(v, str) for v in engines.values()):
        raise StackError(f"--hosts {path}: `engines` must map each node's hostname to its Docker engine, e.g. "
                         "[engines] node2 = \"ssh://root@10.0.0.2\"")
    if not isinstance(place, dict) or not all(isinstance(v, str) for v in place.values()):
        raise StackError(f"--hosts {path}: `place` maps a service to a node's hostname or a node label constraint, "
                         "e.g. [place] valkey = \"node1\", lease-1 = \"node.labels.zone==a\"")
    for service, node in place.items():
        if not re.fullmatch(r"valkey|store|toxiproxy|lease-\d+", service):
            raise StackError(f"--hosts {path}: [place] {service!r} is not a service (valkey, store, toxiproxy, "
                             "lease-N)")
        if node.startswith("node.") and label_constraint(node) is None:
            raise StackError(f"--hosts {path}: [place] {service} = {node!r}: a constraint is a node label's, "
                             "node.labels.KEY==VALUE or node.labels.KEY!=VALUE")
        if not node.startswith("node.") and node not in engines:
            raise StackError(f"--hosts {path}: [place] {service} = {node!r}: no such node in [engines] "
                             f"({', '.join(engines)})")
    if "manager" in data and not isinstance(data["manager"], str):
        raise StackError(f"--hosts {path}: `manager` is the manager's Docker engine, e.g. \"unix:///run/docker.sock\"")
    for key, url in [("manager", data.get("manager")), *((f"[engines] {n}", u) for n, u in engines.items())]:
        problem = engine_problem(url) if url is not None else None
        if problem:
            raise StackError(f"--hosts {path}: {key}: {problem}")
    return data


_LABEL = re.compile(r"node\.labels\.([A-Za-z0-9_.-]+)\s*(==|!=)\s*(\S+)")


def label_constraint(text: str) -> tuple[str, str, str] | None:
    """(key, op, value) of a node label constraint `node.labels.KEY==VALUE` (or `!=`), None when it is not one."""
    m = _LABEL.fullmatch(text.strip())
    return (m.group(1), m.group(2), m.group(3)) if m else None


def label_matches(text: str, labels: dict[str, str]) -> bool:
    """Does a node with `labels` satisfy constraint `text` (as Swarm reads it: a missing label is not equal)?"""
    key, op, value = label_constraint(text) or ("", "", "")
    return (labels.get(key) == value) == (op == "==")


@dataclass
class SwarmOptions(StackOptions):
    """What `SwarmStack.up` deploys and where: the generic options plus the placement."""

    manager: str = ""  # the manager's engine URL ("" -> DOCKER_HOST)
    manager_from: str = "the placement's `manager`"  # where `manager` came from (messages name it)
    engines: dict[str, str] = field(default_factory=dict)  # node hostname -> its engine URL
    place: dict[str, str] = field(default_factory=dict)  # service -> node hostname or label constraint (`placement`)

    def placement(self, managers: list[str], workers: list[str]) -> dict[str, str]:
        """Every service's node (or node label constraint): as placed, else Valkey, the store and Toxiproxy on the manager and the lease
        servers round-robin over the workers (over the manager when there is none)."""
        spread = workers or managers
        chosen = {s: managers[0] for s in SERVICES}
        chosen.update({f"lease-{i}": spread[(i - 1) % len(spread)] for i in range(1, self.servers + 1)})
        chosen.update({s: n for s, n in self.place.items() if s in chosen})
        return chosen


def _engine(url: str) -> Any:
    """A Docker client on one engine URL (one StackError line naming it when it does not answer)."""
    docker = docker_module()
    try:
        return docker.DockerClient(base_url=url, timeout=60)
    except docker.errors.DockerException as e:
        raise StackError(f"cannot reach the Docker engine at {url} ({one_line(e)})") from None


def copy_images(images: list[str], engines: dict[str, str], log: Path) -> dict[str, float]:
    """Get `images` onto every engine: `docker save` from one that has them all, `docker load` into the others
    (no registry); seconds per node loaded. The CLI streams the tar through a file instead of memory."""
    def missing(url: str) -> list[str]:
        client = _engine(url)
        try:
            out = []
            for image in images:
                try:
                    client.images.get(image)
                except docker_module().errors.ImageNotFound:
                    out.append(image)
            return out
        finally:
            client.close()

    lacking = {node: missing(url) for node, url in engines.items()}
    need = {node for node, m in lacking.items() if m}
    if not need:
        return {}
    source = next((node for node, m in lacking.items() if not m), None)
    if source is None:
        raise StackError(f"no node has all of {', '.join(images)}: build them on one (lab/stack/images.py) first")
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fencelab-swarm-images-") as tmp:
        tar = Path(tmp) / "images.tar"
        docker_cli(engines[source], ["save", "-o", str(tar), *images], log)
        for node in sorted(need):
            start = time.monotonic()
            docker_cli(engines[node], ["load", "-q", "-i", str(tar)], log)
            seconds[node] = round(time.monotonic() - start, 1)
    return seconds


def docker_cli(engine: str, args: list[str], log: Path, *, timeout: float = 900.0) -> str:
    """One `docker` CLI command against `engine` (what the SDK has no call for: stack deploy, save/load to a file)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["docker", "-H", engine, *args], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise StackError(f"`docker {args[0]}` on {engine} did not finish in {timeout:.0f}s") from None
    except OSError as e:
        raise StackError(f"cannot run the docker CLI: {e.strerror or e}") from None
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ docker -H {engine} {' '.join(args)}\n{r.stdout}{r.stderr}\n")
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise StackError(f"`docker {' '.join(args[:2])}` on {engine} failed: {last} (output in {log})")
    return r.stdout


# -- the stack file ---------------------------------------------------------------------------------------------
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])((?:[^{}]|\{[^{}]*\})*))?\}")


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR:?message}` done here (Swarm's CLI reads `${VAR:?a-b}` as
    `${VAR-default}`): the stack file Swarm gets holds literal values only."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        have = env.get(name)
        if op in (":-", "-"):
            return have if have or (op == "-" and have is not None) else arg
        if op in (":?", "?"):
            if not have:
                raise StackError(f"the stack file needs {name}: {arg}")
            return have
        return have or ""

    return _VAR.sub(one, value).replace("$", "$$")  # a literal `$` (none expected) stays literal for Swarm


def _merge(base: Any, over: Any) -> Any:
    """`over` laid on `base` as Compose lays a second file: mappings merge, anything else is replaced (a
    healthcheck's `test` list too, where Swarm's CLI would concatenate them)."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
    return over


def stack_file(files: list[Path], env: dict[str, str], services: list[str], nodes: dict[str, str],
               elsewhere: list[str] = ()) -> dict[str, Any]:
    """The one stack file Swarm accepts for `services`, from the Compose `files` (merged in order), each service
    pinned to its node (`nodes`: service -> hostname), or to the nodes of a label constraint (service -> the
    constraint) other than those `elsewhere` (the Swarm's nodes whose engines the lab was not given); see the
    module docstring."""
    merged: dict[str, Any] = {}
    for f in files:
        merged = _merge(merged, yaml.safe_load(Path(f).read_text()))
    merged = _interpolate({k: v for k, v in merged.items() if not k.startswith("x-")}, env)
    out: dict[str, Any] = {"version": "3.8", "services": {}, "networks": {}, "volumes": merged.get("volumes") or {}}
    for name in services:
        svc = {k: v for k, v in merged["services"][name].items() if k not in DROPPED_KEYS}
        svc["ports"] = [{"target": target, "published": _published(name, target), "protocol": "tcp", "mode": "host"}
                        for target in (_target_port(p) for p in svc.get("ports", []))]
        svc["volumes"] = [_clocks_tmpfs(_absolute(v)) for v in svc.get("volumes", [])]
        svc["healthcheck"] = {**svc.get("healthcheck", {}), **HEALTH}
        svc["deploy"] = {"endpoint_mode": "dnsrr", "replicas": 1,
                         "placement": {"constraints": _constraints(nodes[name], elsewhere)},
                         "restart_policy": {"condition": "any", "delay": "1s"}}
        out["services"][name] = svc
        for net in svc.get("networks", []):
            out["networks"][net] = {"driver": "overlay"}
    return out


def _constraints(place: str, elsewhere: list[str]) -> list[str]:
    """A service's placement constraints: its node's hostname, or its label constraint and none of the nodes
    the lab cannot reach (the kill and pause nemeses go through the task's node engine)."""
    if label_constraint(place) is None:
        return [f"node.hostname == {place}"]
    return [place, *(f"node.hostname != {n}" for n in sorted(elsewhere))]


def _target_port(spec: str) -> int:
    """The container port of a Compose short-form port (`127.0.0.1:${X:-}:8080`, `127.0.0.1::26011`)."""
    return int(str(spec).rsplit(":", 1)[-1])


def _published(service: str, target: int) -> int:
    """The host-mode port a service's container port is published on (on its node's address)."""
    if service.startswith("lease-"):
        return LEASE_PUBLISHED + int(service.removeprefix("lease-"))
    if target >= 26000:  # Toxiproxy's client links keep their own numbers
        return target
    return PUBLISHED[service]


def _clocks_tmpfs(volume: Any) -> Any:
    """The clocks/ bind mount as the task's own tmpfs: a node of a real Swarm does not have the lab's files, so
    the lab writes each task's offset inside its container (`TaskClock`), and the clock wrapper starts it at +0."""
    if isinstance(volume, str) and volume.split(":")[1:2] == [CLOCKS_DIR]:
        return {"type": "tmpfs", "target": CLOCKS_DIR}
    return volume


def _absolute(volume: Any) -> Any:
    """A bind mount relative to the compose directory made absolute (the stack file is written elsewhere)."""
    if isinstance(volume, str) and volume.startswith("./"):
        return str(paths.REPO_ROOT / "compose" / volume[2:])
    return volume


# -- one task ---------------------------------------------------------------------------------------------------
@dataclass
class SwarmTask(ContainerProcess):
    """One service's running task: its container through its node's engine. After a `docker kill`, `start`
    does not start the container (Swarm refuses that for a task's container): it awaits Swarm's replacement
    task, rebinds to it, and records it in `replacements` (the kill nemesis's completion carries them)."""

    node: str = ""
    engine: str = ""
    published: dict[str, int] = field(default_factory=dict)  # "8080/tcp" -> the host-mode port on the node
    service_id: str = ""
    manager: str = ""
    replacements: list[dict[str, Any]] = field(default_factory=list)
    where: dict[str, list[str]] = field(default_factory=dict)  # node id -> [hostname, engine, address]
    _killed: float | None = field(default=None, repr=False, compare=False)  # monotonic time of the lab's kill
    _awaiting: float | None = field(default=None, repr=False, compare=False)  # the kill whose replacement `start` awaits

    def kill(self) -> None:
        super().kill()
        self._killed = time.monotonic()

    def start(self, timeout: float = 60.0, wait: bool = True) -> "SwarmTask":
        """Swarm starts the replacement itself: mark it awaited (`healthy` rebinds); wait for it unless told not."""
        if self._killed is None and self.alive():
            raise ProcessError(f"{self.name} is already running (container {self.container_id[:12]})")
        self._awaiting, self._killed = self._killed or time.monotonic(), None
        if wait:
            self.wait_healthy(timeout)
        return self

    def alive(self) -> bool:
        """Running or paused. Killed by the lab: not alive until `start`; then alive while Swarm brings up the
        replacement (the restart is under way, as a restarted process is alive before it answers)."""
        if self._awaiting is not None:
            return True
        return self._killed is None and super().alive()

    def healthy(self) -> bool:
        """The task runs and Docker's health check passes (after a kill: on Swarm's replacement task)."""
        if self._awaiting is not None and not self._rebind():
            return False
        try:
            state = (self.container().attrs or {}).get("State", {})
        except ProcessError:
            return False
        return state.get("Status") == "running" and state.get("Health", {}).get("Status", "healthy") == "healthy"

    def _rebind(self) -> bool:
        """Find Swarm's replacement of the killed task; bind to it and record it (True), or not yet (False)."""
        try:
            manager = _engine(self.manager)
            try:
                tasks = manager.api.tasks(filters={"service": self.service_id, "desired-state": "running"})
            finally:
                manager.close()
        except (StackError, *api_errors()):
            return False
        for t in tasks:
            cid = t.get("Status", {}).get("ContainerStatus", {}).get("ContainerID")
            if t.get("Status", {}).get("State") == "running" and cid and cid != self.container_id:
                moved = self.where.get(t.get("NodeID", ""))
                rec = {"service": self.service, "node": self.node, "task": t["ID"][:12],
                       "old_container": self.container_id[:12], "new_container": cid[:12],
                       "seconds": round(time.monotonic() - (self._awaiting or 0.0), 1)}
                if moved and moved[0] != self.node:  # a label constraint let Swarm restart it on another node
                    rec.update(old_node=self.node, node=moved[0])
                    self.node, self.engine, self.host = moved
                    if self.client is not None:
                        self.client.close()
                    self.client, self.client_factory = None, lambda e=self.engine: _engine(e)
                self.replacements.append(rec)
                self.container_id, self._container, self._awaiting = cid, None, None
                return True
        return False

    def host_port(self, container_port: str | None = None) -> int | None:
        return self.published.get(container_port or self.container_port)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "node": self.node, "engine": self.engine, "published": self.published,
                "service_id": self.service_id, "manager": self.manager, "where": self.where}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "SwarmTask":
        return cls(name=d["name"], log_path=Path(d["log"]), service=d.get("service", d["name"]),
                   container_id=d["container_id"], container_port=d.get("container_port", ""),
                   persistence=d.get("persistence"), data_dir=d.get("data_dir", ""), node=d.get("node", ""),
                   engine=d.get("engine", ""), published=d.get("published", {}), service_id=d.get("service_id", ""),
                   manager=d.get("manager", ""), where=d.get("where", {}))


# -- one task's clock -------------------------------------------------------------------------------------------
class TaskClock:
    """One task's libfaketime offset file, inside its container (the task's own tmpfs: a real Swarm's node is not
    the lab's filesystem), written by `docker exec` through the task's node engine; FakeClock's surface.

    `set_offset`/`reset` return at once (the clock nemesis calls them inside the run's event loop, and a strobe
    flips faster than an exec answers): one thread writes the newest offset asked for (write-then-rename, as
    root), keeps trying while the task is paused (no exec into a paused container) or being replaced, and writes
    it again into Swarm's replacement task (a new container starts at +0). `flush` waits for the write and says
    where it went: the record the nemesis's completion carries."""

    RETRY_S = 0.3  # between attempts while the container is paused or gone
    WRITE = 'printf "%s\\n" "$0" > "$1.tmp" && mv -f "$1.tmp" "$1"'

    def __init__(self, task: SwarmTask, path: str):
        self.task, self.path = task, path
        self._cv = threading.Condition()
        self._want: str | None = None  # the offset text asked for ("+1.500"); None: nothing asked yet
        self._written: tuple[str, str] | None = None  # (container, text) last written
        self._task_ids: dict[str, str] = {}  # container -> its Swarm task (the record names it)
        self._error: str | None = None  # why the last attempt failed
        self._thread: threading.Thread | None = None
        self._closed = False
        self._client: Any = None
        self._client_engine = ""
        self._engine_lock = threading.Lock()  # the writer thread and `read` (the nemesis's setup) share one client

    # -- FakeClock's surface ------------------------------------------------------------------------------------
    def set_offset(self, seconds: float) -> None:
        """Shift the task's wall clock by `seconds` from now on (written in the background)."""
        if not isinstance(seconds, (int, float)) or seconds != seconds or abs(seconds) > 10 * 365 * 86400:
            raise ValueError(f"clock offset must be a finite number of seconds within 10 years, not {seconds!r}")
        self._ask(f"{seconds:+.3f}")

    def reset(self) -> None:
        """Back to the real clock."""
        self._ask("+0")

    def offset(self) -> float:
        """The offset asked for last (the file holds it once `flush` says written)."""
        return float(self._want or 0)

    # -- the writer ---------------------------------------------------------------------------------------------
    def _ask(self, text: str) -> None:
        with self._cv:
            if self._closed:
                raise ValueError(f"{self.task.name}'s clock is closed")
            self._want = text
            self._cv.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"clock {self.task.name}", daemon=True)
                self._thread.start()

    def _done(self) -> bool:
        return self._want is None or self._written == (self.task.container_id, self._want)

    def _run(self) -> None:
        """Write the newest offset into the task's current container until closed (see the class docstring)."""
        while True:
            with self._cv:
                while not self._closed and self._done():
                    self._cv.wait(timeout=0.5)  # wakes to notice a replacement task too
                if self._done():
                    return
                text, cid = self._want, self.task.container_id
            try:
                self.exec(cid, ["sh", "-c", self.WRITE, text, self.path])
                with self._cv:
                    self._written, self._error = (cid, text), None
                    self._cv.notify_all()
            except StackError as e:
                with self._cv:
                    self._error = str(e)
                    if self._closed:
                        return
                    self._cv.wait(timeout=self.RETRY_S)

    def exec(self, cid: str, argv: list[str]) -> str:
        """`argv` run as root in container `cid` through the task's node engine; its output (StackError when it
        cannot run or fails)."""
        try:
            with self._engine_lock:
                if self._client is not None and self._client_engine != self.task.engine:  # the task moved node
                    self._client.close()
                    self._client = None
                if self._client is None:
                    self._client, self._client_engine = _engine(self.task.engine), self.task.engine
                api = self._client.api
                if cid not in self._task_ids:
                    labels = api.inspect_container(cid).get("Config", {}).get("Labels") or {}
                    self._task_ids[cid] = labels.get("com.docker.swarm.task.id", "")
                run = api.exec_create(cid, argv, user="0")
                out = api.exec_start(run["Id"])
                code = api.exec_inspect(run["Id"]).get("ExitCode")
        except api_errors() as e:
            raise StackError(f"{self.task.name}: docker exec in {cid[:12]} on {self.task.node}: {one_line(e)}") from None
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        if code != 0:
            raise StackError(f"{self.task.name}: `{' '.join(argv[:2])}` in {cid[:12]} exited {code}: "
                             f"{one_line(text) or 'no output'}")
        return text

    def flush(self, timeout: float = 5.0) -> dict[str, Any]:
        """Wait (up to `timeout`) for the newest offset to be in the task's container; where it went."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._done() and time.monotonic() < deadline:
                self._cv.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            cid = self.task.container_id
            rec: dict[str, Any] = {"node": self.task.node, "container": cid[:12],
                                   "task": self._task_ids.get(cid, "")[:12], "offset_s": self.offset(),
                                   "written": self._done()}
            if not rec["written"]:
                rec["pending"] = self._error or "not yet written"
            return rec

    def read(self) -> float:
        """The offset the container's file holds now (StackError when it cannot be read)."""
        text = self.exec(self.task.container_id, ["cat", self.path]).strip()
        try:
            return float(text or 0)
        except ValueError:
            raise StackError(f"{self.task.name}: {self.path} holds {text[:40]!r}, not an offset") from None

    def close(self, timeout: float = 5.0) -> None:
        """Write what is pending (up to `timeout`), then stop the writer."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._engine_lock:
            if self._client is not None:
                self._client.close()
                self._client = None


# -- the stack ------------------------------------------------------------------------------------------------------
@dataclass
class SwarmStack(ComposeStack):
    """A named stack deployed on a Swarm (see the module docstring): ComposeStack's inputs, status and store
    set-up; its own deploy, tasks and teardown."""

    deploy_timeout_s: float = 300.0
    processes: list[SwarmTask] = field(default_factory=list)

    backend = BACKEND

    @property
    def project(self) -> str:
        return self.info.get("project") or project_name(self.name)

    def docker(self) -> Any:
        """The manager's Docker client (connected once)."""
        if self._client is None:
            self._client = _engine(self.info["manager"])
        return self._client

    # -- up ---------------------------------------------------------------------------------------------------
    def up(self, opts: StackOptions | None = None) -> StackStatus:
        """Check the manager and the placement, get the images to the nodes, deploy, wait for every task healthy;
        on failure `down()`."""
        if not isinstance(opts, SwarmOptions):
            raise StackError("--backend swarm needs its placement: --hosts FILE (docs/beyond-one-machine.md)")
        opts.validate()
        proxies = load_proxies(self.toxiproxy_config)
        servers, _ = compose_limits(proxies)
        if opts.servers > servers:
            raise StackError(f"--servers {opts.servers}: the stack defines lease-1..lease-{servers}")
        manager_url, source = (opts.manager, opts.manager_from) if opts.manager else (_docker_host(), "DOCKER_HOST")
        nodes = self._check_swarm(manager_url, source, opts)
        if self.load_state():
            raise StackError(f"stack {self.name!r} is already up; run `fencelab down --name {self.name}` first")
        opts = SwarmOptions(**{**vars(opts), "toxiproxy": True, "store": True, "recovery_store": False})
        chosen = opts.placement(nodes["managers"], nodes["workers"])
        services = self._services(opts)
        candidates = self._candidates({s: chosen[s] for s in services}, nodes["labels"])
        self.info = {"name": self.name, "backend": BACKEND, "dir": str(self.dir), "project": project_name(self.name),
                     "manager": manager_url, "engines": opts.engines, "placement": {s: chosen[s] for s in services},
                     "addresses": nodes["addresses"], "candidates": candidates, "node_ids": nodes["ids"],
                     "elsewhere": nodes["elsewhere"], "options": {k: v for k, v in vars(opts).items()
                                                                  if k not in ("engines", "place", "manager", "manager_from")},
                     "services": services, "credentials": str(self.credentials_file),
                     "store_admin": str(self.store_admin_file)}
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_inputs(opts)
        if "clocks" in self.info:  # each offset file is inside its task's container (`clocks()`), not here
            self.info["clocks"] = {n: f"{CLOCKS_DIR}/{n}.rc" for n in self.info["clocks"]}
        self.save_state()  # before anything is deployed: `down` always finds the stack
        try:
            self._deploy(opts, proxies)
        except BaseException as e:
            self._cleanup_after(e)
            raise
        self.save_state()
        return self.status()

    def _check_swarm(self, manager_url: str, source: str, opts: SwarmOptions) -> dict[str, Any]:
        """The manager (named by `source`) is one and every placed node is in its Swarm: the nodes by role and
        their addresses."""
        try:
            client = _engine(manager_url)
        except StackError as e:
            raise StackError(f"the Swarm manager (from {source}): {e}") from None
        try:
            swarm = client.info().get("Swarm", {})
            if not swarm.get("ControlAvailable"):
                state = swarm.get("LocalNodeState") or "inactive"
                raise StackError(f"{manager_url} (from {source}) is not a Swarm manager (its Swarm state: {state}): "
                                 f"name a manager's engine in {source}")
            found = [n.attrs for n in client.nodes.list()]
        except api_errors() as e:
            raise StackError(f"cannot ask the Swarm manager at {manager_url}: {one_line(e)}") from None
        finally:
            client.close()
        ready = {n["Description"]["Hostname"]: n for n in found if n["Status"]["State"] == "ready"}
        for node in [*opts.engines, *(v for v in opts.place.values() if label_constraint(v) is None)]:
            if node not in ready:
                raise StackError(f"the placement names node {node!r}, which is not a ready node of the Swarm at "
                                 f"{manager_url} (its nodes: {', '.join(sorted(ready)) or 'none ready'})")
        managers = [h for h, n in ready.items() if n["Spec"].get("Role") == "manager" and h in opts.engines]
        workers = [h for h, n in ready.items() if n["Spec"].get("Role") != "manager" and h in opts.engines]
        if not managers:
            raise StackError("the placement's [engines] must name the manager node too (Valkey, the store and "
                             "Toxiproxy run there unless [place] says otherwise)")
        return {"managers": sorted(managers), "workers": sorted(workers),
                "addresses": {h: n["Status"]["Addr"] for h, n in ready.items()},
                "labels": {h: n["Spec"].get("Labels") or {} for h, n in ready.items() if h in opts.engines},
                "ids": {n["ID"]: n["Description"]["Hostname"] for n in found},
                "elsewhere": sorted({n["Description"]["Hostname"] for n in found} - set(opts.engines))}

    @staticmethod
    def _candidates(chosen: dict[str, str], labels: dict[str, dict[str, str]]) -> dict[str, list[str]]:
        """The nodes each service may run on: its node, or the [engines] nodes its label constraint matches
        (StackError when none does, or when one that keeps state on its node matches more than one)."""
        out = {}
        for service, place in chosen.items():
            if label_constraint(place) is None:
                out[service] = [place]
                continue
            out[service] = sorted(n for n, ls in labels.items() if label_matches(place, ls))
            if not out[service]:
                raise StackError(f"the placement's {service} = {place!r} matches no node of [engines] (their labels: "
                                 + "; ".join(f"{n}: {ls or 'none'}" for n, ls in sorted(labels.items())) + ")")
            if len(out[service]) > 1 and not service.startswith("lease-"):
                raise StackError(f"the placement's {service} = {place!r} matches {', '.join(out[service])}: "
                                 f"{service} keeps its data, its ports or its links on its node, so Swarm must not "
                                 "restart it elsewhere after a kill: constrain it to one node")
        return out

    def _compose_files(self) -> list[Path]:
        """The Compose files the stack file is made from: the main one, the local-images override when the
        manager has the local images (no registry), and the planted bug."""
        files = [Path(self.compose_file)]
        try:
            self.docker().images.get("fencelab/lease-server:trixie")
            files.append(LOCAL_OVERRIDE)
            self.info["images"] = {"kind": "local", "names": list(LOCAL)}
        except docker_module().errors.ImageNotFound:
            self.info["images"] = {"kind": "official"}
        if self.info.get("options", {}).get("mutant"):
            files.append(self._write_mutant_override(StackOptions(mutant=self.info["options"]["mutant"])))
        return files

    def _deploy(self, opts: SwarmOptions, proxies: dict[str, dict[str, Any]]) -> None:
        """The stack file, the images on the nodes, `docker stack deploy`, then every task found and healthy."""
        files = self._compose_files()
        placement = self.info["placement"]
        if self.info["images"]["kind"] == "local":
            used = {n for s in self.info["services"] for n in self.info["candidates"][s]}
            self.info["images"]["loaded_s"] = copy_images(
                list(LOCAL), {n: u for n, u in opts.engines.items() if n in used}, self.dir / "logs" / "images.log")
        doc = stack_file(files, self._compose_env(), self.info["services"], placement, self.info["elsewhere"])
        path = self.dir / "stack.yml"
        path.write_text(json.dumps(doc, indent=1))  # JSON is YAML: the CLI reads it as the stack file
        path.chmod(0o600)  # it holds the store admin's password
        self.info["stack_file"] = str(path)
        self.save_state()
        # no --detach: Debian's 20.10 CLI has no such flag and both it and newer CLIs return without waiting (the
        # lab awaits each task below); --resolve-image never: no registry is asked about the images
        docker_cli(self.info["manager"], ["stack", "deploy", "--resolve-image", "never", "-c", str(path), self.project],
                    self.dir / "logs" / "swarm.log", timeout=120)
        deadline = time.monotonic() + self.deploy_timeout_s
        for service in self.info["services"]:
            self.processes.append(self._attach(service, deadline))
            self.save_state()
        for proc in self.processes:
            proc.wait_healthy(max(10.0, deadline - time.monotonic()))
        self._describe(opts, proxies)
        self._init_store()

    def _attach(self, service: str, deadline: float) -> SwarmTask:
        """The running task of `service` (awaited until `deadline`), bound to its node's engine."""
        name = f"{self.project}_{service}"
        last = "no task yet"
        while time.monotonic() < deadline:
            try:
                svc = self.docker().services.get(name)
                tasks = svc.tasks(filters={"desired-state": "running"})
            except api_errors() as e:
                last = one_line(e)
                tasks = []
            for t in tasks:
                status = t.get("Status", {})
                cid = status.get("ContainerStatus", {}).get("ContainerID")
                last = f"{status.get('State')}: {status.get('Err') or status.get('Message')}"
                if status.get("State") == "running" and cid:
                    # the node Swarm chose (a label constraint may match several; never one without an engine)
                    node = self.info["node_ids"].get(t.get("NodeID"), self.info["placement"][service])
                    engine = self.info["engines"][node]
                    port = "8080/tcp" if service.startswith("lease-") else {
                        "valkey": "6379/tcp", "store": "5984/tcp", "toxiproxy": "8474/tcp"}[service]
                    published = {f"{p['TargetPort']}/tcp": p["PublishedPort"]
                                 for p in svc.attrs["Spec"].get("EndpointSpec", {}).get("Ports", [])}
                    valkey = service == "valkey"
                    return SwarmTask(name=service, log_path=self.dir / "logs" / f"{service}.log", service=service,
                                     container_id=cid, container_port=port, client_factory=lambda e=engine: _engine(e),
                                     host=self.info["addresses"][node], node=node, engine=engine, published=published,
                                     service_id=svc.id, manager=self.info["manager"], where=self._where(),
                                     persistence=self.info["options"].get("persistence") if valkey else None,
                                     data_dir="/data" if valkey else "")
            time.sleep(0.5)
        raise StackError(f"swarm service {name}: no running task within {self.deploy_timeout_s:.0f}s ({last}; "
                         f"`docker service ps {name}` on the manager says why)")

    def _where(self) -> dict[str, list[str]]:
        """Node id -> [hostname, engine, address] of every node the lab was given an engine for."""
        return {nid: [h, self.info["engines"][h], self.info["addresses"][h]]
                for nid, h in self.info["node_ids"].items() if h in self.info["engines"] and h in self.info["addresses"]}

    def _describe(self, opts: StackOptions, proxies: dict[str, dict[str, Any]]) -> None:
        """URLs on the nodes' addresses (host-mode ports) and the Toxiproxy topology, as ComposeStack records them."""
        super()._describe(opts, proxies)
        for key in ("valkey", "store", "toxiproxy", "lease_servers", "client_nodes", "topology"):
            self.info[key] = _on_nodes(self.info[key], {p.name: p.host for p in self.processes})

    # -- state and status ---------------------------------------------------------------------------------------
    def load_state(self) -> dict[str, Any] | None:
        data = self.read_state_file()
        if data is None:
            return None
        if data.get("backend") != BACKEND:
            raise StackError(f"stack {self.name!r} in {self.dir} belongs to the {data.get('backend', 'local')} "
                             f"backend: take it down with `fencelab down --name {self.name}` or pick another name")
        self.processes = [self._process_from_state(d) for d in data.get("processes", [])]
        self.info = {k: v for k, v in data.items() if k != "processes"}
        return data

    def _process_from_state(self, d: dict[str, Any]) -> SwarmTask:
        p = SwarmTask.from_state(d)
        p.client_factory = lambda e=p.engine: _engine(e)
        return p

    def _bound(self) -> list[SwarmTask]:
        return self.processes  # each task connects to its own node's engine when first used

    def _row(self, p: SwarmTask) -> ProcessRow:
        status = p.status()
        return ProcessRow(name=p.name, pid=p.pid, alive=status in ("running", "paused"), status=status,
                          ports={p.container_port: p.host_port()}, container=p.container_id[:12], node=p.node,
                          host=p.host, log=f"docker -H {p.engine} logs {p.container_id[:12]}")

    def _status_extras(self) -> dict[str, Any]:
        return {"project": self.project, "store_admin": str(self.store_admin_file),
                "nodes": {p.name: p.node for p in self.processes} or dict(self.info.get("placement", {}))}

    def clocks(self) -> dict[str, TaskClock]:
        """The tasks' offset files, each inside its container (the stack was started with fake clocks)."""
        by_name = {p.name: p for p in self.processes}
        return {n: TaskClock(by_name[n], path) for n, path in sorted(self.info.get("clocks", {}).items())}

    def replacements(self) -> list[dict[str, Any]]:
        """Swarm's replacement tasks since the last call (the kill nemesis's completions carry them)."""
        out = [r for p in self.processes for r in p.replacements]
        for p in self.processes:
            p.replacements = []
        return out

    # -- down ------------------------------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Every service's log (all its tasks) into logs/, then the stack's services, networks and volumes gone."""
        if not self.info:
            self.load_state()
        if not self.info:
            return []
        stopped = list(self.info.get("services", []))
        errors = []
        try:
            self._save_logs()
            self._remove()
        except (StackError, *api_errors()) as e:
            errors.append(one_line(e))
        if self._client is not None:
            self._client.close()
            self._client = None
        if errors:
            raise StackError(f"swarm stack {self.project}: {'; '.join(errors)}")
        self.processes, self.info = [], {}
        if self.state_file.exists():
            self.state_file.unlink()
        return stopped

    LOG_TIMEOUT_S = 30.0  # per service: the manager's log stream can stall forever (below)

    def _save_logs(self) -> None:
        """logs/<service>.log: the service's log through the manager (every task's, replaced ones too).

        Read on a thread with a deadline: after a kill of the store's task, the manager's stream of that service's
        log (a chunked reply) stopped sending and never ended (seen 2026-12-04: a 60 s run's teardown blocked on
        it for over 10 minutes); the stack's removal must not wait on a log."""
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        for svc in self.docker().services.list(filters={"label": f"{STACK_LABEL}={self.project}"}):
            service = svc.name.removeprefix(f"{self.project}_")
            (self.dir / "logs" / f"{service}.log").write_bytes(_read_log(svc, self.LOG_TIMEOUT_S))

    def _remove(self, timeout: float = 90.0) -> None:
        """`docker stack rm` by the SDK: services, then (once their containers are gone from every node) the
        networks, then each node's volumes of the stack. Summaries only (`api.containers`, not
        `containers.list`, which inspects each one and fails on a container Swarm removes meanwhile)."""
        label = {"label": f"{STACK_LABEL}={self.project}"}
        client = self.docker()
        for svc in client.api.services(filters=label):
            _gone_ok(lambda: client.api.remove_service(svc["ID"]))
        engines = self.info.get("engines", {})
        deadline = time.monotonic() + timeout
        while True:
            left = []
            for node, url in engines.items():
                c = _engine(url)
                try:
                    left += [f"{node}:{x['Id'][:12]}" for x in c.api.containers(all=True, filters=label)]
                    if not left:  # the node's networks and volumes of the stack go once no container uses them
                        for net in c.api.networks(filters=label):
                            _gone_ok(lambda: c.api.remove_network(net["Id"]))
                        for vol in (c.api.volumes(filters=label) or {}).get("Volumes") or []:
                            _gone_ok(lambda: c.api.remove_volume(vol["Name"], force=True))
                finally:
                    c.close()
            if not left:
                break
            if time.monotonic() > deadline:
                raise StackError(f"containers of the stack still on the nodes {timeout:.0f}s after removal: "
                                 f"{', '.join(left)}")
            time.sleep(0.5)
        for net in client.api.networks(filters=label):  # the overlay networks, on the manager
            _gone_ok(lambda: client.api.remove_network(net["Id"]))


def _gone_ok(remove: Any) -> None:
    """One removal; an object already gone (Swarm removed it meanwhile) is what was wanted."""
    try:
        remove()
    except docker_module().errors.NotFound:
        pass


def _docker_host() -> str:
    """The manager when neither --swarm nor the placement names one: DOCKER_HOST (StackError when that is unset
    too, or not an engine URL)."""
    host = os.environ.get("DOCKER_HOST")
    if not host:
        raise StackError("--backend swarm needs the Swarm manager: --swarm URL, `manager = \"...\"` in the placement "
                         "file, or DOCKER_HOST")
    problem = engine_problem(host)
    if problem:
        raise StackError(f"DOCKER_HOST: {problem}")
    return host


def _on_nodes(value: Any, hosts: dict[str, str]) -> Any:
    """`value` (a URL, a list of them, or the topology) with every 127.0.0.1 address read on the node that
    publishes the port (host-mode ports answer on the node's address, never on 127.0.0.1)."""
    if value is None:
        return None
    if isinstance(value, str):
        return _swap(value, hosts)
    if isinstance(value, list):
        return [_swap(v, hosts) for v in value]
    # the topology: its client links listen on Toxiproxy's node (its backend links on the overlay network)
    return json.loads(json.dumps(value).replace("127.0.0.1", hosts.get("toxiproxy", "127.0.0.1")))


def _swap(url: str, hosts: dict[str, str]) -> str:
    """A URL on 127.0.0.1:<published port> moved onto the node that publishes that port."""
    m = re.search(r"127\.0\.0\.1:(\d+)", url)
    if not m:
        return url
    port = int(m.group(1))
    for service, host in hosts.items():
        if port == _published_port(service):
            return url.replace("127.0.0.1", host)
    return url.replace("127.0.0.1", hosts.get("toxiproxy", "127.0.0.1"))


def _published_port(service: str) -> int | None:
    """The host-mode port of `service`'s own container port (Toxiproxy's client links keep theirs)."""
    if service.startswith("lease-"):
        return LEASE_PUBLISHED + int(service.removeprefix("lease-"))
    return PUBLISHED.get(service)


def _read_log(svc: Any, timeout_s: float) -> bytes:
    """A service's whole log, or what came before `timeout_s` with a last line saying it stopped there (the reading
    thread is a daemon: closing the client ends its socket)."""
    chunks: list[bytes] = []
    failed: list[str] = []

    def read() -> None:
        try:
            for chunk in svc.logs(stdout=True, stderr=True, timestamps=True, details=True):
                chunks.append(chunk)
        except Exception as e:  # noqa: BLE001 - an API error, or the socket closed under a stalled read
            failed.append(one_line(e))

    reader = threading.Thread(target=read, daemon=True, name=f"log-{getattr(svc, 'name', '?')}")
    reader.start()
    reader.join(timeout_s)
    data = b"".join(list(chunks))
    if failed:
        return data + f"(no log: {failed[0]})\n".encode()
    if reader.is_alive():
        return data + f"(log cut: the manager's stream sent nothing more within {timeout_s:g} s)\n".encode()
    return data
