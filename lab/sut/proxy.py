"""`--proxy-urls`: the lab's own Toxiproxy in front of an external system's URLs.

Against a system the lab does not run, the only links it can fault are its
own clients' links to the servers. `ProxiedUrls` starts a Toxiproxy
(`lab.stack.toxiproxy.ToxiproxyProcess`, listening on loopback) and makes one
proxy per link `c<g>_lease-<i>`: client group `g` to the `i`-th `--url`, as
the local stack does (`lab.stack.topology`). The workload's clients then dial
`client_nodes` (thread t talks to `client_nodes[t % len]`), so `partition`,
`latency`, `reset-peer`, `bandwidth` and `slicer` act on client -> server
links only; the grudges that need Valkey or the store links have no target
here and are never drawn.

It owns the Toxiproxy process (pid, port, log) and stops it in `down()`;
it stands in `test.live["stack"]` for `nemesis.registry.build`, which reads
`info["toxiproxy"]` and `info["topology"]` from it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from lab.stack.process import ManagedProcess
from lab.stack.toxiproxy import ToxiproxyProcess
from lab.stack.topology import Topology, standard_links
from lab.stack.toxiproxy_api import ToxiproxyClient


def server_address(url: str) -> str:
    """`host:port` of an http URL (the proxy's upstream)."""
    u = urlsplit(url)
    return f"{u.hostname}:{u.port or 80}"


def via(url: str, listen: str) -> str:
    """The same URL (path kept) through a proxy listening on `listen`."""
    u = urlsplit(url)
    return urlunsplit((u.scheme, listen, u.path, u.query, u.fragment))


class ProxiedUrls:
    """A Toxiproxy owned by the run, with one proxy per (client group, --url) link."""

    def __init__(self, urls: list[str], root: Path, *, client_groups: int = 2):
        if not urls:
            raise ValueError("ProxiedUrls needs at least one URL")
        self.urls = list(urls)
        self.dir = Path(root)
        self.client_groups = client_groups
        self.processes: list[ManagedProcess] = []
        self.info: dict[str, Any] = {}
        self.client_nodes: list[str] = []

    def up(self) -> "ProxiedUrls":
        """Start Toxiproxy and create every link's proxy; on failure stop what was started."""
        names = [f"lease-{i}" for i in range(1, len(self.urls) + 1)]
        try:
            tp = ToxiproxyProcess(self.dir)
            tp.die_with_parent = True  # dies with the run, even on SIGKILL
            self.processes.append(tp)
            tp.start()
            self.info["toxiproxy"] = tp.url
            upstreams = {n: server_address(u) for n, u in zip(names, self.urls)}
            links = standard_links(self.client_groups, names, valkey=False, store=False)

            async def build() -> dict[str, Any]:
                async with ToxiproxyClient(tp.url) as client:
                    return (await Topology.build(client, upstreams, links)).describe()

            self.info["topology"] = asyncio.run(build())
        except BaseException:
            self.down()
            raise
        topo = self.info["topology"]
        by_url = dict(zip(names, self.urls))
        self.client_nodes = [via(by_url[n], topo[f"c{g}_{n}"]["listen"])
                             for g in range(1, self.client_groups + 1) for n in names]
        return self

    def down(self) -> list[str]:
        """Stop Toxiproxy (by pid); returns the names stopped."""
        stopped = []
        for p in reversed(self.processes):
            if p.alive():
                p.stop()
                stopped.append(p.name)
        self.processes = []
        return stopped
