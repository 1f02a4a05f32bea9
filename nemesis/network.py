"""Network nemeses over the Toxiproxy topology: partition, latency, bandwidth, reset-peer, slicer.

Each fault is a set of Toxiproxy toxics on chosen links (`lab.stack.topology`):
one toxic per (link, stream), named `<fault>-<stream>` so several nemeses can
share a link and each removes only its own. A link's `upstream` stream carries
`from -> to` (requests), `downstream` carries `to -> from` (responses); a
fault's `direction` is `both`, `upstream` or `downstream` (the one-way variants).

- `partition`: a blackhole (`timeout` toxic, timeout 0: data is dropped, the
  connection stays open) on the links a grudge picks: `isolate-valkey` (one
  server from Valkey), `isolate-store`, `isolate-server` (every link of one
  server), `isolate-clients` (every client group from one server),
  `isolate-client` (one client group from everything: "a partition isolates a
  worker"), `halves` (servers and clients split in two; the first side keeps
  the backends), or an explicit `links` list.
- `latency` (`latency_ms` +/- `jitter_ms`), `bandwidth` (`rate_kbps`),
  `reset-peer` (connections reset after `timeout_ms` once data flows), `slicer`
  (writes cut into `average_size` +/- `size_variation` byte pieces, `delay_us`
  apart), each on one link, every link of one server, or every link (`scope`).

Every nemesis handles `start-<fault>` and `stop-<fault>`. The op `value` may be
null (targets drawn from the seeded `random.Random`) or a dict fixing any of
the choices. The `info` completion's value records what was done:
`{"fault", "phase": "start"|"end"|"none", "links", "streams", "toxics": [...], ...}`;
`phase` opens or closes the fault window, `none` means nothing changed (a
start while the fault is active, a stop with nothing active, or an error,
which is also in the op's `error`).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from typing import Any

from nemesis.core import NemesisUnavailable, Rounds, as_rng, completion
from lab.stack.topology import Link, Topology, role
from lab.stack.toxiproxy_api import ToxiproxyError, validate_toxic
from lab.testmap import Test

__all__ = [
    "DIRECTIONS",
    "GRUDGES",
    "SCOPES",
    "PartitionNemesis",
    "ToxicNemesis",
    "bandwidth",
    "check_grudges",
    "grudge_pairs",
    "grudge_problem",
    "latency",
    "partition",
    "partition_replay",
    "reset_peer",
    "slicer",
    "streams_of",
    "toxic_replay",
]

DIRECTIONS = ("both", "upstream", "downstream")
GRUDGES = ("isolate-valkey", "isolate-store", "isolate-server", "isolate-clients", "isolate-client", "halves")
SCOPES = ("link", "server", "all")

Pair = tuple[str, str]


# -- validation helpers -------------------------------------------------------
def _choices(param: str, values: Any, allowed: Sequence[str]) -> tuple[str, ...]:
    """A non-empty tuple drawn from `allowed`, or ValueError naming `param`."""
    if isinstance(values, str):
        values = (values,)
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"{param} must be a list of {', '.join(allowed)}, got {values!r}") from None
    bad = [v for v in values if v not in allowed]
    if not values or bad:
        raise ValueError(f"{param} must be a non-empty list of {', '.join(allowed)}; bad: {bad or values!r}")
    return values


# Each toxic fault's parameters (op value keys) and their least value: the classes below check them at a start,
# nemesis.fault_schedule before a replay's stack starts.
TOXIC_PARAMS: dict[str, dict[str, int]] = {
    "latency": {"latency_ms": 1, "jitter_ms": 0},
    "bandwidth": {"rate_kbps": 1},
    "reset-peer": {"timeout_ms": 0},
    "slicer": {"average_size": 1, "size_variation": 0, "delay_us": 0},
}


def _int_param(param: str, value: Any, minimum: int = 0) -> int:
    """An int >= minimum, or ValueError naming `param`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{param} must be an int >= {minimum}, got {value!r}")
    return value


def _int_params(fault: str, p: dict[str, Any]) -> dict[str, int]:
    """`fault`'s parameters from `p`, each an int >= its least value (TOXIC_PARAMS), or ValueError naming it."""
    return {k: _int_param(k, p[k], least) for k, least in TOXIC_PARAMS[fault].items()}


