"""The contract's result codes (section 9) and the one error type that carries them.

The HTTP status of every code is fixed by `HTTP_STATUS`; nothing else in the
server chooses a status. Messages never carry another owner's identity, a raw
backend key, backend detail or a stack trace.
"""

from __future__ import annotations

LEASE_SUCCESS_CODES = ("lease_acquired", "lease_renewed", "lease_released", "lease_inspected", "lease_listed",
                       "lease_revoked")
# `commit_accepted` extends section 9's 200 codes: the table lists none for the commit boundary (section 7).
COMMIT_ACCEPTED = "commit_accepted"
SUCCESS_CODES = LEASE_SUCCESS_CODES + (COMMIT_ACCEPTED,)

HTTP_STATUS = {
    **{code: 200 for code in SUCCESS_CODES},
    "invalid_lease_request": 400,
    "invalid_credential": 401,
    "access_denied": 403,
    "lease_not_found": 404,
    "deadline_exceeded": 408,
    "lease_conflict": 409,
    "lease_lost": 409,
    "idempotency_conflict": 409,
    "lease_rate_limited": 429,
    "lease_backend_unavailable": 503,
    "lease_outcome_unknown": 503,
}

# Whether the same request may succeed if sent again unchanged (later).
RETRYABLE = {
    "invalid_lease_request": False,
    "invalid_credential": False,
    "access_denied": False,
    "lease_not_found": False,
    "deadline_exceeded": True,
    "lease_conflict": True,
    "lease_lost": False,
    "idempotency_conflict": False,
    "lease_rate_limited": True,
    "lease_backend_unavailable": True,
    "lease_outcome_unknown": True,
}


class LeaseError(Exception):
    """A typed failure: the contract code, a safe message and retry advice."""

    def __init__(self, code: str, msg: str, *, retryable: bool | None = None, retry_after_ms: int | None = None,
                 backend_health: str | None = None, submitted: bool | None = None):
        super().__init__(msg)
        if code not in HTTP_STATUS or code in SUCCESS_CODES:
            raise ValueError(f"not an error code: {code!r}")
        self.code = code
        self.msg = msg
        self.retryable = RETRYABLE[code] if retryable is None else retryable
        self.retry_after_ms = retry_after_ms
        self.backend_health = backend_health
        # False = the server knows nothing was executed (the client then reads a 503 as a definite failure)
        self.submitted = submitted

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.code]

    def envelope(self, correlation_id: str) -> dict:
        """The section-9 error body."""
        body = {"status": "error", "code": self.code, "msg": self.msg, "correlation_id": correlation_id,
                "retryable": self.retryable}
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = int(self.retry_after_ms)
        if self.submitted is False:
            body["submitted"] = False
        return body


def invalid(field: str, problem: str) -> LeaseError:
    """400 invalid_lease_request naming the field."""
    return LeaseError("invalid_lease_request", f"{field}: {problem}")
