"""The fenced-write boundary (contract section 7, C24-C29): `POST /api/v1/commits`.

A commit is the linearization point of an authoritative write made under a
lease. Two fences guard it:

1. Validation, one atomic Lua step (`lua/commit.lua`, backend time): this exact
   lease (identity, lease_id, owner principal, service instance, token) is the
   current, unexpired record (C24, C25), and the token is not below the
   identity's durable commit high-water mark `L:hwm` (C26); the mark rises to
   the token, and a `pending` idempotency record remembers the validation.
2. The store write, conditional twice over (C27): on the document's `_rev`
   (a concurrent write makes it fail, and the server re-reads and rebuilds), and
   on the store's own `validate_doc_update` guard, which refuses a document
   whose `fence_token` is lower than the stored one. So a commit validated
   before its lease expired may still land after it (C29), but never over a
   newer holder's write: its late write is refused by the store itself.

The written document records the accepted token, lease, execution, trace and
lock key (C28, the `fence_*` fields) and the last `commit_applied_max` commit
request ids, which a retry checks before appending: a crash between the store
write and the final idempotency record can never apply a commit twice.

Idempotency (C16-C19): key (commit, lock_key, principal, request_id), digest
over the identity, lease fields, `doc` and `body`. A retry finds the final
record (the original result, `replayed: true`), or the `pending` one (the
original was validated, its write may or may not have landed: the retry
continues it from the store step, under the original validation), or nothing
(validation never happened: it validates now).

The write itself is chosen by `commit_mode` (`WRITERS`): `fenced` (above), or
the planted bug `unfenced` (`--allow-mutants` only): validate, then read the
document and write it back into `<store_db>_unfenced`, which has no token
guard: a paused holder's late write lands after its successor's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import orjson

from lab.server import backend as keys
from lab.server.auth import Principal
from lab.server.errors import COMMIT_ACCEPTED, LeaseError, invalid
from lab.server.recovery import RecoveryGate
from lab.server.service import LeaseService, Outcome, corrupt
from lab.server.settings import Settings
from lab.server.store import DocumentStore, StoreOutcomeUnknown, StoreUnavailable
from lab.server.wire import MutationRequest

log = logging.getLogger("lab.server.commit")

Hook = Callable[[MutationRequest], Awaitable[None]]
HOOK_POINTS = ("validated", "before_put")

_LOST_MSG = {
    "expired": "the lease expired (by backend time) before the commit was validated",
    "token_mismatch": "the fencing token does not match the lease",
    "stale_token": "stale token: lower than the high-water mark already accepted for this identity",
    "store_guard": "stale token: the document already holds a commit with a higher fencing token",
}


def commit_lost(problem: str) -> LeaseError:
    """409 lease_lost for a commit; never describes another owner's lease."""
    return LeaseError("lease_lost", _LOST_MSG.get(problem, "the lease is not held by this caller (released, "
                                                           "revoked, expired or superseded); not owner"))


@dataclass
class Accepted:
    """The result of an applied commit."""

    doc: str
    db: str
    rev: str
    accepted_token: int
    lease_id: str
    validated_at_ms: int
    replayed: bool = False

    def wire(self) -> dict[str, Any]:
        out = {"doc": self.doc, "db": self.db, "rev": self.rev, "accepted_token": self.accepted_token,
               "lease_id": self.lease_id, "validated_at_ms": self.validated_at_ms}
        if self.replayed:
            out["replayed"] = True
        return out

    def record(self) -> list[str]:
        """The idempotency record's result (texts: Lua's cjson would round large numbers)."""
        return [self.doc, self.db, self.rev, str(self.accepted_token), self.lease_id, str(self.validated_at_ms)]

    @classmethod
    def from_record(cls, r: Any) -> "Accepted":
        if not isinstance(r, list) or len(r) != 6 or not all(isinstance(x, str) for x in r):
            raise corrupt()
        try:
            return cls(r[0], r[1], r[2], int(r[3]), r[4], int(r[5]), replayed=True)
        except ValueError:
            raise corrupt() from None