def _toxicity(value: Any) -> float:
    """A probability in [0, 1], or ValueError naming `toxicity`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"toxicity must be a number in [0, 1], got {value!r}")
    return float(value)


def streams_of(direction: str) -> list[str]:
    """The Toxiproxy streams a direction covers."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    return ["upstream", "downstream"] if direction == "both" else [direction]


# -- grudges: which links a partition cuts (shared with the netns nemesis) -----
def _endpoints(pairs: Sequence[Pair]) -> list[str]:
    """Every endpoint in the pairs, sorted."""
    return sorted({e for p in pairs for e in p})


def _grudge_candidates(grudge: str, pairs: Sequence[Pair]) -> list[str]:
    """The endpoints a grudge may target (sorted, so a seeded choice is reproducible)."""
    if grudge == "isolate-valkey":
        return sorted({f for f, t in pairs if t == "valkey"})
    if grudge == "isolate-store":
        return sorted({f for f, t in pairs if t == "store"})
    if grudge == "isolate-server":
        return [e for e in _endpoints(pairs) if role(e) == "server"]
    if grudge == "isolate-clients":
        return sorted({t for f, t in pairs if role(t) == "server" and role(f) == "client"})
    if grudge == "isolate-client":
        return [e for e in _endpoints(pairs) if role(e) == "client"]
    raise ValueError(f"grudge must be one of {', '.join(GRUDGES)}, got {grudge!r}")


def grudge_problem(grudge: str, pairs: Sequence[Pair]) -> str | None:
    """Why `grudge` cannot apply to these links, or None when it can."""
    if grudge not in GRUDGES:
        return f"grudge must be one of {', '.join(GRUDGES)}, got {grudge!r}"
    if grudge == "halves":
        servers = [e for e in _endpoints(pairs) if role(e) == "server"]
        return None if len(servers) >= 2 else f"grudge halves needs at least 2 lease servers, have {len(servers)}"
    if not _grudge_candidates(grudge, pairs):
        return f"grudge {grudge} has no target in these links"
    return None


def check_grudges(grudges: Any, pairs: Sequence[Pair]) -> tuple[str, ...]:
    """The grudges to draw from: the given ones (each must apply), or by default every one that applies."""
    if grudges is None:
        usable = tuple(g for g in GRUDGES if grudge_problem(g, pairs) is None)
        if not usable:
            raise ValueError("grudges: no grudge applies to these links")
        return usable
    grudges = _choices("grudges", grudges, GRUDGES)
    for g in grudges:
        problem = grudge_problem(g, pairs)
        if problem:
            raise ValueError(f"grudges: {problem}")
    return grudges


def _halves(pairs: Sequence[Pair], rng: random.Random) -> list[list[str]]:
    """Random sides: the first keeps ceil(n/2) servers, half the clients and every backend."""
    ends = _endpoints(pairs)
    servers = [e for e in ends if role(e) == "server"]
    clients = [e for e in ends if role(e) == "client"]
    rng.shuffle(servers)
    rng.shuffle(clients)
    ks, kc = math.ceil(len(servers) / 2), math.ceil(len(clients) / 2)
    others = [e for e in ends if role(e) not in ("server", "client")]
    return [sorted(servers[:ks] + clients[:kc] + others), sorted(servers[ks:] + clients[kc:])]


def _check_sides(sides: Any, pairs: Sequence[Pair]) -> list[list[str]]:
    """Two disjoint lists of known endpoints; the unnamed ones join the first side."""
    ends = _endpoints(pairs)
    if not (isinstance(sides, (list, tuple)) and len(sides) == 2 and all(isinstance(s, (list, tuple)) for s in sides)):
        raise ValueError(f"sides must be two lists of endpoints, got {sides!r}")
    a, b = list(sides[0]), list(sides[1])
    unknown = [e for e in a + b if e not in ends]
    if unknown:
        raise ValueError(f"sides name unknown endpoints {unknown}; endpoints: {', '.join(ends)}")
    if set(a) & set(b):
        raise ValueError(f"sides overlap on {sorted(set(a) & set(b))}")
    return [sorted(set(a) | (set(ends) - set(b))), sorted(b)]


