"""Workloads, registered by name (Maelstrom's units): `WORKLOADS[name](test) -> Workload`.

`docs/workloads.md` is generated from this registry (`python -m workloads.docs`).
"""

from __future__ import annotations

from typing import Any, Callable

from lab.sut import WorkloadNeeds
from workloads import fenced_append, idempotency, lease, register


WORKLOADS: dict[str, Any] = {
    "fenced-append": fenced_append,
    "idempotency": idempotency,
    "lease": lease,
    "register": register,
}


def needs_of(name: str) -> WorkloadNeeds:
    """What the workload `name` declares it needs from the system under test (its module's `NEEDS`).

    The runner passes this to the SUT layer (`lab.sut.validate_test`), which never imports the workloads.
    """
    try:
        return WORKLOADS[name].NEEDS
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(sorted(WORKLOADS))}") from None


def get_workload(name: str) -> Callable:
    """The `workload(test)` function registered as `name`; a clear error lists the known names."""
    try:
        return WORKLOADS[name].workload
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(sorted(WORKLOADS))}") from None
