"""Network namespaces as hosts (root only): the lab's own kernel-level placement and partition substrate.

`NetnsHosts` owns everything it creates: one network namespace per named host
(`flab-<pid>-<serial>-<i>`), one hub namespace (`...-hub`) holding a bridge, and
a veth pair from each host into the hub, with addresses from a private 10.x
subnet. Nothing is created in the host's own network namespace (but the one
veth below, when asked for) and there is no route out, so traffic only ever
reaches loopback or the lab's namespaces.
Programs run inside a host with `ip netns exec` and are owned by pid
(`NetnsProcess`); `destroy()` stops them, deletes the rules and the namespaces
(taking their veths and the bridge with them) and checks nothing is left.
It also adds and removes the iptables DROP rules a partition is made of (each
carrying the owner's prefix as a comment, so a heal can sweep them all); the
`partition` nemesis on this substrate is `nemesis.netns_partition.NetnsPartition`.

With `outside="c1"` the lab's own (root) namespace joins the bridge as one
more endpoint, through ONE veth `flab<pid>-<n>` into the hub: the lab's clients
reach the hosts at their addresses, and partitions can cut them off too. The
root end gets an address of the lab's subnet (pick one no route overlaps with
`free_subnet()`), so its route leads only to the lab's namespaces. The root
namespace's own firewall is never touched: a DROP "at" the outside endpoint is
placed in the sender's OUTPUT chain instead (the same packets never arrive).
Deleting the hub namespace deletes that veth too.

`describe()` / `NetnsHosts.from_description()` let another process (`fencelab
down`) remove what a run created; `sweep_stale()` removes the namespaces of lab
processes that no longer run (a killed run), by their names.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from lab.stack.process import ManagedProcess
from lab.stack.errors import NemesisUnavailable
from lab.stack.topology import _check_endpoint

__all__ = ["NetnsHosts", "NetnsProcess", "PREFIX", "check_netns_available", "free_subnet", "sweep_stale"]

PREFIX = "flab"
_serial = itertools.count()
_OURS = re.compile(rf"^({PREFIX}-(\d+)-\d+)-")  # our namespaces: flab-<pid>-<serial>-<i|hub>
_OUR_LINK = re.compile(rf"^{PREFIX}(\d+)-\d+$")  # our root-namespace veth: flab<pid>-<n> (15 chars at most)


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


def _netns_pids(ns: str) -> list[int]:
    """The processes living in namespace `ns` (`ip netns pids`; none when it is gone)."""
    return [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split()]


def _root_links() -> list[str]:
    """Interface names in this (the lab's) network namespace."""
    out = _run(["ip", "-o", "link", "show"]).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.strip()]


