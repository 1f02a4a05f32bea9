"""The Target: what is tested and where, decided once (Jepsen's `:db` as a value with abilities).

Built by one factory, `target_of(test)`, from the test's `sut`, `urls`, `proxy_urls`, `backend` and
`hosts_file`; every layer that needs to know what kind of system it has, or where it runs, asks the Target
instead of reading those raw fields:

- `kind`: `reference` (the lab's reference stack, placed by a backend), `system` (a system whose processes
  the lab runs: etcd, valkey-lock), `url` (a service at `--url`: the lab runs nothing of it) or `in-process`
  (a plug-in with neither processes nor URLs). `lab_runs` / `external` are the two sides of that line, and
  `reads_backend` says whether the lab may read the reference server's Valkey directly (scenario pokes).
- `abilities`: what faults can act on here (`ABILITIES`); a fault declares what it needs
  (`nemesis.registry.NemesisSpec.needs`) and `fault_problem(name)` answers yes (None) or no with the reason.
- `make_stack(root, run)`: the run's stack (every kind has one; an external URL's starts nothing or only
  the lab's Toxiproxy in front of it), and `stack_options(...)` what to start on it.
- `BACKENDS`: the one list of placements of the reference stack (`local`, `compose`, `ssh`, `swarm`); adding a
  backend is its stack module and one row here.
"""

from __future__ import annotations

import enum
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.secrets import redact_url
from lab.stack.compose import ComposeStack
from lab.stack.errors import StackError
from lab.stack.local import LocalStack, StackOptions
from lab.stack.ssh import SshOptions, SshStack
from lab.stack.swarm import SwarmOptions, SwarmStack, engine_problem, load_placement
from lab.sut.processes import SutStack, SystemProcesses, declared_processes
from lab.sut.protocol import SutError
from lab.sut.proxy import ProxiedUrls, UrlStack
from lab.sut.registry import SutEntry, client_clock_problem, freeze_problem, sut_of
from lab.testmap import Test
from nemesis.network import DIRECTIONS
from nemesis.ssh import on_hosts, ssh_partition
from nemesis.swarm import swarm_clock, swarm_kill
from nemesis.registry import NEMESES, Builder, validate_names
from nemesis.registry import stack_options as nemesis_stack_options

__all__ = ["ABILITIES", "BACKENDS", "Backend", "Kind", "Target", "TargetError", "load_hosts", "target_of"]


class TargetError(SutError):
    """The test asks something of its system or placement that it cannot give (one line: what to change)."""


class Kind(str, enum.Enum):
    """What kind of system the lab tests."""

    REFERENCE = "reference"  # the lab's reference lease servers over its own Valkey, placed by a backend
    SYSTEM = "system"  # a system whose declared processes the lab runs (lab.sut.processes)
    URL = "url"  # a service at --url: the lab starts nothing of it (at most its Toxiproxy in front)
    IN_PROCESS = "in-process"  # a plug-in that is neither: it runs inside the lab's client


# what a fault may need of the system and its placement: name -> how a refusal names it
ABILITIES: dict[str, str] = {
    "processes": "its processes, to SIGKILL and restart (or SIGSTOP and SIGCONT)",
    "links": "links the lab routes through Toxiproxy (delay, throttle, reset)",
    "partition": "links the lab can cut",
    "netns": "its lease servers running in the lab's network namespaces",
    "clocks": "fake clocks in its server processes (use client-clock for the lab's client clocks)",
    "server-clocks": "fake clocks in the reference lease servers (Valkey's clock, backend time, stays put)",
    "valkey": "its Valkey process and data files",
    "client": "the lab's own client threads",
    "client-freeze": "a client that stops whole when its thread is paused (nothing of it runs between calls, or it "
                     "declares freeze()/thaw())",
    "client-clock": "a client clock the lab can set",
    "leader": "a leader the lab can find",
}
_NO_LEADER = ("a leader the lab can find (only a system that brings its own processes and names its leader has "
              "one, e.g. etcd)")


# -- placements of the reference stack -------------------------------------------------------------------------
HOSTS_KEYS = ("nodes", "user", "port", "key_file", "known_hosts", "remote_root", "remote_dir", "valkey_node",
              "store_node", "server_nodes")


