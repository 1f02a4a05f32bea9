"""Typed values of the lease API: identities, lease records, and call results.

The heart of this module is the definite / indefinite split (Jepsen's client
rule, contract C19/C22/C23 and the "no assumed success" row of section 8):

- `ok`: the server says the operation happened, and here is its result.
- `fail`: the operation definitely did not happen. Only codes the contract
  decides before (or without) any mutation qualify, and only under the HTTP
  status section 9 gives them; plus transport failures where nothing was
  sent (connection refused, deadline passed before sending).
- `info`: it may or may not have happened: `lease_outcome_unknown`, a reply
  lost after the request was sent, a read timeout, our own deadline expiring
  after sending, an unparseable or unexpected reply, and a renewal whose reply
  arrived after the caller's deadline (C23: it grants nothing).

`lease_backend_unavailable` (503) is `fail` only when the server states that
nothing was submitted to the backend: the error envelope's `"submitted": false`.
The contract (section 8) pairs this code with "no assumed success" and keeps
`lease_outcome_unknown` for a timeout after submission, but the code on its own
does not prove nothing happened: the reference server also answers it for an
internal error or an unreadable record after the script ran, and for a script
error (Valkey keeps the writes a script made before failing). Without the
marker the client says `info`. A client for a server known to use the code
strictly for "never submitted" passes `backend_unavailable_is_definite=True`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal

IDENTITY_FIELDS = ("tenant_id", "program_id", "target_namespace", "target_id",
                   "actor_name", "workflow_name", "operation_class")

Outcome = Literal["ok", "fail", "info"]

# Server codes that mean "decided before or without any mutation" (contract sections 5, 9, 10),
# each with the one HTTP status section 9 gives it: a code under any other status breaks the
# table, and a server that breaks it is not trusted to have changed nothing.
DEFINITE_FAIL_STATUS = {
    "invalid_lease_request": 400, "invalid_credential": 401, "access_denied": 403, "lease_not_found": 404,
    "deadline_exceeded": 408, "lease_conflict": 409, "lease_lost": 409, "idempotency_conflict": 409,
    "stale_token": 409,  # the commit boundary's lower-token rejection (C26)
    "lease_rate_limited": 429, "lease_backend_unavailable": 503,
}
DEFINITE_FAIL_CODES = frozenset(DEFINITE_FAIL_STATUS)
OUTCOME_UNKNOWN = "lease_outcome_unknown"

# Codes the client itself assigns when the server's answer is missing or unusable.
CONNECT_ERROR = "connect_error"  # fail: the TCP connection was never made, nothing sent
CLIENT_DEADLINE = "deadline_exceeded"  # fail: our deadline passed before anything was sent
TIMEOUT = "timeout"  # info: our deadline (or a transport timeout) hit after sending
CONNECTION_LOST = "connection_lost"  # info: the exchange broke after the request may have left
BAD_RESPONSE = "unparseable_response"  # info: no usable envelope in the reply
UNEXPECTED_RESPONSE = "unexpected_response"  # info: an envelope that breaks the contract's table
LATE_REPLY = "late_reply"  # info: a renewal granted after the caller's deadline grants nothing
# How a `fail` the client itself decided says that nothing left (its msg starts with one of these): a
# checker holding a server to "a timeout after submission is indeterminate" skips a request never submitted.
NOTHING_SENT = "nothing was sent"
DEADLINE_BEFORE_SEND = "deadline passed before the request was sent"


def nothing_sent(code: str | None, msg: str | None) -> bool:
    """Did the client itself decide this `fail` before any byte of the request left?"""
    return code == CONNECT_ERROR or (code == CLIENT_DEADLINE and isinstance(msg, str)
                                      and msg.startswith((NOTHING_SENT, DEADLINE_BEFORE_SEND)))


class LeaseProtocolError(ValueError):
    """A server reply that does not fit the contract's record or envelope shapes."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The contract's 7-tuple lock identity (C1); `operation_class` defaults to `default`."""

    tenant_id: str
    program_id: str
    target_namespace: str
    target_id: str
    actor_name: str
    workflow_name: str
    operation_class: str = "default"

    def __post_init__(self) -> None:
        for name in IDENTITY_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Identity.{name} must be a non-empty string, not {value!r}")

    def as_dict(self) -> dict[str, str]:
        """The seven fields in contract order, as the wire body carries them."""
        return {name: getattr(self, name) for name in IDENTITY_FIELDS}

    @classmethod
    def from_mapping(cls, d: dict[str, Any]) -> "Identity":
        """The identity named by a record or request mapping."""
        missing = [n for n in IDENTITY_FIELDS[:-1] if n not in d]
        if missing:
            raise ValueError(f"identity is missing {', '.join(missing)}")
        return cls(**{n: d[n] for n in IDENTITY_FIELDS if n in d})


def parse_time_ms(value: Any) -> int | None:
    """An RFC 3339 time (or integer Unix ms) from the wire as integer Unix milliseconds."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value)
        except ValueError as e:
            raise LeaseProtocolError(f"not an RFC 3339 time: {value!r}") from e
        if dt.tzinfo is None:
            raise LeaseProtocolError(f"time without a UTC offset: {value!r}")
        # exact integer arithmetic: float timestamps can be off by one millisecond
        return (int(dt.timestamp()) * 1000) + dt.microsecond // 1000
    raise LeaseProtocolError(f"not a time: {value!r}")


