"""Workloads, registered by name (Maelstrom's units): `WORKLOADS[name](test) -> Workload`.

`docs/workloads.md` is generated from this registry (`python -m workloads.docs`).
"""

from __future__ import annotations

from typing import Any, Callable

from workloads import fenced_append, idempotency, lease, register


WORKLOADS: dict[str, Any] = {
    "fenced-append": fenced_append,
    "idempotency": idempotency,
    "lease": lease,
    "register": register,
}


def get_workload(name: str) -> Callable:
    """The `workload(test)` function registered as `name`; a clear error lists the known names."""
    try:
        return WORKLOADS[name].workload
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(sorted(WORKLOADS))}") from None
