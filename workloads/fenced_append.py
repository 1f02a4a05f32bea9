"""The `fenced-append` workload: commits through the fenced-write path into a CouchDB-API store.

Each process runs sessions on a random key: acquire its lease, then append
entries `[process, token, n]` to the key's document through the server's
fenced commit (`POST /api/v1/commits`), renewing between commits, and release.
A final phase reads every document back. The stale-commit checker then proves
that no accepted commit carries a lower token than one accepted before it,
none was validated after its lease expired, no acknowledged commit is lost and
none is applied twice; the fencing and mutual-exclusion checkers judge the
leases themselves.
"""

from __future__ import annotations

import itertools
from typing import Any

from lab.client import new_request_id
from workloads.common import completion, identity_for
from workloads.lease import LeaseWorkloadClient

DOC = __doc__
DB = "fencelab"


def store_url(test) -> str:
    """The store's URL with its credentials (kept out of test.json: `test.store` is the redacted one)."""
    return test.live.get("store_url") or test.store


def doc_id(key: str) -> str:
    """The store document a key's holders append to."""
    return f"doc-{key}"


class FencedAppendClient(LeaseWorkloadClient):
    """The lease workload client plus fenced commits and final reads of the store."""

    def __init__(self, *args: Any, store_db: dict | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.counter = itertools.count(1)
        # shared by every opened client: the database the boundary reports writing (a planted bug may use another)
        self.store_db = {"db": DB} if store_db is None else store_db

    async def open(self, test, node: str) -> "FencedAppendClient":
        base = await super().open(test, node)
        return FencedAppendClient(self.ttl_ms, self.deadline_s, node, base.api, store_db=self.store_db)

    async def setup(self, test) -> None:
        """Create the store database and its fence guard (validate_doc_update)."""
        from lab.couch import CouchClient

        async with CouchClient(store_url(test)) as couch:
            await couch.ensure_db(DB)

    async def invoke(self, test, op: dict[str, Any]) -> dict[str, Any]:
        f, key = op["f"], op.get("key")
        if f == "commit":
            await self.before_request(test, op)
            return await self._commit(test, op, key)
        if f == "read":
            return await self._read(test, key)
        return await super().invoke(test, op)

    async def _commit(self, test, op: dict[str, Any], key: str) -> dict[str, Any]:
        value = op.get("value") or {}
        request_id = value.get("request_id") or new_request_id()
        lease = self.held.get(key)
        if lease is None:
            return {"type": "fail", "value": {"request_id": request_id, "doc": doc_id(key)}, "error": "not_held"}
        entry = [op["process"], lease.fencing_token, next(self.counter)]
        attempted = {"request_id": request_id, "doc": doc_id(key), "entry": entry, "lease_id": lease.lease_id,
                     "fencing_token": lease.fencing_token}
        r = await self.api.commit(lease, doc_id(key), {"append": entry}, identity=identity_for(key),
                                  request_id=request_id, deadline_s=self.deadline_s)
        if r.ok:
            data = (r.data or {}).get("commit") or r.data or {}
            if data.get("db"):
                self.store_db["db"] = data["db"]
            return completion(r, dict(attempted, rev=data.get("rev"), accepted_token=data.get("accepted_token"),
                                      validated_at_ms=data.get("validated_at_ms")))
        if r.outcome == "fail" and r.code == "lease_lost":
            self.held.pop(key, None)
        return completion(r, attempted)

    async def _read(self, test, key: str) -> dict[str, Any]:
        """Read the key's document straight from the store (a read: an error is a definite `fail`)."""
        from lab.couch import CouchClient, CouchError

        try:
            async with CouchClient(store_url(test)) as couch:
                d = await couch.get(self.store_db["db"], doc_id(key))
        except (CouchError, OSError, Exception) as e:  # noqa: BLE001 - a failed read has no effect
            return {"type": "fail", "value": {"doc": doc_id(key)}, "error": f"{type(e).__name__}: {e}"}
        if d is None:
            return {"type": "ok", "value": {"doc": doc_id(key), "entries": [], "token": None}}
        return {"type": "ok", "value": {"doc": doc_id(key), "entries": d.get("entries", []),
                                        "token": d.get("fence_token"), "lease_id": d.get("fence_lease_id")}}


def session(keys: list[str], commits: int = 3):
    """Acquire a random key, commit `commits` times (renewing in between), release."""

    def rid(ctx) -> dict:
        return {"request_id": f"{ctx.rng.getrandbits(64):016x}"}

    def make(test, ctx):
        k = ctx.rng.choice(keys)
        ops = [{"f": "acquire", "key": k, "value": dict(rid(ctx), ttl_ms=test.ttl_ms)}]
        for i in range(commits):
            ops.append({"f": "commit", "key": k, "value": rid(ctx)})
            if i < commits - 1:
                ops.append({"f": "renew", "key": k, "value": rid(ctx)})
        ops.append({"f": "release", "key": k, "value": rid(ctx)})
        return ops

    return make


class CommitsExercised:
    """`unknown` when no commit was accepted: the fence was never tested, so `valid` would claim too much."""

    def check(self, test, history, opts) -> dict:
        oks = sum(1 for op in history if op.get("f") == "commit" and op.get("type") == "ok")
        attempts = sum(1 for op in history if op.get("f") == "commit" and op.get("type") == "invoke")
        return {"valid": True if oks else "unknown", "accepted_commits": oks, "attempted_commits": attempts}


def workload(test):
    """Fenced appends on `test.keys` documents, then a final read of each."""
    import lab.generator as gen
    from checkers.core import compose, get_checker
    from workloads.base import Workload
    from workloads.common import key_names

    keys = key_names(test.keys)
    return Workload(
        name="fenced-append",
        client=FencedAppendClient(ttl_ms=test.ttl_ms, deadline_s=float(test.extra.get("deadline_s", 2.0))),
        generator=gen.stagger(1.0 / test.rate, gen.each_thread(session(keys))),
        final_generator=[{"f": "read", "key": k, "value": {"doc": doc_id(k)}} for k in keys],
        checker=compose({"commits-exercised": CommitsExercised(),
                         **{name: get_checker(name) for name in
                            ("stale-commit", "fencing", "mutual-exclusion", "lease-state", "idempotency",
                             "availability")}}),
        needs_store=True,
        doc=DOC,
    )
