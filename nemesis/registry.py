"""Nemesis names as users type them (`--nemesis partition,clock,kill`), validated, and built for a run.

- `validate_names(names)`: one clear `ValueError` line before anything starts
  (an unknown name lists the known ones; `netns` needs root and ip/iptables;
  `clock` needs libfaketime; `netns` and `partition` both handle
  `start-partition` and cannot be combined).
- `stack_options(names)`: the `StackOptions` fields the nemeses need
  (Toxiproxy for the network faults, network namespaces for `netns`, fake
  clocks for `clock`, a persistence mode for the Valkey faults).
- `build(test, names, *, interval_s, seed)`: the composed nemesis over the
  running stack (`test.live["stack"]`) and the nemesis lane generator
  (`nemesis.schedule`). It also puts `ClientClocks` and `ClientPauses` in
  `test.live["client_clocks"]` / `test.live["client_pauses"]` for the
  workload clients to read.

Network nemeses are built at once (so their parameters are checked before the
run) on a topology whose Toxiproxy client is created in `setup` (inside the
run's event loop) and closed at teardown.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable

from lab import paths
from nemesis import clock, network, process_faults, valkey
from nemesis.core import NemesisUnavailable, compose
from nemesis.netns_partition import NetnsHosts, check_netns_available, netns_partition
from nemesis.network import DIRECTIONS
from nemesis.schedule import Fault, nemesis_generator
from lab.stack.topology import Topology
from lab.stack.toxiproxy_api import ToxiproxyClient

__all__ = ["NEMESES", "NemesisSpec", "ToxiproxyNemeses", "build", "external_problem", "known_names", "stack_options",
           "start_fs", "validate_names"]


@dataclass(frozen=True)
class NemesisSpec:
    """One nemesis name: what it does, its window's `f`s, and what the stack must provide."""

    name: str
    doc: str
    starts: tuple[str, ...]
    stop: str
    family: str  # network | netns | clock | process | client | valkey
    stack: dict[str, Any] = field(default_factory=dict)

    @property
    def fault(self) -> Fault:
        """The schedule's view of it."""
        return Fault(self.name, self.starts, self.stop)


def _spec(name: str, doc: str, family: str, stack: dict[str, Any] | None = None,
          starts: tuple[str, ...] | None = None, stop: str | None = None) -> NemesisSpec:
    """A spec whose window is `start-<name>` / `stop-<name>` unless given."""
    return NemesisSpec(name, doc, starts or (f"start-{name}",), stop or f"stop-{name}", family, stack or {})


_NET = {"toxiproxy": True}
NEMESES: dict[str, NemesisSpec] = {s.name: s for s in (
    _spec("partition", "blackhole links a grudge picks (one server from Valkey, a server, a client, halves)",
          "network", _NET),
    _spec("latency", "delay on a link, a server's links, or every link (latency +/- jitter)", "network", _NET),
    _spec("bandwidth", "a slow link (KB/s)", "network", _NET),
    _spec("reset-peer", "connections reset once data flows", "network", _NET),
    _spec("slicer", "every write cut into small delayed pieces", "network", _NET),
    _spec("netns", "kernel partitions between the servers' network namespaces and the clients (root; "
          "replaces partition)", "netns", {"netns": True}, starts=("start-partition",), stop="stop-partition"),
    _spec("clock", "bump or strobe the wall clocks of Valkey, lease servers and clients; reset",
          "clock", {"fake_clocks": True}, starts=("bump-clock", "strobe-clock"), stop="reset-clock"),
    _spec("server-clock", "bump or strobe the wall clocks of the lease servers only (Valkey's clock, backend "
          "time, never moves); reset", "clock", {"fake_clocks": True}, starts=("bump-clock", "strobe-clock"),
          stop="reset-clock"),
    _spec("kill", "SIGKILL a lease server, Valkey or the store; restart it at the stop", "process",
          {"persistence": "always", "recovery_store": True}),
    _spec("pause", "SIGSTOP a lease server, Valkey or the store; SIGCONT at the stop", "process"),
    _spec("client-pause", "hold one client thread at its gates (a GC-paused lease holder)", "client"),
    _spec("leader-pause", "SIGSTOP the current leader of a system that has one (etcd's raft leader); SIGCONT at "
          "the stop", "process"),
    _spec("client-clock", "bump or strobe the lab's client clocks only (no fake clocks needed; works against an "
          "external system)", "client", starts=("bump-clock", "strobe-clock"), stop="reset-clock"),
    _spec("valkey-crash", "SIGKILL Valkey, restart it from its own files (everysec: may lose ~1 s)", "valkey",
          {"persistence": "everysec", "recovery_store": True}),
    _spec("valkey-restore", "snapshot Valkey, later restart it from that older snapshot (rolls counters back)",
          "valkey", {"persistence": "always", "recovery_store": True}),
)}

