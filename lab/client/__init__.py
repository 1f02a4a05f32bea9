"""Lease API clients with typed results and the definite / indefinite error split.

`LeaseClient` speaks the reference server's wire API (contract section 13);
every call returns a `Result` whose `outcome` is `ok`, `fail` (definitely did
not happen) or `info` (may have happened: settle it with `LeaseClient.resolve`).
"""

from lab.client.lease import LeaseClient, new_request_id, now_ms
from lab.client.results import (
    DEFINITE_FAIL_CODES,
    IDENTITY_FIELDS,
    Call,
    Identity,
    Lease,
    LeaseCallError,
    LeaseFailed,
    LeaseIndeterminate,
    LeaseProtocolError,
    Result,
    classify_envelope,
    parse_time_ms,
)

__all__ = [
    "DEFINITE_FAIL_CODES", "IDENTITY_FIELDS", "Call", "Identity", "Lease", "LeaseCallError", "LeaseClient",
    "LeaseFailed", "LeaseIndeterminate", "LeaseProtocolError", "Result", "classify_envelope",
    "new_request_id", "now_ms", "parse_time_ms",
]