def load_hosts(path: Any) -> dict[str, Any]:
    """`--hosts FILE`: the SSH nodes and how to reach them (TOML; docs/ssh-backend.md); TargetError naming the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise TargetError(f"--hosts {path}: cannot read it ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"--hosts {path}: not TOML ({e})") from None
    unknown = sorted(set(data) - set(HOSTS_KEYS))
    if unknown:
        raise TargetError(f"--hosts {path}: unknown key {unknown[0]!r}; known keys: {', '.join(HOSTS_KEYS)}")
    if not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise TargetError(f"--hosts {path}: `nodes` must list the hosts, e.g. nodes = [\"root@10.0.0.1\", \"10.0.0.2\"]")
    return data


def _local_stack(test: Test, root: Path) -> Any:
    return LocalStack(name="stack", root=root, die_with_parent=True)


def _compose_stack(test: Test, root: Path) -> Any:
    return ComposeStack(name=f"run-{Path(test.run_dir or root).name.lower()}", root=root, start_engine=True,
                        die_with_owner=True)


def _ssh_stack(test: Test, root: Path) -> Any:
    return SshStack(name="stack", root=root)


def _named_ssh(name: str, home: Path | None) -> Any:
    return SshStack(name=name, home=home)


def _ssh_options(test: Test, opts: StackOptions) -> Any:
    """The SSH stack's options: the hosts file, plus what the workload and nemeses need of the stack."""
    return SshOptions(**load_hosts(test.hosts_file), servers=opts.servers, persistence=opts.persistence,
                      store=opts.wants_store, fake_clocks=opts.fake_clocks, mutant=opts.mutant)


def _ssh_clock(ctx: Any, names: list[str]) -> Any:
    """clock / server-clock as the registry builds and draws them, each offset file rewritten on its host."""
    return on_hosts(ctx.stack, NEMESES[names[0]].build(ctx, names))


def _ssh_partition(ctx: Any, names: list[str]) -> Any:
    return ssh_partition(ctx.stack, rng=ctx.rng("partition"), directions=DIRECTIONS)


def _swarm_stack(test: Test, root: Path) -> Any:
    return SwarmStack(name=f"run-{Path(test.run_dir or root).name.lower()}", root=root)


def _swarm_placement(path: Any) -> dict[str, Any]:
    """`--hosts FILE` of `--backend swarm`: the placement (lab.stack.swarm.load_placement), TargetError naming the key."""
    try:
        return load_placement(path)
    except StackError as e:
        raise TargetError(str(e)) from None


def _swarm_options(test: Test, opts: StackOptions) -> Any:
    """The Swarm stack's options: the generic ones plus the placement file's manager, engines and places; the
    manager is --swarm's, else the placement's, else DOCKER_HOST's (lab.stack.swarm.SwarmStack.up)."""
    placement = _swarm_placement(test.hosts_file)
    if test.swarm:
        placement.update(manager=test.swarm, manager_from="--swarm")
    return SwarmOptions(**vars(opts), **placement)


def _swarm_kill(ctx: Any, names: list[str]) -> Any:
    return swarm_kill(ctx.stack, rng=ctx.rng("kill"))


def _swarm_clock(ctx: Any, names: list[str]) -> Any:
    """clock / server-clock as the registry builds and draws them, each offset written inside its task."""
    return swarm_clock(ctx.stack, NEMESES[names[0]].build(ctx, names))


