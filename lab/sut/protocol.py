"""The `LeaseSystem` protocol: what a lease implementation provides for the lab to test it.

A system under test is ONE class (an HTTP client for another API, or a
library called in-process) whose async methods return the lab's typed
`Result` (outcome `ok` / `fail` / `info`, a contract code, the `Lease`):

    acquire(identity, *, ttl_ms, request_id=None, deadline_s=None) -> Result   (ok: lease_acquired + lease)
    renew(lease, *, identity=None, request_id=None, deadline_s=None) -> Result (ok: lease_renewed + lease)
    release(lease, *, identity=None, request_id=None, deadline_s=None) -> Result (ok: lease_released + lease)
    inspect(identity_or_lease_id, *, deadline_s=None) -> Result (ok: lease_inspected + lease; else lease_not_found)
    aclose() -> None

plus the optional abilities it declares in `capabilities`:

    "force_release": force_release(lease, reason, *, identity=None, request_id=None, deadline_s=None)
    "revoke":        revoke(lease, reason, *, incident_id=None, identity=None, request_id=None, deadline_s=None)
    "commit":        commit(lease, doc, body, *, identity=None, request_id=None, deadline_s=None)  (fenced write)

Times in `Lease` are integer Unix milliseconds from the system's own clock
(backend time). `fail` means the operation definitely did not happen; `info`
means it may have (a timeout after sending, an unknown outcome). Codes are the
contract's (section 9): `lease_conflict`, `lease_lost`, `idempotency_conflict`, ...
A system may expose a public `clock_ms` attribute (the client's wall clock),
which the client-clock nemesis replaces.

Following Jepsen's optional client abilities, each optional method also has a
runtime-checkable protocol (`FencedCommit`, `ForceRelease`, `Revoke`);
`check_system` verifies that an opened system has the methods its
capabilities promise, and `check_result` that a returned value is a
well-formed `Result` (an actionable error otherwise).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from lab.client.results import Identity, Lease, Result

OPTIONAL_CAPABILITIES = ("commit", "force_release", "revoke")
CORE_METHODS = ("acquire", "renew", "release", "inspect", "aclose")
OUTCOMES = ("ok", "fail", "info")
# the success code an ok Result of each operation carries (section 9)
OK_CODES = {"acquire": "lease_acquired", "renew": "lease_renewed", "release": "lease_released",
            "inspect": "lease_inspected", "force_release": "lease_released", "revoke": "lease_revoked"}
NEEDS_LEASE = frozenset({"acquire", "renew", "release", "force_release", "revoke"})


class SutError(ValueError):
    """A system under test cannot be found, opened or trusted as given (the message says what to change)."""


@runtime_checkable
class LeaseSystem(Protocol):
    """The operations every system under test provides (see the module docstring)."""

    async def acquire(self, identity: Identity, *, ttl_ms: int, request_id: str | None = None,
                      deadline_s: float | None = None) -> Result: ...

    async def renew(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                    deadline_s: float | None = None) -> Result: ...

    async def release(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                      deadline_s: float | None = None) -> Result: ...

    async def inspect(self, target: Identity | str, *, deadline_s: float | None = None) -> Result: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class FencedCommit(Protocol):
    """Capability `commit`: a fenced write of `body` to document `doc` under `lease` (contract section 7)."""

    async def commit(self, lease: Lease, doc: str, body: Any, *, identity: Identity | None = None,
                     request_id: str | None = None, deadline_s: float | None = None) -> Result: ...


@runtime_checkable
class ForceRelease(Protocol):
    """Capability `force_release`: an admin release of the observed lease, with a reason (C15)."""

    async def force_release(self, lease: Lease, reason: str, *, identity: Identity | None = None,
                            request_id: str | None = None, deadline_s: float | None = None) -> Result: ...


@runtime_checkable
class Revoke(Protocol):
    """Capability `revoke`: an admin revoke of the observed lease, with a reason and incident (C15)."""

    async def revoke(self, lease: Lease, reason: str, *, incident_id: str | None = None,
                     identity: Identity | None = None, request_id: str | None = None,
                     deadline_s: float | None = None) -> Result: ...


ABILITY_PROTOCOLS = {"commit": FencedCommit, "force_release": ForceRelease, "revoke": Revoke}


def check_capabilities(capabilities: Any, where: str) -> frozenset[str]:
    """A validated capability set (a subset of OPTIONAL_CAPABILITIES)."""
    if isinstance(capabilities, str) or not hasattr(capabilities, "__iter__"):
        raise SutError(f"{where}: capabilities must be a set of names, not {capabilities!r}")
    caps = frozenset(capabilities)
    unknown = sorted(c for c in caps if c not in OPTIONAL_CAPABILITIES)
    if unknown:
        raise SutError(f"{where}: unknown capabilities {unknown}; known: {', '.join(OPTIONAL_CAPABILITIES)}")
    return caps


def check_system(system: Any, capabilities: frozenset[str], where: str) -> Any:
    """The opened system itself, once it is shown to have the core methods and those of its capabilities."""
    missing = [m for m in CORE_METHODS if not callable(getattr(system, m, None))]
    missing += [c for c in sorted(capabilities) if not isinstance(system, ABILITY_PROTOCOLS[c])]
    if missing:
        raise SutError(f"{where} returned {type(system).__name__}, which lacks {', '.join(missing)}: "
                       f"a system implements the lab.sut.LeaseSystem methods and those of its capabilities "
                       f"({', '.join(sorted(capabilities)) or 'none'})")
    return system


def check_result(op: str, result: Any, where: str) -> Result:
    """The result itself, once it is a well-formed `Result` for `op` (else a SutError naming the problem)."""
    if not isinstance(result, Result):
        raise SutError(f"{where}.{op} returned {type(result).__name__}, not a lab.client.Result")
    if result.outcome not in OUTCOMES:
        raise SutError(f"{where}.{op} returned outcome {result.outcome!r}; use one of {', '.join(OUTCOMES)}")
    if not isinstance(result.code, str) or not result.code:
        raise SutError(f"{where}.{op} returned a {result.outcome} Result without a code (a contract code string)")
    if result.outcome != "ok":
        return result
    if op in NEEDS_LEASE or (op == "inspect" and result.lease is not None):
        lease = result.lease
        if not isinstance(lease, Lease):
            raise SutError(f"{where}.{op} returned ok without a Lease (Result.lease)")
        bad = [n for n in ("acquired_at_ms", "expires_at_ms") if getattr(lease, n) is not None
               and (not isinstance(getattr(lease, n), int) or isinstance(getattr(lease, n), bool))]
        if not isinstance(lease.fencing_token, int) or isinstance(lease.fencing_token, bool) or bad:
            raise SutError(f"{where}.{op} returned a Lease whose fencing_token / {', '.join(bad) or 'times'} "
                           f"are not integers (times are integer Unix ms)")
    return result
