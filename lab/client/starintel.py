"""A client for the StarIntel server's own lease HTTP dialect, with the contract's typed results.

The StarIntel server (`/work/shared/spec/starintel-http-dialect.md`) runs the
same operations as the contract under a different wire shape. This adapter
speaks that shape and hands the lab the same `Result` / `Lease` values as
`LeaseClient`, so every workload and checker runs unchanged:

- routes: release is `DELETE /api/v1/target-leases/{lease_id}` with a JSON
  body; there is no inspect-by-identity (emulated with the list route and a
  filter on the full identity), no force-release and no fenced commit (the
  capability set is `{"revoke"}`);
- credentials `star_sk_v1_<credential-id>_<hex-secret>` (checked eagerly);
  `request_id` in the body and the same value as `Idempotency-Key`; the
  deadline travels as `X-Request-Timeout-Ms` (the server's only deadline input);
- bare codes under their own statuses (`acquired` 201, `stale_token` and
  `expired` 412, `deadline_exceeded` 504, ...) mapped to the contract's codes
  (`DIALECT_CODES`), lease records with a nested `identity` and Unix-ms times
  flattened into `Lease`.

The definite / indefinite split for this dialect: a code is `fail` only when
the server decided it before any mutation (validation, auth, conflict,
ownership, token, expiry, rate limit) and only under the status the dialect
gives it. `outcome_unknown` is `info`; `backend_unavailable` is `info` (the
server turns any internal error into it, also after the backend ran); a 504
`deadline_exceeded` is `info` for a mutation because the server reports a
backend timeout after submission with the same code (it is `fail` for a read,
which changes nothing). Transport failures follow `LeaseClient`.

Every difference from the contract is a `Finding` (`FINDINGS`, the static
list) and is reported with an example the first time a run meets it
(`StarIntelClient.findings`, a `lab.findings.FindingsLog`).
"""

from __future__ import annotations

import builtins
import re
from typing import Any, Mapping
from urllib.parse import unquote

import httpx

from lab.client import results as R
from lab.client.lease import (API, DEFAULT_MAX_CONNECTIONS, DEFAULT_TIMEOUT_S, LeaseClient, _dumps, _seg,
                              new_request_id, now_ms)
from lab.client.results import IDENTITY_FIELDS, Call, Identity, Lease, LeaseProtocolError, Result
from lab.findings import Finding, FindingsLog, static_records

UNSUPPORTED = "unsupported"  # fail: the dialect has no such operation, nothing was sent
CAPABILITIES = frozenset({"revoke"})
API_KEY_RE = re.compile(r"^star_sk_v1_([^_\s]+)_([0-9A-Fa-f]+)$")
LIST_FILTERS = ("owner_principal_id", "target_id", "program_id", "dataset_id")
MUTATIONS = frozenset({"acquire", "renew", "release", "revoke"})
READS = frozenset({"inspect", "list"})

# dialect code -> (contract code, the dialect's HTTP status, the contract's HTTP status or None)
DIALECT_CODES: dict[str, tuple[str, int, int | None]] = {
    "acquired": ("lease_acquired", 201, 200),
    "renewed": ("lease_renewed", 200, 200),
    "released": ("lease_released", 200, 200),
    "found": ("lease_inspected", 200, 200),
    "listed": ("lease_listed", 200, 200),
    "revoked": ("lease_revoked", 200, 200),
    "invalid_request": ("invalid_lease_request", 400, 400),
    "invalid_lease_request": ("invalid_lease_request", 400, 400),  # the HTTP boundary's own validation
    "idempotency_key_mismatch": ("invalid_lease_request", 400, 400),
    "idempotency_key_required": ("invalid_lease_request", 400, 400),
    "missing_query_parameter": ("invalid_lease_request", 400, 400),
    "unauthenticated": ("invalid_credential", 401, 401),
    "invalid_credential": ("invalid_credential", 401, 401),  # the authentication middleware's code
    "unauthorized": ("access_denied", 403, 403),
    "access_denied": ("access_denied", 403, 403),
    "not_found": ("lease_not_found", 404, 404),
    "conflict": ("lease_conflict", 409, 409),
    "idempotency_conflict": ("idempotency_conflict", 409, 409),
    "not_owner": ("lease_lost", 409, 409),
    "stale_token": ("lease_lost", 412, 409),
    "expired": ("lease_lost", 412, 409),
    "rate_limited": ("lease_rate_limited", 429, 429),
    "backend_unavailable": ("lease_backend_unavailable", 503, 503),
    "outcome_unknown": ("lease_outcome_unknown", 503, 503),
    "deadline_exceeded": ("deadline_exceeded", 504, 408),
    "request_timeout": (R.TIMEOUT, 504, None),  # the HTTP boundary's own timeout
    "internal_error": (R.UNEXPECTED_RESPONSE, 500, None),
}
SUCCESS = frozenset({"acquired", "renewed", "released", "found", "listed", "revoked"})
# decided before any mutation: definitely did not happen (under the dialect's own status)
DEFINITE = frozenset({"invalid_request", "invalid_lease_request", "idempotency_key_mismatch",
                      "idempotency_key_required", "missing_query_parameter", "unauthenticated",
                      "invalid_credential", "unauthorized", "access_denied", "not_found", "conflict",
                      "idempotency_conflict", "not_owner", "stale_token", "expired", "rate_limited"})
