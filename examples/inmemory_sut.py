"""An in-memory lease system plugged into fencelab: the complete example of docs/plugging-in-a-system.md.

`LeaseTable` is the "library under test": leases per identity, a fencing
counter per identity that never goes back, TTLs on its own clock, and
idempotent retries by request_id. `InMemoryLeaseSystem` is the one class
the lab needs: the `lab.sut.LeaseSystem` methods, returning the lab's
`Result` / `Lease` with the contract's codes. Every worker of a run shares
one table through `test.live` (the place for what is never saved).

Run it: fencelab test --sut inmemory_sut:InMemoryLeaseSystem   (with this directory on PYTHONPATH)
"""

from __future__ import annotations

import dataclasses
import itertools
import time

from lab.client import Identity, Lease, Result

PRINCIPAL = "inproc-principal"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class LeaseTable:
    """One in-memory lease system: current lease per identity, counters, idempotency records."""

    def __init__(self, clock_ms=now_ms, max_lifetime_ms: int = 60_000):
        self.clock_ms = clock_ms
        self.max_lifetime_ms = max_lifetime_ms
        self.current: dict[Identity, Lease] = {}
        self.counters: dict[Identity, int] = {}
        self.done: dict[tuple, tuple[tuple, Result]] = {}  # (op, identity, owner, request_id) -> (inputs, result)
        self.ids = itertools.count(1)

    def live(self, identity: Identity) -> Lease | None:
        """The identity's lease if it is active and unexpired now (C10: expiry needs no cleanup)."""
        lease = self.current.get(identity)
        ok = lease is not None and lease.state == "active" and self.clock_ms() < lease.expires_at_ms
        return lease if ok else None

    def once(self, key: tuple, inputs: tuple, run) -> Result:
        """Run a mutation at most once per idempotency key; a changed body is idempotency_conflict (C17)."""
        if key[-1] is not None and key in self.done:
            seen, result = self.done[key]
            return result if seen == inputs else Result("fail", "idempotency_conflict")
        result = run()
        if result.ok and key[-1] is not None:
            self.done[key] = (inputs, result)
        return result


class InMemoryLeaseSystem:
    """A worker's handle on the run's LeaseTable (owner = principal + this worker's service instance)."""

    capabilities = frozenset({"force_release", "revoke"})  # no fenced commit: fenced-append refuses to run
    background = False  # nothing of it runs between calls: client-pause's gate stops it whole

    def __init__(self, test, node, service_instance_id: str):
        self.table: LeaseTable = test.live.setdefault("inmemory_table", LeaseTable())
        self.instance = service_instance_id

    def _copy(self, lease: Lease, code: str) -> Result:
        return Result("ok", code, lease=dataclasses.replace(lease, extra={}))

    async def acquire(self, identity: Identity, *, ttl_ms: int, request_id=None, deadline_s=None) -> Result:
        def run() -> Result:
            if self.table.live(identity):
                return Result("fail", "lease_conflict")
            token = self.table.counters[identity] = self.table.counters.get(identity, 0) + 1
            now = self.table.clock_ms()
            lease = Lease(lease_id=f"lease-{next(self.table.ids)}", fencing_token=token, state="active",
                          acquired_at_ms=now, renewed_at_ms=now, expires_at_ms=now + ttl_ms, ttl_ms=ttl_ms,
                          maximum_lifetime_ms=self.table.max_lifetime_ms, owner_principal_id=PRINCIPAL,
                          service_instance_id=self.instance, request_id=request_id, **identity.as_dict())
            self.table.current[identity] = lease
            return self._copy(lease, "lease_acquired")

        return self.table.once(("acquire", identity, self.instance, request_id), (ttl_ms,), run)

    def _mine(self, lease: Lease, identity: Identity | None, admin: bool = False) -> Lease | None:
        """The exact live lease (same id and token; same owner unless admin), or None (C12, C13, C15)."""
        cur = self.table.live(identity or lease.identity)
        if cur is None or (cur.lease_id, cur.fencing_token) != (lease.lease_id, lease.fencing_token):
            return None
        return cur if admin or cur.service_instance_id == self.instance else None

    async def renew(self, lease: Lease, *, identity=None, request_id=None, deadline_s=None) -> Result:
        def run() -> Result:
            cur = self._mine(lease, identity)
            if cur is None:
                return Result("fail", "lease_lost")
            now = self.table.clock_ms()
            cur.renewed_at_ms = now
            cur.expires_at_ms = min(now + cur.ttl_ms, cur.acquired_at_ms + cur.maximum_lifetime_ms)
            return self._copy(cur, "lease_renewed")

        return self.table.once(("renew", lease.identity, self.instance, request_id), (lease.lease_id,), run)

    async def _end(self, op: str, lease: Lease, identity, request_id, state: str, code: str,
                   reason: str | None = None) -> Result:
        def run() -> Result:
            cur = self._mine(lease, identity, admin=reason is not None)
            if cur is None:
                return Result("fail", "lease_lost")
            cur.state, cur.ended_at_ms, cur.admin_reason = state, self.table.clock_ms(), reason
            del self.table.current[cur.identity]
            return self._copy(cur, code)

        return self.table.once((op, lease.identity, self.instance, request_id), (lease.lease_id, reason), run)

    async def release(self, lease: Lease, *, identity=None, request_id=None, deadline_s=None) -> Result:
        return await self._end("release", lease, identity, request_id, "released", "lease_released")

    async def force_release(self, lease: Lease, reason: str, *, identity=None, request_id=None,
                            deadline_s=None) -> Result:
        return await self._end("force_release", lease, identity, request_id, "released", "lease_released", reason)

    async def revoke(self, lease: Lease, reason: str, *, incident_id=None, identity=None, request_id=None,
                     deadline_s=None) -> Result:
        return await self._end("revoke", lease, identity, request_id, "revoked", "lease_revoked", reason)

    async def inspect(self, target, *, deadline_s=None) -> Result:
        if isinstance(target, Identity):
            lease = self.table.live(target)
        else:
            lease = next((x for x in self.table.current.values() if x.lease_id == target), None)
        return self._copy(lease, "lease_inspected") if lease else Result("fail", "lease_not_found")

    async def aclose(self) -> None:
        return None
