"""The lease operations: one backend script call each, results mapped to the contract's codes.

The HTTP layer (app.py) has already authenticated the caller, checked the
capability and the scope, and validated the canonical request; this module
turns a validated request into exactly one atomic script call (or a bounded
series of them for an acquire with `wait_ms`), and the script's answer into a
success `Outcome` or a `LeaseError`. Backend time (the script's `TIME`) is the
only clock that decides a lease (C20); the server clock only bounds deadlines.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from lab.server import backend as keys
from lab.server.auth import Principal
from lab.server.backend import Backend, BackendFault, BackendUnavailable, NotStarted, OutcomeUnknown
from lab.server.errors import LeaseError
from lab.server.identity import KEY_PREFIX, Identity, identity_from_canonical_json, lock_key_of
from lab.server.ratelimit import TokenBuckets
from lab.server.recovery import RecoveryGate
from lab.server.settings import Settings
from lab.server.wire import MutationRequest, now_ms

_INT_FIELDS = ("fencing_token", "ttl_ms", "maximum_lifetime_ms")
_TIME_FIELDS = ("acquired_at", "renewed_at", "expires_at", "ended_at")
_OPTIONAL_TEXT = ("owner_client_id", "execution_id", "job_id", "trace_id")
CORRUPT_MSG = "stored lease state failed its integrity check; failing closed"


@dataclass
class Outcome:
    """A successful result: the code, the lease (or leases) and what the audit should record."""

    code: str
    lease: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)


@functools.lru_cache(maxsize=1024)
def _rfc3339_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def rfc3339_ms(ms: int) -> str:
    """Unix ms as RFC 3339 UTC with milliseconds."""
    return f"{_rfc3339_second(ms // 1000)}.{ms % 1000:03d}Z"


def corrupt() -> LeaseError:
    return LeaseError("lease_backend_unavailable", CORRUPT_MSG, retryable=False, backend_health="corrupt")


def recovering() -> LeaseError:
    """503 while the recovery rule re-establishes the fencing floor (nothing was executed)."""
    return LeaseError("lease_backend_unavailable",
                      "the lease store restarted or was restored; the server is re-establishing the fencing "
                      "floor (recovery rule): retry shortly", retry_after_ms=200, backend_health="recovering",
                      submitted=False)


def lease_view(flat: list[str] | str, state: str, identity: Identity | None = None) -> dict[str, Any]:
    """A stored flat record (a field/value array, or its JSON text: the mutation scripts return the
    JSON they stored, one string instead of 40) as the API's lease object, checking it against its key (C4).

    With `identity`, the script has already compared the stored identity text with
    the requested one; without it (inspect by id, list) the stored identity is
    re-normalized and must derive the stored lock key.
    """
    if isinstance(flat, str):
        try:
            flat = orjson.loads(flat)
        except orjson.JSONDecodeError:
            raise corrupt() from None
    if not isinstance(flat, list) or len(flat) % 2:
        raise corrupt()
    rec = dict(zip(flat[0::2], flat[1::2]))
    lock_key = rec.get("lock_key", "")
    try:
        if identity is None or rec.get("identity") != identity.canonical_json().decode():
            identity = identity_from_canonical_json(rec.get("identity", ""))
            if lock_key_of(identity.canonical_json()) != lock_key:
                raise ValueError("identity does not derive the stored lock key")
        elif identity.lock_key() != lock_key:
            raise ValueError("lock key mismatch")
        out: dict[str, Any] = {"record_version": 1, "lock_key": lock_key, **identity.as_dict(),
                               "lease_id": rec["lease_id"]}
        if "owner_principal_id" in rec:  # a full record (not an index entry alone)
            out["owner_principal_id"] = rec["owner_principal_id"]
            out["owner_credential_id"] = rec["owner_credential_id"]
            out["service_instance_id"] = rec["service_instance_id"]
            for name in _OPTIONAL_TEXT:
                out[name] = rec[name] or None
            for name in _INT_FIELDS:
                out[name] = int(rec[name])
            for name in _TIME_FIELDS:
                if name in rec:
                    ms = int(rec[name])
                    out[name] = rfc3339_ms(ms)
                    out[name + "_ms"] = ms
            out["request_id"] = rec["request_id"]
            out["metadata"] = orjson.loads(rec["metadata"])
            for name in ("end_reason", "ended_by", "admin_reason", "incident_id"):
                if name in rec:
                    out[name] = rec[name]
    except (KeyError, ValueError, TypeError):
        raise corrupt() from None
    if state not in ("active", "expired", "released", "revoked"):
        raise corrupt()
    out["state"] = state
    return out


class LeaseService:
    """The operations of one server instance over the shared Valkey."""

    def __init__(self, settings: Settings, backend: Backend, gate: RecoveryGate | None = None):
        self.settings = settings
        self.backend = backend
        self.gate = gate or RecoveryGate(active=False)
        self.rate_target = TokenBuckets(settings.rate_per_principal_target, settings.burst_per_principal_target)
        self.rate_principal = TokenBuckets(settings.rate_per_principal, settings.burst_per_principal)
        self.waiters = 0
        self.waiters_by: collections.Counter = collections.Counter()  # ("tenant"|"principal", id) -> waiting

    # -- shared steps ------------------------------------------------------------
    def call_deadline(self, deadline_ms: int) -> float:
        """The event-loop time by which the backend must answer; 408 when already past (C23)."""
        remaining = deadline_ms - now_ms()
        if remaining <= 0:
            raise LeaseError("deadline_exceeded", "deadline_at has passed; the request was not started",
                             backend_health="not_contacted")
        remaining = min(remaining, self.settings.max_backend_timeout_ms)
        return asyncio.get_running_loop().time() + remaining / 1000

    def check_rate(self, principal: Principal, lock_key: str) -> None:
        """429 when the per-(principal, identity) or per-principal bucket is empty (section 10)."""
        wait = self.rate_target.take((principal.principal_id, lock_key))
        if not wait:
            wait = self.rate_principal.take(principal.principal_id)
        if wait:
            raise LeaseError("lease_rate_limited", "too many acquire/renew requests; slow down",
                             retry_after_ms=max(1, int(wait * 1000 + 0.999)), backend_health="not_contacted")

    async def run(self, name: str, key_list: list[str], args: list[Any], deadline: float, *, mutation: bool,
                  incarnation: str = "") -> list:
        """One script call, backend failures mapped to the contract's codes (C19, C23).

        A mutation passes `incarnation` (the gate's expected run_id, '' without the recovery rule): the
        call is written only on a connection to that Valkey incarnation, else answered `recovering`.
        """
        try:
            return await self.backend.run(name, key_list, args, deadline, incarnation=incarnation)
        except NotStarted:
            raise LeaseError("deadline_exceeded", "the deadline passed before the request reached the lease store",
                             backend_health="not_contacted") from None
        except BackendUnavailable:
            raise LeaseError("lease_backend_unavailable", "the lease store is unavailable; nothing was changed",
                             retry_after_ms=200, backend_health="unavailable",
                             submitted=False) from None
        except OutcomeUnknown:
            if mutation:
                raise LeaseError("lease_outcome_unknown",
                                 "no reply from the lease store before the deadline; the outcome is unknown: "
                                 "retry with the same request_id to settle it", retry_after_ms=100,
                                 backend_health="unknown") from None
            raise LeaseError("lease_backend_unavailable", "no reply from the lease store before the deadline",
                             retry_after_ms=100, backend_health="unknown") from None
        except BackendFault:
            raise LeaseError("lease_backend_unavailable", "the lease store refused the operation; nothing is assumed",
                             retryable=False, backend_health="fault") from None

    def common_failure(self, res: list, expected_run_id: str = "") -> LeaseError | None:
        """The error for a script answer shared by every mutation, else None."""
        status = res[0]
        if status == "recovering":
            self.gate.refused(expected_run_id)
            return recovering()
        if status == "idempotency_conflict":
            return LeaseError("idempotency_conflict",
                              "request_id was already used for this operation with a different body")
        if status == "corrupt":
            return corrupt()
        return None

    def replayed(self, res: list, identity: Identity) -> Outcome:
        """The original result of an idempotent retry, with the lease's current state (C17, C18)."""
        _, now, state, code, flat = res[:5]
        lease = lease_view(flat, state, identity)
        return Outcome(code, lease, {"replayed": True, "backend_time_ms": int(now)},
                       {"backend_time_ms": int(now), "replayed": True, "resulting_state": state,
                        "lease_id": lease["lease_id"], "fencing_token": lease.get("fencing_token")})

    # -- mutations ------------------------------------------------------------------
    async def acquire(self, principal: Principal, req: MutationRequest) -> Outcome:
        """acquire-if-free (C11), non-blocking unless `wait_ms` asks for a bounded retry (C22)."""
        s = self.settings
        lock_key = req.identity.lock_key()
        lease_id = str(uuid.uuid4())
        key_list = [lock_key, keys.fence_key(lock_key), keys.history_key(lock_key),
                    keys.idempotency_key("acquire", lock_key, principal.principal_id, req.request_id),
                    keys.lease_index_key(lease_id), keys.ACTIVE_INDEX, keys.quota_key(principal.principal_id)]
        f = req.fields
        expected = self.gate.expected_run_id()
        args = [req.identity.canonical_json(), req.digest, lease_id, principal.principal_id, f["client_id"],
                principal.credential_id, req.service_instance_id, f["ttl_ms"], f["maximum_lifetime_ms"],
                f["execution_id"], f["job_id"], f["trace_id"], req.request_id, req.metadata_json,
                s.idempotency_ttl_ms, self.gate.ceiling(s.fence_max), s.active_lease_quota, s.history_max_entries,
                s.history_retention_ms, s.expired_record_retention_ms, self.gate.floor]
        res = await self.run("acquire", key_list, args, self.call_deadline(req.deadline_ms), mutation=True,
                             incarnation=expected)
        if res[0] == "lease_conflict" and f["wait_ms"]:
            res = await self._wait_and_retry(res, key_list, args, req, principal, expected)
        status = res[0]
        audit = {"requested_ttl_ms": f["ttl_ms"]}
        if status == "lease_acquired":
            lease = lease_view(res[2], "active", req.identity)
            audit.update(backend_time_ms=int(res[1]), lease_id=lease["lease_id"], fencing_token=lease["fencing_token"],
                         effective_ttl_ms=lease["ttl_ms"], previous_state="none", resulting_state="active")
            return Outcome("lease_acquired", lease, {"backend_time_ms": int(res[1])}, audit)
        if status == "replayed":
            out = self.replayed(res, req.identity)
            out.audit.update(audit)
            return out
        if status == "fence_exhausted" and self.gate.ceiling(s.fence_max) < s.fence_max:
            raise LeaseError("lease_backend_unavailable",
                             "the fencing counter of this identity reached the end of its recovery epoch; "
                             "acquisition refused until the next recovery epoch", retryable=False,
                             backend_health="fence_exhausted")
        if status == "lease_conflict":
            raise LeaseError("lease_conflict", "another lease holds this identity",
                             retry_after_ms=max(1, min(int(res[2]), s.max_ttl_ms)))
        if status == "fence_exhausted":
            raise LeaseError("lease_backend_unavailable",
                             "the fencing counter of this identity is at its limit; acquisition refused",
                             retryable=False, backend_health="fence_exhausted")
        if status == "quota_exceeded":
            raise LeaseError("lease_rate_limited", "the active lease quota of this principal is reached",
                             retry_after_ms=max(1, int(res[2])), backend_health="ok")
        raise self.common_failure(res, expected) or corrupt()

    def _take_waiter(self, principal: Principal, req: MutationRequest) -> tuple | None:
        """A waiting slot, or None when the instance, this tenant or this principal has used its share."""
        s = self.settings
        shares = (("tenant", req.identity.tenant_id), s.max_waiters_per_tenant), \
                 (("principal", principal.principal_id), s.max_waiters_per_principal)
        if self.waiters >= s.max_waiters or any(self.waiters_by[key] >= cap for key, cap in shares):
            return None
        self.waiters += 1
        for key, _ in shares:
            self.waiters_by[key] += 1
        return tuple(key for key, _ in shares)

    def _give_waiter(self, slot: tuple) -> None:
        self.waiters -= 1
        for key in slot:
            self.waiters_by[key] -= 1
            if not self.waiters_by[key]:
                del self.waiters_by[key]

    async def _wait_and_retry(self, res: list, key_list: list[str], args: list[Any], req: MutationRequest,
                              principal: Principal, expected: str) -> list:
        """Retry a conflicting acquire with jittered backoff within wait_ms and the deadline (C22).

        Waiting slots are shared out: one tenant or one principal cannot hold
        them all (a caller over its share gets the plain conflict at once).
        """
        s = self.settings
        loop = asyncio.get_running_loop()
        wait_until = loop.time() + req.fields["wait_ms"] / 1000
        slot = self._take_waiter(principal, req)
        if slot is None:
            return res
        try:
            attempt = 0
            while res[0] == "lease_conflict":
                backoff = min(s.acquire_retry_max_ms, s.acquire_retry_base_ms * 2 ** attempt) / 1000
                attempt += 1
                delay = min(backoff / 2 + random.uniform(0, backoff / 2), int(res[2]) / 1000 + random.uniform(0, 0.005))
                left = min(wait_until - loop.time(), (req.deadline_ms - now_ms()) / 1000 - 0.005)
                if left <= delay:
                    return res
                await asyncio.sleep(delay)
                res = await self.run("acquire", key_list, args, self.call_deadline(req.deadline_ms), mutation=True,
                                     incarnation=expected)
            return res
        finally:
            self._give_waiter(slot)

    async def renew(self, principal: Principal, req: MutationRequest) -> Outcome:
        """renew-if-owner (C12)."""
        s = self.settings
        lock_key = req.identity.lock_key()
        ttl = req.fields.get("ttl_ms")
        expected = self.gate.expected_run_id()
        key_list = [lock_key, keys.idempotency_key("renew", lock_key, principal.principal_id, req.request_id),
                    keys.lease_index_key(req.lease_id), keys.quota_key(principal.principal_id)]
        args = [req.identity.canonical_json(), req.digest, req.lease_id, principal.principal_id,
                req.service_instance_id, req.fields["fencing_token"], "" if ttl is None else ttl,
                s.idempotency_ttl_ms, s.expired_record_retention_ms, s.active_lease_quota]
        res = await self.run("renew", key_list, args, self.call_deadline(req.deadline_ms), mutation=True,
                             incarnation=expected)
        return self._owner_result(res, req, "lease_renewed", "active", {"requested_ttl_ms": ttl}, expected)

    async def release(self, principal: Principal, req: MutationRequest) -> Outcome:
        """release-if-owner (C13)."""
        s = self.settings
        expected = self.gate.expected_run_id()
        lock_key = req.identity.lock_key()
        key_list = [lock_key, keys.idempotency_key("release", lock_key, principal.principal_id, req.request_id),
                    keys.lease_index_key(req.lease_id), keys.history_key(lock_key), keys.ACTIVE_INDEX,
                    keys.quota_key(principal.principal_id)]
        args = [req.identity.canonical_json(), req.digest, req.lease_id, principal.principal_id,
                req.service_instance_id, req.fields["fencing_token"], s.idempotency_ttl_ms, s.history_max_entries,
                s.history_retention_ms]
        res = await self.run("release", key_list, args, self.call_deadline(req.deadline_ms), mutation=True,
                             incarnation=expected)
        return self._owner_result(res, req, "lease_released", "released", {}, expected)

    async def end_by_admin(self, principal: Principal, req: MutationRequest, event_type: str,
                           event_json: bytes) -> Outcome:
        """force-release or revoke of the observed lease (C15); the script appends the audit event."""
        s = self.settings
        expected = self.gate.expected_run_id()
        lock_key = req.identity.lock_key()
        key_list = [lock_key, keys.idempotency_key(req.op, lock_key, principal.principal_id, req.request_id),
                    keys.lease_index_key(req.lease_id), keys.history_key(lock_key), keys.ACTIVE_INDEX,
                    keys.AUDIT_STREAM]
        args = [req.identity.canonical_json(), req.digest, req.lease_id, principal.principal_id,
                req.fields["fencing_token"], req.fields["reason"], req.fields.get("incident_id", ""),
                s.idempotency_ttl_ms, s.history_max_entries, s.history_retention_ms, s.audit_stream_maxlen,
                event_type, event_json]
        res = await self.run(req.op, key_list, args, self.call_deadline(req.deadline_ms), mutation=True,
                             incarnation=expected)
        code = "lease_revoked" if req.op == "revoke" else "lease_released"
        return self._owner_result(res, req, code, "revoked" if req.op == "revoke" else "released", {}, expected)

    def _owner_result(self, res: list, req: MutationRequest, code: str, state: str, audit: dict,
                      expected: str) -> Outcome:
        """Map a renew/release/admin script answer."""
        status = res[0]
        if status == code:
            lease = lease_view(res[2], state, req.identity)
            audit.update(backend_time_ms=int(res[1]), lease_id=lease["lease_id"], fencing_token=lease["fencing_token"],
                         effective_ttl_ms=lease["ttl_ms"], previous_state="active", resulting_state=state)
            return Outcome(code, lease, {"backend_time_ms": int(res[1])}, audit)
        if status == "replayed":
            out = self.replayed(res, req.identity)
            out.audit.update(audit)
            return out
        if status == "lease_lost":
            raise lease_lost(res[2])
        raise self.common_failure(res, expected) or corrupt()

    # -- reads ------------------------------------------------------------------------
    async def inspect_identity(self, identity: Identity, deadline_ms: int) -> Outcome:
        """The current (or latest terminal) lease of an identity the caller may see (C14)."""
        lock_key = identity.lock_key()
        res = await self.run("inspect", [lock_key, keys.history_key(lock_key)], [identity.canonical_json()],
                             self.call_deadline(deadline_ms), mutation=False)
        if res[0] == "not_found":
            raise LeaseError("lease_not_found", "no lease is recorded for this identity")
        if res[0] != "found":
            raise self.common_failure(res) or corrupt()
        lease = lease_view(res[3], res[2], identity)
        return Outcome("lease_inspected", lease, {"backend_time_ms": int(res[1])},
                       {"backend_time_ms": int(res[1]), "lease_id": lease["lease_id"],
                        "fencing_token": lease.get("fencing_token"), "resulting_state": lease["state"]})

    async def inspect_lease(self, principal: Principal, lease_id: str, deadline_ms: int) -> Outcome:
        """A lease by id; out-of-scope and unknown ids are the same 404 (C14)."""
        res = await self.run("inspect_id", [keys.lease_index_key(lease_id)], [lease_id],
                             self.call_deadline(deadline_ms), mutation=False)
        if res[0] == "not_found":
            raise LeaseError("lease_not_found", "no such lease")
        if res[0] != "found":
            raise self.common_failure(res) or corrupt()
        lease = lease_view(res[3], res[2])
        ident = Identity(*(lease[name] for name in Identity._fields))
        if not principal.allows(ident):
            raise LeaseError("lease_not_found", "no such lease")
        return Outcome("lease_inspected", lease, {"backend_time_ms": int(res[1])},
                       {"backend_time_ms": int(res[1]), "lease_id": lease_id,
                        "fencing_token": lease.get("fencing_token"), "resulting_state": lease["state"],
                        **ident.as_dict()})

    async def list_leases(self, principal: Principal, filters: dict[str, str], limit: int, after: str,
                          deadline_ms: int) -> Outcome:
        """Active leases in scope, ordered by lock key, one bounded page (C14)."""
        s = self.settings
        deadline = self.call_deadline(deadline_ms)
        leases: list[dict[str, Any]] = []
        examined = 0
        next_key: str | None = None
        now = 0
        while True:
            count = min(200, s.list_scan_budget - examined)
            res = await self.run("list", [keys.ACTIVE_INDEX], [after, count], deadline, mutation=False)
            if res[0] != "listed":
                raise self.common_failure(res) or corrupt()
            now, last, seen = int(res[1]), res[2], int(res[3])
            examined += seen
            for flat in res[4:]:
                try:
                    lease = lease_view(flat, "active")
                except LeaseError:
                    continue  # a corrupt record is never shown as a lease
                if not self._listed(principal, lease, filters):
                    continue
                leases.append(lease)
                if len(leases) == limit:
                    break
            if len(leases) == limit:
                next_key = leases[-1]["lock_key"]
                break
            if seen < count:
                break  # the index is exhausted
            after = last
            if examined >= s.list_scan_budget:
                next_key = last
                break
        cursor = None if next_key is None else "c1." + next_key[len(KEY_PREFIX):]
        return Outcome("lease_listed", None, {"leases": leases, "next_cursor": cursor, "backend_time_ms": now},
                       {"backend_time_ms": now})

    @staticmethod
    def _listed(principal: Principal, lease: dict[str, Any], filters: dict[str, str]) -> bool:
        """In the caller's scope and matching every filter?"""
        ident = Identity(*(lease[name] for name in Identity._fields))
        if not principal.allows(ident):
            return False
        if "owner" in filters and lease.get("owner_principal_id") != filters["owner"]:
            return False
        if "program" in filters and ident.program_id != filters["program"]:
            return False
        if "target" in filters and ident.target_id != filters["target"]:
            return False
        return True


_LOST_MSG = {
    "expired": "the lease has expired",
    "token_mismatch": "the fencing token does not match the lease",
}


def lease_lost(problem: str) -> LeaseError:
    """409 lease_lost; the message never describes another owner's lease."""
    return LeaseError("lease_lost", _LOST_MSG.get(problem, "the lease is not held by this caller "
                                                           "(released, revoked, expired or superseded)"))
