"""Nemesis names as users type them (`--nemesis partition,clock,kill`), validated, and built for a run.

- `validate_names(names)`: one clear `ValueError` line before anything starts
  (an unknown name lists the known ones; `netns` needs root and ip/iptables;
  `clock` needs libfaketime; `netns` and `partition` both handle
  `start-partition` and cannot be combined).
- `stack_options(names)`: the `StackOptions` fields the nemeses need
  (Toxiproxy for the network faults, network namespaces for `netns`, fake
  clocks for `clock`, a persistence mode for the Valkey faults).
- `NEMESES`: one row per fault: its windows, what it needs of the system and
  its placement (`needs`, held against the Target by
  `lab.sut.target.Target.fault_problem` before anything starts) and its
  builder. A new fault is its module and one row here.
- `build(test, names, *, interval_s, seed, builders, schedule)`: the composed
  nemesis over the running stack (`test.live.stack`), each group of names built
  by its row's builder or the placement's own, and the nemesis lane generator
  (`nemesis.schedule`: drawn, or a recorded schedule replayed). It also puts `ClientClocks` and `ClientPauses` in
  `test.live.client_clocks` / `test.live.client_pauses` for the
  workload clients to read.

Network nemeses are built at once (so their parameters are checked before the
run) on a topology whose Toxiproxy client is created in `setup` (inside the
run's event loop) and closed at teardown.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from lab import paths
from nemesis import clock, network, process_faults, valkey
from nemesis.core import NemesisUnavailable, compose
from nemesis.netns_partition import NetnsHosts, check_netns_available, netns_partition
from nemesis.network import DIRECTIONS
from nemesis.schedule import Fault, Window, nemesis_generator, replay_generator
from lab.stack.topology import Topology
from lab.stack.toxiproxy_api import ToxiproxyClient
from lab.testmap import Test

__all__ = ["NEMESES", "Builder", "FaultContext", "LeaderStack", "NemesisSpec", "ToxiproxyNemeses", "build", "known_names",
           "stack_options", "start_fs", "validate_names"]


@dataclass
class FaultContext:
    """What a fault's builder gets: the running stack, the run's seed and the lab's own client handles."""

    test: Test
    stack: Any  # the run's stack (None when no fault of the run acts on it)
    seed: int
    client_clocks: Any
    client_pauses: Any

    @property
    def info(self) -> dict[str, Any]:
        """The stack's addresses, Toxiproxy topology and clock files (empty without a stack)."""
        return self.stack.info if self.stack is not None else {}

    def rng(self, name: str) -> random.Random:
        """The rng of nemesis `name`, derived from the run's seed (the same seed replays the same faults)."""
        return _rng_for(self.seed, name)


# a fault group's builder: (the context, the group's names asked for) -> one nemesis member
Builder = Callable[[FaultContext, list[str]], Any]


@dataclass(frozen=True)
class NemesisSpec:
    """One nemesis name: what it does, its window's `f`s, what it needs, and how it is built.

    `needs` names abilities of the system and its placement (`lab.sut.target.ABILITIES`); the Target holds
    them against what it has, before anything starts. `replay` turns what a start did (its completion's value)
    into the start op's value that does it again (`nemesis.fault_schedule`); a fault without one is refused a
    replayed schedule, by name. `group`: the names built together by one `build`
    (the Toxiproxy faults share one client); `rank`: the order members are built in (healed in reverse).
    """

    name: str
    doc: str
    starts: tuple[str, ...]
    stop: str
    family: str  # network | netns | clock | process | client | valkey
    build: Builder
    needs: frozenset[str] = frozenset()
    stack: dict[str, Any] = field(default_factory=dict)
    group: str = ""
    rank: int = 50
    # a start completion's value -> the start op's value that does the same again (nemesis.fault_schedule)
    replay: Callable[[dict[str, Any]], Any] | None = None

    @property
    def fault(self) -> Fault:
        """The schedule's view of it."""
        return Fault(self.name, self.starts, self.stop)