def grudge_pairs(grudge: str, pairs: Sequence[Pair], rng: random.Random, *, target: str | None = None,
                 sides: Any = None) -> tuple[dict[str, Any], list[Pair]]:
    """The links a grudge cuts, and what it chose (`target` or `sides`) for the record."""
    problem = grudge_problem(grudge, pairs)
    if problem:
        raise ValueError(problem)
    if grudge == "halves":
        chosen = _check_sides(sides, pairs) if sides is not None else _halves(pairs, rng)
        side = {e: i for i, s in enumerate(chosen) for e in s}
        return {"sides": chosen}, [(f, t) for f, t in pairs if side[f] != side[t]]
    if sides is not None:
        raise ValueError(f"grudge {grudge} takes a target, not sides")
    candidates = _grudge_candidates(grudge, pairs)
    if target is None:
        target = rng.choice(candidates)
    elif target not in candidates:
        raise ValueError(f"grudge {grudge} cannot target {target!r}; candidates: {', '.join(candidates)}")
    if grudge == "isolate-valkey":
        cut = [(target, "valkey")]
    elif grudge == "isolate-store":
        cut = [(target, "store")]
    elif grudge == "isolate-server":
        cut = [p for p in pairs if target in p]
    elif grudge == "isolate-clients":
        cut = [(f, t) for f, t in pairs if t == target and role(f) == "client"]
    else:  # isolate-client
        cut = [p for p in pairs if target in p]
    return {"target": target}, cut