_TIME_FIELDS = {"acquired_at": "acquired_at_ms", "renewed_at": "renewed_at_ms", "expires_at": "expires_at_ms",
                "ended_at": "ended_at_ms"}
_MS_FIELDS = frozenset(_TIME_FIELDS.values())


@dataclass(slots=True)
class Lease:
    """One lease record as the server reports it (contract section 2), times as Unix ms."""

    lease_id: str
    fencing_token: int
    state: str
    acquired_at_ms: int | None = None
    renewed_at_ms: int | None = None
    expires_at_ms: int | None = None
    ttl_ms: int | None = None
    maximum_lifetime_ms: int | None = None
    record_version: int | None = None
    lock_key: str | None = None
    tenant_id: str | None = None
    program_id: str | None = None
    target_namespace: str | None = None
    target_id: str | None = None
    actor_name: str | None = None
    workflow_name: str | None = None
    operation_class: str | None = None
    owner_principal_id: str | None = None
    owner_client_id: str | None = None
    owner_credential_id: str | None = None
    service_instance_id: str | None = None
    execution_id: str | None = None
    job_id: str | None = None
    trace_id: str | None = None
    request_id: str | None = None
    metadata: dict[str, Any] | None = None
    # terminal evidence (released / revoked / expired records)
    ended_at_ms: int | None = None
    end_reason: str | None = None
    ended_by: str | None = None
    admin_reason: str | None = None
    incident_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields this client does not know, kept verbatim

    @classmethod
    def from_wire(cls, d: Any) -> "Lease":
        """A lease from the server's JSON record; raises LeaseProtocolError on a malformed one.

        Times arrive as RFC 3339 (`expires_at`) and may also arrive as integer
        Unix ms (`expires_at_ms`); the integer form wins when both are present.
        """
        if not isinstance(d, dict):
            raise LeaseProtocolError(f"lease record is not an object: {d!r:.100}")
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        texts: dict[str, Any] = {}
        for key, value in d.items():
            if key in _LEASE_FIELDS:
                kwargs[key] = value
            elif key in _TIME_FIELDS:
                texts[_TIME_FIELDS[key]] = value
            elif key in _MS_FIELDS:
                if not isinstance(value, int) or isinstance(value, bool):
                    raise LeaseProtocolError(f"{key} is not integer milliseconds: {value!r}")
                kwargs[key] = value
            else:
                extra[key] = value
        for ms_name, text in texts.items():
            if ms_name not in kwargs:
                kwargs[ms_name] = parse_time_ms(text)
        for required in ("lease_id", "fencing_token", "state"):
            if required not in kwargs:
                raise LeaseProtocolError(f"lease record has no {required}")
        token = kwargs["fencing_token"]
        if not isinstance(token, int) or isinstance(token, bool):
            raise LeaseProtocolError(f"fencing_token is not an integer: {token!r}")
        return cls(**kwargs, extra=extra)

    @property
    def identity(self) -> Identity:
        """The lock identity the record carries (C4)."""
        return Identity.from_mapping({n: getattr(self, n) for n in IDENTITY_FIELDS})

    def history_value(self) -> dict[str, Any]:
        """The `ok` value of an acquire/renew/release op in docs/history-format.md."""
        return {"lease_id": self.lease_id, "fencing_token": self.fencing_token,
                "acquired_at_ms": self.acquired_at_ms, "renewed_at_ms": self.renewed_at_ms,
                "expires_at_ms": self.expires_at_ms, "ttl_ms": self.ttl_ms, "state": self.state}


