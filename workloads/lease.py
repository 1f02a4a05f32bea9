"""The `lease` workload: many processes acquire, renew, release and inspect leases on a few keys.

Each process runs sessions `acquire -> renew x N -> release` on a random key,
mixed with `inspect`s; conflicts are expected and are the point (one winner
per key at a time). Every completion keeps the lease id, fencing token and the
server's backend times, so the fencing, mutual-exclusion and lease-state
checkers can judge the run.
"""

from __future__ import annotations

from typing import Any

from lab.client import Lease, new_request_id
from workloads.common import completion, identity_for, lease_client

DOC = __doc__


class LeaseWorkloadClient:
    """A worker's lease API client; remembers the lease it holds per key."""

    def __init__(self, ttl_ms: int = 2000, deadline_s: float = 2.0, node: str | None = None, api=None):
        self.ttl_ms = ttl_ms
        self.deadline_s = deadline_s
        self.node = node
        self.api = api
        self.held: dict[str, Lease] = {}

    async def open(self, test, node: str) -> "LeaseWorkloadClient":
        """A fresh client (fresh service instance: a new owner) bound to lease server `node`."""
        return LeaseWorkloadClient(self.ttl_ms, self.deadline_s, node, lease_client(test, node))

    async def setup(self, test) -> None:
        return None

    async def teardown(self, test) -> None:
        return None

    async def close(self, test) -> None:
        if self.api is not None:
            await self.api.aclose()

    async def before_request(self, test, op: dict[str, Any]) -> None:
        """Honour the client nemeses: a paused process waits here; a skewed one reads its own clock."""
        clocks = test.live.get("client_clocks")
        if clocks is not None and self.api is not None:
            self.api.clock_ms = clocks.clock_for(op["process"])
        pauses = test.live.get("client_pauses")
        if pauses is not None:
            await pauses.wait(op["process"])

    async def invoke(self, test, op: dict[str, Any]) -> dict[str, Any]:
        """Run one lease op; `fail` only when it definitely did not happen."""
        await self.before_request(test, op)
        f, key = op["f"], op.get("key")
        value = op.get("value") or {}
        request_id = value.get("request_id") or new_request_id()
        identity = identity_for(key)
        if f == "acquire":
            r = await self.api.acquire(identity, ttl_ms=value.get("ttl_ms", self.ttl_ms), request_id=request_id,
                                       deadline_s=self.deadline_s)
            if r.ok:
                self.held[key] = r.lease
                return completion(r, dict(r.lease.history_value(), request_id=request_id))
            return completion(r, {"request_id": request_id})
        if f in ("renew", "release"):
            lease = self.held.get(key)
            if lease is None:
                return {"type": "fail", "value": {"request_id": request_id}, "error": "not_held"}
            call = self.api.renew if f == "renew" else self.api.release
            r = await call(lease, identity=identity, request_id=request_id, deadline_s=self.deadline_s)
            attempted = {"request_id": request_id, "lease_id": lease.lease_id, "fencing_token": lease.fencing_token}
            if r.ok:
                if f == "renew":
                    self.held[key] = r.lease
                else:
                    self.held.pop(key, None)
                return completion(r, dict(r.lease.history_value(), request_id=request_id))
            if r.outcome == "fail" and r.code == "lease_lost":
                self.held.pop(key, None)  # the server says we do not hold it any more
            return completion(r, attempted, late=True) if r.late else completion(r, attempted)
        if f == "inspect":
            r = await self.api.inspect(identity, deadline_s=self.deadline_s)
            if r.ok:
                return completion(r, r.lease.history_value() if r.lease else None)
            if r.code == "lease_not_found":
                return {"type": "ok", "value": None}
            return completion(r, None)
        raise ValueError(f"lease workload: unknown f {f!r}")


def session(keys: list[str], renews: int = 2):
    """One worker session as a function generator: acquire a random key, renew it, release it."""

    def rid(ctx) -> dict:
        # request ids come from the seeded rng, so a replay sends the same ids
        return {"request_id": f"{ctx.rng.getrandbits(64):016x}"}

    def make(test, ctx):
        k = ctx.rng.choice(keys)
        ops = [{"f": "acquire", "key": k, "value": dict(rid(ctx), ttl_ms=test.ttl_ms)}]
        ops += [{"f": "renew", "key": k, "value": rid(ctx)} for _ in range(renews)]
        ops.append({"f": "release", "key": k, "value": rid(ctx)})
        if ctx.rng.random() < 0.2:
            ops.append({"f": "inspect", "key": k, "value": None})
        return ops

    return make


def lease_checker(test):
    """The lease workload's checkers: fencing, mutual exclusion, lease state, idempotency, availability."""
    from checkers.core import compose, get_checker

    return compose({name: get_checker(name) for name in
                    ("fencing", "mutual-exclusion", "lease-state", "idempotency", "availability")})


def workload(test):
    """Sessions of acquire / renew / release / inspect on `test.keys` keys, at `test.rate` ops/s in total."""
    import lab.generator as gen
    from workloads.base import Workload
    from workloads.common import key_names

    keys = key_names(test.keys)
    ttl_ms = int(test.extra.get("ttl_ms", test.ttl_ms))
    return Workload(
        name="lease",
        client=LeaseWorkloadClient(ttl_ms=ttl_ms, deadline_s=float(test.extra.get("deadline_s", 2.0))),
        generator=gen.stagger(1.0 / test.rate, gen.each_thread(session(keys))),
        checker=lease_checker(test),
        doc=DOC,
    )