# -- the toxic nemeses ------------------------------------------------------------
class ToxicNemesis:
    """A fault made of one Toxiproxy toxic per (link, stream) on links chosen per start op."""

    toxic_type = "noop"
    choice_keys = frozenset({"links", "scope", "target", "direction"})  # op value keys besides the params

    def __init__(self, topology: Topology, *, fault: str, rng: Any, params: dict[str, Any],
                 directions: Any = ("both",), scopes: Any = SCOPES, toxicity: float = 1.0):
        if not isinstance(topology, Topology):
            raise ValueError(f"topology must be a lab.stack.topology.Topology, got {type(topology).__name__}")
        if not topology.links:
            raise ValueError("topology has no links")
        self.topology = topology
        self.name = fault
        self.rng = as_rng(rng)
        self.rounds = Rounds(self.rng)  # grudges, scopes, directions: each once per round
        self.directions = _choices("directions", directions, DIRECTIONS)
        self.scopes = _choices("scopes", scopes, SCOPES)
        if "server" in self.scopes and not topology.servers:
            raise ValueError("scopes: 'server' needs lease servers (lease-N) in the topology")
        self.toxicity = _toxicity(toxicity)
        self.params = self._check_params(params)
        self._active: list[dict[str, Any]] = []  # the toxics this nemesis has in place

    # -- the protocol --------------------------------------------------------
    @property
    def fs(self) -> frozenset[str]:
        """`start-<fault>` and `stop-<fault>`."""
        return frozenset({f"start-{self.name}", f"stop-{self.name}"})

    async def setup(self, test: Test) -> None:
        """Check Toxiproxy answers and every link's proxy exists (NemesisUnavailable otherwise)."""
        try:
            proxies = await self.topology.client.proxies()
        except ToxiproxyError as e:
            raise NemesisUnavailable(f"{self.name}: Toxiproxy is not usable: {e}") from e
        missing = sorted(set(self.topology.links) - set(proxies))
        if missing:
            raise NemesisUnavailable(f"{self.name}: Toxiproxy at {self.topology.client.url} lacks proxies "
                                     f"{', '.join(missing)}; build the topology first")

    async def invoke(self, test: Test, op: dict) -> dict:
        """Start or stop the fault; the `info` completion records exactly what was done."""
        f = op.get("f")
        if f == f"start-{self.name}":
            return await self._start(op)
        if f == f"stop-{self.name}":
            return await self._stop(op)
        raise ValueError(f"{self.name} nemesis does not handle f {f!r}; it handles {', '.join(sorted(self.fs))}")

    async def teardown(self, test: Test) -> None:
        """Remove every toxic of this fault from the topology's proxies and re-enable them."""
        proxies = await self.topology.client.proxies()
        prefix = f"{self.name}-"
        for name in self.topology.links:
            proxy = proxies.get(name)
            if proxy is None:
                continue
            for toxic in proxy.get("toxics") or []:
                if toxic["name"].startswith(prefix):
                    await self._remove(name, toxic["name"])
            if not proxy.get("enabled", True):
                await self.topology.client.enable(name)
        self._active = []

    # -- what a start does (overridden per fault) ------------------------------
    def _check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Validate the fault's parameters (subclasses)."""
        return dict(params)

    def _attributes(self, params: dict[str, Any]) -> dict[str, Any]:
        """Toxiproxy attributes from the fault's parameters (subclasses)."""
        return {}

    def _choose(self, value: dict[str, Any]) -> tuple[dict[str, Any], list[Link]]:
        """The targets (`scope`, `target`, or explicit `links`) for one start."""
        if "links" in value:
            return {"scope": "links"}, self._named_links(value["links"])
        scope = value.get("scope") or self.rounds.pick("scope", self.scopes)
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        target = value.get("target")
        if scope == "all":
            return {"scope": "all"}, list(self.topology.links.values())
        if scope == "link":
            names = sorted(self.topology.links)
            target = target if target is not None else self.rounds.pick("link", names)
            return {"scope": "link", "target": target}, self._named_links([target])
        servers = self.topology.servers
        target = target if target is not None else self.rounds.pick("server", servers)
        if target not in servers:
            raise ValueError(f"scope server: target must be one of {', '.join(servers)}, got {target!r}")
        return {"scope": "server", "target": target}, self.topology.links_touching(target)

    def _named_links(self, names: Any) -> list[Link]:
        """Links by proxy name, or ValueError naming the unknown ones."""
        if isinstance(names, str) or not isinstance(names, (list, tuple)) or not names:
            raise ValueError(f"links must be a non-empty list of link names, got {names!r}")
        links = self.topology.links
        unknown = [n for n in names if n not in links]
        if unknown:
            shared = any(n.startswith("members_") for n in links)  # lab.sut.processes.MEMBERS, one proxy per receiver
            why = (" (no per-pair links between members here: the lab could not give each member its own "
                   "/etc/hosts, see the stack's info peer_links; members_<to> cuts all sent to <to>)") if shared else ""
            raise ValueError(f"unknown links {unknown}{why}; links: {', '.join(sorted(links))}")
        return [links[n] for n in dict.fromkeys(names)]

    def _plan(self, value: Any) -> tuple[dict[str, Any], list[Link], list[str], dict[str, Any]]:
        """(choices, links, streams, params) for a start op's value (None = all drawn at random)."""
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ValueError(f"start-{self.name} value must be null or an object, got {value!r}")
        overrides = {k: v for k, v in value.items() if k in self.params}
        unknown = set(value) - set(self.params) - self.choice_keys
        if unknown:
            raise ValueError(f"start-{self.name}: unknown value key(s) {', '.join(sorted(unknown))}")
        params = self._check_params({**self.params, **overrides})
        chosen, links = self._choose(value)
        direction = value.get("direction") or self.rounds.pick("direction", self.directions)
        return {**chosen, "direction": direction}, links, streams_of(direction), params

    # -- start / stop ------------------------------------------------------------
    async def _start(self, op: dict) -> dict:
        """Add the toxics; on a Toxiproxy error roll back and report `phase: none` with the error."""
        if self._active:
            return completion(op, {"fault": self.name, "phase": "none", "active": list(self._active)},
                              error=f"{self.name} is already active; stop it first")
        chosen, links, streams, params = self._plan(op.get("value"))
        attrs = self._attributes(params)
        validate_toxic(self.toxic_type, "upstream", self.toxicity, attrs)
        record = {"fault": self.name, **chosen, "links": [l.name for l in links], "streams": streams,
                  "params": params, "toxicity": self.toxicity}
        try:
            for link in links:
                for stream in streams:
                    await self._add(link.name, stream, attrs)
        except ToxiproxyError as e:
            error = str(e)
            try:
                await self._remove_active()
            except ToxiproxyError as e2:  # the rest stays remembered; teardown sweeps it
                error += f"; rollback failed too: {e2}"
            value = {**record, "phase": "start" if self._active else "none", "toxics": list(self._active)}
            return completion(op, value, error=error)
        return completion(op, {**record, "phase": "start", "toxics": list(self._active)})

    async def _stop(self, op: dict) -> dict:
        """Remove the toxics this fault added; `phase: end` when it was active."""
        if not self._active:
            return completion(op, {"fault": self.name, "phase": "none", "removed": []})
        removed = list(self._active)
        try:
            await self._remove_active()
        except ToxiproxyError as e:
            return completion(op, {"fault": self.name, "phase": "none", "active": list(self._active)}, error=str(e))
        return completion(op, {"fault": self.name, "phase": "end", "removed": removed})

    async def _add(self, proxy: str, stream: str, attrs: dict[str, Any]) -> None:
        """Add one toxic and remember it."""
        name = f"{self.name}-{stream}"
        t = await self.topology.client.add_toxic(proxy, self.toxic_type, name=name, stream=stream,
                                                 toxicity=self.toxicity, attributes=attrs)
        self._active.append({"proxy": proxy, "name": name, "type": self.toxic_type, "stream": stream,
                             "toxicity": self.toxicity, "attributes": t.get("attributes", attrs)})

    async def _remove(self, proxy: str, name: str) -> None:
        """Remove one toxic (one that is already gone, e.g. after /reset, counts as removed)."""
        try:
            await self.topology.client.remove_toxic(proxy, name)
        except ToxiproxyError as e:
            if e.status != 404:
                raise

    async def _remove_active(self) -> None:
        """Remove the remembered toxics, forgetting each once it is gone."""
        while self._active:
            t = self._active[0]
            await self._remove(t["proxy"], t["name"])
            self._active.pop(0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, params={self.params})"