class CommitService:
    """Validation in Valkey, then the conditional store write of `commit_mode`."""

    def __init__(self, settings: Settings, service: LeaseService, store: DocumentStore | None, gate: RecoveryGate):
        self.settings = settings
        self.service = service
        self.store = store
        self.gate = gate
        self.writer = WRITERS[settings.commit_mode]
        # test and lab hooks: awaited at HOOK_POINTS with the request (an injected pause, a fault)
        self.hooks: dict[str, Hook] = {}

    async def commit(self, principal: Principal, req: MutationRequest) -> Outcome:
        """Validate, write, remember; the contract's codes for every way it can end."""
        if self.store is None:
            raise LeaseError("lease_backend_unavailable", "commits need a document store and this server has none "
                             "(start it with --store-url)", retryable=False, backend_health="not_contacted",
                             submitted=False)
        deadline = self.service.call_deadline(req.deadline_ms)
        try:
            token, validated_at, replay = await self.validate(principal, req, deadline)
        except LeaseError as e:
            if e.code != "lease_lost":
                raise
            replay = await self.applied_before(principal, req, deadline)
            if replay is None:
                raise
        if replay is not None:
            return self.outcome(replay, req)
        await self._hook("validated", req)
        if self.settings.commit_delay_ms:
            await asyncio.sleep(max(0.0, min(self.settings.commit_delay_ms / 1000,
                                              deadline - asyncio.get_running_loop().time())))
        if asyncio.get_running_loop().time() >= deadline:
            raise LeaseError("deadline_exceeded", "validated, but the deadline passed before the write was sent; "
                             "nothing was written", backend_health="ok")
        try:
            await self.store.prepare(deadline)
            accepted = await self.writer(self, principal, req, token, validated_at, deadline)
        except StoreUnavailable:
            raise LeaseError("lease_backend_unavailable", "the document store is unavailable; the commit was not "
                             "written", retry_after_ms=200, backend_health="unavailable") from None
        except StoreOutcomeUnknown:
            raise LeaseError("lease_outcome_unknown", "no reply from the document store before the deadline; the "
                             "outcome is unknown: retry with the same request_id to settle it",
                             retry_after_ms=100, backend_health="unknown") from None
        await self.remember(principal, req, accepted)
        return self.outcome(accepted, req)

    async def validate(self, principal: Principal, req: MutationRequest,
                       deadline: float) -> tuple[int, int, Accepted | None]:
        """The validation script: (token, validated_at_ms, None) to write, or a replayed result (C25, C26)."""
        lock_key = req.identity.lock_key()
        expected = self.gate.expected_run_id()
        key_list = [lock_key, keys.hwm_key(lock_key),
                    keys.idempotency_key("commit", lock_key, principal.principal_id, req.request_id)]
        args = [req.identity.canonical_json(), req.digest, req.lease_id, principal.principal_id,
                req.service_instance_id, req.fields["fencing_token"], self.settings.idempotency_ttl_ms]
        res = await self.service.run("commit", key_list, args, deadline, mutation=True, incarnation=expected)
        status = res[0]
        if status == "validated":
            return req.fields["fencing_token"], int(res[1]), None
        if status == "pending":  # validated by an earlier attempt: continue it under that validation (C29)
            r = res[3]
            if not isinstance(r, list) or len(r) != 2 or int(r[0]) != req.fields["fencing_token"]:
                raise corrupt()
            return int(r[0]), int(r[1]), None
        if status == "replayed":
            if res[2] != COMMIT_ACCEPTED:
                raise corrupt()
            return 0, 0, Accepted.from_record(res[3])
        if status == "lease_lost":
            raise commit_lost(res[2])
        raise self.service.common_failure(res, expected) or corrupt()

    async def applied_before(self, principal: Principal, req: MutationRequest, deadline: float) -> Accepted | None:
        """A retry of a commit that was written, whose idempotency record Valkey no longer has (C17).

        After Valkey restarted from an older snapshot the record may be gone and the lease revoked by
        the recovery rule: the validation answers lease_lost, but the write happened, and the store's
        applied list says so. The original result is answered (replayed), nothing is written.
        """
        assert self.store is not None
        try:
            current = await self.store.get(self.store.commit_db, req.fields["doc"], deadline)
        except (StoreUnavailable, StoreOutcomeUnknown):
            return None  # the refusal stands: nothing is assumed
        return self.already_applied(current, principal, req, self.store.commit_db)

    async def remember(self, principal: Principal, req: MutationRequest, accepted: Accepted) -> None:
        """Replace the pending idempotency record by the result; the write happened whatever this does."""
        lock_key = req.identity.lock_key()
        record = orjson.dumps({"d": req.digest, "c": COMMIT_ACCEPTED, "r": accepted.record()})
        loop = asyncio.get_running_loop()
        try:
            await self.service.backend.command(
                loop.time() + self.settings.max_backend_timeout_ms / 1000, "SET",
                keys.idempotency_key("commit", lock_key, principal.principal_id, req.request_id), record,
                "PX", self.settings.idempotency_ttl_ms)
        except Exception as e:  # noqa: BLE001 - a retry still finds the commit in the document's applied list
            log.warning("commit applied but its idempotency record was not written: %s", type(e).__name__)

    @staticmethod
    def outcome(accepted: Accepted, req: MutationRequest) -> Outcome:
        """The success envelope's parts and the audit fields."""
        extra: dict[str, Any] = {"commit": accepted.wire(), "backend_time_ms": accepted.validated_at_ms}
        audit: dict[str, Any] = {"backend_time_ms": accepted.validated_at_ms, "lease_id": accepted.lease_id,
                                 "fencing_token": accepted.accepted_token, "previous_state": "active",
                                 "resulting_state": "active"}
        if accepted.replayed:
            extra["replayed"] = True
            audit["replayed"] = True
        return Outcome(COMMIT_ACCEPTED, None, extra, audit)

    async def _hook(self, point: str, req: MutationRequest) -> None:
        hook = self.hooks.get(point)
        if hook is not None:
            await hook(req)

    # -- the store step ------------------------------------------------------------
    async def conditional_write(self, principal: Principal, req: MutationRequest, token: int, validated_at: int,
                                deadline: float, db: str) -> Accepted:
        """Read, rebuild, write conditional on `_rev`; re-read after a conflict (bounded)."""
        assert self.store is not None
        for _ in range(self.settings.commit_max_attempts):
            current = await self.store.get(db, req.fields["doc"], deadline)
            done = self.already_applied(current, principal, req, db)
            if done is not None:
                return done
            new = self.build(current, principal, req, token, validated_at)
            await self._hook("before_put", req)
            res = await self.store.put(db, req.fields["doc"], new, deadline)
            if res.ok and res.rev:
                return Accepted(req.fields["doc"], db, res.rev, token, req.lease_id, validated_at)
            if res.forbidden:
                raise commit_lost("store_guard")
            if not res.conflict:
                raise LeaseError("lease_backend_unavailable", "the document store refused the write",
                                 retryable=False, backend_health="fault")
        raise LeaseError("lease_backend_unavailable", "the document kept changing under concurrent commits; "
                         "retry with the same request_id", retry_after_ms=50, backend_health="ok")

    @staticmethod
    def already_applied(current: dict[str, Any] | None, principal: Principal, req: MutationRequest,
                        db: str) -> Accepted | None:
        """This commit's entry in the document's applied list (a retry after a lost reply), checking C24."""
        if current is None:
            return None
        bound = current.get("fence_lock_key")
        if bound is not None and bound != req.identity.lock_key():
            raise invalid("doc", "is fenced by another lock identity; a lease commits only to documents of its "
                                 "own identity (C24)")
        for entry in applied_list(current):
            if entry[0] == req.request_id and entry[1] == principal.principal_id:
                if entry[2] != req.digest[:16]:
                    raise LeaseError("idempotency_conflict",
                                     "request_id was already used for this operation with a different body")
                # the rev its write produced: recorded by the next commit's write, else the current one (C17)
                rev = entry[5] if len(entry) == 6 else current["_rev"]
                return Accepted(req.fields["doc"], db, rev, entry[3], req.lease_id, entry[4], replayed=True)
        return None

    def build(self, current: dict[str, Any] | None, principal: Principal, req: MutationRequest, token: int,
              validated_at: int) -> dict[str, Any]:
        """The new document: the change, the fence record (C28), the applied list; `_rev` kept (conditional)."""
        doc: dict[str, Any] = dict(current) if current is not None else {"_id": req.fields["doc"]}
        change = req.fields["body"]
        if "append" in change:
            entries = doc.get("entries", [])
            if not isinstance(entries, list):
                raise LeaseError("lease_backend_unavailable", "the document's entries are not a list; failing closed",
                                 retryable=False, backend_health="corrupt")
            doc["entries"] = [*entries, change["append"]]
        else:
            doc.update(change["set"])
        f = req.fields
        doc.update(fence_token=token, fence_lease_id=req.lease_id, fence_lock_key=req.identity.lock_key(),
                   fence_execution_id=f["execution_id"] or None, fence_trace_id=f["trace_id"] or None,
                   fence_service_instance_id=req.service_instance_id, fence_validated_at_ms=validated_at)
        earlier = list(applied_list(doc))
        if earlier and current is not None and len(earlier[-1]) == 5:  # the current rev is the last commit's
            earlier[-1] = [*earlier[-1], current["_rev"]]
        applied = [*earlier, [req.request_id, principal.principal_id, req.digest[:16], token, validated_at]]
        doc["fence_applied"] = applied[-self.settings.commit_applied_max:]
        return doc


