"""The local stack: a named set of lab-owned processes on loopback, with a state file.

`LocalStack.up()` starts Valkey, the CouchDB-API store and N reference lease
servers (Toxiproxy joins with the nemesis), provisions the demo principals and
writes `state.json` after every process it starts, so that `down()` (possibly
from another command, much later) always finds and stops exactly what `up()`
started, by pid.

Layout of a stack's state directory (`$FENCELAB_HOME/stacks/<name>/`):
    state.json          what runs: pids, ports, urls, logs
    principals.json     principal records with salted key hashes (server input)
    credentials.json    the demo API keys (0600, for clients; never logged)
    logs/ audit/ valkey/ store/   per-process logs and data
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.stack.leaseserver import LeaseServerProcess
from lab.secrets import redact_url
from lab.stack.clock import faketime_env
from lab.stack.process import ManagedProcess, ProcessError, free_port
from lab.stack.store import PouchDBProcess
from lab.stack.toxiproxy import ToxiproxyProcess
from lab.stack.valkey import PERSISTENCE_MODES, ValkeyProcess

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class StackError(RuntimeError):
    """A stack cannot be brought up, found, or stopped as asked."""


@dataclass
class ExternalStore:
    """A CouchDB-API store the lab does not run (the user's real CouchDB): only its URL."""

    url: str

    @property
    def address(self) -> str:
        """host:port, for a Toxiproxy upstream."""
        from urllib.parse import urlsplit

        u = urlsplit(self.url)
        return f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"

    def via(self, listen: str) -> str:
        """The same URL (credentials kept) through a proxy listening on `listen`."""
        from urllib.parse import urlsplit, urlunsplit

        u = urlsplit(self.url)
        auth = f"{u.username}:{u.password}@" if u.username else ""
        return urlunsplit((u.scheme, auth + listen, u.path, u.query, u.fragment))


def fencelab_home() -> Path:
    """Where named stacks keep their state: $FENCELAB_HOME or ~/.fencelab."""
    return Path(os.environ.get("FENCELAB_HOME") or Path.home() / ".fencelab")


def stack_dir(name: str, home: Path | None = None) -> Path:
    """The state directory of stack `name` (validated: it becomes a path component)."""
    if not NAME_RE.match(name):
        raise StackError(f"invalid stack name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    return (home or fencelab_home()) / "stacks" / name


def write_private_json(path: Path, data: Any) -> None:
    """Write JSON readable only by its owner (created 0600, never world-readable even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@dataclass
class StackOptions:
    """What `up` starts; validated eagerly so bad input fails before anything runs."""

    servers: int = 2
    persistence: str = "none"
    store: bool = True
    toxiproxy: bool = False  # route every link through its own Toxiproxy proxy (the network nemeses need it)
    client_groups: int = 2  # client process groups c1..cN, each with its own link to every server
    fake_clocks: bool = False  # start Valkey and the lease servers under libfaketime (the clock nemesis needs it)
    store_url: str | None = None  # a CouchDB-API store the user runs (e.g. real CouchDB) instead of pouchdb-server

    def validate(self) -> None:
        if not 1 <= self.servers <= 16:
            raise StackError(f"--servers must be between 1 and 16, not {self.servers}")
        if self.store_url is not None:
            from urllib.parse import urlsplit

            u = urlsplit(self.store_url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise StackError(f"--store-url must be an http(s) URL of a CouchDB-API store, not {redact_url(self.store_url)!r}")
        if not 1 <= self.client_groups <= 16:
            raise StackError(f"client groups must be between 1 and 16, not {self.client_groups}")
        if self.persistence not in PERSISTENCE_MODES:
            raise StackError(f"--persistence must be one of {', '.join(PERSISTENCE_MODES)}, not {self.persistence!r}")


@dataclass
class LocalStack:
    """A named local stack: its processes and state directory."""

    name: str = "default"
    home: Path | None = None
    root: Path | None = None  # an explicit state directory (a test run's own stack), instead of home/stacks/name
    die_with_parent: bool = False  # a test run's stack dies with the run (even on SIGKILL); `fencelab up`'s does not
    processes: list[ManagedProcess] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return Path(self.root) if self.root is not None else stack_dir(self.name, self.home)

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def credentials_file(self) -> Path:
        return self.dir / "credentials.json"

    # -- up ---------------------------------------------------------------
    def up(self, opts: StackOptions | None = None) -> dict[str, Any]:
        """Start everything; on any failure stop what was started and re-raise."""
        opts = opts or StackOptions()
        opts.validate()
        existing = self.load_state()
        if existing and any(p.alive() for p in self.processes):
            raise StackError(f"stack {self.name!r} is already up; run `fencelab down --name {self.name}` first")
        self.processes = []
        self.dir.mkdir(parents=True, exist_ok=True)
        self.info = {"name": self.name, "dir": str(self.dir), "options": vars(opts), "credentials": str(self.credentials_file)}
        try:
            self._start_all(opts)
        except BaseException:
            self.down()
            raise
        return self.status()

    def _start_all(self, opts: StackOptions) -> None:
        from lab.server.auth import provision_demo_principals, write_principals_file

        valkey = self._start(ValkeyProcess(self.dir, persistence=opts.persistence, env=self._clock_env("valkey", opts)))
        self.info["valkey"] = valkey.url
        records, credentials = provision_demo_principals()
        principals_file = self.dir / "principals.json"
        write_principals_file(records, principals_file)
        write_private_json(self.credentials_file, credentials)
        store = None
        if opts.store and opts.store_url:
            store = ExternalStore(opts.store_url)
            self.info["store"] = redact_url(opts.store_url)
        elif opts.store:
            store = self._start(PouchDBProcess(self.dir))
            self.info["store"] = store.url
        names = [f"lease-{i}" for i in range(1, opts.servers + 1)]
        ports = {n: free_port() for n in names}
        valkey_urls = {n: valkey.url for n in names}
        store_urls = {n: store.url if store else None for n in names}
        self.info["client_nodes"] = [f"http://127.0.0.1:{ports[n]}" for n in names]
        if opts.toxiproxy:
            topo = self._build_topology(opts, valkey, store, ports)
            valkey_urls = {n: f"redis://{topo.address(n, 'valkey')}/0" for n in names}
            if store:
                store_urls = {n: store.via(topo.address(n, 'store')) for n in names}
            # thread t of the interpreter talks to client_nodes[t % len]: group c(g) to server s via its own proxy
            self.info["client_nodes"] = [f"http://{topo.address(f'c{g}', n)}"
                                         for g in range(1, opts.client_groups + 1) for n in names]
        self.info["lease_servers"] = []
        for n in names:
            srv = self._start(LeaseServerProcess(self.dir, valkey_url=valkey_urls[n], principals_file=principals_file,
                                                 name=n, port=ports[n], env=self._clock_env(n, opts),
                                                 store_url=store_urls[n]))
            self.info["lease_servers"].append(srv.url)
            self.save_state()

    def _clock_env(self, name: str, opts: StackOptions) -> dict[str, str] | None:
        """libfaketime environment for process `name` when fake clocks are on (its offset file under clocks/)."""
        if not opts.fake_clocks:
            return None
        path = self.dir / "clocks" / f"{name}.rc"
        self.info.setdefault("clocks", {})[name] = str(path)
        return faketime_env(path)

    def _build_topology(self, opts: StackOptions, valkey, store, ports: dict[str, int]):
        """Start Toxiproxy and create one proxy per link; the description goes into state.json."""
        import asyncio

        from nemesis.topology import Topology, standard_links
        from nemesis.toxiproxy import ToxiproxyClient

        tp = self._start(ToxiproxyProcess(self.dir))
        self.info["toxiproxy"] = tp.url
        upstreams = {"valkey": f"127.0.0.1:{valkey.port}", **{n: f"127.0.0.1:{p}" for n, p in ports.items()}}
        if store is not None:
            upstreams["store"] = store.address
        links = standard_links(opts.client_groups, list(ports), store=store is not None)

        async def build():
            async with ToxiproxyClient(tp.url) as client:
                return (await Topology.build(client, upstreams, links)).describe()

        self.info["topology"] = asyncio.run(build())
        self.save_state()
        return Topology.from_description(None, self.info["topology"])

    def _start(self, proc: ManagedProcess) -> ManagedProcess:
        """Start one process and record it in state.json at once (so `down` can always find it)."""
        proc.die_with_parent = self.die_with_parent
        self.processes.append(proc)
        try:
            proc.start()
        finally:
            self.save_state()
        return proc

    # -- state ------------------------------------------------------------
    def save_state(self) -> None:
        data = dict(self.info, processes=[p.state() for p in self.processes if p.pid is not None])
        write_private_json(self.state_file, data)

    def load_state(self) -> dict[str, Any] | None:
        """Read state.json (if any) into handles that can stop the recorded pids."""
        if not self.state_file.exists():
            return None
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as e:
            raise StackError(f"cannot read {self.state_file}: {e}") from e
        self.processes = [ManagedProcess.from_state(d) for d in data.get("processes", [])]
        self.info = {k: v for k, v in data.items() if k != "processes"}
        return data

    def status(self) -> dict[str, Any]:
        """What `fencelab status --json` prints."""
        procs = [{"name": p.name, "pid": p.pid, "alive": p.alive(), "ports": p.ports, "log": str(p.log_path)}
                 for p in self.processes]
        return {
            "name": self.name,
            "up": bool(procs) and all(p["alive"] for p in procs),
            "lease_servers": self.info.get("lease_servers", []),
            "valkey": self.info.get("valkey"),
            "store": self.info.get("store"),
            "toxiproxy": self.info.get("toxiproxy"),
            "client_nodes": self.info.get("client_nodes", self.info.get("lease_servers", [])),
            "topology": self.info.get("topology"),
            "clocks": self.info.get("clocks", {}),
            "credentials": str(self.credentials_file),
            "dir": str(self.dir),
            "processes": procs,
        }

    def process(self, name: str) -> ManagedProcess:
        """The owned process called `name` (e.g. `valkey`, `lease-2`, `store`)."""
        for p in self.processes:
            if p.name == name:
                return p
        raise StackError(f"stack {self.name!r} has no process {name!r}; it has {[p.name for p in self.processes]}")

    # -- down -------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop every recorded process (reverse start order) and remove state.json; returns names stopped."""
        if not self.processes:
            self.load_state()
        stopped, errors = [], []
        for p in reversed(self.processes):
            try:
                if p.alive():
                    p.stop()
                    stopped.append(p.name)
            except ProcessError as e:
                errors.append(str(e))
        if errors:
            raise StackError("; ".join(errors))
        self.processes = []
        if self.state_file.exists():
            self.state_file.unlink()
        return stopped