def _spec(name: str, doc: str, family: str, build: Builder, needs: tuple[str, ...], rank: int,
          stack: dict[str, Any] | None = None, starts: tuple[str, ...] | None = None, stop: str | None = None,
          group: str | None = None, replay: Callable[[dict[str, Any]], Any] | None = None) -> NemesisSpec:
    """A spec whose window is `start-<name>` / `stop-<name>` unless given, built alone unless grouped."""
    return NemesisSpec(name, doc, starts or (f"start-{name}",), stop or f"stop-{name}", family, build,
                       frozenset(needs), stack or {}, group or name, rank, replay)


# -- the builders, one per fault group ------------------------------------------------------------------------
def _build_kill(ctx: FaultContext, names: list[str]) -> Any:
    return process_faults.kill(process_faults.stack_targets(ctx.stack), rng=ctx.rng("kill"),
                               leader=_leader_probe(ctx.stack))


def _build_pause(ctx: FaultContext, names: list[str]) -> Any:
    return process_faults.pause(process_faults.stack_targets(ctx.stack), rng=ctx.rng("pause"),
                                leader=_leader_probe(ctx.stack))


def _leader_probe(stack: Any) -> Any:
    """Who leads now, where the system under test can say (a LeaderProbe stack); else None."""
    return stack.leader_probe() if isinstance(stack, LeaderProbe) else None


def _build_valkey_crash(ctx: FaultContext, names: list[str]) -> Any:
    return valkey.valkey_crash(ctx.stack.process("valkey"))


def _build_valkey_restore(ctx: FaultContext, names: list[str]) -> Any:
    return valkey.valkey_restore(ctx.stack.process("valkey"), ctx.stack.dir / "valkey-snapshots")


def _build_client_pause(ctx: FaultContext, names: list[str]) -> Any:
    return process_faults.client_pause(ctx.client_pauses, rng=ctx.rng("client-pause"))


def _build_leader_pause(ctx: FaultContext, names: list[str]) -> Any:
    """A system that declares its leader (lab.sut.processes.SutStack.leader_nemesis)."""
    if not isinstance(ctx.stack, LeaderStack):
        raise ValueError("--nemesis leader-pause: the system under test declares no leader")
    return ctx.stack.leader_nemesis(rng=ctx.rng("leader-pause"))


def _build_clock(ctx: FaultContext, names: list[str]) -> Any:
    if not ctx.info.get("clocks"):
        raise ValueError("--nemesis clock: the stack was started without fake clocks (StackOptions fake_clocks=True)")
    return clock.clock(ctx.info["clocks"], rng=ctx.rng("clock"), client_clocks=ctx.client_clocks)


def _build_server_clock(ctx: FaultContext, names: list[str]) -> Any:
    """The lease servers only: backend time (Valkey's clock) never moves. Each window moves a strict subset of
    the servers (with two or more), so two servers always disagree while it lasts, by steps sized against the
    run's TTL and request deadline (`clock.lease_skews`)."""
    clocks = ctx.info.get("clocks") or {}
    servers = sorted(n for n in clocks if n.startswith("lease-"))
    if not servers:
        raise ValueError("--nemesis server-clock: the stack was started without fake clocks "
                         "(StackOptions fake_clocks=True)")
    backward, forward = clock.lease_skews(ctx.test.ttl_ms, ctx.test.deadline_s or clock.DEFAULT_DEADLINE_S)
    return clock.clock({n: clocks[n] for n in servers}, rng=ctx.rng("server-clock"), targets=servers,
                       bump_s=backward, forward_s=forward, strict_subset=True)


def _build_client_clock(ctx: FaultContext, names: list[str]) -> Any:
    """The lab's own clients only: no stack process is touched."""
    return clock.clock(None, rng=ctx.rng("client-clock"), client_clocks=ctx.client_clocks)


