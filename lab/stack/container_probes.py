"""Health probes of the Compose stack's containers, over the ports they publish on 127.0.0.1.

The same questions the local stack's owners ask of their processes: Valkey
answers PING, the store serves CouchDB's welcome document, Toxiproxy its
version, a lease server `/healthz`.
"""

from __future__ import annotations

from typing import Protocol

import httpx
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["PublishedService", "default_probe"]


class PublishedService(Protocol):
    """What a probe needs of a container (`lab.stack.container.ContainerProcess`, which imports these probes):
    its service name and the host port Docker published for it."""

    service: str

    def host_port(self, container_port: str | None = None) -> int | None: ...


def _http_ok(url: str, statuses: tuple[int, ...] = (200,)) -> bool:
    """Does GET `url` answer one of `statuses`?"""
    try:
        return httpx.get(url, timeout=1.0).status_code in statuses
    except httpx.HTTPError:
        return False


def _welcome_ok(url: str) -> bool:
    """Does GET `url` answer a CouchDB welcome document (a JSON object with `version`)?"""
    try:
        r = httpx.get(url, timeout=1.0)
        return r.status_code == 200 and "version" in r.json()
    except (httpx.HTTPError, ValueError):
        return False


def _valkey_ok(port: int) -> bool:
    """Does Valkey answer PING (not merely accept: it loads its AOF before serving)?"""
    c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0, socket_connect_timeout=1.0,
                    retry=Retry(NoBackoff(), 0))
    try:
        return bool(c.ping())
    except Exception:
        return False
    finally:
        c.close()


def default_probe(proc: PublishedService) -> bool:
    """The service's own health probe through its published port, as the local stack's owners do."""
    port = proc.host_port()
    if port is None:
        return False
    if proc.service == "valkey":
        return _valkey_ok(port)
    if proc.service == "store":  # the welcome document: Apache CouchDB and pouchdb-server both serve it
        return _welcome_ok(f"http://127.0.0.1:{port}/")
    if proc.service == "toxiproxy":
        return _http_ok(f"http://127.0.0.1:{port}/version")
    return _http_ok(f"http://127.0.0.1:{port}/healthz")