@dataclass(frozen=True)
class Backend:
    """One placement of the reference stack: how its stack is made, and what faults reach there."""

    name: str
    doc: str
    make: Callable[[Test, Path], Any]  # (test, root) -> the run's stack, which dies with the run
    named: Callable[[str, Path | None], Any]  # (name, home) -> a named stack (`fencelab up/status/down`)
    lacks: Mapping[str, str] = field(default_factory=dict)  # ability -> why this placement has none
    options: Callable[[Test, StackOptions], Any] | None = None  # the stack's own options, from the generic ones
    builders: Mapping[str, Builder] = field(default_factory=dict)  # fault group -> this placement's own builder
    needs_hosts: bool = False  # --hosts FILE names its nodes
    load_hosts: Callable[[Any], Any] = load_hosts  # reads and checks that file (TargetError naming the key)
    hosts_doc: str = "docs/ssh-backend.md"

    def check(self, test: Test) -> None:
        """The placement's own options are consistent (TargetError naming the option)."""
        if self.needs_hosts and not test.hosts_file:
            raise TargetError(f"--backend {self.name} needs --hosts FILE, the nodes to run on: --backend {self.name} "
                              f"and --hosts FILE go together ({self.hosts_doc})")
        if not self.needs_hosts and test.hosts_file:
            raise TargetError("--hosts names SSH nodes: it goes with --backend ssh (or a placement: --backend swarm)")
        if self.needs_hosts:
            self.load_hosts(test.hosts_file)


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("local", "processes on this machine's loopback (default)", _local_stack,
            lambda name, home: LocalStack(name=name, home=home)),
    Backend("compose", "containers through Docker Compose (docs/compose.md)", _compose_stack,
            lambda name, home: ComposeStack(name=name, home=home),
            lacks={"netns": "network namespaces around host processes (the compose stack has its own networks; "
                            "use partition)"}),
    Backend("ssh", "remote nodes over SSH (docs/ssh-backend.md)", _ssh_stack, _named_ssh,
            lacks={"links": "Toxiproxy on its links (on SSH hosts kernel rules cut links; nothing there delays them)",
                   "netns": "network namespaces (SSH hosts are partitioned with iptables: use partition)",
                   "valkey": "Valkey's data files on this machine (the Valkey faults run on the local and compose "
                             "backends)"},
            options=_ssh_options, builders={"clock": _ssh_clock, "server-clock": _ssh_clock, "network": _ssh_partition},
            needs_hosts=True),
    Backend("swarm", "a Docker Swarm stack across its nodes (docs/beyond-one-machine.md)", _swarm_stack,
            lambda name, home: SwarmStack(name=name, home=home),
            lacks={"netns": "network namespaces around host processes (a Swarm stack's links go through Toxiproxy: "
                            "use partition)",
                   "valkey": "Valkey's data files moved on its node (not built for Swarm yet: use kill or pause)"},
            options=_swarm_options, builders={"kill": _swarm_kill, "clock": _swarm_clock, "server-clock": _swarm_clock},
            needs_hosts=True,
            load_hosts=_swarm_placement, hosts_doc="docs/beyond-one-machine.md"),
)}


