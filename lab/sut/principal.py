"""The lab's workload principal: the identity scope its runs act in, and how its credential is picked.

Every lease-API workload, scenario and probe acts as one principal of the
system under test, on identities of one tenant / program / actor; the SUT
layer picks that principal's API key from a stack's credentials
(`api_key_for`), and the probe of a `--url` run inspects one of its
identities. Workloads re-export these names (`workloads.common`).
"""

from __future__ import annotations

from typing import Any

from lab.client import Identity

WORKLOAD_TENANT = "tenant-a"
WORKLOAD_PROGRAM = "program-1"
WORKLOAD_ACTOR = "actor-1"


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