# may have happened when the call was a mutation; a read changes nothing, so there they are `fail`
AMBIGUOUS_FOR_MUTATIONS = frozenset({"deadline_exceeded", "request_timeout", "internal_error"})


def _f(finding_id: str, rule: str, contract: str, dialect: str) -> Finding:
    """One catalogue entry (short name: the catalogue below is long)."""
    return Finding(finding_id, rule, contract, dialect)


_STATIC = [
    _f("route.release", "section 13", "release is POST /api/v1/target-leases/{lease_id}/release",
       "release is DELETE /api/v1/target-leases/{lease_id} with a JSON body (proxies may drop a DELETE body)"),
    _f("route.inspect-by-identity", "C14, section 13",
       "GET /api/v1/target-leases?<identity fields> returns the identity's active lease",
       "no lookup by identity: GET /{lease_id} needs the lease id plus the identity as query parameters; "
       "the adapter lists with target_id/program_id filters and picks the active record of the exact identity"),
    _f("route.force-release", "C15, section 13", "POST /api/v1/target-leases/{lease_id}/force-release",
       "no force-release route (only revoke): capability off"),
    _f("route.commit", "section 7 (C24-C29), section 13",
       "POST /api/v1/commits: the fenced-write boundary checks lease, token high-water mark and expiry",
       "no fenced commit route: capability off; workloads that commit refuse to run"),
    _f("route.pagination", "C14", "list has opaque bounded pagination (limit, cursor) and a max page size",
       "list has no limit or cursor: one unbounded page"),
    _f("codes.bare", "section 9", "codes are lease_acquired, lease_conflict, lease_lost, ... (lease_ prefix)",
       "codes are bare outcome names: acquired, conflict, not_owner, stale_token, expired, ..."),
    _f("deadline.header", "C22, section 13",
       "every mutation body carries deadline_at (absolute, required, finite)",
       "the only deadline input is the optional relative X-Request-Timeout-Ms header, in whole seconds; "
       "a missing or out-of-range value silently becomes the server's default"),
    _f("deadline.ambiguous", "C23, section 9",
       "deadline_exceeded (408) means the call was not started: definitely nothing happened",
       "deadline_exceeded (504) also reports a backend timeout after submission: "
       "the adapter classifies it info for mutations"),
    _f("backend-unavailable.catch-all", "C19, section 8",
       "backend_unavailable: no assumed success; a timeout after submission is outcome_unknown",
       "any error inside the lease service (also after the backend ran) is answered backend_unavailable "
       "(503): the adapter classifies it info"),
    _f("envelope.retry", "section 9", "error envelopes carry retryable and retry_after_ms",
       "error envelopes have neither retryable nor retry_after_ms"),
    _f("record.shape", "section 2",
       "the record is flat: the 7 identity fields, lock_key, record_version, owner_client_id, "
       "owner_credential_id, service_instance_id, request_id, ...",
       "identity nested under `identity`; no lock_key, record_version, owner_client_id, owner_credential_id, "
       "service_instance_id or request_id (plus dataset_id)"),
    _f("record.times", "section 13", "times in responses are RFC 3339 UTC with milliseconds",
       "times are integer Unix milliseconds"),
    _f("owner.server-instance", "C12, C13, section 13",
       "the owner is the principal plus the caller's service_instance_id: any instance can serve any lease",
       "service_instance_id is the server's own: a renew or release sent to another instance is not_owner"),
    _f("renew.default-ttl", "C12", "renew moves expires_at to min(now + the lease's ttl, lifetime bound)",
       "a renew without ttl_ms uses the server's default TTL (30 s), not the lease's: "
       "the adapter always sends the lease's ttl_ms"),
    _f("mutation.not-found", "section 9", "404 lease_not_found is for inspect/list only; a lost lease is lease_lost",
       "renew/release/revoke of an identity with no current lease answer 404 not_found "
       "(the adapter maps it to lease_lost, a definite fail)"),
    _f("idempotency.header", "C16, section 13", "request_id in the body; a bad request is invalid_lease_request",
       "request_id or Idempotency-Key header; both and different: 400 idempotency_key_mismatch, "
       "neither: 400 idempotency_key_required"),
]
_STATIC += [
    _f(f"code.{code}", "section 9", f"{contract} (HTTP {cstatus})" if cstatus else "not a contract code",
       f"{code} (HTTP {dstatus})")
    for code, (contract, dstatus, cstatus) in DIALECT_CODES.items()
    if dstatus != cstatus or contract not in (code, "lease_" + code)  # a plain lease_ prefix is codes.bare
]
_STATIC += [
    _f("status.unexpected", "section 9", "each code comes with the one status its table gives it",
       "a code under another status than the dialect's own table (classified info)"),
    _f("code.unknown", "section 9", "codes come from section 9's closed table", "a code outside the dialect's table"),
]
FINDINGS: dict[str, Finding] = {f.id: f for f in _STATIC}


