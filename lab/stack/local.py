"""The local stack: a named set of lab-owned processes on loopback, with a state file.

`LocalStack.up()` starts Valkey, the CouchDB-API store and N reference lease
servers (Toxiproxy joins with the nemesis), provisions the demo principals and
writes `state.json` after every process it starts, so that `down()` (possibly
from another command, much later) always finds and stops exactly what `up()`
started, by pid. The lifecycle (recording, the store choice, the topology,
`down`, the typed status) is `lab.stack.lifecycle.ProcessStack`'s; this
module says what the reference system runs and where (a local pid, or one in a
network namespace).

With `StackOptions(netns=True)` (root) every server process runs in its own
network namespace host (`lab.stack.netns.NetnsHosts`: `valkey`, `store`,
`lease-N`), listening on that host's address, and this (the lab's) namespace
joins their bridge through one veth as endpoint `c1`, where the workload's
clients run; the `netns` nemesis cuts links between them with iptables.
state.json records the namespaces and the veth; `down()` deletes them (also
from another process) and sweeps those of killed runs.

Layout of a stack's state directory (`$FENCELAB_HOME/stacks/<name>/`):
    state.json          what runs: pids, ports, urls, logs
    principals.json     principal records with salted key hashes (server input)
    credentials.json    the demo API keys (0600, for clients; never logged)
    logs/ audit/ valkey/ store/   per-process logs and data
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lab.secrets import redact_url
from lab.server.auth import provision_demo_principals, write_principals_file
from lab.server.mutants import MUTANT_NAMES
from lab.stack.base import StackStatus, write_private_json  # noqa: F401 - re-exported
from lab.stack.errors import NAME_RE, NemesisUnavailable, StackError, fencelab_home, stack_dir  # noqa: F401 - re-exported
from lab.stack.faketime import faketime_env
from lab.stack.leaseserver import LeaseServerProcess
from lab.stack.lifecycle import ProcessStack
from lab.stack.netns import NetnsHosts, check_netns_available, free_subnet, sweep_stale
from lab.stack.process import ManagedProcess, ProcessError, free_port  # noqa: F401 - ProcessError re-exported
from lab.stack.store import ExternalStore  # noqa: F401 - re-exported
from lab.stack.topology import Link, standard_links
from lab.stack.toxiproxy import ToxiproxyProcess
from lab.stack.valkey import PERSISTENCE_MODES, ValkeyProcess
from lab.testmap import servers_problem

# a netns stack: the endpoint name of the lab's clients (this namespace), and each server's port on its host
NETNS_CLIENTS = "c1"
NETNS_PORTS = {"valkey": 6379, "store": 5984, "lease": 8080}

@dataclass
class StackOptions:
    """What `up` starts; validated eagerly so bad input fails before anything runs."""

    servers: int = 2
    persistence: str = "none"
    store: bool = True
    toxiproxy: bool = False  # route every link through its own Toxiproxy proxy (the network nemeses need it)
    client_groups: int = 2  # client process groups c1..cN, each with its own link to every server
    fake_clocks: bool = False  # start Valkey and the lease servers under libfaketime (the clock nemesis needs it)
    mutant: str = ""  # a planted bug in every lease server (lab/server/mutants, docs/mutants.md); "" = none
    store_url: str | None = None  # a CouchDB-API store the user runs (e.g. real CouchDB) instead of pouchdb-server
    netns: bool = False  # each server in its own network namespace, clients here (the netns nemesis; root only)
    # start the store even when the workload needs none: the lease servers' recovery rule keeps its epoch there
    # (the nemeses that restart Valkey from its files need it: without it the servers fail closed after a restart)
    recovery_store: bool = False

    @property
    def wants_store(self) -> bool:
        """Does the stack run (or use) a store: for the workload, or for the recovery rule's epoch?"""
        return self.store or self.recovery_store

    def validate(self) -> None:
        if servers_problem(self.servers):  # the one range check of a server count (lab.testmap)
            raise StackError(servers_problem(self.servers))
        if self.store_url is not None:
            u = urlsplit(self.store_url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise StackError(f"--store-url must be an http(s) URL of a CouchDB-API store, not {redact_url(self.store_url)!r}")
        if not 1 <= self.client_groups <= 16:
            raise StackError(f"client groups must be between 1 and 16, not {self.client_groups}")
        if self.persistence not in PERSISTENCE_MODES:
            raise StackError(f"--persistence must be one of {', '.join(PERSISTENCE_MODES)}, not {self.persistence!r}")
        if self.mutant:
            if self.mutant not in MUTANT_NAMES:
                raise StackError(f"--mutant: unknown mutant {self.mutant!r}; known: {', '.join(MUTANT_NAMES)}")
        if self.netns:
            self._validate_netns()

    def _validate_netns(self) -> None:
        """netns excludes Toxiproxy and an external store (no route leaves the namespaces); needs root, ip, iptables."""
        if self.toxiproxy:
            raise StackError("netns and toxiproxy are mutually exclusive: the servers run either in network "
                             "namespaces or on loopback behind Toxiproxy")
        if self.store_url is not None:
            raise StackError("netns cannot use --store-url: no route leaves the lab's network namespaces")
        try:
            check_netns_available()
        except NemesisUnavailable as e:
            raise StackError(str(e)) from None


@dataclass
class LocalStack(ProcessStack):
    """A named local stack: its processes and state directory."""

    name: str = "default"
    home: Path | None = None
    root: Path | None = None  # an explicit state directory (a test run's own stack), instead of home/stacks/name
    die_with_parent: bool = False  # a test run's stack dies with the run (even on SIGKILL); `fencelab up`'s does not
    processes: list[ManagedProcess] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    netns_hosts: Any = field(default=None, repr=False)  # a netns stack's NetnsHosts (the netns nemesis cuts them)

    # -- up ---------------------------------------------------------------
    def up(self, opts: StackOptions | None = None) -> StackStatus:
        """Start everything; on any failure stop what was started and re-raise."""
        return super().up(opts or StackOptions())

    def _start_all(self, opts: StackOptions) -> None:
        if opts.netns:
            self._create_netns(opts)
        # Valkey, the store and Toxiproxy need nothing of each other: all three are spawned, then waited for (their
        # start-ups overlap). The lease servers start once Valkey answers, without waiting for the store: their
        # Python start-up overlaps the store's (a server that meets no store yet retries its recovery every 0.1 s
        # and is not healthy until it is done, lab/server/recovery.py), and each is waited for after the store
        valkey = self._start(ValkeyProcess(self.dir, persistence=opts.persistence, env=self._clock_env("valkey", opts)),
                             wait=False)
        self.info["valkey"] = valkey.url
        store = self._start_store(opts.wants_store, opts.store_url, wait=False)
        toxiproxy = self._start(ToxiproxyProcess(self.dir), wait=False) if opts.toxiproxy else None
        records, credentials = provision_demo_principals()
        principals_file = self.dir / "principals.json"
        write_principals_file(records, principals_file)
        write_private_json(self.credentials_file, credentials)
        valkey.wait_healthy()
        names = [f"lease-{i}" for i in range(1, opts.servers + 1)]
        ports = {n: free_port() for n in names}
        valkey_urls = {n: valkey.url for n in names}
        store_urls = {n: store.url if store else None for n in names}
        self.info["client_nodes"] = [f"http://127.0.0.1:{ports[n]}" for n in names]
        if self.netns_hosts is not None:  # each server on its own host; the clients (here) dial its address
            ports = {n: NETNS_PORTS["lease"] for n in names}
            self.info["client_nodes"] = [f"http://{self.netns_hosts.address(n)}:{ports[n]}" for n in names]
        if opts.toxiproxy:
            upstreams = {"valkey": f"127.0.0.1:{valkey.port}", **{n: f"127.0.0.1:{p}" for n, p in ports.items()}}
            if store is not None:
                upstreams["store"] = store.address
            links = standard_links(opts.client_groups, names, store=store is not None)
            topo = self._start_proxies((Link(f, t, "127.0.0.1:0", upstreams[t]) for f, t in links), toxiproxy)
            valkey_urls = {n: f"redis://{topo.address(n, 'valkey')}/0" for n in names}
            if store:
                store_urls = {n: store.via(topo.address(n, 'store')) for n in names}
            # thread t of the interpreter talks to client_nodes[t % len]: group c(g) to server s via its own proxy
            self.info["client_nodes"] = [f"http://{topo.address(f'c{g}', n)}"
                                         for g in range(1, opts.client_groups + 1) for n in names]
        self.info["lease_servers"] = []
        servers = []
        for n in names:  # all spawned, then each waited for: their Python start-ups overlap
            srv = self._start(LeaseServerProcess(self.dir, valkey_url=valkey_urls[n], principals_file=principals_file,
                                                 name=n, port=ports[n], env=self._clock_env(n, opts),
                                                 store_url=store_urls[n], mutant=opts.mutant or None), wait=False)
            self.info["lease_servers"].append(srv.url)
            servers.append(srv)
        self.save_state()
        for proc in (store, *servers):
            if isinstance(proc, ManagedProcess):
                proc.wait_healthy()

    def _stop_tiers(self) -> list[list[ManagedProcess]]:
        """The lease servers together first (each flushes its audit events to Valkey as it exits), then Toxiproxy,
        the store and Valkey together: nothing of theirs needs another at shutdown."""
        last_first = list(reversed(self.processes))
        servers = [p for p in last_first if p.name.startswith("lease-")]
        return [tier for tier in (servers, [p for p in last_first if not p.name.startswith("lease-")]) if tier]

    def _clock_env(self, name: str, opts: StackOptions) -> dict[str, str] | None:
        """libfaketime environment for process `name` when fake clocks are on (its offset file under clocks/)."""
        if not opts.fake_clocks:
            return None
        path = self.dir / "clocks" / f"{name}.rc"
        self.info.setdefault("clocks", {})[name] = str(path)
        return faketime_env(path)

    # -- network namespaces (netns=True) ---------------------------------------------------
    def _create_netns(self, opts: StackOptions) -> None:
        """One namespace host per server process, and this namespace on their bridge as `c1`."""
        try:
            sweep_stale()  # what killed runs left
            names = ["valkey", *(["store"] if opts.wants_store else []),
                     *(f"lease-{i}" for i in range(1, opts.servers + 1))]
            self.netns_hosts = NetnsHosts(names, subnet=free_subnet(), outside=NETNS_CLIENTS)
            self.info["netns"] = self.netns_hosts.describe()
            self.save_state()  # recorded before anything exists: `down` finds even a half-made set
            self.netns_hosts.create()
        except RuntimeError as e:
            raise StackError(f"cannot create the network namespaces: {e}") from e

    def _place(self, proc: ManagedProcess) -> None:
        """Place a server not yet started into its namespace host (netns=True): listen on the host's address and
        well-known port, under `ip netns exec` (which execs the program: the pid stays its own)."""
        hosts = self.netns_hosts
        if hosts is None or proc.argv[:3] == ["ip", "netns", "exec"]:
            return
        addr, port = hosts.address(proc.name), NETNS_PORTS["lease" if proc.name.startswith("lease-") else proc.name]
        argv = list(proc.argv)
        # the owner classes build loopback command lines; only the listen address and port differ here.
        # Valkey's protected mode admits only loopback without a password: the lease servers dial it from
        # their own hosts, and no route leaves the lab's namespaces.
        for flag, value in (("--bind", addr), ("--host", addr), ("--port", str(port)), ("--protected-mode", "no")):
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        if addr not in argv:
            raise StackError(f"{proc.name}: cannot place it in a namespace: no --bind/--host in its command line")
        proc.argv = hosts.exec_argv(proc.name, argv)
        proc.host = addr
        proc.ports = {k: port for k in proc.ports}

    def _after_stop(self) -> list[str]:
        """Delete this stack's namespaces and veth (its processes stopped), then those of killed runs."""
        errors = []
        if self.netns_hosts is not None or self.info.get("netns"):
            try:
                hosts = self.netns_hosts or NetnsHosts.from_description(self.info["netns"])
                hosts.destroy()
                self.netns_hosts = None
            except (RuntimeError, ValueError) as e:
                errors.append(str(e))
        try:
            check_netns_available()
        except NemesisUnavailable:
            return errors  # not root: this stack made no namespaces, and others' are not ours to sweep
        try:
            sweep_stale()
        except RuntimeError as e:
            errors.append(f"sweeping the namespaces of killed runs: {e}")
        return errors

    # -- status -----------------------------------------------------------
    def _status_extras(self) -> dict[str, Any]:
        return {"netns": self.info.get("netns")}
