"""One figure of `make bench`'s summary table: what each bench script measures, beside its target (issue 13).

Every bench script exposes `figures(quick: bool = False) -> list[Figure]`; `bench/summary.py` runs them all in
one process order and prints one table (docs/performance.md records it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """A measured figure: `value` in `unit`, the `target` it is held to (text, as the issue states it), and
    whether it met it (`ok`); `note` says how it was measured (the run's conditions, the baseline)."""

    area: str      # client, recording, server, domain checkers, linearizability
    name: str
    value: float
    unit: str
    target: str
    ok: bool
    note: str = ""