def static_findings() -> list[dict[str, Any]]:
    """Every known difference between this dialect and the contract (observed: None)."""
    return static_records(FINDINGS)


def new_findings_log(path=None) -> FindingsLog:
    """A findings log for StarIntel runs (written to `path`, a run's findings.jsonl, when given)."""
    return FindingsLog(FINDINGS, path)


def check_api_key(api_key: Any) -> str:
    """The credential id of a well-formed `star_sk_v1_<credential-id>_<hex-secret>` key, or a clear error."""
    if not isinstance(api_key, str) or not api_key:
        raise ValueError("the StarIntel API key must be a non-empty string")
    m = API_KEY_RE.match(api_key)
    if m is None or len(m.group(2)) % 2:
        # never echo the key: it is a secret
        raise ValueError("a StarIntel API key has the form star_sk_v1_<credential-id>_<hex-secret> "
                         "(credential id without '_', an even number of hex digits)")
    return m.group(1)


def lease_from_starintel(d: Any) -> Lease:
    """A `Lease` from the dialect's record: the nested identity flattened, Unix-ms times kept as they are."""
    if not isinstance(d, dict):
        raise LeaseProtocolError(f"lease record is not an object: {d!r:.100}")
    flat = {k: v for k, v in d.items() if k != "identity"}
    ident = d.get("identity")
    if isinstance(ident, dict):
        for name in IDENTITY_FIELDS:
            if name in ident:
                flat.setdefault(name, ident[name])
    elif ident is not None:
        raise LeaseProtocolError(f"lease identity is not an object: {ident!r:.100}")
    return Lease.from_wire(flat)


