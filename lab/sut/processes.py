"""Systems that bring their own processes (Jepsen's DB protocol): declared by the system, owned by the lab.

A system under test the lab can run declares what it needs with a
`SystemProcesses`, returned by a function of the test given at registration:

    register_sut("mysys", MyClient, processes=lambda test: SystemProcesses(
        system="mysys", install="run `scripts/install.sh mysys`", check_installed=find_binary,
        processes=(ProcessSpec("mysys-1", argv=lambda p: [...], ports=("client", "peer")), ...),
        links=(LinkSpec("clients", "mysys-1", "client"), LinkSpec("peers", "mysys-1", "peer"), ...),
        client_url=lambda address: f"http://{address}"))

- `ProcessSpec`: one process: its name (an endpoint name; `<word>-<n>` is a
  *member* the clients dial, a "server" to the nemeses' grudges), its command
  line (`argv(placement)`, built once every port and address is known) or its
  own `ManagedProcess` (`make(placement)`, e.g. `lab.stack.valkey.ValkeyProcess`),
  its named ports (the lab picks free loopback ports), its health probe, and
  whether libfaketime reaches its clock (`fake_clock`: a Go binary reads the
  kernel's vDSO clock itself, so it cannot be faked).
- `LinkSpec(frm, to, port)`: `frm` dials `to`'s named `port`. `frm` is
  `clients` (every client group `c1..cN`, each its own link), a process name,
  `members` (every other process dials it by one name they all agree on: a
  link per (sender, receiver) pair, below), or another word naming a group of
  senders sharing one proxy (`peers_<to>`). With a network nemesis every link
  gets its own Toxiproxy proxy `<frm>_<to>`, and `placement.address(frm, to)`
  is what `frm` dials: the command lines advertise those addresses, so the
  traffic takes the proxies. The client groups always get a link to the lab's
  store (they write there).
- Per-pair links for members that must agree on one address per member (etcd
  derives member IDs from the peer URLs in `--initial-cluster`):
  `LinkSpec(MEMBERS, to, port)`. Every member is told the same URL for `to`,
  `placement.url(MEMBERS, to, port)` = `http://<to>.fencelab.test:<P>`, and
  each sender resolves that name through its OWN /etc/hosts: the lab starts
  each sender in its own mount namespace (`unshare --mount`, a bind mount of
  `<run>/stack/hosts/<name>` on /etc/hosts, then `exec` of the command, so the
  recorded pid is the program's own), where `<to>.fencelab.test` is a
  loopback address `127.0.<i>.<j>` (sender i, receiver j) on which the
  proxy `<sender>_<to>` listens at port P. So each direction of each pair is
  one proxy, and the grudges cut per pair. Without root or a usable `unshare`
  the lab falls back to one shared proxy per receiver (`members_<to>`) and says
  why in `info["peer_links"]`.
- `client_url(address)`: the node URL a worker is given for a member.

`SutStack` (what `lab.runner` starts for such a system, in place of the
reference `LocalStack`) owns every process through the same lifecycle as the
local stack (`lab.stack.lifecycle.ProcessStack`): a `ManagedProcess` each (pid, log under `<run>/stack/logs/`, data dir, stop by
pid, dies with the run), `state.json`, Toxiproxy on every declared link and
libfaketime clocks when the nemeses ask for them, and the lab's CouchDB-API
store when the workload needs one. It exposes the same `processes` / `info`
(`toxiproxy`, `topology`, `clocks`) / `process(name)` interface, so the
existing nemeses (partition, latency, clock, kill, pause, client-pause) act on
the system's processes unchanged. A nemesis that cannot apply to the system
(a clock fault on processes libfaketime cannot reach, `netns`, the Valkey
faults without a Valkey) is refused before the run by the Target (`lab.sut.target`), naming
the system and the missing ability. Systems the lab cannot own stay behind `--url`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.stack.errors import StackError
from lab.stack.faketime import faketime_env
from lab.stack.lifecycle import ProcessStack
from lab.stack.process import ManagedProcess, ProcessError, free_port
from lab.stack.store import PouchDBProcess
from lab.sut.protocol import SutError
from lab.sut.registry import sut_of
from lab.testmap import Test
from nemesis.core import completion
from nemesis.process_faults import PauseNemesis
from lab.stack.topology import Link, _check_endpoint, role

CLIENTS = "clients"  # the `frm` of a link every client group dials (one proxy per group: c1_<to>, c2_<to>, ...)
STORE = "store"  # the lab's CouchDB-API store, as a link's `to`
STORE_PORT = "http"
MEMBERS = "members"  # the `frm` of a link every other process dials by one agreed name (one proxy per pair)
DOMAIN = "fencelab.test"  # the agreed names are `<member>.fencelab.test` (.test: reserved, never on the network)
HOSTS = Path("/etc/hosts")
# run argv in its own mount namespace with $0 bind-mounted on /etc/hosts; exec keeps the pid the lab records
OWN_HOSTS = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
             f'mount --bind "$0" {HOSTS} && exec "$@"')


@dataclass(frozen=True)
class ProcessSpec:
    """One process a system brings (see the module docstring)."""

    name: str
    argv: Callable[["Placement"], list[str]] | None = None  # the command line, once ports and addresses are known
    make: Callable[["Placement"], ManagedProcess] | None = None  # or the system's own ManagedProcess subclass
    ports: tuple[str, ...] = ("client",)
    health: Callable[[ManagedProcess], bool] | None = None  # does it answer? (default: every port accepts TCP)
    env: Mapping[str, str] = field(default_factory=dict)
    fake_clock: bool = True  # does libfaketime move its wall clock?
    clock_note: str = ""  # why not, when fake_clock is False (shown when a clock nemesis is refused)
    keep_data: bool = True  # False: its data directory is removed once the run's stack is down (logs stay)

    @property
    def member(self) -> bool:
        """A member the clients dial: named `<word>-<n>` (a "server" to the partition grudges)."""
        return role(self.name) == "server"


@dataclass(frozen=True)
class LinkSpec:
    """`frm` dials the named `port` of process `to` (one Toxiproxy proxy `<frm>_<to>` per client group)."""

    frm: str
    to: str
    port: str = "client"


@dataclass(frozen=True)
class SystemProcesses:
    """Everything the lab needs to run a system's own processes (see the module docstring)."""

    system: str
    processes: tuple[ProcessSpec, ...]
    links: tuple[LinkSpec, ...]
    client_url: Callable[[str], str]
    install: str = ""  # how to install what is missing (shown when check_installed fails)
    check_installed: Callable[[], Any] | None = None  # raises (e.g. lab.paths.MissingTool) when a binary is missing
    ready: Callable[["SutStack"], bool] | None = None  # after start: polled until True (e.g. a leader is elected)
    ready_timeout_s: float = 60.0
    start_timeout_s: float = 30.0
    client_clock: bool = True  # does the system's client read a clock the client-clock nemesis could move?
    client_clock_note: str = ""  # why not
    leader: Callable[["SutStack"], str | None] | None = None  # the member leading now (the leader-pause nemesis)

    def validate(self) -> None:
        """Names, ports and links are consistent (SutError naming the problem)."""
        names = [p.name for p in self.processes]
        if not names:
            raise SutError(f"SUT {self.system!r} declares no process")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SutError(f"SUT {self.system!r} declares process {', '.join(dup)} twice")
        for p in self.processes:
            try:
                _check_endpoint(p.name)
            except ValueError as e:
                raise SutError(f"SUT {self.system!r}: process {e}") from None
            if p.name in (STORE, "toxiproxy", MEMBERS) or p.name.startswith("c") and p.name[1:].isdigit():
                raise SutError(f"SUT {self.system!r}: process name {p.name!r} is the lab's own; pick another")
            if (p.argv is None) == (p.make is None):
                raise SutError(f"SUT {self.system!r}: process {p.name!r} needs exactly one of argv or make")
            if not p.ports:
                raise SutError(f"SUT {self.system!r}: process {p.name!r} declares no port")
        ports = {p.name: p.ports for p in self.processes}
        seen = set()
        for link in self.links:
            if link.to == STORE:
                continue
            if link.to not in ports:
                raise SutError(f"SUT {self.system!r}: link {link.frm} -> {link.to}: no process {link.to!r}")
            if link.port not in ports[link.to]:
                raise SutError(f"SUT {self.system!r}: link {link.frm} -> {link.to}: {link.to} has no port "
                               f"{link.port!r} (ports: {', '.join(ports[link.to])})")
            if (link.frm, link.to) in seen:
                raise SutError(f"SUT {self.system!r}: link {link.frm} -> {link.to} is declared twice")
            if (link.frm in ports and (MEMBERS, link.to) in seen) or (
                    link.frm == MEMBERS and any((f, link.to) in seen for f in ports)):
                raise SutError(f"SUT {self.system!r}: link {link.frm} -> {link.to} is declared twice (a "
                               f"{MEMBERS!r} link to {link.to} already gives every process its own)")
            seen.add((link.frm, link.to))
        if any(link.frm == MEMBERS for link in self.links) and len(self.processes) > 255:
            raise SutError(f"SUT {self.system!r}: per-pair links address at most 255 processes")
        if not any(link.frm == CLIENTS for link in self.links):
            raise SutError(f"SUT {self.system!r}: no link from the clients (LinkSpec('clients', <process>))")

    def members(self) -> list[str]:
        """The processes the clients dial (their client links' targets), in declaration order."""
        dialled = {link.to for link in self.links if link.frm == CLIENTS}
        return [p.name for p in self.processes if p.name in dialled]


