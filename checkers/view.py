"""The lease-history view: what the domain checkers derive from one history, built once and handed to each.

Five checkers start from the same work: pair the history, index the leases the
ok acquires reported, find the first attempt of every request, see whether the
nemesis moved the backend's clock. As Elle's checkers build their indexes once
and pass them to the analyses that need them, `lease_view(history)` pairs the
history (the one strict pairing, `lab.history.pair`) and returns a frozen
`LeaseView`; `checkers.core.Compose` builds one per history when any of its
checkers takes a view (`checkers.core.ViewChecker`) and passes it to each
(`check_view(test, view, opts)`); a checker called alone builds its own.

The view is frozen (no field can be set again) and holds no cache outside
itself: every index is an attribute, computed on first use and then kept with
the view (`functools.cached_property`), so a checker that reads only the pairs
does not pay for the lease index. What it returns is shared by every checker of
a composition: read it, never mutate it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from checkers.commits import Commit, FinalRead, commits_of, final_reads
from checkers.origin import Origins
from checkers.pairs import (Lease, Pair, PrefixMax, by_f, first_invocations, index_leases, settle_starts,
                            successor_index, successor_thresholds)
from checkers.windows import Faults
from lab.history.ops import pair

__all__ = ["LeaseView", "lease_view"]


@dataclass(frozen=True, eq=False)
class LeaseView:
    """One history's client operations and the indexes the domain checkers share (see the module docstring).

    `pairs`: the client operations in invocation order (`checkers.pairs.Pair`); `faults`: what the nemesis
    did (`checkers.windows.Faults`: windows, clock moves, Valkey losses). The rest is derived on first use.
    """

    history: list[dict] = field(repr=False)
    pairs: list[Pair] = field(repr=False)
    faults: Faults = field(repr=False)

    @cached_property
    def _by_f(self) -> dict[Any, list[Pair]] | None:
        """The pairs grouped by f (`checkers.pairs.by_f`)."""
        return by_f(self.pairs)

    @property
    def by_f(self) -> dict[Any, list[Pair]] | None:
        """The pairs grouped by f, each group in invocation order (None when an f is no dict key)."""
        return self._by_f

    def of(self, f: str) -> list[Pair]:
        """The pairs whose f is `f`, in invocation order (a rule about one f reads its ops, not every op)."""
        groups = self._by_f
        if groups is None:  # an f that is no dict key
            return [p for p in self.pairs if p.f == f]
        return groups.get(f, [])

    @cached_property
    def first_invocations(self) -> dict[tuple, int]:
        """Idempotency key -> the earliest invocation time carrying it (`checkers.pairs.first_invocations`)."""
        return first_invocations(self.pairs)

    @cached_property
    def starts(self) -> tuple[dict[tuple, Pair], list[Pair]]:
        """Every pair's `start` settled (`checkers.pairs.settle_starts`), once: a rule that reads `Pair.start`
        asks for this first. Its value: (idempotency key -> the first pair carrying it; the pairs whose key an
        earlier pair carried)."""
        return settle_starts(self.pairs)

    @cached_property
    def leases(self) -> dict[Any, Lease]:
        """Every lease an ok acquire reported, by lease_id (`checkers.pairs.index_leases`)."""
        return index_leases(self.pairs, self.of("acquire"))

    @cached_property
    def successors(self) -> tuple[dict[Any, PrefixMax], dict[Any, PrefixMax]]:
        """Per key, the leases' tokens by first acquire-ok completion time and by `acquired_at_ms`
        (`checkers.pairs.successor_index`); each lease's `rt_next` / `bk_next` set from them
        (`checkers.pairs.successor_thresholds`)."""
        leases = self.leases
        realtime, backend = successor_index(leases)
        successor_thresholds(leases, realtime, backend)
        return realtime, backend

    @cached_property
    def commits(self) -> list[Commit]:
        """The commit ops as `checkers.commits.Commit`s, in invocation order (stale-commit and stale-write)."""
        self.starts  # noqa: B018 - each commit's start is its pair's
        return commits_of(self.of("commit"), settled=True)

    @cached_property
    def origins(self) -> Origins:
        """Where stale holders came from: the marked ops per session and the fault windows that make them
        (`checkers.origin.Origins`; stale-commit and stale-write)."""
        return Origins(self.pairs, self.faults)

    @cached_property
    def final_reads(self) -> dict[tuple, FinalRead]:
        """(key, doc) -> the last ok read of that document (`checkers.commits.final_reads`)."""
        return final_reads(self.of("read"))


def lease_view(history: list[dict]) -> LeaseView:
    """The view of `history`: its strict pairing (a malformed history raises `HistoryError`), with the nemesis
    ops the pairing found on its way (no second pass over the history for them)."""
    pairing = pair(history, strict=True, make=Pair)
    return LeaseView(history, pairing.pairs, Faults(history, [(pos, history[pos]) for pos in pairing.nemesis]))