# When two names ask for different persistence, the one that exposes more wins:
# valkey-crash's everysec exists to show lost acknowledged writes.
_PERSISTENCE_RANK = {"everysec": 0, "always": 1, "none": 2}


def known_names() -> list[str]:
    """Every nemesis name, in the order of `NEMESES`."""
    return list(NEMESES)


def _split(names: Any) -> list[str]:
    """A list of stripped names from `"a,b"` or a list of strings (commas allowed inside items)."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Iterable) or isinstance(names, (bytes, dict)):
        raise ValueError(f"--nemesis takes comma-separated names, got {names!r}")
    out = []
    for item in names:
        if not isinstance(item, str):
            raise ValueError(f"--nemesis takes names, got {item!r}")
        out += [n.strip() for n in item.split(",")]
    return out


def validate_names(names: Any) -> list[str]:
    """The nemesis names, checked: known, not repeated, compatible, and runnable here; else one-line ValueError."""
    names = _split(names)
    if any(not n for n in names):
        raise ValueError(f"--nemesis: empty name in {','.join(names)!r}; known: {', '.join(NEMESES)}")
    unknown = [n for n in names if n not in NEMESES]
    if unknown:
        raise ValueError(f"--nemesis: unknown nemesis {', '.join(unknown)}; known: {', '.join(NEMESES)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--nemesis: {', '.join(repeated)} given more than once")
    if "netns" in names and "partition" in names:
        raise ValueError("--nemesis: netns and partition are two ways to partition (both handle start-partition); "
                         "pick one")
    if "clock" in names and "client-clock" in names:
        raise ValueError("--nemesis: clock already moves the client clocks (with the servers'); give clock or "
                         "client-clock, not both")
    clocks = [n for n in names if n in ("clock", "server-clock", "client-clock")]
    if "server-clock" in clocks and len(clocks) > 1:
        raise ValueError(f"--nemesis: {' and '.join(clocks)} all bump and reset clocks (bump-clock, reset-clock); "
                         "give one")
    toxiproxied = [n for n in names if NEMESES[n].family == "network"]
    if "netns" in names and toxiproxied:
        raise ValueError(f"--nemesis: netns cannot be combined with {', '.join(toxiproxied)}: netns places the "
                         "servers in network namespaces, the Toxiproxy faults need them on loopback")
    if "netns" in names:
        try:
            check_netns_available()
        except NemesisUnavailable as e:
            raise ValueError(f"--nemesis netns: {e}") from None
    for name in ("clock", "server-clock"):
        if name not in names:
            continue
        try:
            paths.libfaketime()
        except paths.MissingTool as e:
            raise ValueError(f"--nemesis {name}: {e}") from None
    return names


def start_fs() -> dict[str, tuple[str, ...]]:
    """Each nemesis name -> the `f`s that open its window (what `checkers.faults` counts as "it fired")."""
    return {n: s.starts for n, s in NEMESES.items()}


def stack_options(names: Any) -> dict[str, Any]:
    """The `StackOptions` fields these nemeses need (merged; absent fields are the caller's choice)."""
    opts: dict[str, Any] = {}
    if names is None or names == "" or (isinstance(names, (list, tuple)) and not names):
        return opts
    for n in validate_names(names):
        for k, v in NEMESES[n].stack.items():
            if k == "persistence" and k in opts:
                v = min(opts[k], v, key=_PERSISTENCE_RANK.__getitem__)
            opts[k] = v
    return opts


# -- external systems ---------------------------------------------------------------
def external_problem(name: str, test: Any, *, client_clock: Callable[[], str | None]) -> str | None:
    """Why nemesis `name` cannot act on the test's external system under test (None: it can).

    Against a system the lab does not run, only the lab's own side can be faulted: its client threads
    (client-pause), their clocks (client-clock, when the system's client has a settable `clock_ms`), and,
    with `--proxy-urls`, the client -> server links through the lab's own Toxiproxy (docs/external-systems.md).
    `client_clock()` says why the system's client has no settable clock (None: it has one); required, so a
    caller cannot forget it and let client-clock through.
    """
    spec = NEMESES.get(name)
    if spec is None:
        return f"unknown nemesis; known: {', '.join(NEMESES)}"
    urls = list(getattr(test, "urls", None) or [])
    system = f"the external system {', '.join(urls)}" if urls else f"the in-process SUT {getattr(test, 'sut', None)!r}"
    if name == "client-pause":
        return None
    if name == "client-clock":
        return client_clock()  # the caller asks the SUT layer (lab.sut.registry.client_clock_problem): it sits above us
    if spec.family == "network":
        if not urls:
            return f"{system} has no network link the lab could proxy"
        if not getattr(test, "proxy_urls", False):
            return (f"{system} is reached directly; add --proxy-urls to put the lab's Toxiproxy in front of it "
                    "(the fault then acts on the client -> server links only)")
        return None
    needs = {"netns": "its lease servers running in the lab's network namespaces",
             "clock": "fake clocks in its server processes (use client-clock for the lab's client clocks)",
             "kill": "its processes, to SIGKILL and restart", "pause": "its processes, to SIGSTOP and SIGCONT",
             "valkey-crash": "its Valkey process and data files", "valkey-restore": "its Valkey process and snapshots"}
    need = needs.get(name, "the lab's own stack")
    return (f"cannot apply to {system}: it needs {need}, which only the lab's own "
            "stack gives; against an external system use client-pause, client-clock, or a network fault with "
            "--proxy-urls")


# -- building -----------------------------------------------------------------------
class ToxiproxyNemeses:
    """The network nemeses over the stack's Toxiproxy topology, as one nemesis.

    The members are built (and validated) on a topology without a client;
    `setup` binds a `ToxiproxyClient` created in the running event loop and
    `teardown` heals, then closes it.
    """

    name = "network"

    def __init__(self, url: str, description: dict[str, Any], names: list[str], seed: int):
        factories = {
            "partition": lambda topo, rng: network.partition(topo, rng=rng, directions=network.DIRECTIONS),
            "latency": lambda topo, rng: network.latency(topo, rng=rng),
            "bandwidth": lambda topo, rng: network.bandwidth(topo, rng=rng),
            "reset-peer": lambda topo, rng: network.reset_peer(topo, rng=rng),
            "slicer": lambda topo, rng: network.slicer(topo, rng=rng),
        }
        self.url = url
        self.topology = Topology.from_description(None, description)
        self.members = compose(factories[n](self.topology, _rng_for(seed, n)) for n in names)

    @property
    def fs(self) -> frozenset[str]:
        """Every member's `f`s."""
        return self.members.fs

    async def setup(self, test: Any) -> None:
        """Bind a Toxiproxy client of this event loop, then set the members up."""
        self.topology.client = ToxiproxyClient(self.url, timeout=5.0)
        try:
            await self.members.setup(test)
        except BaseException:
            await self._close()
            raise

    async def invoke(self, test: Any, op: dict) -> dict:
        """Route to the member handling `op`'s f."""
        return await self.members.invoke(test, op)

    async def teardown(self, test: Any) -> None:
        """Heal every member, then close the client."""
        if self.topology.client is None:
            return
        try:
            await self.members.teardown(test)
        finally:
            await self._close()

    async def _close(self) -> None:
        client, self.topology.client = self.topology.client, None
        if client is not None:
            await client.aclose()


def _rng_for(seed: int, name: str) -> random.Random:
    """An rng per nemesis name, derived from the run's seed (the same seed replays the same faults)."""
    return random.Random(f"{seed}:{name}")


def _stack_of(test: Any) -> Any:
    """The running LocalStack in `test.live["stack"]`, or ValueError."""
    stack = getattr(test, "live", {}).get("stack")
    if stack is None or not hasattr(stack, "processes"):
        raise ValueError("the nemesis needs the running stack in test.live['stack'] (a LocalStack that is up)")
    return stack


def build(test: Any, names: Any, *, interval_s: float, seed: int, hold_s: float | None = None) -> tuple[Any, Any]:
    """(the composed nemesis, the nemesis lane generator) for `names` over `test.live["stack"]`.

    The generator runs for `test.time_limit` seconds from its first op, then
    stops every fault once; run it next to the clients' time-limited
    generator (`gen.any_of(...)`), not inside a `time_limit`.
    """
    names = validate_names(names)
    if not names:
        raise ValueError("--nemesis: no nemesis named")
    # the client nemeses act on the lab's own clients only: they need no stack (an external system has none)
    stack = _stack_of(test) if any(NEMESES[n].family != "client" for n in names) else None
    info = stack.info if stack is not None else {}
    concurrency = int(getattr(test, "concurrency", 1))
    client_clocks = test.live.setdefault("client_clocks", clock.ClientClocks(concurrency))
    client_pauses = test.live.setdefault("client_pauses", process_faults.ClientPauses(concurrency))
    members: list[Any] = []
    # the heal runs in reverse: network first, then clocks and clients, then processes (backends first)
    if "kill" in names:
        members.append(process_faults.kill(process_faults.stack_targets(stack), rng=_rng_for(seed, "kill")))
    if "pause" in names:
        members.append(process_faults.pause(process_faults.stack_targets(stack), rng=_rng_for(seed, "pause")))
    if "valkey-crash" in names:
        members.append(valkey.valkey_crash(stack.process("valkey")))
    if "valkey-restore" in names:
        members.append(valkey.valkey_restore(stack.process("valkey"), stack.dir / "valkey-snapshots"))
    if "client-pause" in names:
        members.append(process_faults.client_pause(client_pauses, rng=_rng_for(seed, "client-pause")))
    if "leader-pause" in names:  # a system that declares its leader (lab.sut.processes.SutStack.leader_nemesis)
        if not hasattr(stack, "leader_nemesis"):
            raise ValueError("--nemesis leader-pause: the system under test declares no leader")
        members.append(stack.leader_nemesis(rng=_rng_for(seed, "leader-pause")))
    on_ssh = info.get("backend") == "ssh"  # SSH hosts: offset files and iptables rules live on the hosts
    if on_ssh and ("clock" in names or "partition" in names):
        from nemesis.ssh import ssh_clock, ssh_partition  # paramiko (~80 ms): only for an SSH stack
    if "clock" in names and on_ssh:
        members.append(ssh_clock(stack, rng=_rng_for(seed, "clock"), client_clocks=client_clocks))
    elif "clock" in names:
        if not info.get("clocks"):
            raise ValueError("--nemesis clock: the stack was started without fake clocks (StackOptions fake_clocks=True)")
        members.append(clock.clock(info["clocks"], rng=_rng_for(seed, "clock"), client_clocks=client_clocks))
    if "server-clock" in names:  # the lease servers only: backend time (Valkey's clock) never moves
        servers = sorted(n for n in info.get("clocks") or {} if n.startswith("lease-"))
        if not servers:
            raise ValueError("--nemesis server-clock: the stack was started without fake clocks "
                             "(StackOptions fake_clocks=True)")
        members.append(clock.clock({n: info["clocks"][n] for n in servers}, rng=_rng_for(seed, "server-clock"),
                                   targets=servers))
    if "client-clock" in names:  # the lab's own clients only: no stack process is touched
        members.append(clock.clock(None, rng=_rng_for(seed, "client-clock"), client_clocks=client_clocks))
    network_names = [n for n in names if NEMESES[n].family == "network"]
    if network_names and not info.get("toxiproxy") and on_ssh:
        if network_names != ["partition"]:  # SSH hosts: kernel rules cut links; nothing there delays them
            raise ValueError(f"--nemesis {','.join(network_names)}: on SSH hosts only partition (iptables) applies")
        members.append(ssh_partition(stack, rng=_rng_for(seed, "partition"), directions=DIRECTIONS))
    elif network_names:
        if not info.get("toxiproxy") or not info.get("topology"):
            raise ValueError(f"--nemesis {','.join(network_names)}: the stack was started without Toxiproxy "
                             "(StackOptions toxiproxy=True)")
        members.append(ToxiproxyNemeses(info["toxiproxy"], info["topology"], network_names, seed))
    if "netns" in names:
        hosts = test.live.get("netns_hosts") or getattr(stack, "netns_hosts", None)
        if not isinstance(hosts, NetnsHosts):
            raise ValueError("--nemesis netns: the stack's processes must run in network namespaces "
                             "(test.live['netns_hosts'], a nemesis.netns_partition.NetnsHosts): start the local stack "
                             "with StackOptions(netns=True)")
        # every grudge that applies, both ways and one-way (the Toxiproxy partition draws the same)
        members.append(netns_partition(hosts, rng=_rng_for(seed, "netns"), directions=DIRECTIONS))
    nemesis = compose(members)
    faults = [NEMESES[n].fault for n in names]
    generator = nemesis_generator(faults, interval_s=interval_s, hold_s=hold_s,
                                  duration_s=float(getattr(test, "time_limit")), seed=seed)
    return nemesis, generator