def declared_processes(test: Test) -> SystemProcesses | None:
    """The processes the test's system declares, or None (the reference stack, an in-process system). Whether
    the lab runs them (not with --url) is the Target's answer (lab.sut.target)."""
    entry = sut_of(test)
    if entry.processes is None:
        return None
    decl = entry.processes(test)
    if not isinstance(decl, SystemProcesses):
        raise SutError(f"{entry.where}: its processes function returned {type(decl).__name__}, "
                       "not a lab.sut.processes.SystemProcesses")
    return decl


def check_test(test: Test) -> None:
    """Before anything starts: the system's declaration is consistent and its binaries are installed (what it can
    take of the nemeses asked is the Target's answer: lab.sut.target)."""
    decl = declared_processes(test)
    if decl is None:
        return
    decl.validate()
    if decl.check_installed is not None:
        try:
            decl.check_installed()
        except Exception as e:  # noqa: BLE001 - a missing tool is one clear line
            raise SutError(f"SUT {decl.system!r}: {e}" + (f"; {decl.install}" if decl.install else "")) from None



# -- placing the processes ---------------------------------------------------------------
class Placement:
    """Where everything listens: each process's real ports, and what each link's sender dials."""

    def __init__(self, decl: SystemProcesses, root: Path, client_groups: int, clocks: bool,
                 persistence: str = "none"):
        self.decl = decl
        self.persistence = persistence  # what the nemeses asked of a Valkey (StackOptions.persistence), for make()
        self.root = Path(root).resolve()
        self.client_groups = client_groups
        self.clocks = clocks
        self.ports: dict[str, dict[str, int]] = {p.name: {k: free_port() for k in p.ports} for p in decl.processes}
        self.store_address: str | None = None
        self.proxies: dict[tuple[str, str], str] = {}  # (frm, to) -> proxy listen address, when proxied
        self.per_pair = False  # MEMBERS links: one proxy per (sender, receiver), reached by name (set_per_pair)
        self.agreed_ports: dict[str, int] = {}  # receiver -> the port of its agreed name (per_pair)

    def port(self, name: str, port: str = "client") -> int:
        """The real port `port` of process `name`."""
        return self.ports[name][port]

    def real(self, to: str, port: str = "client") -> str:
        """`host:port` where process `to` (or the store) really listens."""
        if to == STORE:
            if self.store_address is None:
                raise StackError("no store in this stack")
            return self.store_address
        return f"127.0.0.1:{self.port(to, port)}"

    def address(self, frm: str, to: str, port: str = "client") -> str:
        """What `frm` dials to reach `to` (its link's proxy when there is one, else the real address); for
        `MEMBERS` with per-pair links, the agreed name each sender resolves to its own proxy."""
        if frm == MEMBERS and self.per_pair:
            return f"{self.agreed_name(to)}:{self.agreed_ports[to]}"
        return self.proxies.get((frm, to)) or self.real(to, port)

    # -- per-pair links (MEMBERS): one agreed name per member, resolved per sender ------------------------------
    def set_per_pair(self) -> None:
        """Give every MEMBERS link one proxy per sender (call before `pairs()`): pick each receiver's agreed
        port, free on every sender's loopback address for it."""
        self.per_pair = True
        for to in self.receivers():
            self.agreed_ports[to] = _port_free_on([self.pair_host(s, to) for s in self.senders(to)])

    def receivers(self) -> list[str]:
        """The processes dialled through MEMBERS links, in declaration order."""
        dialled = {link.to for link in self.decl.links if link.frm == MEMBERS}
        return [p.name for p in self.decl.processes if p.name in dialled]

    def pair_links(self) -> set[tuple[str, str]]:
        """The (sender, receiver) links of MEMBERS, when they are per pair (else none)."""
        if not self.per_pair:
            return set()
        return {(frm, to) for to in self.receivers() for frm in self.senders(to)}

    def senders(self, to: str) -> list[str]:
        """Every other process: the senders of a MEMBERS link to `to`."""
        return [p.name for p in self.decl.processes if p.name != to]

    @staticmethod
    def agreed_name(to: str) -> str:
        """The host name every member uses for `to` (`etcd-2.fencelab.test`)."""
        return f"{to}.{DOMAIN}"

    def pair_host(self, frm: str, to: str) -> str:
        """The loopback address of the proxy `frm_to` (`127.0.<i>.<j>`, by declaration order from 1): where the
        agreed name of `to` resolves in `frm`'s own /etc/hosts."""
        index = {p.name: i for i, p in enumerate(self.decl.processes, start=1)}
        return f"127.0.{index[frm]}.{index[to]}"

    def hosts_text(self, name: str) -> str:
        """Process `name`'s own /etc/hosts: the machine's, then each receiver's agreed name -> the address of
        `name`'s own proxy to it (its own name -> an address nothing listens on: it never dials itself)."""
        try:
            base = HOSTS.read_text()
        except OSError:
            base = "127.0.0.1 localhost\n"
        lines = [f"{self.pair_host(name, to)} {self.agreed_name(to)}" for to in self.receivers()]
        return base.rstrip("\n") + "\n# fencelab: per-pair links (lab.sut.processes)\n" + "\n".join(lines) + "\n"

    def in_own_hosts(self, name: str, argv: list[str]) -> list[str]:
        """`argv`, run with process `name`'s own /etc/hosts when it sends over per-pair links (else unchanged);
        a system's own `make` process wraps its command line with this too."""
        if not self.per_pair or not any(name in self.senders(to) for to in self.receivers()):
            return argv
        path = self.root / "hosts" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.hosts_text(name))
        return [*OWN_HOSTS, str(path), *argv]

    def url(self, frm: str, to: str, port: str = "client", scheme: str = "http") -> str:
        return f"{scheme}://{self.address(frm, to, port)}"

    def data_dir(self, name: str) -> Path:
        """The process's own data directory (created)."""
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def log_path(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def clock_file(self, name: str) -> Path:
        return self.root / "clocks" / f"{name}.rc"

    def env(self, name: str) -> dict[str, str] | None:
        """libfaketime for process `name` when the clocks are faked (and its clock can be), else None."""
        spec = next(p for p in self.decl.processes if p.name == name)
        if not self.clocks or not spec.fake_clock:
            return None
        return faketime_env(self.clock_file(name))

    def pairs(self) -> list[tuple[str, str, str]]:
        """Every proxied link as (frm, to, port): `clients` expanded to c1..cN, `members` to every other process
        (per-pair links; else one shared `members_<to>`), plus each client group -> store."""
        out = []
        for link in self.decl.links:
            if link.frm == CLIENTS:
                senders = [f"c{g}" for g in range(1, self.client_groups + 1)]
            elif link.frm == MEMBERS and self.per_pair:
                senders = self.senders(link.to)
            else:
                senders = [link.frm]
            out += [(s, link.to, link.port) for s in senders]
        if self.store_address is not None and not any(t == STORE for _, t, _ in out):
            out += [(f"c{g}", STORE, STORE_PORT) for g in range(1, self.client_groups + 1)]
        return out


class DeclaredProcess(ManagedProcess):
    """A process of a system under test, run from its declared command line; healthy by its declared probe."""

    def __init__(self, spec: ProcessSpec, placement: Placement):
        env = dict(spec.env)
        env.update(placement.env(spec.name) or {})
        argv = placement.in_own_hosts(spec.name, [str(a) for a in spec.argv(placement)])
        super().__init__(name=spec.name, argv=argv,
                         log_path=placement.log_path(spec.name), ports=dict(placement.ports[spec.name]),
                         env=env or None, cwd=placement.data_dir(spec.name))
        self.probe = spec.health
        self.data_dir = placement.data_dir(spec.name)

    def healthy(self) -> bool:
        if self.probe is None:
            return super().healthy()
        try:
            return bool(self.probe(self))
        except Exception:  # noqa: BLE001 - a probe that raises means "not answering yet"
            return False

    def state(self) -> dict:
        d = super().state()
        d.update(data_dir=str(self.data_dir), declared=True)
        return d


class SutStack(ProcessStack):
    """The lab-owned processes of one system under test (+ the store, Toxiproxy, fake clocks); see module doc."""

    def __init__(self, decl: SystemProcesses, *, root: Path, die_with_parent: bool = False, name: str = "stack"):
        self.decl = decl
        self.name = name
        self.home = None
        self.root = Path(root)
        self.die_with_parent = die_with_parent
        self.processes: list[ManagedProcess] = []
        self.info: dict[str, Any] = {"system": decl.system}
        self.netns_hosts = None  # declared processes run on loopback (the netns nemesis is refused)
        self.placement: Placement | None = None

    # -- up ---------------------------------------------------------------
    def _check(self, opts: Any) -> None:
        opts.validate()
        if getattr(opts, "netns", False):
            raise StackError(f"SUT {self.decl.system!r}: its processes run on loopback; network namespaces "
                             "(netns) are not available for them")

    def _initial_info(self, opts: Any) -> dict[str, Any]:
        return {"system": self.decl.system}

    def _start_all(self, opts: Any) -> None:
        """Start the store (if asked), Toxiproxy with a proxy per declared link (if asked), then the system's
        processes (all spawned, then each waited for: a cluster needs its peers to come up)."""
        groups = int(getattr(opts, "client_groups", 2))
        placement = self.placement = Placement(self.decl, self.dir, groups, bool(getattr(opts, "fake_clocks", False)),
                                               getattr(opts, "persistence", "none"))
        store = self._start_store(opts.store, opts.store_url)
        if isinstance(store, PouchDBProcess):  # the lab's own store: the client groups reach it by links
            placement.store_address = store.address
        if opts.toxiproxy:
            self._build_topology(placement)
        procs = []
        for spec in self.decl.processes:
            proc = spec.make(placement) if spec.make is not None else DeclaredProcess(spec, placement)
            if not isinstance(proc, ManagedProcess):
                raise StackError(f"SUT {self.decl.system!r}: make() for {spec.name!r} returned "
                                 f"{type(proc).__name__}, not a lab.stack ManagedProcess")
            if placement.clocks and spec.fake_clock:
                self.info.setdefault("clocks", {})[spec.name] = str(placement.clock_file(spec.name))
            procs.append(self._start(proc, wait=False))
        for proc in procs:
            proc.wait_healthy(self.decl.start_timeout_s)
        self._wait_ready()
        self._describe(placement, store)
        self.save_state()

    def _wait_ready(self) -> None:
        """Poll the system's own readiness (e.g. a leader elected) until it holds."""
        if self.decl.ready is None:
            return
        deadline = time.monotonic() + self.decl.ready_timeout_s
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if not p.alive()]
            if dead:
                raise ProcessError(f"{dead[0].name} exited during start-up; log {dead[0].log_path}:\n"
                                   f"{dead[0].log_tail()}")
            try:
                if self.decl.ready(self):
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.2)
        tails = "\n".join(f"--- {p.name} ({p.log_path})\n{p.log_tail(8)}" for p in self.processes)
        raise ProcessError(f"SUT {self.decl.system!r} not ready after {self.decl.ready_timeout_s:.0f}s:\n{tails}")

    def _build_topology(self, placement: Placement) -> None:
        """Start Toxiproxy and one proxy per declared link (listening on ports chosen now, so the command lines
        can advertise them); the description goes into info["topology"] for the network nemeses."""
        if any(link.frm == MEMBERS for link in self.decl.links):
            problem = own_hosts_problem()
            if problem is None:
                placement.set_per_pair()
                self.info["peer_links"] = {"mode": "per-pair"}
            else:
                self.info["peer_links"] = {"mode": "per-receiver", "why": problem}
        links = []
        for frm, to, port in placement.pairs():
            if (frm, to) in placement.pair_links():
                listen = f"{placement.pair_host(frm, to)}:{placement.agreed_ports[to]}"
            else:
                listen = f"127.0.0.1:{free_port()}"
            links.append(Link(frm, to, listen, placement.real(to, port)))
            placement.proxies[(frm, to)] = listen
        self._start_proxies(links)

    def _describe(self, placement: Placement, store: Any) -> None:
        """info: the members' URLs, the client nodes (group g -> member m through its proxy) and each node's store."""
        members = self.decl.members()
        url = self.decl.client_url
        self.info["members"] = {m: url(placement.real(m)) for m in members}
        nodes, node_store = [], {}
        for g in range(1, placement.client_groups + 1):
            for m in members:
                node = url(placement.address(f"c{g}", m))
                nodes.append(node)
                if isinstance(store, PouchDBProcess):  # a --store-url store is reached directly (its URL is secret)
                    node_store[node] = store.via(placement.address(f"c{g}", STORE))
        self.info["client_nodes"] = nodes
        self.info["node_store"] = node_store

    # -- what the runner and the nemeses read -------------------------------
    def leader_nemesis(self, *, rng: Any):
        """`--nemesis leader-pause` on this system (nemesis.registry asks the stack, as it asks an SSH stack for
        its clock nemesis); ValueError when the system declares no leader."""
        if self.decl.leader is None:
            raise ValueError("--nemesis leader-pause: the system under test declares no leader")
        return leader_pause(self, rng=rng)

    def leader_probe(self) -> Callable[[], str | None] | None:
        """Who leads now, by the system's own report (kill and pause record it); None when it declares no leader."""
        declared = self.decl.leader
        return None if declared is None else (lambda: declared(self))

    def _status_extras(self) -> dict[str, Any]:
        """The members are the servers the clients dial; no Valkey or API keys of the lab's own."""
        members = self.info.get("members", {})
        return {"system": self.decl.system, "lease_servers": list(members.values()), "members": members,
                "client_nodes": self.info.get("client_nodes", []), "credentials": None}

    def store_url_for(self, node: str) -> str | None:
        """The store as the client group of `node` reaches it (through its proxy when there is one)."""
        return self.info.get("node_store", {}).get(node) or self.info.get("store")

    # -- down -------------------------------------------------------------
    def _after_stop(self) -> list[str]:
        self._drop_scratch_data()
        return []

    def _drop_scratch_data(self) -> None:
        """Remove the data directories the system marks as scratch (`keep_data=False`: e.g. etcd's 64 MB
        preallocated WAL files per member), once every process is stopped; the logs and the history stay."""
        if self.placement is None:
            return
        for spec in self.decl.processes:
            if not spec.keep_data:
                shutil.rmtree(self.placement.root / spec.name, ignore_errors=True)