def _link_exists(name: str) -> bool:
    """Does interface `name` exist in this namespace?"""
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def _alive(pid: int) -> bool:
    """Is `pid` a running (not zombie) process?"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _root_routes() -> list[ipaddress.IPv4Network]:
    """The IPv4 destinations routed in this namespace (main table; `default` excluded)."""
    out = _run(["ip", "-4", "route", "show"]).stdout
    return [ipaddress.ip_network(w.split()[0], strict=False) for w in out.splitlines()
            if w.split() and w.split()[0][0].isdigit()]


def free_subnet(second_octet: int = 214) -> str:
    """A `10.<second_octet>.x.0/24` that no route of this namespace overlaps (the search starts at our pid)."""
    routed = _root_routes()
    for i in range(250):
        net = ipaddress.ip_network(f"10.{second_octet}.{(os.getpid() + i) % 250}.0/24")
        if not any(net.overlaps(r) for r in routed):
            return str(net)
    raise RuntimeError(f"no free 10.{second_octet}.x.0/24 subnet: every one overlaps a route of this namespace")


def sweep_stale() -> list[str]:
    """Delete what lab processes that no longer run left behind (a killed run); return what was deleted.

    A run's namespaces go together, and only when nothing runs in any of them
    (a stack started without `die_with_parent` outlives its creator on purpose:
    `fencelab down` removes it from its state file). A root-namespace veth of a
    dead creator goes too (normally it already went with its hub).
    """
    check_netns_available()
    groups: dict[str, list[str]] = {}
    for ns in _netns_list():
        m = _OURS.match(ns)
        if m and int(m.group(2)) != os.getpid() and not _alive(int(m.group(2))):
            groups.setdefault(m.group(1), []).append(ns)
    gone = []
    for names in groups.values():
        if any(_netns_pids(ns) for ns in names):
            continue
        for ns in names:
            _run(["ip", "netns", "del", ns], check=False)
            gone.append(ns)
    for link in _root_links():
        m = _OUR_LINK.match(link)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            if _run(["ip", "link", "del", link], check=False).returncode == 0:
                gone.append(link)
    return gone


class NetnsProcess(ManagedProcess):
    """A program running inside one of our namespaces, owned by pid; healthy when its port accepts."""

    def __init__(self, hosts: "NetnsHosts", host: str, name: str, argv: list[str], log_path: Path, port: int):
        self.hosts, self.netns_host = hosts, host
        super().__init__(name=name, argv=hosts.exec_argv(host, argv), log_path=log_path,
                         ports={"tcp": port}, host=hosts.address(host))

    def healthy(self) -> bool:
        """Its port accepts a connection made from inside its own namespace."""
        return self.hosts.can_connect(self.netns_host, self.netns_host, self.ports["tcp"], timeout=0.5)


class NetnsHosts:
    """Named hosts, each in its own network namespace, bridged on a private subnet; owns all of it."""

    def __init__(self, names: Sequence[str], *, subnet: str = "10.213.0.0/24", outside: str | None = None):
        names = [_check_endpoint(n) for n in names]
        if len(names) < 2:
            raise ValueError(f"NetnsHosts needs at least 2 host names, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"NetnsHosts host names must be unique, got {names!r}")
        if outside is not None and _check_endpoint(outside) in names:
            raise ValueError(f"outside endpoint {outside!r} is also a host name")
        try:
            net = ipaddress.ip_network(subnet)
        except ValueError as e:
            raise ValueError(f"subnet must be an IPv4 network like 10.213.0.0/24: {e}") from None
        need = len(names) + (outside is not None)
        if not (net.version == 4 and net.is_private and net.num_addresses - 2 >= need):
            raise ValueError(f"subnet {subnet} must be a private IPv4 network with room for {need} hosts")
        self.names = names
        self.outside = outside
        serial = next(_serial)
        self.prefix = f"{PREFIX}-{os.getpid()}-{serial}"
        self.hub = f"{self.prefix}-hub"
        self._ns = {n: f"{self.prefix}-{i}" for i, n in enumerate(names)}
        hosts = net.hosts()
        self._ip = {n: str(next(hosts)) for n in names}
        self.subnet = str(net)
        self.prefixlen = net.prefixlen
        # the lab's end: the subnet's last host address, on a veth named within IFNAMSIZ (15 characters)
        self.link = f"{PREFIX}{os.getpid()}-{serial % 1000}" if outside is not None else None
        if outside is not None:
            self._ip[outside] = str(net.broadcast_address - 1)
        self._created: list[str] = []  # namespaces, in creation order
        self._link_made = False
        self._rules: dict[tuple[str, str], None] = {}  # (at, src): a DROP at `at` of packets from `src`
        self._processes: list[NetnsProcess] = []

    @property
    def endpoints(self) -> list[str]:
        """Every endpoint partitions can name: the hosts, and the outside endpoint if any."""
        return self.names + ([self.outside] if self.outside is not None else [])

    # -- lifecycle ---------------------------------------------------------------
    def create(self) -> "NetnsHosts":
        """Create the hub, the hosts, their links (and the lab's veth); on any failure delete what was made."""
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
            if self.outside is not None:
                self._add_link()
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        """Create one namespace and remember it for destroy()."""
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)

    def _add_link(self) -> None:
        """One veth from this (the lab's) namespace into the bridge; its route reaches only our subnet."""
        net = ipaddress.ip_network(self.subnet)
        overlap = [str(r) for r in _root_routes() if r.overlaps(net)]
        if overlap:
            raise RuntimeError(f"subnet {net} overlaps route {overlap[0]} of the lab's namespace; "
                               "pick a free one (lab.stack.netns.free_subnet())")
        _run(["ip", "link", "add", self.link, "type", "veth", "peer", "name", "lab0", "netns", self.hub])
        self._link_made = True
        _run(["ip", "-n", self.hub, "link", "set", "lab0", "master", "br0", "up"])
        _run(["ip", "addr", "add", f"{self._ip[self.outside]}/{self.prefixlen}", "dev", self.link])
        _run(["ip", "link", "set", self.link, "up"])

    def destroy(self) -> None:
        """Stop our processes, drop our rules, delete the lab's veth and our namespaces; raise if anything is left."""
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
        for ns in self._created:  # a process still inside would keep its namespace alive, unnamed
            errors += [f"process {pid} still runs in {ns}" for pid in _netns_pids(ns)]
        if self._link_made:
            r = _run(["ip", "link", "del", self.link], check=False)
            if r.returncode != 0 and _link_exists(self.link):
                errors.append(f"deleting veth {self.link}: {r.stderr.strip()}")
            self._link_made = False
        for ns in reversed(self._created):
            r = _run(["ip", "netns", "del", ns], check=False)
            if r.returncode != 0 and ns in _netns_list():
                errors.append(f"deleting namespace {ns}: {r.stderr.strip()}")
        self._created = []
        left = self.leftovers()
        if left or errors:
            raise RuntimeError(f"netns cleanup incomplete: {'; '.join(errors + left)}")

    def leftovers(self) -> list[str]:
        """What of ours still exists (namespaces, the lab's veth, live processes)."""
        left = [f"namespace {ns}" for ns in _netns_list() if ns.startswith(self.prefix + "-")]
        if self.link is not None and _link_exists(self.link):
            left.append(f"veth {self.link}")
        left += [f"process {p.pid}" for p in self._processes if p.alive()]
        return left

    def __enter__(self) -> "NetnsHosts":
        return self.create()

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    # -- a record for another process ---------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Everything another process needs to find and delete what this owner creates (JSON-able)."""
        return {"prefix": self.prefix, "hub": self.hub, "subnet": self.subnet, "namespaces": dict(self._ns),
                "addresses": dict(self._ip), "outside": self.outside, "link": self.link}

    @classmethod
    def from_description(cls, d: dict[str, Any]) -> "NetnsHosts":
        """An owner of the namespaces (and veth) `describe()` recorded, as far as they still exist."""
        try:
            self = cls.__new__(cls)
            self.names, self.outside = list(d["namespaces"]), d.get("outside")
            self.prefix, self.hub, self.subnet = d["prefix"], d["hub"], d["subnet"]
            self._ns, self._ip, self.link = dict(d["namespaces"]), dict(d["addresses"]), d.get("link")
            self.prefixlen = ipaddress.ip_network(self.subnet).prefixlen
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a NetnsHosts description ({type(e).__name__}: {e}): {d!r}") from None
        if not _OURS.match(self.hub) or any(not _OURS.match(ns) for ns in self._ns.values()):
            raise ValueError(f"not a NetnsHosts description: namespace names must start with {PREFIX}-<pid>-: {d!r}")
        existing = set(_netns_list())
        self._created = [ns for ns in [self.hub, *self._ns.values()] if ns in existing]
        self._link_made = self.link is not None and _link_exists(self.link)
        self._rules, self._processes = {}, []
        return self

    # -- lookup ------------------------------------------------------------------
    def netns(self, host: str) -> str:
        """The namespace name of `host`."""
        if host not in self._ns:
            where = " (the lab's own namespace)" if host == self.outside and host is not None else ""
            raise ValueError(f"{host!r} is not a namespace host{where}; hosts: {', '.join(self.names)}")
        return self._ns[host]

    def address(self, host: str) -> str:
        """The IPv4 address of `host` (or of the outside endpoint) on the lab bridge."""
        if host not in self._ip:
            raise ValueError(f"unknown host {host!r}; endpoints: {', '.join(self.endpoints)}")
        return self._ip[host]

    # -- running things inside ---------------------------------------------------------
    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `host`'s namespace: `ip netns exec` execs it, so the pid stays the program's."""
        return ["ip", "netns", "exec", self.netns(host), *argv]

    def run(self, host: str, argv: list[str], *, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run a short command inside `host`'s namespace."""
        return _run(self.exec_argv(host, argv), timeout=timeout, check=check)

    def can_connect(self, frm: str, to: str, port: int, *, timeout: float = 1.0) -> bool:
        """Can `frm` (a host or the outside endpoint) open a TCP connection to `to`:`port` within `timeout`?"""
        if frm == self.outside and frm is not None:
            try:
                socket.create_connection((self.address(to), int(port)), timeout=timeout).close()
                return True
            except OSError:
                return False
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
    def placement(self, at: str, src: str) -> tuple[str, list[str]]:
        """(the host whose namespace holds it, the rule spec) dropping `src`'s packets at `at`.

        At a host: its INPUT chain drops packets from `src`. At the outside
        endpoint (the lab's namespace, whose firewall we leave alone): `src`'s
        OUTPUT chain drops packets to it, so the same packets never arrive.
        """
        if at == src:
            raise ValueError(f"cannot cut {at!r} from itself")
        tag = ["-m", "comment", "--comment", self.prefix, "-j", "DROP"]
        if at == self.outside and at is not None:
            return src, ["OUTPUT", "-d", f"{self.address(at)}/32", *tag]
        return at, ["INPUT", "-s", f"{self.address(src)}/32", *tag]

    def describe_rule(self, at: str, src: str) -> dict[str, Any]:
        """Where the DROP of `src`'s packets at `at` lives, as recorded in op values."""
        host, spec = self.placement(at, src)
        return {"host": host, "netns": self.netns(host), "chain": spec[0], "rule": " ".join(["-A", *spec])}

    def drop(self, at: str, src: str) -> None:
        """Drop every packet from `src` to `at` (at `at`, or as it leaves `src` when `at` is outside)."""
        if (at, src) in self._rules:
            return
        host, spec = self.placement(at, src)
        self.run(host, ["iptables", "-w", "-A", *spec])
        self._rules[(at, src)] = None

    def undrop(self, at: str, src: str) -> None:
        """Remove the drop of `src`'s packets at `at` (a rule already gone is fine)."""
        host, spec = self.placement(at, src)
        r = self.run(host, ["iptables", "-w", "-D", *spec], check=False)
        if r.returncode != 0 and self.run(host, ["iptables", "-w", "-C", *spec], check=False).returncode == 0:
            raise RuntimeError(f"cannot remove the DROP of {src} at {at}: {r.stderr.strip()}")
        self._rules.pop((at, src), None)

    def _tagged(self, host: str) -> list[str]:
        """The `iptables -S` lines in `host` carrying our prefix as their comment (any chain)."""
        out = self.run(host, ["iptables", "-w", "-S"]).stdout
        found = []
        for line in out.splitlines():
            words = line.split()
            if line.startswith("-A ") and any(a == "--comment" and b == self.prefix for a, b in zip(words, words[1:])):
                found.append(line)
        return found

    def rules(self) -> list[str]:
        """Every rule of ours in every host (as `iptables -S` lines, prefixed with the host)."""
        return [f"{host}: {line}" for host in self.names if self.netns(host) in self._created
                for line in self._tagged(host)]

    def heal(self) -> None:
        """Remove every rule of ours: the remembered ones, then any other tagged with our prefix."""
        for at, src in list(self._rules):
            self.undrop(at, src)
        for host in self.names:
            if self.netns(host) not in self._created:
                continue
            for line in self._tagged(host):
                self.run(host, ["iptables", "-w", "-D", *line.split()[1:]])