# -- the Target ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """The system under test and its placement, resolved once from a test (see the module docstring)."""

    kind: Kind
    sut: SutEntry
    backend: Backend
    urls: tuple[str, ...] = ()
    proxied: bool = False  # the lab's Toxiproxy in front of the URLs
    decl: SystemProcesses | None = None  # the processes a `system` declares
    client_clock_note: str | None = None  # why the system's client has no settable clock (None: it has one)

    # -- what kind ---------------------------------------------------------------------------------------------
    @property
    def lab_runs(self) -> bool:
        """Does the lab start and own the system's processes (so it can fault them)?"""
        return self.kind in (Kind.REFERENCE, Kind.SYSTEM)

    @property
    def external(self) -> bool:
        """Is the system outside the lab (a URL, or a plug-in running in-process)?"""
        return not self.lab_runs

    @property
    def reads_backend(self) -> bool:
        """May the lab read and poke the system's own backend (the reference server's Valkey)?"""
        return self.kind is Kind.REFERENCE

    @property
    def name(self) -> str:
        """The system's name: what a system that brings its processes calls itself, else its registered name."""
        return self.decl.system if self.decl is not None else self.sut.name

    def describe(self) -> str:
        """How messages name the system and where it runs."""
        if self.kind is Kind.REFERENCE:
            return f"the lab's reference stack on --backend {self.backend.name}"
        if self.kind is Kind.SYSTEM:
            return f"SUT {self.name!r}"
        if self.kind is Kind.URL:
            return f"the external system {', '.join(redact_url(u) for u in self.urls)}"
        return f"the in-process SUT {self.name!r}"

    def summary(self) -> dict[str, Any]:
        """The target as evidence.json and reports record it (never a key)."""
        d: dict[str, Any] = {"kind": self.kind.value, "sut": self.name}
        if self.kind is Kind.REFERENCE:
            d["backend"] = self.backend.name
        if self.urls:
            d["urls"] = [redact_url(u) for u in self.urls]
        return d

    # -- what faults can act on --------------------------------------------------------------------------------
    @property
    def abilities(self) -> frozenset[str]:
        """What faults can act on for this system here (`ABILITIES`)."""
        return frozenset(a for a in ABILITIES if self._lacks(a) is None)

    def _lacks(self, ability: str) -> str | None:
        """Why this target has no `ability` (None: it has it)."""
        if ability == "client":
            return None
        if ability == "client-freeze":  # a paused client must stop whole: its background activity too
            return freeze_problem(self.sut)
        if ability == "client-clock":
            return self.client_clock_note
        if self.kind is Kind.REFERENCE:
            if ability == "leader":
                return _NO_LEADER
            return self.backend.lacks.get(ability)
        if self.kind is Kind.SYSTEM:
            return _system_lacks(self.decl, ability)
        if ability in ("links", "partition") and self.kind is Kind.URL:
            return None if self.proxied else "proxied"
        return "external"

    def fault_problem(self, name: str) -> str | None:
        """Why nemesis `name` cannot act on this target (one line naming the nemesis), or None when it can."""
        spec = NEMESES.get(name)
        if spec is None:
            return f"--nemesis {name}: unknown nemesis; known: {', '.join(NEMESES)}"
        for need in sorted(spec.needs):
            why = self._lacks(need)
            if why is not None:
                return self._refusal(name, need, why)
        return None

    def _refusal(self, name: str, need: str, why: str) -> str:
        """The line refusing nemesis `name`, which needs `need`, for the reason `why`."""
        if need in ("client-freeze", "client-clock"):
            return f"--nemesis {name}: {why}"
        if self.kind is Kind.REFERENCE and why is _NO_LEADER:
            return f"--nemesis {name} cannot apply to SUT {self.name!r}: it lacks {why}"
        if self.kind is Kind.REFERENCE:
            there = ", ".join(n for n in NEMESES if self.can_take(n))
            return f"--nemesis {name} cannot run on --backend {self.backend.name}: it needs {why}; there: {there}"
        if self.kind is Kind.SYSTEM:
            return f"--nemesis {name} cannot apply to SUT {self.name!r}: it lacks {why}"
        system = self.describe()
        if need in ("links", "partition") and self.kind is Kind.URL:
            return (f"--nemesis {name}: {system} is reached directly; add --proxy-urls to put the lab's Toxiproxy in "
                    "front of it (the fault then acts on the client -> server links only)")
        if need in ("links", "partition"):
            return f"--nemesis {name}: {system} has no network link the lab could proxy"
        return (f"--nemesis {name}: cannot apply to {system}: it needs {ABILITIES[need]}, which only a stack the lab "
                "runs gives; against an external system use client-pause, client-clock, or a network fault with "
                "--proxy-urls")

    def can_take(self, name: str) -> bool:
        """Can nemesis `name` act on this target? (no message built)"""
        return all(self._lacks(need) is None for need in NEMESES[name].needs)

    def check_faults(self, names: Any) -> list[str]:
        """The nemesis names, validated (`validate_names`) and each one held against this target."""
        names = validate_names(names) if names else []
        for name in names:
            problem = self.fault_problem(name)
            if problem:
                raise TargetError(problem)
        return names

    def fault_builders(self) -> Mapping[str, Builder]:
        """This placement's own builders of fault groups (SSH hosts: clocks and partitions over SSH)."""
        return self.backend.builders if self.kind is Kind.REFERENCE else {}

    # -- what a run may ask --------------------------------------------------------------------------------------
    def check(self, test: Test) -> None:
        """Everything about the test's system and placement that can be refused before anything starts."""
        if test.swarm is not None:
            if test.backend != "swarm":
                raise TargetError("--swarm names the Swarm manager's engine: it goes with --backend swarm")
            problem = engine_problem(test.swarm)
            if problem:
                raise TargetError(f"--swarm: {problem}")
        if self.kind is not Kind.REFERENCE and test.backend != "local":
            raise TargetError(f"--backend {test.backend} places the lab's own reference stack; another system "
                              "(--url, or a --sut that brings its own processes) is placed by itself: drop --backend")
        if self.kind is Kind.REFERENCE:
            self.backend.check(test)
            if test.backend != "local" and (test.live.store_url or test.store_url):
                raise TargetError(f"--store-url with --backend {test.backend}: that stack runs its own store; drop "
                                  "one of them")
        elif test.hosts_file:
            raise TargetError("--hosts names SSH nodes: it goes with --backend ssh")
        problem = self.mutant_problem() if test.mutant else None
        if problem:
            raise TargetError(problem)
        if self.kind is Kind.SYSTEM and test.scenario:
            raise TargetError(self.scenario_problem(None))
        if self.kind is not Kind.URL and test.proxy_urls:
            raise TargetError("--proxy-urls puts the lab's Toxiproxy in front of the --url servers: give --url")
        if test.servers is not None and self.kind is Kind.URL:
            raise TargetError("--servers sets how many lease servers the lab's own stack starts; with --url the "
                              "system under test is external: drop --servers (give one --url per server)")

    def scenario_problem(self, stack_only: str | None) -> str | None:
        """Why a races-table scenario cannot run here (None: it can). `stack_only`: why the scenario needs the lab's
        own reference stack (its Valkey pokes or stack faults), None when it runs against any lease API."""
        if self.kind is Kind.REFERENCE:
            return None
        if self.kind is Kind.SYSTEM:
            return (f"--scenario drives the reference server's hooks; SUT {self.name!r} runs its own processes: drop "
                    "--scenario (use --nemesis)")
        return f"not applicable to an external system: {stack_only}" if stack_only else None

    def mutant_problem(self) -> str | None:
        """Why a planted bug cannot go into this system (None: it can: the lab's own reference servers)."""
        if self.kind is Kind.REFERENCE:
            return None
        if self.kind is Kind.SYSTEM:
            return (f"--mutant plants a bug in the lab's own reference servers; SUT {self.name!r} runs its own "
                    "processes: drop --mutant")
        return ("--mutant plants a bug in the lab's own reference servers; it cannot apply to an external system "
                "under test: drop --mutant, or drop --sut / --url")

    # -- its stack -----------------------------------------------------------------------------------------------
    def make_stack(self, test: Test, root: Path) -> Any:
        """The run's own stack, rooted at `root` (it dies with the run)."""
        if self.kind is Kind.REFERENCE:
            return self.backend.make(test, Path(root))
        if self.kind is Kind.SYSTEM:
            return SutStack(self.decl, root=Path(root), die_with_parent=True)
        store = test.store_url if test.live.store_url else None  # the system's own store, as test.json shows it
        if self.proxied:
            return ProxiedUrls(list(self.urls), Path(root), client_groups=2, store=store)
        return UrlStack(list(self.urls), Path(root), store=store)

    def stack_options(self, test: Test, *, store: bool) -> Any:
        """What the run's stack must start: servers, the store, and what the test's nemeses need of it."""
        opts = StackOptions(servers=test.server_count(), store=store, store_url=test.live.store_url,
                            mutant=test.mutant or "", **(nemesis_stack_options(test.nemesis) if test.nemesis else {}))
        if self.kind is Kind.REFERENCE and self.backend.options is not None:
            return self.backend.options(test, opts)
        return opts