def classify_starintel(op: str, http_status: int, envelope: Any, *,
                       backend_unavailable_is_definite: bool = False) -> tuple[R.Outcome, str]:
    """Outcome and contract code for a decoded dialect reply (see the module docstring)."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("code"), str):
        return "info", R.BAD_RESPONSE
    code, status = envelope["code"], envelope.get("status")
    known = DIALECT_CODES.get(code)
    if known is None:
        return ("fail" if op in READS and http_status >= 400 else "info"), code
    contract_code, dialect_status, _ = known
    if http_status != dialect_status:
        return "info", contract_code
    if code in SUCCESS:
        return ("ok", contract_code) if status == "success" else ("info", contract_code)
    if status != "error":
        return "info", contract_code
    if code in DEFINITE:
        if code == "not_found" and op in MUTATIONS:
            return "fail", "lease_lost"  # the service's preflight read found no current lease: nothing mutated
        return "fail", contract_code
    if code == "backend_unavailable":
        definite = backend_unavailable_is_definite or envelope.get("submitted") is False
        return ("fail" if definite else "info"), contract_code
    if code in AMBIGUOUS_FOR_MUTATIONS:
        return ("info" if op in MUTATIONS else "fail"), contract_code
    return "info", contract_code  # outcome_unknown


class StarIntelClient(LeaseClient):
    """One principal's client for one StarIntel server, returning the lab's typed results.

    Reuses `LeaseClient`'s connection pools, deadlines and `resolve`; sends the
    dialect's requests and decodes its replies. `findings` collects every
    difference from the contract met on the wire (share one log per run).
    """

    capabilities = CAPABILITIES

    def __init__(self, base_url: str, api_key: str, *, service_instance_id: str,
                 timeout_s: float = DEFAULT_TIMEOUT_S, http: httpx.AsyncClient | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, backend_unavailable_is_definite: bool = False,
                 clock_ms=now_ms, findings: FindingsLog | None = None, transport: str = "auto"):
        self.credential_id = check_api_key(api_key)
        super().__init__(base_url, api_key, service_instance_id=service_instance_id, timeout_s=timeout_s,
                         http=http, max_connections=max_connections,
                         backend_unavailable_is_definite=backend_unavailable_is_definite, clock_ms=clock_ms,
                         transport=transport)
        self.findings = findings if findings is not None else new_findings_log()

    # -- mutations -----------------------------------------------------------
    async def acquire(self, identity: Identity, *, ttl_ms: int, request_id: str | None = None,
                      deadline_s: float | None = None, deadline_at_ms: int | None = None,
                      maximum_lifetime_ms: int | None = None, metadata: Mapping[str, Any] | None = None,
                      dataset_id: str | None = None) -> Result:
        """Acquire-if-free: `POST /acquire` (201 acquired)."""
        body = self._body(identity, request_id)
        body["ttl_ms"] = _positive("ttl_ms", ttl_ms)
        if maximum_lifetime_ms is not None:
            body["maximum_lifetime_ms"] = _positive("maximum_lifetime_ms", maximum_lifetime_ms)
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise TypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
            body["metadata"] = dict(metadata)
        if dataset_id is not None:
            body["dataset_id"] = _text("dataset_id", dataset_id)
        result = await self._send(Call("acquire", "POST", API + "/acquire", body),
                                  self._deadline(deadline_s, deadline_at_ms))
        if result.ok:
            self.findings.remember_acquired(result.lease.lease_id, self.base_url)
        return result

    async def renew(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                    deadline_s: float | None = None, deadline_at_ms: int | None = None,
                    ttl_ms: int | None = None) -> Result:
        """Renew-if-owner: `POST /{lease_id}/renew`, always with a ttl_ms (the lease's when not given)."""
        body = self._lease_body(lease, identity, request_id)
        ttl = ttl_ms if ttl_ms is not None else lease.ttl_ms
        if ttl is not None:  # without it the server applies its own default TTL, not the lease's
            body["ttl_ms"] = _positive("ttl_ms", ttl)
        call = Call("renew", "POST", f"{API}/{_seg(lease.lease_id)}/renew", body)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def release(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                      deadline_s: float | None = None, deadline_at_ms: int | None = None) -> Result:
        """Release-if-owner: `DELETE /{lease_id}` with the lease body."""
        body = self._lease_body(lease, identity, request_id)
        self.findings.observe("route.release", f"release of {lease.lease_id} sent as DELETE {API}/{{lease_id}}")
        call = Call("release", "DELETE", f"{API}/{_seg(lease.lease_id)}", body)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def revoke(self, lease: Lease, reason: str, *, incident_id: str | None = None,
                     identity: Identity | None = None, request_id: str | None = None,
                     deadline_s: float | None = None, deadline_at_ms: int | None = None) -> Result:
        """Admin revoke of the observed lease: `POST /{lease_id}/revoke` with a reason (no incident id field)."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("revoke needs a non-empty reason")
        body = self._lease_body(lease, identity, request_id)
        body["reason"] = reason if incident_id is None else f"{reason} (incident {incident_id})"
        call = Call("revoke", "POST", f"{API}/{_seg(lease.lease_id)}/revoke", body)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def force_release(self, lease: Lease, reason: str, **kw: Any) -> Result:
        """Not in this dialect: a definite `fail unsupported` (nothing is sent)."""
        return self._unsupported("force_release", "route.force-release")

    async def commit(self, lease: Lease, doc: str, body: Any, **kw: Any) -> Result:
        """Not in this dialect (no fenced-write route): a definite `fail unsupported` (nothing is sent)."""
        return self._unsupported("commit", "route.commit")

    # -- reads ---------------------------------------------------------------
    async def inspect(self, target: str | Identity | Lease, *, identity: Identity | None = None,
                      deadline_s: float | None = None, deadline_at_ms: int | None = None) -> Result:
        """The lease with this id (its identity is required), or the active lease of this identity (via list)."""
        deadline = self._deadline(deadline_s, deadline_at_ms)
        if isinstance(target, Identity):
            return await self._inspect_identity(target, deadline)
        if isinstance(target, Lease):
            target, identity = target.lease_id, identity or target.identity
        if not isinstance(target, str) or not target:
            raise TypeError(f"inspect needs a lease_id string, a Lease or an Identity, not {target!r}")
        if identity is None:
            raise ValueError("the StarIntel dialect inspects a lease id only together with its identity: "
                             "pass identity=...")
        call = Call("inspect", "GET", f"{API}/{_seg(target)}", params=identity.as_dict())
        return await self._send(call, deadline)

    async def list(self, filters: Mapping[str, str] | None = None, *, limit: int | None = None,
                   cursor: str | None = None, deadline_s: float | None = None,
                   deadline_at_ms: int | None = None) -> Result:
        """All leases in the caller's scope matching the filters (the dialect has no pagination)."""
        if limit is not None or cursor is not None:
            raise ValueError("the StarIntel dialect has no pagination: drop limit and cursor")
        params: dict[str, str] = {}
        for key, value in (filters or {}).items():
            if key not in LIST_FILTERS:
                raise ValueError(f"unknown list filter {key!r}; the dialect filters by {', '.join(LIST_FILTERS)}")
            params[key] = _text(key, value)
        return await self._send(Call("list", "GET", API, params=params), self._deadline(deadline_s, deadline_at_ms))

    async def _inspect_identity(self, identity: Identity, deadline_at_ms: int) -> Result:
        """Inspect by identity, emulated: list by target and program, keep the exact identity's active lease."""
        self.findings.observe("route.inspect-by-identity",
                              f"inspect of {identity.target_id} emulated with GET {API}?target_id=&program_id=")
        call = Call("inspect", "GET", API, params={"target_id": identity.target_id,
                                                   "program_id": identity.program_id})
        result = await self._send(call, deadline_at_ms)
        if not result.ok:
            return result
        mine = [x for x in result.leases or [] if _same_identity(x, identity) and x.state == "active"]
        result.leases = None
        if not mine:
            result.outcome, result.code = "fail", "lease_not_found"
            result.msg = "no active lease for this identity in the listed records"
            return result
        result.lease = max(mine, key=lambda x: x.fencing_token)
        result.code = "lease_inspected"
        return result

    # -- internals -------------------------------------------------------------
    def _body(self, identity: Identity, request_id: str | None) -> dict[str, Any]:
        """Identity fields plus request_id (the dialect takes no deadline or service instance in the body)."""
        if not isinstance(identity, Identity):
            raise TypeError(f"identity must be an Identity, not {type(identity).__name__}")
        body: dict[str, Any] = identity.as_dict()
        body["request_id"] = request_id if request_id is not None else _new_request_id()
        if not isinstance(body["request_id"], str) or not body["request_id"]:
            raise ValueError(f"request_id must be a non-empty string, not {request_id!r}")
        return body

    def _unsupported(self, op: str, finding: str) -> Result:
        """A definite failure for an operation the dialect does not have."""
        self.findings.observe(finding, f"the workload called {op}; the dialect has no route for it")
        return Result("fail", UNSUPPORTED, msg=f"the StarIntel dialect has no {op}: nothing was sent")

    def _prepare(self, call: Call, deadline_at_ms: int, remaining_ms: int) -> tuple[Any, Any, Any]:
        """This dialect takes the deadline as X-Request-Timeout-Ms and the request_id also as Idempotency-Key."""
        headers = list(self._headers)
        headers.append(("x-request-timeout-ms", str(remaining_ms)))
        if call.body is not None:
            headers.append(("idempotency-key", call.body["request_id"]))
            return _dumps(call.body), None, headers
        return None, dict(call.params or {}), headers

    def _decode(self, call: Call, resp: Any) -> Result:
        """The typed Result for a complete dialect reply, noting every difference from the contract."""
        status = resp.status_code
        envelope = self._envelope(call, resp)
        if isinstance(envelope, Result):
            return envelope
        outcome, code = classify_starintel(call.op, status, envelope,
                                           backend_unavailable_is_definite=self.backend_unavailable_is_definite)
        self._note_reply(call, status, envelope)
        result = Result(outcome, code, http_status=status, call=call, data=envelope, msg=envelope.get("msg"),
                        retryable=envelope.get("retryable"), retry_after_ms=envelope.get("retry_after_ms"),
                        correlation_id=envelope.get("correlation_id") or resp.headers.get("x-correlation-id"))
        try:
            if envelope.get("lease") is not None:
                self._note_record(envelope["lease"])
                result.lease = lease_from_starintel(envelope["lease"])
            if "leases" in envelope:
                leases = envelope["leases"]
                if not isinstance(leases, builtins.list):
                    raise LeaseProtocolError("leases is not a list")
                result.leases = [lease_from_starintel(x) for x in leases]
        except LeaseProtocolError as e:
            result.outcome, result.code, result.msg = "info", R.BAD_RESPONSE, f"{code}: {e}"
            return result
        if outcome == "ok" and call.op in MUTATIONS and result.lease is None:
            result.outcome, result.code, result.msg = "info", R.BAD_RESPONSE, f"{code} without a lease record"
        return result

    def _note_reply(self, call: Call, status: int, envelope: dict[str, Any]) -> None:
        """Record the findings a reply shows: its code and status, its envelope, ownership by instance."""
        code = envelope.get("code")
        seen = f"{call.op} answered HTTP {status} {code!r}"
        known = DIALECT_CODES.get(code)
        if known is None:
            self.findings.observe("code.unknown", seen)
            return
        if status != known[1]:
            self.findings.observe("status.unexpected", f"{seen}; the dialect's table gives {code} HTTP {known[1]}")
        if f"code.{code}" in self.findings.catalogue:
            self.findings.observe(f"code.{code}", seen)
        if code != known[0]:
            self.findings.observe("codes.bare", f"{seen}; the contract says {known[0]}")
        if status >= 400 and "retry_after_ms" not in envelope:
            self.findings.observe("envelope.retry", f"{seen} without retry_after_ms"
                                  + ("" if "retryable" in envelope else " or retryable"))
        if code == "not_found" and call.op in MUTATIONS:
            self.findings.observe("mutation.not-found", f"{seen} for lease {_lease_id_of(call)}")
        if code == "deadline_exceeded" and call.op in MUTATIONS:
            self.findings.observe("deadline.ambiguous", f"{seen}: classified info (may have happened)")
        if code == "backend_unavailable" and call.op in MUTATIONS:
            self.findings.observe("backend-unavailable.catch-all", f"{seen}: classified info")
        if code == "not_owner" and call.op in ("renew", "release", "revoke"):
            lease_id = _lease_id_of(call)
            via = self.findings.acquired_via(lease_id) if lease_id else None
            if via is not None and via != self.base_url:
                self.findings.observe("owner.server-instance",
                                      f"{call.op} of lease {lease_id} acquired via {via} was refused not_owner "
                                      f"by {self.base_url}")

    def _note_record(self, rec: Any) -> None:
        """Record the findings a lease record shows: nested identity, missing fields, integer times."""
        if not isinstance(rec, dict):
            return
        missing = [k for k in ("lock_key", "record_version", "service_instance_id", "owner_client_id",
                               "owner_credential_id", "request_id") if k not in rec]
        if "identity" in rec or missing:
            self.findings.observe("record.shape", ("identity nested; " if "identity" in rec else "")
                                  + f"missing {', '.join(missing)}")
        times = {k: rec[k] for k in ("acquired_at", "renewed_at", "expires_at") if k in rec}
        if any(isinstance(v, int) and not isinstance(v, bool) for v in times.values()):
            self.findings.observe("record.times", f"times as integers: {times}")


def _same_identity(lease: Lease, identity: Identity) -> bool:
    """Does the record carry exactly this identity?"""
    return all(getattr(lease, name) == value for name, value in identity.as_dict().items())


def _lease_id_of(call: Call) -> str | None:
    """The lease id in a lease-scoped call's path."""
    rest = call.path[len(API) + 1:] if call.path.startswith(API + "/") else ""
    return unquote(rest.split("/", 1)[0]) if rest else None


def _positive(name: str, value: Any) -> int:
    """A positive integer (ms), or a clear error (the dialect rejects anything else with 400)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return value


def _text(name: str, value: Any) -> str:
    """A non-empty string, or a clear error."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, not {value!r}")
    return value


def _new_request_id() -> str:
    return new_request_id()