def store_url_for(test: Test, node: str) -> str | None:
    """The store a worker bound to `node` writes into: its client group's link to the store, when the lab runs
    the system's processes; else the run's store (`test.live.store_url`, `test.live.store`)."""
    stack = test.live.stack
    if hasattr(stack, "store_url_for") and not test.live.store_url:  # a stack that proxies each group's store
        found = stack.store_url_for(node)
        if found:
            return found
    return test.live.store_url or test.live.store


def _port_free_on(hosts: list[str]) -> int:
    """A port free on every one of these loopback addresses (Toxiproxy binds it on each, one proxy per sender)."""
    for _ in range(50):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise StackError(f"no port free on all of {', '.join(hosts)}")


@functools.cache
def own_hosts_problem() -> str | None:
    """Why a process cannot be given its own /etc/hosts on this machine (None: it can): the per-pair links need
    root, unshare(1) and a bind mount in a new mount namespace; tried once, with `true` in place of a program."""
    if os.geteuid() != 0:
        return "the lab is not root, so a member cannot have its own /etc/hosts (one proxy per receiver instead)"
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed (util-linux), so a member cannot have its own /etc/hosts"
    try:
        r = subprocess.run([*OWN_HOSTS, str(HOSTS), "true"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare --mount did not run: {e}"
    if r.returncode != 0:
        return f"unshare --mount with a bind mount on {HOSTS} failed: {(r.stderr or r.stdout).strip()[:200]}"
    return None


def member_processes_of(stack: "SutStack") -> dict[str, ManagedProcess]:
    """A SutStack's own system processes by name (the store and Toxiproxy excluded)."""
    names = {p.name for p in stack.decl.processes}
    return {p.name: p for p in stack.processes if p.name in names}



# -- the leader-pause nemesis ---------------------------------------------------------------------------------------
def leader_pause(stack: "SutStack", *, rng: Any):
    """SIGSTOP the system's current leader (`SystemProcesses.leader`) at `start-leader-pause`, SIGCONT it at the
    stop: the existing pause, aimed where a pause hurts a consensus system most."""
    class LeaderPause(PauseNemesis):
        fault = "leader-pause"

        async def _start(self, op: dict, value: dict[str, Any]) -> dict:
            if "targets" not in value and not self._active:
                leader = await asyncio.to_thread(stack.decl.leader, stack)
                if leader is None or leader not in self.processes:
                    return completion(op, {"fault": self.fault, "phase": "none", "leader": leader},
                                      error=f"{stack.decl.system} has no leader right now")
                value = {**value, "targets": [leader]}
            return await super()._start(op, value)

    return LeaderPause(member_processes_of(stack), rng=rng)