class PartitionNemesis(ToxicNemesis):
    """Blackholes (`timeout` toxic, timeout 0) on the links a grudge picks."""

    toxic_type = "timeout"
    choice_keys = frozenset({"links", "grudge", "target", "sides", "direction"})

    def __init__(self, topology: Topology, *, rng: Any, grudges: Any = None, directions: Any = ("both",)):
        super().__init__(topology, fault="partition", rng=rng, params={}, directions=directions, scopes=("all",))
        self.grudges = check_grudges(grudges, self._pairs())

    def _pairs(self) -> list[Pair]:
        """The topology's links as (from, to) pairs."""
        return [(l.frm, l.to) for l in self.topology.links.values()]

    def _attributes(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"timeout": 0}

    def _choose(self, value: dict[str, Any]) -> tuple[dict[str, Any], list[Link]]:
        """A grudge (drawn, or `grudge` with optional `target`/`sides`), or explicit `links`."""
        if "links" in value:
            return {"grudge": "links"}, self._named_links(value["links"])
        grudge = value.get("grudge") or self.rounds.pick("grudge", self.grudges)
        chosen, cut = grudge_pairs(grudge, self._pairs(), self.rng, target=value.get("target"),
                                   sides=value.get("sides"))
        return {"grudge": grudge, **chosen}, [self.topology.link(f, t) for f, t in cut]


class _Latency(ToxicNemesis):
    toxic_type = "latency"

    def _check_params(self, p: dict[str, Any]) -> dict[str, Any]:
        return _int_params("latency", p)

    def _attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"latency": p["latency_ms"], "jitter": p["jitter_ms"]}


class _Bandwidth(ToxicNemesis):
    toxic_type = "bandwidth"

    def _check_params(self, p: dict[str, Any]) -> dict[str, Any]:
        return _int_params("bandwidth", p)

    def _attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"rate": p["rate_kbps"]}


class _ResetPeer(ToxicNemesis):
    toxic_type = "reset_peer"

    def _check_params(self, p: dict[str, Any]) -> dict[str, Any]:
        return _int_params("reset-peer", p)

    def _attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"timeout": p["timeout_ms"]}