def applied_list(doc: dict[str, Any]) -> list[list[Any]]:
    """The document's recent commits `[request_id, principal_id, digest16, token, validated_at_ms, rev?]`.

    `rev` is the revision the commit's write produced, recorded by the next commit's write (the latest
    commit's is the document's current `_rev`), so a retry gets the original result back.
    """
    applied = doc.get("fence_applied", [])
    if not isinstance(applied, list) or not all(
            isinstance(e, list) and len(e) in (5, 6) and isinstance(e[0], str) and isinstance(e[1], str)
            and isinstance(e[2], str) and isinstance(e[3], int) and isinstance(e[4], int)
            and (len(e) == 5 or isinstance(e[5], str)) for e in applied):
        raise LeaseError("lease_backend_unavailable", "the document's commit record is malformed; failing closed",
                         retryable=False, backend_health="corrupt")
    return applied


async def fenced_write(svc: CommitService, principal: Principal, req: MutationRequest, token: int,
                       validated_at: int, deadline: float) -> Accepted:
    """C27: `_rev`-conditional write into the guarded database (the store refuses a lower token)."""
    assert svc.store is not None
    return await svc.conditional_write(principal, req, token, validated_at, deadline, svc.store.db)


async def unfenced_write(svc: CommitService, principal: Principal, req: MutationRequest, token: int,
                         validated_at: int, deadline: float) -> Accepted:
    """PLANTED BUG (`commit_mode: unfenced`): check-then-write into a database without the token guard."""
    assert svc.store is not None
    return await svc.conditional_write(principal, req, token, validated_at, deadline, svc.store.unfenced_db)


WRITERS: dict[str, Callable[..., Awaitable[Accepted]]] = {"fenced": fenced_write, "unfenced": unfenced_write}
