"""The link topology: one Toxiproxy proxy per directed link `<from>_<to>`.

Endpoints are named by role: client process groups `c1..cN`, lease servers
`lease-1..` (or a system's own members `<word>-N`, e.g. `etcd-1`), `valkey`, `store`. A link `(frm, to)` is the TCP path `frm` uses to
reach `to`; its proxy is named `<frm>_<to>` (e.g. `lease-1_valkey`,
`c1_lease-2`), listens on a free loopback port, and forwards to `to`'s real
address. Everything is created in one `POST /populate`. `frm` then dials
`topology.address(frm, to)` instead of `to`'s real address, so a fault on one
link (one proxy) affects exactly that pair and nothing else.

On a link, Toxiproxy's `upstream` stream carries `frm -> to` (requests) and
`downstream` carries `to -> frm` (responses).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab.stack.toxiproxy_api import ToxiproxyClient, ToxiproxyError, _check_address

__all__ = ["Link", "Topology", "link_name", "role", "standard_links"]

# No underscore in endpoint names: `_` separates from and to in a proxy name.
_ENDPOINT = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_CLIENT = re.compile(r"^c[0-9]+$")
# a server: a lease server `lease-N`, or a member `<word>-N` of a system under test that brings its own
# processes (`etcd-1`, lab.sut.processes): the grudges isolate servers whatever their system
_SERVER = re.compile(r"^[a-z][a-z0-9]*-[0-9]+$")


def _check_endpoint(name: Any) -> str:
    """An endpoint name (lower-case letters, digits, '-'; no '_'), or ValueError."""
    if not isinstance(name, str) or not _ENDPOINT.match(name):
        raise ValueError(f"endpoint name must be lower-case letters, digits and '-' (no '_'), "
                         f"starting with a letter, got {name!r}")
    return name


def link_name(frm: str, to: str) -> str:
    """The proxy name of the link `frm -> to`."""
    return f"{_check_endpoint(frm)}_{_check_endpoint(to)}"


def role(name: str) -> str:
    """An endpoint's role from its name: client, server, valkey, store or other."""
    if _CLIENT.match(name):
        return "client"
    if _SERVER.match(name):
        return "server"
    if name in ("valkey", "store"):
        return name
    return "other"


def standard_links(clients: int | Sequence[str], servers: int | Sequence[str], *, valkey: bool = True,
                   store: bool = True, clients_to_store: bool = False) -> list[tuple[str, str]]:
    """The lab's links: every client group to every server, every server to valkey and to the store
    (and, with `clients_to_store`, every client group's fenced writer to the store)."""
    cs = [f"c{i}" for i in range(1, clients + 1)] if isinstance(clients, int) else list(clients)
    ss = [f"lease-{i}" for i in range(1, servers + 1)] if isinstance(servers, int) else list(servers)
    if not ss:
        raise ValueError("standard_links needs at least one server")
    for n in cs + ss:
        _check_endpoint(n)
    links = [(c, s) for c in cs for s in ss]
    if valkey:
        links += [(s, "valkey") for s in ss]
    if store:
        links += [(s, "store") for s in ss]
        if clients_to_store:
            links += [(c, "store") for c in cs]
    return links


@dataclass(frozen=True)
class Link:
    """One directed link and its proxy: `frm` dials `listen`, which forwards to `upstream` (`to`)."""

    frm: str
    to: str
    listen: str
    upstream: str

    @property
    def name(self) -> str:
        """The proxy name, `<frm>_<to>`."""
        return f"{self.frm}_{self.to}"

    def touches(self, endpoint: str) -> bool:
        """Is `endpoint` one end of this link?"""
        return endpoint in (self.frm, self.to)