class _Slicer(ToxicNemesis):
    toxic_type = "slicer"

    def _check_params(self, p: dict[str, Any]) -> dict[str, Any]:
        out = _int_params("slicer", p)
        if out["size_variation"] >= out["average_size"]:
            raise ValueError(f"size_variation ({out['size_variation']}) must be smaller than average_size "
                             f"({out['average_size']})")
        return out

    def _attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"average_size": p["average_size"], "size_variation": p["size_variation"], "delay": p["delay_us"]}


# -- replaying a start (nemesis.fault_schedule): what it did, as the value that does it again ----------------
def partition_replay(record: dict[str, Any]) -> dict[str, Any]:
    """The `start-partition` value that cuts again what the start completion `record` says it cut: its grudge
    with its target or sides, or its explicit links, and its direction (Toxiproxy's, netns' and SSH's alike)."""
    if record.get("grudge") == "links":
        return {"links": list(record["links"]), "direction": record["direction"]}
    return {k: copy.deepcopy(record[k]) for k in ("grudge", "target", "sides", "direction") if k in record}


def toxic_replay(record: dict[str, Any]) -> dict[str, Any]:
    """The `start-<fault>` value of a latency / bandwidth / reset-peer / slicer start that adds again the toxics
    its completion `record` says it added: the scope and target (or the links), the direction, the parameters."""
    where = ({"links": list(record["links"])} if record.get("scope") == "links"
             else {k: record[k] for k in ("scope", "target") if k in record})
    return {**where, "direction": record["direction"], **record.get("params", {})}


# -- constructors (validated parameters; a bad one is a ValueError naming it) ----------
def partition(topology: Topology, *, rng: Any, grudges: Any = None, directions: Any = ("both",)) -> PartitionNemesis:
    """Blackhole partitions: `start-partition` / `stop-partition` (grudges default to every one that applies)."""
    return PartitionNemesis(topology, rng=rng, grudges=grudges, directions=directions)


def latency(topology: Topology, *, rng: Any, latency_ms: int = 200, jitter_ms: int = 50,
            directions: Any = ("downstream",), scopes: Any = SCOPES, toxicity: float = 1.0) -> ToxicNemesis:
    """Delay (`latency_ms` +/- `jitter_ms`): `start-latency` / `stop-latency`."""
    return _Latency(topology, fault="latency", rng=rng, params={"latency_ms": latency_ms, "jitter_ms": jitter_ms},
                    directions=directions, scopes=scopes, toxicity=toxicity)


def bandwidth(topology: Topology, *, rng: Any, rate_kbps: int = 16, directions: Any = ("downstream",),
              scopes: Any = SCOPES, toxicity: float = 1.0) -> ToxicNemesis:
    """A slow link (`rate_kbps` KB/s): `start-bandwidth` / `stop-bandwidth`."""
    return _Bandwidth(topology, fault="bandwidth", rng=rng, params={"rate_kbps": rate_kbps},
                      directions=directions, scopes=scopes, toxicity=toxicity)


def reset_peer(topology: Topology, *, rng: Any, timeout_ms: int = 0, directions: Any = ("upstream",),
               scopes: Any = SCOPES, toxicity: float = 1.0) -> ToxicNemesis:
    """Connections reset once data flows (after `timeout_ms`): `start-reset-peer` / `stop-reset-peer`."""
    return _ResetPeer(topology, fault="reset-peer", rng=rng, params={"timeout_ms": timeout_ms},
                      directions=directions, scopes=scopes, toxicity=toxicity)


def slicer(topology: Topology, *, rng: Any, average_size: int = 8, size_variation: int = 4, delay_us: int = 1000,
           directions: Any = ("both",), scopes: Any = SCOPES, toxicity: float = 1.0) -> ToxicNemesis:
    """Writes cut into small pieces `delay_us` apart: `start-slicer` / `stop-slicer`."""
    return _Slicer(topology, fault="slicer", rng=rng,
                   params={"average_size": average_size, "size_variation": size_variation, "delay_us": delay_us},
                   directions=directions, scopes=scopes, toxicity=toxicity)
