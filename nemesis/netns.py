"""Real kernel partitions: network namespaces, veth pairs and iptables DROP rules (root only).

The alternative to Toxiproxy for the same topology idea. `NetnsHosts` owns
everything it creates: one network namespace per named host
(`flab-<pid>-<serial>-<i>`), one hub namespace (`...-hub`) holding a bridge, and
a veth pair from each host into the hub, with addresses from a private 10.x
subnet. Nothing is created in the host's own network namespace and there is no
route out, so traffic only ever reaches loopback or the lab's namespaces.
Programs run inside a host with `ip netns exec` and are owned by pid
(`NetnsProcess`); `destroy()` stops them, deletes the rules and the namespaces
(taking their veths and the bridge with them) and checks nothing is left.

`NetnsPartition` is the `partition` nemesis on this substrate (it handles the
same `start-partition` / `stop-partition`, so it is a drop-in alternative; the
two cannot be composed together). A cut link `a -> b` drops, with an iptables
rule in `b`'s INPUT chain, packets from `a` (stream `upstream`), and/or in
`a`'s INPUT chain packets from `b` (`downstream`). Every rule carries the
owner's prefix as an iptables comment, so a heal can sweep them all.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.stack.process import ManagedProcess
from nemesis.core import NemesisUnavailable, completion
from nemesis.network import DIRECTIONS, _choices, _rng, check_grudges, grudge_pairs, streams_of
from nemesis.topology import _check_endpoint, role

__all__ = [
    "NetnsHosts",
    "NetnsPartition",
    "NetnsProcess",
    "check_netns_available",
    "netns_partition",
    "sweep_stale",
]

PREFIX = "flab"
_serial = itertools.count()
_OURS = re.compile(rf"^{PREFIX}-(\d+)-\d+-")


def check_netns_available() -> None:
    """Raise a one-line NemesisUnavailable unless we are root with `ip` and `iptables` installed."""
    if os.geteuid() != 0:
        raise NemesisUnavailable(f"netns nemesis needs root (network namespaces, iptables); running as uid {os.geteuid()}")
    missing = [b for b in ("ip", "iptables") if shutil.which(b) is None]
    if missing:
        raise NemesisUnavailable(f"netns nemesis needs {' and '.join(missing)} on PATH "
                                 "(apt-get install iproute2 iptables)")


def _run(argv: list[str], *, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    """Run a short command; a failure raises RuntimeError with its stderr."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{' '.join(argv)} timed out after {timeout}s") from e
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r