class Topology:
    """The proxies of one lab stack, by link; built with `Topology.build`."""

    def __init__(self, client: ToxiproxyClient, links: Iterable[Link]):
        self.client = client
        self._links: dict[str, Link] = {link.name: link for link in links}

    @classmethod
    async def build(cls, client: ToxiproxyClient, upstreams: Mapping[str, str],
                    links: Iterable[tuple[str, str]], *, host: str = "127.0.0.1") -> "Topology":
        """Create one proxy per link (`POST /populate`, free ports on `host`) and return the topology.

        `upstreams` maps each endpoint that is dialled (`to`) to its real `host:port`.
        """
        pairs = _validate_links(upstreams, links)
        return await cls.create(client, [Link(f, t, f"{host}:0", upstreams[t]) for f, t in pairs])

    @classmethod
    async def create(cls, client: ToxiproxyClient, links: Iterable[Link]) -> "Topology":
        """Create the proxy of every link in one `POST /populate` (each listening where its `listen` says; port 0:
        a free one) and return the topology with the addresses Toxiproxy listens on."""
        links = list(links)
        body = [{"name": link_name(link.frm, link.to), "upstream": link.upstream, "listen": link.listen}
                for link in links]
        made = {p["name"]: p for p in await client.populate(body)}
        missing = [b["name"] for b in body if b["name"] not in made]
        if missing:
            raise ToxiproxyError(f"Toxiproxy did not create proxies {', '.join(missing)}", proxy=missing[0])
        return cls(client, [Link(link.frm, link.to, made[link.name]["listen"], link.upstream) for link in links])

    @classmethod
    def from_description(cls, client: ToxiproxyClient, desc: Mapping[str, Mapping[str, str]]) -> "Topology":
        """The topology `describe()` wrote (e.g. into a stack's state), bound to a client of this event loop."""
        return cls(client, [Link(d["from"], d["to"], d["listen"], d["upstream"]) for d in desc.values()])

    # -- lookup ------------------------------------------------------------
    @property
    def links(self) -> dict[str, Link]:
        """Every link by proxy name."""
        return dict(self._links)

    @property
    def endpoints(self) -> list[str]:
        """Every endpoint that is one end of a link, sorted."""
        return sorted({e for link in self._links.values() for e in (link.frm, link.to)})

    @property
    def clients(self) -> list[str]:
        """The client groups (`c1..`)."""
        return [e for e in self.endpoints if role(e) == "client"]

    @property
    def servers(self) -> list[str]:
        """The lease servers (`lease-1..`)."""
        return [e for e in self.endpoints if role(e) == "server"]

    def link(self, frm: str, to: str) -> Link:
        """The link `frm -> to`, or ValueError listing the links there are."""
        name = f"{frm}_{to}"
        if name not in self._links:
            raise ValueError(f"no link {frm} -> {to} in this topology; links: {', '.join(sorted(self._links))}")
        return self._links[name]

    def address(self, frm: str, to: str) -> str:
        """The `host:port` that `frm` must dial to reach `to` (through the link's proxy)."""
        return self.link(frm, to).listen

    def links_touching(self, endpoint: str) -> list[Link]:
        """The links with `endpoint` at either end."""
        return [link for link in self._links.values() if link.touches(endpoint)]

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (for test.json and reports)."""
        return {name: {"from": l.frm, "to": l.to, "listen": l.listen, "upstream": l.upstream}
                for name, l in sorted(self._links.items())}

    # -- lifecycle ---------------------------------------------------------
    async def reset(self) -> None:
        """`POST /reset`: every proxy enabled, every toxic removed (between tests)."""
        await self.client.reset()

    async def teardown(self) -> None:
        """Delete this topology's proxies (ones already gone are fine)."""
        for name in list(self._links):
            try:
                await self.client.delete_proxy(name)
            except ToxiproxyError as e:
                if e.status != 404:
                    raise
            del self._links[name]


def _validate_links(upstreams: Mapping[str, str], links: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The links as a list of (frm, to), checked: names, no self-links, no duplicates, every `to` has an address."""
    if not isinstance(upstreams, Mapping):
        raise ValueError(f"upstreams must map endpoint names to 'host:port', got {type(upstreams).__name__}")
    for name, addr in upstreams.items():
        _check_endpoint(name)
        _check_address(f"upstream address of {name}", addr)
    pairs: list[tuple[str, str]] = []
    for item in links:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"a link must be a (from, to) pair, got {item!r}")
        frm, to = _check_endpoint(item[0]), _check_endpoint(item[1])
        if frm == to:
            raise ValueError(f"link {frm} -> {to}: an endpoint does not link to itself")
        if to not in upstreams:
            raise ValueError(f"link {frm} -> {to}: no upstream address for {to!r} (known: {', '.join(sorted(upstreams))})")
        if (frm, to) in pairs:
            raise ValueError(f"link {frm} -> {to} is listed twice")
        pairs.append((frm, to))
    if not pairs:
        raise ValueError("a topology needs at least one link")
    return pairs