def _build_network(ctx: FaultContext, names: list[str]) -> Any:
    """Every Toxiproxy fault asked, over the stack's topology, as one nemesis."""
    if not ctx.info.get("toxiproxy") or not ctx.info.get("topology"):
        raise ValueError(f"--nemesis {','.join(names)}: the stack was started without Toxiproxy "
                         "(StackOptions toxiproxy=True)")
    return ToxiproxyNemeses(ctx.info["toxiproxy"], ctx.info["topology"], names, ctx.seed)


def _build_netns(ctx: FaultContext, names: list[str]) -> Any:
    hosts = getattr(ctx.stack, "netns_hosts", None)
    if not isinstance(hosts, NetnsHosts):
        raise ValueError("--nemesis netns: the stack's processes must run in network namespaces "
                         "(a nemesis.netns_partition.NetnsHosts): start the local stack with StackOptions(netns=True)")
    # every grudge that applies, both ways and one-way (the Toxiproxy partition draws the same)
    return netns_partition(hosts, rng=ctx.rng("netns"), directions=DIRECTIONS)


@runtime_checkable
class LeaderStack(Protocol):
    """A stack whose system names its leader (the leader-pause nemesis's target)."""

    def leader_nemesis(self, *, rng: Any) -> Any: ...


@runtime_checkable
class LeaderProbe(Protocol):
    """A stack that may say who leads: `leader_probe()` is a call returning the leading member's name (or None
    when none leads), or None when its system declares no leader. Kill and pause record it."""

    def leader_probe(self) -> Any: ...


