"""What every lease-API workload shares: identities per key, credentials, and op completions.

A workload key is a short name (`k0`, `k1`, ...) for one lock identity; the
full identity lives in `test.json` so histories stay small.
"""

from __future__ import annotations

import itertools
from typing import Any

from lab.client import Identity, LeaseClient, Result

WORKLOAD_TENANT = "tenant-a"
WORKLOAD_PROGRAM = "program-1"
WORKLOAD_ACTOR = "actor-1"

_instances = itertools.count(1)


def key_names(n: int) -> list[str]:
    """`k0` .. `k{n-1}`."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"keys must be a positive integer, not {n!r}")
    return [f"k{i}" for i in range(n)]


def identity_for(key: str, *, namespace: str = "fencelab", workflow: str = "lab") -> Identity:
    """The lock identity behind a workload key."""
    return Identity(tenant_id=WORKLOAD_TENANT, program_id=WORKLOAD_PROGRAM, target_namespace=namespace,
                    target_id=key, actor_name=WORKLOAD_ACTOR, workflow_name=workflow, operation_class="default")


def pick_credential(credentials: list[dict[str, Any]], capability: str = "targets:lease",
                    tenant: str = WORKLOAD_TENANT, program: str = WORKLOAD_PROGRAM,
                    actor: str = WORKLOAD_ACTOR) -> dict[str, Any]:
    """The first credential with `capability` whose scopes allow tenant/program/actor."""

    def scope_allows(scope: dict[str, Any], kind: str, value: str) -> bool:
        v = scope.get(kind, "*")
        vals = [v] if isinstance(v, str) else list(v)
        return "*" in vals or value in vals

    def allows(scopes: Any, wanted: dict[str, str]) -> bool:
        # the server's principals carry a list of scope objects: one of them must cover the whole identity
        scopes = [scopes] if isinstance(scopes, dict) else list(scopes or [])
        return any(isinstance(s, dict) and all(scope_allows(s, k, v) for k, v in wanted.items()) for s in scopes)

    for c in credentials:
        caps = c.get("capabilities", [])
        scopes = c.get("scopes", {})
        if capability in caps and allows(scopes, {"tenant": tenant, "program": program, "actor": actor}):
            return c
    raise ValueError(f"no credential with {capability} for {tenant}/{program}/{actor} among "
                     f"{[c.get('principal_id') for c in credentials]}")


def new_instance_id(prefix: str = "worker") -> str:
    """A fresh service_instance_id: each opened client is its own worker (owner = principal + instance)."""
    return f"{prefix}-{next(_instances)}"


def completion(result: Result, value: Any, **extra: Any) -> dict[str, Any]:
    """The completion op for a lease API result: ok/fail/info, the value, and the contract code as error."""
    op: dict[str, Any] = {"type": result.outcome, "value": value}
    if result.outcome != "ok":
        op["error"] = result.code
    op.update(extra)
    return op


def lease_client(test, node: str, *, instance: str | None = None, timeout_s: float = 5.0):
    """The system under test's client for one worker against `node` (a `lab.sut.LeaseSystem`).

    The system is `test.extra["sut"]` (default `reference`: a LeaseClient with the
    stack's credentials); a workload needing an ability the system lacks is refused here.
    """
    from lab.sut import open_system

    return open_system(test, node, instance or new_instance_id(), timeout_s=timeout_s)
