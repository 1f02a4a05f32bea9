"""Fencing tokens: unique per identity, and increasing in real-time and in backend-time order.

For each key (lock identity) of a lease history, over the leases that ok acquires
reported (contract C5, C11, verification row 4):

- `duplicate-token`: two different leases carry the same token. An idempotent
  replay returning the same lease_id is the same lease, not a duplicate.
- `token-order-realtime`: lease A's acquisition completed before lease B's was
  invoked, yet token(A) >= token(B). A lease's acquisition spans from the first
  invocation of any request_id that returned it (a replay's original attempt
  included) to the first ok that reported it. Sort by start, sweep with a running
  max over completed acquisitions: O(n log n).
- `token-order-backend`: acquired_at_ms(A) < acquired_at_ms(B) yet token(A) >= token(B).
  Leases acquired in the same millisecond are not ordered against each other.

With no key acquired (ok) twice there is nothing to compare: the verdict is
"unknown" with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

from checkers.core import ViewCheck, Violations
from checkers.pairs import Lease, acquisition_start
from checkers.view import LeaseView
from checkers.windows import backend_rules_note

__all__ = ["FencingChecker"]


class FencingChecker(ViewCheck):
    """Checks fencing-token uniqueness and monotonicity per identity (see module docstring)."""

    def __init__(self, max_violations: int = 1000):
        self.max_violations = max_violations

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge the ok acquires of a lease history."""
        leases = view.leases
        view.starts  # noqa: B018 - every pair's `start` settled: `acquisition_start(lease, None)` reads them
        first_invoke = None
        by_key: dict[Any, list[Lease]] = defaultdict(list)
        for lease in leases.values():
            if lease.token is not None:
                by_key[lease.key].append(lease)
        v = Violations(self.max_violations)
        moved = view.faults.clock_moves
        for key, ls in by_key.items():
            _check_unique(key, ls, v)
            _check_realtime(key, ls, first_invoke, v)
            if not moved:
                _check_backend(key, ls, v)
        compared = sum(1 for ls in by_key.values() if len(ls) > 1)
        return v.result(keys=len(by_key), leases=len(leases), keys_compared=compared,
                        backend_time_rules=backend_rules_note(moved), unjudged=_unjudged(leases, compared))


def _unjudged(leases: dict[Any, Lease], compared: int) -> str | None:
    """Why the history gives the token rules nothing to compare (None when it does)."""
    if not leases:
        return "no successful acquisition"
    if not any(lease.token is not None for lease in leases.values()):
        return "no acquisition reported a fencing token"
    if not compared:
        return "no key was acquired twice: token order has nothing to compare"
    return None


def _check_unique(key: Any, leases: list[Lease], v: Violations) -> None:
    """Different leases on one key must carry different tokens."""
    seen: dict[Any, Lease] = {}
    for lease in leases:
        other = seen.setdefault(lease.token, lease)
        if other is not lease:
            v.add("duplicate-token", [other.first.i1, lease.first.i1],
                  f"key {key!r}: leases {other.lease_id!r} and {lease.lease_id!r} both got token {lease.token}",
                  key=key, token=lease.token, leases=[other.lease_id, lease.lease_id])


def _acquisition_span(lease: Lease, first_invoke: dict[tuple, int] | None) -> tuple[int, int]:
    """Real-time window in which the lease was created: earliest attempt to earliest ok."""
    start = acquisition_start(lease, first_invoke)
    end = lease.granted  # min(p.t1 for p in lease.acquires)
    return min(start, end), end


def _check_realtime(key: Any, leases: list[Lease], first_invoke: dict[tuple, int] | None, v: Violations) -> None:
    """A acquired (completed) before B was invoked implies token(A) < token(B)."""
    spans = [(*_acquisition_span(lease, first_invoke), lease) for lease in leases]
    by_end = sorted(spans, key=lambda s: s[1])
    j, best = 0, None  # best: the completed lease with the largest token so far
    for start, _end, lease in sorted(spans, key=lambda s: s[0]):
        while j < len(by_end) and by_end[j][1] < start:
            done = by_end[j][2]
            if best is None or done.token > best.token:
                best = done
            j += 1
        if best is not None and best.token >= lease.token:
            v.add("token-order-realtime", [best.first.i1, lease.first.i0, lease.first.i1],
                  f"key {key!r}: lease {lease.lease_id!r} (token {lease.token}) was acquired after "
                  f"lease {best.lease_id!r} (token {best.token}) completed",
                  key=key, token=lease.token, earlier_token=best.token, leases=[best.lease_id, lease.lease_id])


def _check_backend(key: Any, leases: list[Lease], v: Violations) -> None:
    """acquired_at_ms(A) < acquired_at_ms(B) implies token(A) < token(B)."""
    timed = sorted((lease for lease in leases if lease.acquired_at_ms is not None), key=lambda x: x.acquired_at_ms)
    best: Lease | None = None  # max token among strictly earlier milliseconds
    i = 0
    while i < len(timed):
        j = i
        while j < len(timed) and timed[j].acquired_at_ms == timed[i].acquired_at_ms:
            j += 1
        group = timed[i:j]
        if best is not None:
            for lease in group:
                if lease.token <= best.token:
                    v.add("token-order-backend", [best.first.i1, lease.first.i1],
                          f"key {key!r}: lease {lease.lease_id!r} acquired at {lease.acquired_at_ms} ms got "
                          f"token {lease.token}, not above {best.token} of {best.lease_id!r} acquired at "
                          f"{best.acquired_at_ms} ms",
                          key=key, token=lease.token, earlier_token=best.token,
                          leases=[best.lease_id, lease.lease_id])
        for lease in group:
            if best is None or lease.token > best.token:
                best = lease
        i = j