def _system_lacks(decl: SystemProcesses | None, ability: str) -> str | None:
    """Why a system that brings its own processes has no `ability` (None: it has it)."""
    assert decl is not None
    if ability in ("processes",):
        return None
    if ability == "clocks":
        unfakeable = [p for p in decl.processes if not p.fake_clock]
        if not unfakeable:
            return None
        by_note: dict[str, list[str]] = {}
        for p in unfakeable:
            by_note.setdefault(p.clock_note or "its clock cannot be faked", []).append(p.name)
        notes = "; ".join(f"{', '.join(names)}: {note}" for note, names in by_note.items())
        return f"the ability to move its processes' clocks (libfaketime cannot reach {notes})"
    if ability == "server-clocks":
        return ("reference lease servers whose clocks move apart from their backend's (use clock: it moves the "
                "clocks of the system's own processes)")
    if ability == "netns":
        return ("network namespaces (the lab runs a system's declared processes on loopback; use partition, which "
                "cuts every declared link through Toxiproxy)")
    if ability == "valkey":
        if any(p.name == "valkey" and p.make is not None for p in decl.processes):
            return None
        return "a Valkey process of its own (a lab.stack.valkey.ValkeyProcess named 'valkey')"
    if ability == "leader":
        return None if decl.leader is not None else "a leader (it declares no function naming its current leader)"
    if ability in ("links", "partition"):
        return None if decl.links else "declared links (the network faults act on links through Toxiproxy)"
    return f"{ABILITIES.get(ability, ability)}"


def target_of(test: Test) -> Target:
    """The one factory of a test's Target (TargetError / SutError: one line naming what to change)."""
    if test.backend not in BACKENDS:
        raise TargetError(f"--backend must be one of {', '.join(BACKENDS)}, not {test.backend!r}")
    entry = sut_of(test)
    urls = tuple(test.urls or ())
    decl = None if urls else declared_processes(test)  # behind --url the lab runs none of its processes
    if urls:
        kind = Kind.URL
    elif entry.name == "reference":
        kind = Kind.REFERENCE
    elif decl is not None:
        kind = Kind.SYSTEM
    else:
        kind = Kind.IN_PROCESS
    return Target(kind=kind, sut=entry, backend=BACKENDS[test.backend if kind is Kind.REFERENCE else "local"],
                  urls=urls, proxied=bool(test.proxy_urls and urls), decl=decl,
                  client_clock_note=client_clock_problem(test))
