"""Stacks of systems the lab does not run: `--url` servers, bare (`UrlStack`) or behind the lab's Toxiproxy.

Both implement the `lab.stack.base.Stack` protocol, so a run treats a system
at given URLs like any stack: `up()` returns a `StackStatus` whose
`lease_servers` are the given URLs and whose `client_nodes` are what the
workload's clients dial; `down()`, `status()`, `processes`, `process(name)`,
`dir` and `info` as everywhere.

`UrlStack`: nothing to start or stop; the status reports the given URLs (an
in-process system has none).

`ProxiedUrls` (`--proxy-urls`): against a system the lab does not run, the
only links it can fault are its own clients' links to the servers. It starts
a Toxiproxy (`lab.stack.toxiproxy.ToxiproxyProcess`, listening on loopback;
through `lab.stack.lifecycle.ProcessStack`, so it is recorded in
`<dir>/state.json` and dies with the run) and makes one proxy per link
`c<g>_lease-<i>`: client group `g` to the `i`-th `--url`, as the local stack
does (`lab.stack.topology`). The workload's clients then dial `client_nodes`
(thread t talks to `client_nodes[t % len]`), so `partition`, `latency`,
`reset-peer`, `bandwidth` and `slicer` act on client -> server links only;
the grudges that need Valkey or the store links have no target here and are
never drawn. It stands in `test.live.stack` for `nemesis.registry.build`,
which reads `info["toxiproxy"]` and `info["topology"]` from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from lab.secrets import redact_url
from lab.stack.base import StackStatus
from lab.stack.errors import StackError
from lab.stack.lifecycle import ProcessStack
from lab.stack.process import ManagedProcess
from lab.stack.topology import Link, standard_links

__all__ = ["ProxiedUrls", "UrlStack", "server_address", "via"]

BACKEND = "external"  # StackStatus.backend of a system the lab does not run


def server_address(url: str) -> str:
    """`host:port` of an http URL (the proxy's upstream)."""
    u = urlsplit(url)
    return f"{u.hostname}:{u.port or 80}"


def via(url: str, listen: str) -> str:
    """The same URL (path kept) through a proxy listening on `listen`."""
    u = urlsplit(url)
    return urlunsplit((u.scheme, listen, u.path, u.query, u.fragment))


class UrlStack:
    """A system at given URLs (or in-process: none) that the lab neither starts nor stops."""

    backend = BACKEND

    def __init__(self, urls: list[str], root: Path, *, store: str | None = None, name: str = "stack"):
        self.urls = list(urls)
        self.root = Path(root)
        self.store = store  # the system's own store, as the run may show it (redacted)
        self.name = name
        self.processes: list[Any] = []
        self.info: dict[str, Any] = {}
        self._up = False

    @property
    def dir(self) -> Path:
        return self.root

    def up(self, opts: Any = None) -> StackStatus:
        """Nothing to start: the status of the given URLs."""
        self._up = True
        return self.status()

    def down(self) -> list[str]:
        """Nothing to stop."""
        self._up = False
        return []

    def status(self) -> StackStatus:
        return StackStatus(name=self.name, backend=BACKEND, dir=str(self.dir), up=self._up, system="external",
                           lease_servers=self.urls, client_nodes=self.urls, store=self.store)

    def process(self, name: str) -> Any:
        raise StackError(f"stack {self.name!r} runs no process {name!r}: the system under test is not the lab's")


class ProxiedUrls(ProcessStack):
    """A Toxiproxy owned by the run, with one proxy per (client group, --url) link."""

    backend = BACKEND

    def __init__(self, urls: list[str], root: Path, *, client_groups: int = 2, store: str | None = None,
                 name: str = "stack"):
        if not urls:
            raise ValueError("ProxiedUrls needs at least one URL")
        self.urls = list(urls)
        self.name = name
        self.home = None
        self.root = Path(root)
        self.die_with_parent = True  # dies with the run, even on SIGKILL
        self.client_groups = client_groups
        self.store = store
        self.processes: list[ManagedProcess] = []
        self.info: dict[str, Any] = {}

    @property
    def client_nodes(self) -> list[str]:
        """The given URLs through their proxies: group 1's link to each URL, then group 2's, ..."""
        return list(self.info.get("client_nodes", []))

    def up(self, opts: Any = None) -> StackStatus:
        """Start Toxiproxy and create every link's proxy; on failure stop what was started."""
        return super().up(opts)

    def _check(self, opts: Any) -> None:
        """Nothing to check: the URLs were probed before the run."""

    def _initial_info(self, opts: Any) -> dict[str, Any]:
        return {"name": self.name, "dir": str(self.dir), "urls": [redact_url(u) for u in self.urls]}

    def _start_all(self, opts: Any) -> None:
        names = [f"lease-{i}" for i in range(1, len(self.urls) + 1)]
        upstreams = {n: server_address(u) for n, u in zip(names, self.urls)}
        links = standard_links(self.client_groups, names, valkey=False, store=False)
        topo = self._start_proxies(Link(f, t, "127.0.0.1:0", upstreams[t]) for f, t in links)
        by_url = dict(zip(names, self.urls))
        self.info["client_nodes"] = [via(by_url[n], topo.address(f"c{g}", n))
                                     for g in range(1, self.client_groups + 1) for n in names]
        self.save_state()

    def _status_extras(self) -> dict[str, Any]:
        """The given URLs (in memory only: state.json keeps them redacted); no Valkey or keys of the lab's."""
        return {"system": "external", "lease_servers": self.urls, "store": self.store, "credentials": None}