_LEASE_FIELDS = frozenset(f.name for f in fields(Lease)) - _MS_FIELDS - {"extra"}


@dataclass(frozen=True, slots=True)
class Call:
    """One prepared API call: enough to send it again with the same request_id (C17, C19)."""

    op: str  # acquire, renew, release, force_release, revoke, commit, inspect, list
    method: str
    path: str
    body: dict[str, Any] | None = None  # JSON body without deadline_at (refreshed per attempt)
    params: dict[str, Any] | None = None  # query parameters (GET calls)

    @property
    def request_id(self) -> str | None:
        return self.body.get("request_id") if self.body else None

    @property
    def is_mutation(self) -> bool:
        return self.method == "POST"


@dataclass(slots=True)
class Result:
    """How one call completed: `ok`, `fail` (did not happen) or `info` (may have happened)."""

    outcome: Outcome
    code: str
    http_status: int | None = None
    lease: Lease | None = None
    leases: list[Lease] | None = None
    cursor: str | None = None
    msg: str | None = None
    retryable: bool | None = None
    retry_after_ms: int | None = None
    correlation_id: str | None = None
    latency_ns: int = 0
    late: bool = False  # the reply arrived after the caller's deadline
    call: Call | None = None
    data: dict[str, Any] | None = None  # the decoded envelope, for fields not lifted above (commit results)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"

    @property
    def indeterminate(self) -> bool:
        return self.outcome == "info"

    def error(self) -> dict[str, Any] | None:
        """The history `error` field for a fail/info completion (None for ok)."""
        if self.outcome == "ok":
            return None
        return {"code": self.code, "msg": self.msg} if self.msg else {"code": self.code}

    def raise_for_outcome(self) -> "Result":
        """Return self when ok; raise LeaseFailed (fail) or LeaseIndeterminate (info) otherwise."""
        if self.outcome == "ok":
            return self
        raise (LeaseFailed if self.outcome == "fail" else LeaseIndeterminate)(self)


class LeaseCallError(Exception):
    """A call that did not complete `ok`; `.result` holds the typed Result."""

    def __init__(self, result: Result):
        super().__init__(f"{result.call.op if result.call else 'call'} {result.outcome}: {result.code}"
                         + (f" ({result.msg})" if result.msg else ""))
        self.result = result


class LeaseFailed(LeaseCallError):
    """The operation definitely did not happen."""


class LeaseIndeterminate(LeaseCallError):
    """The operation may or may not have happened; resolve it by request_id."""


def classify_envelope(http_status: int, envelope: Any, *, backend_unavailable_is_definite: bool = False
                      ) -> tuple[Outcome, str]:
    """Outcome and code for a reply whose body decoded as JSON (see the module docstring)."""
    if not isinstance(envelope, dict):
        return "info", BAD_RESPONSE
    status, code = envelope.get("status"), envelope.get("code")
    if not isinstance(code, str):
        return "info", BAD_RESPONSE
    if 200 <= http_status < 300:
        return ("ok", code) if status == "success" else ("info", code)
    if status != "error" or code == OUTCOME_UNKNOWN or http_status < 400:
        return "info", code
    if code == "lease_backend_unavailable" and http_status == 503:
        definite = backend_unavailable_is_definite or envelope.get("submitted") is False
        return ("fail" if definite else "info"), code
    return ("fail", code) if DEFINITE_FAIL_STATUS.get(code) == http_status else ("info", code)