def _netns_list() -> list[str]:
    """The names in `ip netns list`."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]


def sweep_stale() -> list[str]:
    """Delete lab namespaces left by lab processes that no longer run (a crashed run); return their names."""
    check_netns_available()
    gone = []
    for ns in _netns_list():
        m = _OURS.match(ns)
        if m and int(m.group(1)) != os.getpid() and not Path(f"/proc/{m.group(1)}").exists():
            _run(["ip", "netns", "del", ns], check=False)
            gone.append(ns)
    return gone


class NetnsProcess(ManagedProcess):
    """A program running inside one of our namespaces, owned by pid; healthy when its port accepts."""

    def __init__(self, hosts: "NetnsHosts", host: str, name: str, argv: list[str], log_path: Path, port: int):
        self.hosts, self.netns_host = hosts, host
        super().__init__(name=name, argv=["ip", "netns", "exec", hosts.netns(host), *argv], log_path=log_path,
                         ports={"tcp": port}, host=hosts.address(host))

    def healthy(self) -> bool:
        """Its port accepts a connection made from inside its own namespace."""
        return self.hosts.can_connect(self.netns_host, self.netns_host, self.ports["tcp"], timeout=0.5)


class NetnsHosts:
    """Named hosts, each in its own network namespace, bridged on a private subnet; owns all of it."""

    def __init__(self, names: Sequence[str], *, subnet: str = "10.213.0.0/24"):
        names = [_check_endpoint(n) for n in names]
        if len(names) < 2:
            raise ValueError(f"NetnsHosts needs at least 2 host names, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"NetnsHosts host names must be unique, got {names!r}")
        try:
            net = ipaddress.ip_network(subnet)
        except ValueError as e:
            raise ValueError(f"subnet must be an IPv4 network like 10.213.0.0/24: {e}") from None
        if not (net.version == 4 and net.is_private and net.num_addresses - 2 >= len(names)):
            raise ValueError(f"subnet {subnet} must be a private IPv4 network with room for {len(names)} hosts")
        self.names = names
        self.prefix = f"{PREFIX}-{os.getpid()}-{next(_serial)}"
        self.hub = f"{self.prefix}-hub"
        self._ns = {n: f"{self.prefix}-{i}" for i, n in enumerate(names)}
        hosts = net.hosts()
        self._ip = {n: str(next(hosts)) for n in names}
        self.prefixlen = net.prefixlen
        self._created: list[str] = []  # namespaces, in creation order
        self._rules: dict[tuple[str, str], None] = {}  # (at, src): a DROP at `at` of packets from `src`
        self._processes: list[NetnsProcess] = []

    # -- lifecycle ---------------------------------------------------------------
    def create(self) -> "NetnsHosts":
        """Create the hub, the hosts and their links; on any failure delete what was made and re-raise."""
        check_netns_available()
        try:
            self._add_ns(self.hub)
            _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
            for i, name in enumerate(self.names):
                ns = self._ns[name]
                self._add_ns(ns)
                _run(["ip", "link", "add", "veth0", "netns", ns, "type", "veth", "peer", "name", f"h{i}",
                      "netns", self.hub])
                _run(["ip", "-n", self.hub, "link", "set", f"h{i}", "master", "br0", "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self._ip[name]}/{self.prefixlen}", "dev", "veth0"])
                _run(["ip", "-n", ns, "link", "set", "veth0", "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        """Create one namespace and remember it for destroy()."""
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)

    def destroy(self) -> None:
        """Stop our processes, drop our rules, delete our namespaces; raise if anything is left."""
        errors = []
        for p in self._processes:
            try:
                p.stop()
            except Exception as e:
                errors.append(f"stopping {p.name}: {e}")
        self._processes = []
        try:
            self.heal()
        except Exception as e:
            errors.append(f"removing rules: {e}")
        for ns in reversed(self._created):
            r = _run(["ip", "netns", "del", ns], check=False)
            if r.returncode != 0 and ns in _netns_list():
                errors.append(f"deleting namespace {ns}: {r.stderr.strip()}")
        self._created = []
        left = self.leftovers()
        if left or errors:
            raise RuntimeError(f"netns cleanup incomplete: {'; '.join(errors + left)}")

    def leftovers(self) -> list[str]:
        """What of ours still exists (namespaces, live processes)."""
        left = [f"namespace {ns}" for ns in _netns_list() if ns.startswith(self.prefix + "-")]
        left += [f"process {p.pid}" for p in self._processes if p.alive()]
        return left

    def __enter__(self) -> "NetnsHosts":
        return self.create()

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    # -- lookup ------------------------------------------------------------------
    def netns(self, host: str) -> str:
        """The namespace name of `host`."""
        if host not in self._ns:
            raise ValueError(f"unknown host {host!r}; hosts: {', '.join(self.names)}")
        return self._ns[host]

    def address(self, host: str) -> str:
        """The IPv4 address of `host` on the lab bridge."""
        self.netns(host)
        return self._ip[host]

    # -- running things inside ---------------------------------------------------------
    def run(self, host: str, argv: list[str], *, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run a short command inside `host`'s namespace."""
        return _run(["ip", "netns", "exec", self.netns(host), *argv], timeout=timeout, check=check)

    def can_connect(self, frm: str, to: str, port: int, *, timeout: float = 1.0) -> bool:
        """Can `frm` open a TCP connection to `to`:`port` within `timeout` seconds?"""
        code = f"import socket; socket.create_connection(({self.address(to)!r}, {int(port)}), timeout={timeout}).close()"
        r = self.run(frm, [sys.executable, "-c", code], timeout=timeout + 10, check=False)
        return r.returncode == 0

    def spawn(self, host: str, name: str, argv: list[str], *, port: int, log_dir: Path,
              timeout: float = 15.0) -> NetnsProcess:
        """Start a server inside `host` (owned by pid, stopped by destroy()) and wait until `port` accepts."""
        p = NetnsProcess(self, host, name, argv, Path(log_dir) / f"{name}.log", port)
        self._processes.append(p)
        p.start(timeout=timeout)
        return p

    # -- iptables ------------------------------------------------------------------
    def _rule(self, at: str, src: str) -> list[str]:
        """The INPUT rule spec dropping packets from `src` at `at`, tagged with our prefix."""
        return ["INPUT", "-s", self.address(src), "-m", "comment", "--comment", self.prefix, "-j", "DROP"]

    def drop(self, at: str, src: str) -> None:
        """Inside `at`, drop every packet coming from `src`."""
        if (at, src) in self._rules:
            return
        self.run(at, ["iptables", "-w", "-A", *self._rule(at, src)])
        self._rules[(at, src)] = None

    def undrop(self, at: str, src: str) -> None:
        """Remove the drop of `src`'s packets at `at` (a rule already gone is fine)."""
        r = self.run(at, ["iptables", "-w", "-D", *self._rule(at, src)], check=False)
        if r.returncode != 0 and self.run(at, ["iptables", "-w", "-C", *self._rule(at, src)], check=False).returncode == 0:
            raise RuntimeError(f"cannot remove the DROP of {src} at {at}: {r.stderr.strip()}")
        self._rules.pop((at, src), None)

    def rules(self) -> list[str]:
        """Every rule of ours in every host (as `iptables -S` lines, prefixed with the host)."""
        found = []
        for host in self.names:
            if self.netns(host) not in self._created:
                continue
            out = self.run(host, ["iptables", "-w", "-S", "INPUT"]).stdout
            found += [f"{host}: {line}" for line in out.splitlines() if f"--comment {self.prefix}" in line]
        return found

    def heal(self) -> None:
        """Remove every rule of ours: the remembered ones, then any other tagged with our prefix."""
        for at, src in list(self._rules):
            self.undrop(at, src)
        for host in self.names:
            if self.netns(host) not in self._created:
                continue
            out = self.run(host, ["iptables", "-w", "-S", "INPUT"]).stdout
            for line in out.splitlines():
                if f"--comment {self.prefix}" in line and line.startswith("-A "):
                    self.run(host, ["iptables", "-w", "-D", *line.split()[1:]])