_NET = {"toxiproxy": True}
NEMESES: dict[str, NemesisSpec] = {s.name: s for s in (
    _spec("partition", "blackhole links a grudge picks (one server from Valkey, a server, a client, halves)",
          "network", _build_network, ("partition",), 90, _NET, group="network", replay=network.partition_replay),
    _spec("latency", "delay on a link, a server's links, or every link (latency +/- jitter)", "network",
          _build_network, ("links",), 90, _NET, group="network", replay=network.toxic_replay),
    _spec("bandwidth", "a slow link (KB/s)", "network", _build_network, ("links",), 90, _NET, group="network",
          replay=network.toxic_replay),
    _spec("reset-peer", "connections reset once data flows", "network", _build_network, ("links",), 90, _NET,
          group="network", replay=network.toxic_replay),
    _spec("slicer", "every write cut into small delayed pieces", "network", _build_network, ("links",), 90, _NET,
          group="network", replay=network.toxic_replay),
    _spec("netns", "kernel partitions between the servers' network namespaces and the clients (root; "
          "replaces partition)", "netns", _build_netns, ("netns",), 100, {"netns": True},
          starts=("start-partition",), stop="stop-partition", replay=network.partition_replay),
    _spec("clock", "bump or strobe the wall clocks of Valkey, lease servers and clients; reset",
          "clock", _build_clock, ("clocks",), 60, {"fake_clocks": True}, starts=("bump-clock", "strobe-clock"),
          stop="reset-clock", replay=clock.clock_replay),
    _spec("server-clock", "bump or strobe the wall clocks of the lease servers only (Valkey's clock, backend "
          "time, never moves); reset", "clock", _build_server_clock, ("server-clocks",), 70, {"fake_clocks": True},
          starts=("bump-clock", "strobe-clock"), stop="reset-clock", replay=clock.clock_replay),
    _spec("kill", "SIGKILL a lease server, Valkey or the store; restart it at the stop", "process", _build_kill,
          ("processes",), 0, {"persistence": "always", "recovery_store": True},
          replay=process_faults.kill_replay),
    _spec("pause", "SIGSTOP a lease server, Valkey or the store; SIGCONT at the stop", "process", _build_pause,
          ("processes",), 10, replay=process_faults.pause_replay),
    _spec("client-pause", "hold one client thread at its gates (a GC-paused lease holder)", "client",
          _build_client_pause, ("client", "client-freeze"), 40, replay=process_faults.client_pause_replay),
    _spec("leader-pause", "SIGSTOP the current leader of a system that has one (etcd's raft leader); SIGCONT at "
          "the stop", "process", _build_leader_pause, ("processes", "leader"), 50,
          replay=process_faults.pause_replay),
    _spec("client-clock", "bump or strobe the lab's client clocks only (no fake clocks needed; works against an "
          "external system)", "client", _build_client_clock, ("client", "client-clock"), 80,
          starts=("bump-clock", "strobe-clock"), stop="reset-clock", replay=clock.clock_replay),
    _spec("valkey-crash", "SIGKILL Valkey, restart it from its own files (everysec: may lose ~1 s)", "valkey",
          _build_valkey_crash, ("valkey",), 20, {"persistence": "everysec", "recovery_store": True},
          replay=valkey.crash_replay),
    _spec("valkey-restore", "snapshot Valkey, later restart it from that older snapshot (rolls counters back)",
          "valkey", _build_valkey_restore, ("valkey",), 30, {"persistence": "always", "recovery_store": True},
          replay=valkey.restore_replay),
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

    async def setup(self, test: Test) -> None:
        """Bind a Toxiproxy client of this event loop, then set the members up."""
        self.topology.client = ToxiproxyClient(self.url, timeout=5.0)
        try:
            await self.members.setup(test)
        except BaseException:
            await self._close()
            raise

    async def invoke(self, test: Test, op: dict) -> dict:
        """Route to the member handling `op`'s f."""
        return await self.members.invoke(test, op)

    async def teardown(self, test: Test) -> None:
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


def build(test: Test, names: Any, *, interval_s: float, seed: int, hold_s: float | None = None,
          builders: Mapping[str, Builder] | None = None, schedule: Sequence[Window] | None = None) -> tuple[Any, Any]:
    """(the composed nemesis, the nemesis lane generator) for `names` over `test.live.stack`.

    Each group of names is built by its row's builder (`NEMESES`), or by the placement's own (`builders`:
    group -> builder, from the Target: SSH hosts move clocks and cut links over SSH). The generator runs for
    `test.time_limit` seconds from its first op, then stops every fault once; run it next to the clients'
    time-limited generator (`gen.any_of(...)`), not inside a `time_limit`. With `schedule` (a recorded one,
    nemesis.fault_schedule) the generator replays its windows instead of drawing them.
    """
    names = validate_names(names)
    if not names:
        raise ValueError("--nemesis: no nemesis named")
    stack = test.live.stack
    # the client nemeses act on the lab's own clients only: they need no stack (an external system has none)
    if stack is None and any(NEMESES[n].needs - {"client", "client-freeze", "client-clock"} for n in names):
        raise ValueError("the nemesis needs the running stack in test.live.stack (a stack that is up)")
    live = test.live
    if live.client_clocks is None:
        live.client_clocks = clock.ClientClocks(test.concurrency)
    if live.client_pauses is None:
        live.client_pauses = process_faults.ClientPauses(test.concurrency)
    ctx = FaultContext(test=test, stack=stack, seed=seed, client_clocks=live.client_clocks,
                       client_pauses=live.client_pauses)
    groups: dict[str, list[str]] = {}
    for n in sorted(names, key=lambda n: NEMESES[n].rank):
        groups.setdefault(NEMESES[n].group, []).append(n)
    own = builders or {}
    members = [own.get(g, NEMESES[group_names[0]].build)(ctx, group_names) for g, group_names in groups.items()]
    nemesis = compose(members)
    faults = [NEMESES[n].fault for n in names]
    if schedule is not None:
        return nemesis, replay_generator(schedule, faults)
    generator = nemesis_generator(faults, interval_s=interval_s, hold_s=hold_s, duration_s=float(test.time_limit),
                                  seed=seed)
    return nemesis, generator
