"""The Compose stack: the system under test in Docker containers, with LocalStack's surface.

`ComposeStack.up(opts)` writes the stack's inputs into its state directory
(the principals file with key hashes only, for the containers; the API keys in
`credentials.json` and the CouchDB admin in `store-admin.json`, both 0600 and
host-only; the clock offset files), records the Compose project in
`state.json`, runs `docker compose up` on `compose/docker-compose.yml`, finds
each service's container by its Compose labels and waits until it answers.
`down()` (from any later command) runs `docker compose down -v` on the same
project, so it removes exactly the containers, networks and volumes `up` made.

The parts live by role: the engine's API (the Docker SDK, the Compose CLI)
in `lab.stack.docker_api`, the reaping of dead runs' projects (owner labels)
in `lab.stack.orphans`, the containers' health probes in
`lab.stack.container_probes`, and each service's container, a
`ContainerProcess` driven through the Docker SDK (so the nemeses that take a
stack's processes drive containers), in `lab.stack.container`; this module
holds `ComposeStack` (on the lifecycle of `lab.stack.lifecycle.ProcessStack`)
and the Compose files' Toxiproxy configuration.
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

import json
import os
import re
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from lab import paths
from lab.server.auth import provision_demo_principals, write_principals_file
from lab.stack.base import ProcessRow, StackStatus, write_private_json
from lab.stack.container import LIVE_STATUSES, ContainerProcess
from lab.stack.docker_api import api_errors, compose_command, connect_docker, is_compose_v2, one_line
from lab.stack.dockerd import ensure_engine
from lab.stack.errors import StackError, stack_dir
from lab.stack.faketime import FakeClock
from lab.stack.images import ImageSet, ensure_images
from lab.stack.lifecycle import ProcessStack
from lab.stack.local import StackOptions
from lab.stack.orphans import OWNER_LABEL, PROJECT_LABEL, owner_id, reap_orphans  # noqa: F401 - re-exported
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
PERSISTENCE_ENV = {  # StackOptions.persistence -> (VALKEY_APPENDONLY, VALKEY_APPENDFSYNC)
    "none": ("no", "everysec"),
    "everysec": ("yes", "everysec"),
    "always": ("yes", "always"),
}
SERVICE_LABEL = "com.docker.compose.service"


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



# -- the stack --------------------------------------------------------------------------
@dataclass
class ComposeStack(ProcessStack):
    """A named Compose stack: its project, containers and state directory (LocalStack's surface; its own `up`
    and `down` drive Compose, the rest is `ProcessStack`'s).

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

    backend = BACKEND

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

    def up(self, opts: StackOptions | None = None) -> StackStatus:
        """Validate, reach Docker, write the inputs, `compose up`, wait until healthy; on failure `down()`."""
        opts = opts or StackOptions()
        proxies = self.check(opts)
        engine = None
        if self.start_engine and self.docker_factory is None:
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
        except api_errors() as e:  # leftovers of a dead run stay (and are reported); this run still goes on
            reaped = {"error": one_line(e)}
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
            raise StackError(f"{one_line(error)}; cleaning up also failed: {cleanup}") from error

    def _services(self, opts: StackOptions) -> list[str]:
        """The services `up` starts, backends first."""
        return ["valkey", *(["store"] if opts.store else []), "toxiproxy",
                *[f"lease-{i}" for i in range(1, opts.servers + 1)]]

    def _write_inputs(self, opts: StackOptions) -> None:
        """The principals file (hashes only), the host-only credentials, the store admin, clocks and audit dirs."""
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
        self.processes = [self._process_from_state(d) for d in data.get("processes", [])]
        self.info = {k: v for k, v in data.items() if k != "processes"}
        if self.info.get("compose_file"):
            self.compose_file = Path(self.info["compose_file"])
        return data

    def _process_from_state(self, d: dict[str, Any]) -> ContainerProcess:
        p = ContainerProcess.from_state(d)
        p.client_factory, p.probe = self.docker, self.probe
        return p

    def _bound(self) -> list[ContainerProcess]:
        """The processes, each bound to this stack's Docker client (StackError when no engine answers)."""
        if self.processes:
            client = self.docker()
            for p in self.processes:
                p.client = p.client or client
        return self.processes

    def status(self) -> StackStatus:
        """What `fencelab status --json` prints (no secrets: the store URL carries no password); `error` and no
        processes when no engine answers."""
        try:
            bound = self._bound()
        except StackError as e:
            return self._status([], error=str(e))
        return self._status([self._row(p) for p in bound])

    def _row(self, p: ContainerProcess) -> ProcessRow:
        """One container in `status()`: LocalStack's fields (name, pid, alive, ports, log) plus Docker's view."""
        status = p.status()
        return ProcessRow(name=p.name, pid=p.pid, alive=status in LIVE_STATUSES, status=status,
                          ports={p.container_port: p.host_port()}, container=p.container_id[:12],
                          log=f"docker logs {p.container_id[:12]}")

    def _status_extras(self) -> dict[str, Any]:
        return {"project": self.project, "store_admin": str(self.store_admin_file)}

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
