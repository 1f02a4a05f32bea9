"""A workload is a unit (Maelstrom's idea): `workload(test) -> Workload`.

It bundles the client prototype, the generator of the main phase, the
generator of the final phase (run after faults are healed, e.g. reading every
document back), the checker, and which nodes its clients talk to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Workload:
    """What a workload contributes to a test."""

    name: str
    client: Any
    generator: Any
    checker: Any
    final_generator: Any = None
    # which of the run context's addresses its clients talk to (asked once the stack is up)
    nodes: Callable[[Any], list[str]] = field(
        default=lambda test: list(test.live.client_nodes or test.live.lease_servers))
    needs_store: bool = False
    doc: str = ""
