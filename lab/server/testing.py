"""Helpers to run the reference lease server in process (tests, benchmarks, other helpers).

`in_process_server(settings)` runs the app's lifespan and yields an
`InProcessServer` whose `client` is an `httpx.AsyncClient` over
`httpx.ASGITransport`: the same code path as uvicorn minus the socket, against
a real Valkey.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import redis
from starlette.applications import Starlette

from lab.server.app import LeaseServer, create_app
from lab.server.auth import provision_demo_principals, write_principals_file
from lab.server.identity import IDENTITY_FIELDS
from lab.server.settings import Settings
from lab.server.wire import now_ms

PREFIX = "/api/v1/target-leases"
COMMITS = "/api/v1/commits"


@dataclass
class InProcessServer:
    """A running in-process app, its client and the demo credentials (principal_id -> api_key)."""

    app: Starlette
    client: httpx.AsyncClient
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def server(self) -> LeaseServer:
        return self.app.state.server

    def headers(self, principal_id: str, **extra: str) -> dict[str, str]:
        """Authorization headers for a demo principal."""
        return {"authorization": f"Bearer {self.keys[principal_id]}", **extra}

    async def acquire(self, principal: str = "lease-a1", **fields: Any) -> httpx.Response:
        """POST acquire with `body(**fields)`."""
        return await self.client.post(PREFIX + "/acquire", json=body(**fields), headers=self.headers(principal))

    async def renew(self, lease: dict[str, Any], principal: str = "lease-a1", **fields: Any) -> httpx.Response:
        """POST renew of `lease` (its identity and token) by the owner instance unless overridden."""
        return await self._on_lease("renew", lease, principal, fields)

    async def release(self, lease: dict[str, Any], principal: str = "lease-a1", **fields: Any) -> httpx.Response:
        """POST release of `lease`."""
        return await self._on_lease("release", lease, principal, fields)

    async def admin(self, op: str, lease: dict[str, Any], principal: str = "admin", **fields: Any) -> httpx.Response:
        """POST force-release or revoke of `lease` with a reason."""
        fields.setdefault("reason", "test incident")
        return await self._on_lease(op, lease, principal, fields)

    async def _on_lease(self, op: str, lease: dict[str, Any], principal: str, fields: dict[str, Any]) -> httpx.Response:
        lease_id = fields.pop("lease_id", lease["lease_id"])
        b = body(ttl_ms=None, **{k: lease[k] for k in IDENTITY_FIELDS})
        b["fencing_token"] = lease["fencing_token"]
        b["service_instance_id"] = lease.get("service_instance_id") or "worker-1"
        b.update(fields)
        return await self.client.post(f"{PREFIX}/{lease_id}/{op}", json=b, headers=self.headers(principal))

    async def commit(self, lease: dict[str, Any], doc: str = "doc-1", change: dict[str, Any] | None = None,
                     principal: str = "lease-a1", **fields: Any) -> httpx.Response:
        """POST a fenced commit of `change` (default `{"append": 1}`) to `doc` under `lease`."""
        b = body(ttl_ms=None, **{k: lease[k] for k in IDENTITY_FIELDS})
        b.update(fencing_token=lease["fencing_token"], lease_id=lease["lease_id"], lock_key=lease["lock_key"],
                 expires_at=lease["expires_at_ms"], doc=doc, body=change if change is not None else {"append": 1},
                 service_instance_id=lease.get("service_instance_id") or "worker-1")
        for name in ("execution_id", "trace_id"):
            if lease.get(name):
                b[name] = lease[name]
        b.update(fields)
        return await self.client.post(COMMITS, json=b, headers=self.headers(principal))

    async def inspect(self, lease_id: str, principal: str = "lease-a1") -> httpx.Response:
        return await self.client.get(f"{PREFIX}/{lease_id}", headers=self.headers(principal))


def demo_principals(run_dir: Path) -> tuple[Path, dict[str, str]]:
    """Write fresh demo principals under run_dir; (principals file, principal_id -> api_key)."""
    records, credentials = provision_demo_principals()
    path = write_principals_file(records, Path(run_dir) / "principals.json")
    return path, {c["principal_id"]: c["api_key"] for c in credentials}


@contextlib.asynccontextmanager
async def in_process_server(run_dir: Path, valkey_url: str, **overrides: Any) -> AsyncIterator[InProcessServer]:
    """Start the app in process (lifespan included) against `valkey_url`, with demo principals."""
    principals, keys = demo_principals(run_dir)
    settings = Settings(valkey_url=valkey_url, principals_file=str(principals),
                        audit_log=str(Path(run_dir) / "audit.jsonl"), **overrides).validate()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://lease.test") as client:
            yield InProcessServer(app, client, keys)


def identity(**changes: str) -> dict[str, str]:
    """A demo identity inside lease-a1's scope (tenant-a/program-1/actor-1), with changes."""
    base = {"tenant_id": "tenant-a", "program_id": "program-1", "target_namespace": "dns",
            "target_id": "example.com", "actor_name": "actor-1", "workflow_name": "recon",
            "operation_class": "default"}
    base.update(changes)
    return base


def body(ttl_ms: int | None = 1000, deadline_in_ms: int = 5000, **fields: Any) -> dict[str, Any]:
    """A mutation body: the demo identity, a fresh request_id, a deadline, an instance id, plus fields."""
    out: dict[str, Any] = {**identity(), "request_id": uuid.uuid4().hex, "deadline_at": now_ms() + deadline_in_ms,
                           "service_instance_id": "worker-1"}
    if ttl_ms is not None:
        out["ttl_ms"] = ttl_ms
    out.update(fields)
    return out


class CommandCounter:
    """Valkey's per-command call counters (INFO commandstats), to prove a request touched nothing.

    One persistent connection, opened at construction, so that its own
    handshake is not counted between two snapshots (only its INFO calls are).
    """

    def __init__(self, url: str):
        self._client = redis.Redis.from_url(url)
        self.snapshot()

    def snapshot(self) -> dict[str, int]:
        """The call count of every command Valkey has run so far."""
        stats = self._client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def close(self) -> None:
        self._client.close()


def command_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands whose counters moved between two snapshots."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