def _default_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """The lab's links among these hosts: clients to servers, servers to valkey and store."""
    clients = [n for n in names if role(n) == "client"]
    servers = [n for n in names if role(n) == "server"]
    pairs = [(c, s) for c in clients for s in servers]
    pairs += [(s, b) for s in servers for b in ("valkey", "store") if b in names]
    return pairs


class NetnsPartition:
    """The `partition` nemesis with iptables DROP rules between namespaces instead of Toxiproxy toxics."""

    name = "netns-partition"
    fault = "partition"

    def __init__(self, hosts: NetnsHosts, *, rng: Any, links: Sequence[tuple[str, str]] | None = None,
                 grudges: Any = None, directions: Any = ("both",)):
        if not isinstance(hosts, NetnsHosts):
            raise ValueError(f"hosts must be a NetnsHosts, got {type(hosts).__name__}")
        self.hosts = hosts
        self.rng = _rng(rng)
        self.pairs = [tuple(p) for p in (links if links is not None else _default_pairs(hosts.names))]
        if not self.pairs:
            raise ValueError("links: no links among these hosts (give links=[(from, to), ...])")
        for f, t in self.pairs:
            hosts.netns(f), hosts.netns(t)  # both ends must be hosts
        self.directions = _choices("directions", directions, DIRECTIONS)
        self.grudges = check_grudges(grudges, self.pairs)
        self._active: list[dict[str, str]] = []

    @property
    def fs(self) -> frozenset[str]:
        """`start-partition` and `stop-partition` (a drop-in for the Toxiproxy partition)."""
        return frozenset({"start-partition", "stop-partition"})

    async def setup(self, test: Any) -> None:
        """Check root and binaries, and that the hosts exist (one-line NemesisUnavailable otherwise)."""
        check_netns_available()
        missing = [h for h in self.hosts.names if self.hosts.netns(h) not in self.hosts._created]
        if missing:
            raise NemesisUnavailable(f"netns-partition: hosts {', '.join(missing)} are not created; call NetnsHosts.create()")

    async def invoke(self, test: Any, op: dict) -> dict:
        """Add or remove the DROP rules; the `info` completion records them."""
        f = op.get("f")
        if f == "start-partition":
            return await self._start(op)
        if f == "stop-partition":
            return await self._stop(op)
        raise ValueError(f"netns-partition does not handle f {f!r}; it handles start-partition, stop-partition")

    async def teardown(self, test: Any) -> None:
        """Remove every rule of ours."""
        await asyncio.to_thread(self.hosts.heal)
        self._active = []

    def _plan(self, value: Any) -> tuple[dict[str, Any], list[tuple[str, str]], list[str]]:
        """(choices, cut links, streams) for a start op's value."""
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise ValueError(f"start-partition value must be null or an object, got {value!r}")
        unknown = set(value) - {"links", "grudge", "target", "sides", "direction"}
        if unknown:
            raise ValueError(f"start-partition: unknown value key(s) {', '.join(sorted(unknown))}")
        if "links" in value:
            names = {f"{f}_{t}": (f, t) for f, t in self.pairs}
            bad = [n for n in value["links"] if n not in names]
            if bad:
                raise ValueError(f"unknown links {bad}; links: {', '.join(sorted(names))}")
            chosen, cut = {"grudge": "links"}, [names[n] for n in value["links"]]
        else:
            grudge = value.get("grudge") or self.rng.choice(self.grudges)
            picked, cut = grudge_pairs(grudge, self.pairs, self.rng, target=value.get("target"), sides=value.get("sides"))
            chosen = {"grudge": grudge, **picked}
        direction = value.get("direction") or self.rng.choice(self.directions)
        return {**chosen, "direction": direction}, cut, streams_of(direction)

    async def _start(self, op: dict) -> dict:
        """Add the rules for the chosen cut."""
        base = {"fault": self.fault, "backend": "netns"}
        if self._active:
            return completion(op, {**base, "phase": "none", "active": list(self._active)},
                              error="partition is already active; stop it first")
        chosen, cut, streams = self._plan(op.get("value"))
        drops: dict[tuple[str, str], None] = {}
        for f, t in cut:
            if "upstream" in streams:
                drops[(t, f)] = None  # at t, from f: f -> t packets
            if "downstream" in streams:
                drops[(f, t)] = None
        record = {**base, **chosen, "links": [f"{f}_{t}" for f, t in cut], "streams": streams}
        try:
            for at, src in drops:
                await asyncio.to_thread(self.hosts.drop, at, src)
                self._active.append({"at": at, "from": src, "from_ip": self.hosts.address(src), "action": "DROP"})
        except RuntimeError as e:
            return completion(op, {**record, "phase": "start" if self._active else "none",
                                   "rules": list(self._active)}, error=str(e))
        return completion(op, {**record, "phase": "start", "rules": list(self._active)})

    async def _stop(self, op: dict) -> dict:
        """Remove the rules of the active partition."""
        base = {"fault": self.fault, "backend": "netns"}
        if not self._active:
            return completion(op, {**base, "phase": "none", "removed": []})
        removed = list(self._active)
        try:
            while self._active:
                r = self._active[0]
                await asyncio.to_thread(self.hosts.undrop, r["at"], r["from"])
                self._active.pop(0)
        except RuntimeError as e:
            return completion(op, {**base, "phase": "none", "active": list(self._active)}, error=str(e))
        return completion(op, {**base, "phase": "end", "removed": removed})


def netns_partition(hosts: NetnsHosts, *, rng: Any, links: Sequence[tuple[str, str]] | None = None,
                    grudges: Any = None, directions: Any = ("both",)) -> NetnsPartition:
    """Kernel partitions between namespaces: `start-partition` / `stop-partition` (root only)."""
    return NetnsPartition(hosts, rng=rng, links=links, grudges=grudges, directions=directions)
