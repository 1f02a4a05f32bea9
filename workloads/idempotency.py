"""The `idempotency` workload: retries with the same request_id, and reuse of a request_id with a changed body.

Each session on a random key: an acquire whose first attempt has a tiny
deadline (its response is often lost: an `info`), retried with the same
request_id and body (must return the same lease and token, C17), then with
the same request_id and a changed body (must be `idempotency_conflict`,
mutating nothing); a renew and a release, each retried with the same
request_id (the retry returns the original result). The idempotency checker
judges the groups of ops by request_id; fencing and lease-state judge the rest.
"""

from __future__ import annotations

from typing import Any

from workloads.common import completion, identity_for
from workloads.lease import LeaseWorkloadClient

DOC = __doc__


class IdempotencyClient(LeaseWorkloadClient):
    """Lease ops that honour the op's request_id, ttl and deadline, and remember leases by request_id."""

    def __init__(self, *args: Any, by_request: dict | None = None, **kw: Any):
        super().__init__(*args, **kw)
        # shared by every opened client: a retry may run in a fresh process after an `info`
        self.by_request: dict[str, Any] = {} if by_request is None else by_request

    async def open(self, test, node: str) -> "IdempotencyClient":
        base = await super().open(test, node)
        return IdempotencyClient(self.ttl_ms, self.deadline_s, node, base.api, by_request=self.by_request)

    async def invoke(self, test, op: dict[str, Any]) -> dict[str, Any]:
        f, key, value = op["f"], op.get("key"), op.get("value") or {}
        await self.before_request(test, op)
        deadline_s = value.get("deadline_ms", self.deadline_s * 1000) / 1000
        rid = value["request_id"]
        identity = identity_for(key)
        # the owner (principal + service instance) is part of the idempotency digest: a retry made by a fresh
        # process after an `info` must come from the same service instance as the first attempt
        if value.get("session"):
            self.api.service_instance_id = f"idem-{value['session']}"
        if f == "acquire":
            r = await self.api.acquire(identity, ttl_ms=value["ttl_ms"], request_id=rid, deadline_s=deadline_s)
            if r.ok:
                self.by_request[value.get("session")] = r.lease
                return completion(r, dict(r.lease.history_value(), request_id=rid))
            return completion(r, {"request_id": rid})
        if f in ("renew", "release"):
            lease = self.by_request.get(value.get("session"))
            if lease is None:
                return {"type": "fail", "value": {"request_id": rid}, "error": "not_held"}
            call = self.api.renew if f == "renew" else self.api.release
            r = await call(lease, identity=identity, request_id=rid, deadline_s=deadline_s)
            if r.ok:
                return completion(r, dict(r.lease.history_value(), request_id=rid))
            return completion(r, {"request_id": rid, "lease_id": lease.lease_id, "fencing_token": lease.fencing_token})
        return await super().invoke(test, op)


def _body(value: dict[str, Any]) -> dict[str, Any]:
    """What the server's digest covers (deadlines are not part of it)."""
    return {k: v for k, v in value.items() if k not in ("deadline_ms", "session", "body")}


def _with_body(value: dict[str, Any]) -> dict[str, Any]:
    """The invoke value, with `body` naming what the idempotency digest covers (the checker compares it)."""
    return dict(value, body=_body(value))


def session(keys: list[str]):
    """One retry session on a random key (see the module docstring)."""

    def make(test, ctx):
        k = ctx.rng.choice(keys)
        sid = f"{ctx.rng.getrandbits(64):016x}"
        acq = {"request_id": f"{sid}-a", "ttl_ms": test.ttl_ms, "session": sid}
        ren = {"request_id": f"{sid}-r", "session": sid}
        rel = {"request_id": f"{sid}-x", "session": sid}
        changed = dict(acq, ttl_ms=test.ttl_ms + 1)
        return [
            {"f": "acquire", "key": k, "value": _with_body(dict(acq, deadline_ms=5))},  # response often lost
            {"f": "acquire", "key": k, "value": _with_body(acq)},  # same request_id, same body: same lease
            {"f": "acquire", "key": k, "value": _with_body(changed)},  # changed body: idempotency_conflict
            {"f": "renew", "key": k, "value": _with_body(ren)},
            {"f": "renew", "key": k, "value": _with_body(ren)},
            {"f": "release", "key": k, "value": _with_body(rel)},
            {"f": "release", "key": k, "value": _with_body(rel)},
        ]

    return make


def workload(test):
    """Retry sessions on `test.keys` keys."""
    import lab.generator as gen
    from checkers.core import compose, get_checker
    from workloads.base import Workload
    from workloads.common import key_names

    keys = key_names(test.keys)
    return Workload(
        name="idempotency",
        client=IdempotencyClient(ttl_ms=test.ttl_ms, deadline_s=float(test.extra.get("deadline_s", 2.0))),
        generator=gen.stagger(1.0 / test.rate, gen.each_thread(session(keys))),
        checker=compose({name: get_checker(name) for name in ("idempotency", "fencing", "lease-state",
                                                                "mutual-exclusion")}),
        doc=DOC,
    )
