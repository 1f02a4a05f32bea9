"""The `partition` nemesis on real kernel partitions: iptables DROP rules between network namespaces.

The alternative to Toxiproxy for the same topology idea, on the hosts of
`lab.stack.netns.NetnsHosts` (the stack owns the namespaces, the bridge and
the rule primitives). `NetnsPartition` handles the same `start-partition` /
`stop-partition` as the Toxiproxy partition, so it is a drop-in alternative
(the two cannot be composed together). A cut link `a -> b` drops, with an
iptables rule in `b`'s INPUT chain, packets from `a` (stream `upstream`),
and/or in `a`'s INPUT chain packets from `b` (`downstream`). Every rule
carries the owner's prefix as an iptables comment, so a heal can sweep them
all. The SSH stack's partition (`nemesis.ssh`) reuses it with rules added
over SSH.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from lab.stack.netns import NetnsHosts, NetnsProcess, check_netns_available, free_subnet, sweep_stale  # noqa: F401
from lab.stack.topology import role
from nemesis.core import NemesisUnavailable, Rounds, as_rng, completion
from nemesis.network import DIRECTIONS, _choices, check_grudges, grudge_pairs, streams_of
from lab.testmap import Test

__all__ = ["NetnsHosts", "NetnsPartition", "NetnsProcess", "check_netns_available", "free_subnet",
           "netns_partition", "sweep_stale"]


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
        self.rng = as_rng(rng)
        self.rounds = Rounds(self.rng)  # grudges and directions: each once per round
        self.pairs = [tuple(p) for p in (links if links is not None else _default_pairs(hosts.endpoints))]
        if not self.pairs:
            raise ValueError("links: no links among these hosts (give links=[(from, to), ...])")
        for f, t in self.pairs:
            hosts.address(f), hosts.address(t)  # both ends must be hosts (or the outside endpoint)
            if f == t:
                raise ValueError(f"links: {f}_{t} links an endpoint to itself")
        self.directions = _choices("directions", directions, DIRECTIONS)
        self.grudges = check_grudges(grudges, self.pairs)
        self._active: list[dict[str, str]] = []

    @property
    def fs(self) -> frozenset[str]:
        """`start-partition` and `stop-partition` (a drop-in for the Toxiproxy partition)."""
        return frozenset({"start-partition", "stop-partition"})

    async def setup(self, test: Test) -> None:
        """Check root and binaries, and that the hosts exist (one-line NemesisUnavailable otherwise)."""
        check_netns_available()
        missing = [h for h in self.hosts.names if self.hosts.netns(h) not in self.hosts._created]
        if missing:
            raise NemesisUnavailable(f"netns-partition: hosts {', '.join(missing)} are not created; call NetnsHosts.create()")
        if self.hosts.outside is not None and not self.hosts._link_made:
            raise NemesisUnavailable(f"netns-partition: the lab's veth {self.hosts.link} to {self.hosts.outside} "
                                     "does not exist; call NetnsHosts.create()")

    async def invoke(self, test: Test, op: dict) -> dict:
        """Add or remove the DROP rules; the `info` completion records them."""
        f = op.get("f")
        if f == "start-partition":
            return await self._start(op)
        if f == "stop-partition":
            return await self._stop(op)
        raise ValueError(f"netns-partition does not handle f {f!r}; it handles start-partition, stop-partition")

    async def teardown(self, test: Test) -> None:
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
            grudge = value.get("grudge") or self.rounds.pick("grudge", self.grudges)
            picked, cut = grudge_pairs(grudge, self.pairs, self.rng, target=value.get("target"), sides=value.get("sides"))
            chosen = {"grudge": grudge, **picked}
        direction = value.get("direction") or self.rounds.pick("direction", self.directions)
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
        ends = sorted({e for pair in cut for e in pair})
        record = {**base, **chosen, "links": [f"{f}_{t}" for f, t in cut], "streams": streams,
                  "addresses": {e: self.hosts.address(e) for e in ends}}
        try:
            for at, src in drops:
                await asyncio.to_thread(self.hosts.drop, at, src)
                self._active.append({"at": at, "from": src, "from_ip": self.hosts.address(src), "action": "DROP",
                                     **self._placed(at, src)})
        except RuntimeError as e:
            return completion(op, {**record, "phase": "start" if self._active else "none",
                                   "rules": list(self._active)}, error=str(e))
        return completion(op, {**record, "phase": "start", "rules": list(self._active)})

    def _placed(self, at: str, src: str) -> dict[str, Any]:
        """Where a rule lives (`host`, `netns`, `chain`, `rule`) when the substrate says (NetnsHosts does;
        the SSH stack's subclass drives its own rules)."""
        describe = getattr(self.hosts, "describe_rule", None)
        return describe(at, src) if describe is not None else {}

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
