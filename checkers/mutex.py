"""Mutual exclusion: at most one valid lease per identity at any backend time.

Violations (`overlap`): a lease M acquired (backend `acquired_at_ms`) while
another lease L on the same key was still valid. L is valid on the half-open
backend interval [acquired_at_ms, end), where end is the smaller of:

- its latest known `expires_at_ms` (the largest any acquire/renew ok reported), and
- its backend release/revoke time when a release/revoke ok reports one
  (`released_at_ms`, `revoked_at_ms` or `ended_at_ms`; not in the history format yet).

When L was released/revoked (ok, or info: it may have happened) but no backend
time was reported, the release is only known to have taken effect after the
release was invoked, so the overlap is definite only if M's acquisition
completed before L's first release/revoke was invoked; otherwise the server may
have ordered the release first and no violation is reported.

Informational (`unsafe_windows`, never a violation): client-side overlaps of
"believed held" intervals, in monotonic `time`. A client believes it holds L from
the first acquire ok that reported L until the earlier of its first `release`
invocation of L and the completion of an op on L that failed with `lease_lost`
or `stale_token`. When neither happened (an abandoned lease, or the last one),
until the later of the last completion of an op on L and the holder's local
expiry (its latest ok acquire/renew invocation time plus the `ttl_ms` returned).
The local expiry does not cut a belief short otherwise: a paused client that
resumes and acts on its lease is exactly what fencing must cover. Each belief that begins while
another lease's belief is open counts once, against the open belief lasting
longest; these are the windows that fencing had to cover, with the commits the
older holder issued inside them.

Per key the check sorts leases and sweeps with heaps: O(n log n). When the
nemesis moved Valkey's clock, backend times are comparable only between two
moves: the sweep runs per key and per such stretch, over the leases whose timed
ops (acquires, grants, ended releases) all lie in it. With no key holding two
comparable leases the rule has nothing to judge: "unknown" with the reason.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from checkers.core import ViewCheck, Violations
from checkers.pairs import Lease, Pair, error_code
from checkers.view import LeaseView
from checkers.windows import Faults, backend_rules_note, segment_of

__all__ = ["MutualExclusionChecker"]

LOSS_CODES = frozenset(("lease_lost", "stale_token"))
MAX_NAMED = 10  # overlapping leases named per violation


class MutualExclusionChecker(ViewCheck):
    """Checks backend-time exclusivity of leases, and measures client-side unsafe windows."""

    def __init__(self, max_violations: int = 1000, max_windows: int = 1000):
        self.max_violations = max_violations
        self.max_windows = max_windows

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge the leases of a lease history."""
        pairs = view.pairs
        leases = view.leases
        by_key: dict[Any, list[Lease]] = defaultdict(list)
        for lease in leases.values():
            by_key[lease.key].append(lease)
        v = Violations(self.max_violations)
        moved = view.faults.clock_moves
        compared = 0
        groups = by_key.items() if not moved else _by_clock_segment(view.faults, by_key).items()
        excused = _RollbackExcuse(view.faults, pairs)
        for key, ls in groups:
            compared += _check_backend_overlaps(key[0] if moved else key, ls, v, excused)
        windows = _unsafe_windows(pairs, leases, by_key, self.max_windows, view.of("commit"))
        rules = backend_rules_note(moved) if not moved else (
            "per stretch between clock moves: the nemesis moved Valkey's clock, so only leases whose timed ops "
            "all lie between the same two moves are compared")
        return v.result(keys=len(by_key), leases=len(leases), keys_compared=compared, unsafe_windows=windows,
                        backend_time_rules=rules, unjudged=_unjudged(leases, moved, compared),
                        **excused.summary())


def _by_clock_segment(faults: Faults, by_key: dict[Any, list[Lease]]) -> dict[tuple, list[Lease]]:
    """(key, stretch) -> the leases whose every timed op lies in that stretch between clock moves.

    Backend times of one stretch are comparable with each other; a lease with ops on both sides of a
    move (or never completed), or with an op while a strobe was flipping a clock, is left out: fewer
    comparisons, never a false alarm.
    """
    bounds = faults.clock_segments
    strobes = faults.strobe_windows  # a strobe flips the clock between its start and reset ops

    def strobed(ops: list[Pair]) -> bool:
        return any(p.t0 <= e and (p.t1 is None or p.t1 >= s) for p in ops for s, e in strobes)

    out: dict[tuple, list[Lease]] = defaultdict(list)
    for key, ls in by_key.items():
        for lease in ls:
            ops = [*lease.acquires, *lease.grants, *(e for e in lease.ends if e.type == "ok")]
            seg = segment_of(ops, bounds)
            if seg is not None and not strobed(ops):
                out[(key, seg)].append(lease)
    return out


def _unjudged(leases: dict[Any, Lease], moved: list[int], compared: int) -> str | None:
    """Why the history gives the exclusion rule nothing to judge (None when it does)."""
    if not leases:
        return "no successful acquisition"
    if moved and not compared:
        return ("the nemesis moved Valkey's clock and no key has two leases between the same two moves, so "
                "no backend validity intervals were comparable (client-side unsafe windows are still reported)")
    if not compared:
        return ("no key has two leases with backend acquisition and expiry times: exclusion has nothing to "
                "compare")
    return None


def _backend_end(lease: Lease) -> Any:
    """The backend time at which the lease stopped being valid, as far as backend times tell."""
    exp, ended = lease.expires_at_ms, lease.ended_at_ms
    if exp is None or ended is None:
        return ended if exp is None else exp
    return min(exp, ended)


def _release_invoked(lease: Lease) -> int | None:
    """Monotonic time of the first release/revoke of the lease that ok'd or may have (None: never)."""
    ends = lease.ends
    if len(ends) < 2:  # the common case without a generator
        return ends[0].t0 if ends else None
    return min(p.t0 for p in ends)


class _RollbackExcuse:
    """The contract's restore row (section 8, "backup / restore, failover"): after Valkey lost or rolled back
    its state, a system may move to "a higher epoch and all restored leases invalid" instead of proving its
    counters. An overlap of lease L with lease M is then no violation when the history shows exactly that:

    - a Valkey loss E (the nemesis killed Valkey: `valkey-crash` or `kill` of `valkey`, or restored it from an
      older snapshot: `valkey-restore` end) completed after L's acquire was invoked, and M's acquire completed
      after E began (the nemesis op's invocation: M may have run on the restarted Valkey);
    - M's token is greater than L's (the higher epoch);
    - no renew, release or commit of L invoked after E succeeded (L really was invalid after E); a replayed
      commit (the original result of one validated before, `replayed: true`) is no such success.

    A system that kept L valid across E (a later success of L) and granted M over it is still convicted, and
    a token issued twice is the fencing checker's. Nothing else is excused.
    """

    SUCCESS_FS = frozenset(("renew", "release", "commit"))

    def __init__(self, faults: Faults, pairs: list[Pair]):
        self.losses = sorted(faults.valkey_losses)  # (began, completed), by completion below
        self.losses.sort(key=lambda e: e[1])
        self.last_success: dict[Any, int] = {}
        for p in pairs if self.losses else ():
            # a replayed commit is the original result of one validated earlier: no sign the lease lived on
            replayed = isinstance(p.result, dict) and p.result.get("replayed") is True
            if p.type == "ok" and p.f in self.SUCCESS_FS and not replayed:
                lid = p.lid  # op_lease_id(p)
                if lid is not None:
                    self.last_success[lid] = max(self.last_success.get(lid, p.t0), p.t0)
        self.count = 0

    def __call__(self, lease: Lease, m: Lease) -> bool:
        if not self.losses or lease.token is None or m.token is None or not m.token > lease.token:
            return False
        lo, hi = lease.first.t0, m.first.t1
        between = [done for began, done in self.losses if done > lo and hi is not None and began < hi]
        if not between:
            return False
        if self.last_success.get(lease.lease_id, lo) > max(between):  # L was used after the (last) loss: valid
            return False
        self.count += 1
        return True

    def __bool__(self) -> bool:
        """Whether there is anything to excuse (a Valkey loss in the history)."""
        return bool(self.losses)

    def summary(self) -> dict:
        if not self.losses:
            return {}
        return {"valkey_losses": len(self.losses), "overlaps_after_valkey_loss": self.count,
                "valkey_loss_rule": "a lease acquired before Valkey was killed or restored and never used "
                                    "successfully after it may be invalid (contract section 8, backup / restore: "
                                    "a higher epoch and all restored leases invalid); its overlaps with leases "
                                    "of higher tokens acquired after the loss are not violations"}


def _check_backend_overlaps(key: Any, leases: list[Lease], v: Violations, excused=None) -> int:
    """Sweep leases by acquired_at_ms, keeping those still valid at each acquisition; 1 if it compared any.

    `excused(lease, m)`: an overlap of `m` with `lease` that is not a violation (_RollbackExcuse).
    """
    # with nothing to excuse (no Valkey loss: _RollbackExcuse is falsy) no overlap is asked about
    excused = excused if excused else None
    timed = [lease for lease in leases if lease.acquired_at_ms is not None and _backend_end(lease) is not None]
    timed.sort(key=lambda x: (x.acquired_at_ms, x.token if x.token is not None else 0))
    if len(timed) >= _FEW and not _may_overlap(timed):
        return int(len(timed) > 1)  # the sweep below would find nothing and excuse nothing
    seq = itertools.count()
    valid: list[tuple] = []  # heap (backend end, seq, lease)
    held: dict[Any, Lease] = {}  # valid leases with no release: every one overlaps a newcomer
    alive: set = set()  # lease_ids still valid by backend time
    released: list[tuple] = []  # max-heap (-release invoke time, seq, lease), lazily pruned
    for m in timed:
        while valid and valid[0][0] <= m.acquired_at_ms:
            gone = heapq.heappop(valid)[2]
            held.pop(gone.lease_id, None)
            alive.discard(gone.lease_id)
        granted = m.granted  # min(p.t1 for p in m.acquires)
        unexcused = ([lease for lease in held.values() if not excused(lease, m)] if excused is not None
                     else list(held.values()))
        overlapping = unexcused[:MAX_NAMED]
        total = len(unexcused)
        popped = []
        while released and len(overlapping) < MAX_NAMED:
            neg_rel, s, lease = released[0]
            if lease.lease_id not in alive:
                heapq.heappop(released)  # no longer valid by backend time
                continue
            if -neg_rel < granted:
                break  # every remaining release may have taken effect before m was granted
            popped.append(heapq.heappop(released))
            if excused is not None and excused(lease, m):
                continue
            overlapping.append(lease)
            total += 1
        for e in popped:
            heapq.heappush(released, e)
        if overlapping:
            _report(key, m, overlapping, total, v)
        s = next(seq)
        heapq.heappush(valid, (_backend_end(m), s, m))
        alive.add(m.lease_id)
        rel = _release_invoked(m)
        if rel is None or m.ended_at_ms is not None:  # a reported backend end time is exact: valid until then
            held[m.lease_id] = m
        else:
            heapq.heappush(released, (-rel, s, m))
    return int(len(timed) > 1)


_FEW = 16  # below this many leases on a key the sweep costs less than the array pass that would skip it
_MIN = np.iinfo(np.int64).min


def _may_overlap(timed: list[Lease]) -> bool:
    """Whether `_check_backend_overlaps`'s sweep over `timed` (its order) may meet an overlap: some lease m with
    an earlier one L that is still valid at m's acquisition and counts, held (no release, or a reported end:
    `_backend_end(L) > m.acquired_at_ms`) or released (release invoked at or after m's grant). False means
    the sweep reports nothing and asks no excuse; True when a time is no int (then the sweep decides).

    Running maxima over the leases in sweep order (numpy), where a Python heap sweep would visit every lease
    of a 1M-op history."""
    acq, ends, granted, held, released = [], [], [], [], []
    for m in timed:
        a, e, g, r = m.acquired_at_ms, _backend_end(m), m.granted, _release_invoked(m)
        if a.__class__ is not int or e.__class__ is not int or g.__class__ is not int or not (
                r is None or r.__class__ is int):
            return True
        acq.append(a)
        ends.append(e)
        granted.append(g)
        if r is None or m.ended_at_ms is not None:
            held.append(e)
            released.append(_MIN)
        else:
            held.append(_MIN)
            released.append(r)
    try:
        held_a, released_a = np.array(held, dtype=np.int64), np.array(released, dtype=np.int64)
        acq_a, granted_a = np.array(acq, dtype=np.int64), np.array(granted, dtype=np.int64)
    except OverflowError:
        return True
    # the largest held end / release time among the leases before each one (exclusive running maxima)
    held_before = np.maximum.accumulate(held_a)[:-1]
    released_before = np.maximum.accumulate(released_a)[:-1]
    return bool(((held_before > acq_a[1:]) | (released_before >= granted_a[1:])).any())


def _report(key: Any, m: Lease, overlapping: list[Lease], total: int, v: Violations) -> None:
    """One violation: lease m was granted while the overlapping leases were valid."""
    ops = [m.first.i0, m.first.i1, *(lease.first.i1 for lease in overlapping)]
    names = ", ".join(f"{lease.lease_id!r} (token {lease.token}, valid until {_backend_end(lease)} ms)"
                      for lease in overlapping)
    more = f" and {total - len(overlapping)} more" if total > len(overlapping) else ""
    v.add("overlap", ops,
          f"key {key!r}: lease {m.lease_id!r} (token {m.token}) acquired at {m.acquired_at_ms} ms while "
          f"{names}{more} still valid",
          key=key, lease=m.lease_id, acquired_at_ms=m.acquired_at_ms,
          overlapping=[lease.lease_id for lease in overlapping], overlapping_count=total)


# --------------------------------------------------------------------------- client-side windows


def _belief_ends(pairs: list[Pair], leases: dict[Any, Lease]) -> dict[Any, int]:
    """lease_id -> monotonic time its holder stopped believing it held it (see the module docstring)."""
    stopped: dict[Any, int] = {}  # release invoked, or loss seen
    last_use: dict[Any, int] = {}
    last = last_use.get
    for p in pairs:
        lid = p.lid  # op_lease_id(p)
        if lid not in leases:
            continue
        t1 = p.t1
        t = t1 if t1 is not None else p.t0
        if t > last(lid, -1):
            last_use[lid] = t
        if p.f == "release":
            end = p.t0
        elif p.type == "fail" and error_code(p.comp) in LOSS_CODES:
            end = t1
        else:
            continue
        if end is not None and (lid not in stopped or end < stopped[lid]):
            stopped[lid] = end
    return {lid: stopped[lid] if lid in stopped else max(last_use[lid], _local_expiry(lease) or 0)
            for lid, lease in leases.items()}


def _local_expiry(lease: Lease) -> int | None:
    """The holder's own idea of the expiry: the latest grant's invocation time + its ttl_ms (monotonic ns)."""
    best = None
    for g in lease.grants:
        ttl = g.result.get("ttl_ms") if isinstance(g.result, dict) else None
        if ttl is not None:
            t = g.t0 + int(ttl * 1_000_000)
            best = t if best is None or t > best else best
    return best


def _unsafe_windows(pairs: list[Pair], leases: dict[Any, Lease], by_key: dict[Any, list[Lease]],
                    limit: int, commit_pairs: list[Pair] | None = None) -> dict:
    """Overlapping client beliefs per key, with the commits the older holder made inside them.
    `commit_pairs`: the commits of `pairs` in order, when the caller has them (`LeaseView.of`)."""
    ends = _belief_ends(pairs, leases)
    commits: dict[Any, list[Pair]] = defaultdict(list)
    for p in pairs if commit_pairs is None else commit_pairs:
        if p.f == "commit":
            commits[p.lid].append(p)  # pairs come in invocation order: sorted by t0
    commit_times: dict[Any, list[int]] = {}
    found: list[dict] = []
    count, total, longest = 0, 0, 0
    in_windows = {"ok": 0, "fail": 0, "info": 0}
    for key, ls in by_key.items():
        beliefs = sorted(((lease.granted, ends[lease.lease_id], lease)
                          for lease in ls), key=lambda b: b[0])
        open_end, holder = None, None
        for start, end, lease in beliefs:
            if holder is not None and start < open_end and end > start:
                w_end = min(end, open_end)
                count += 1
                total += w_end - start
                longest = max(longest, w_end - start)
                cs = commits.get(holder.lease_id, [])
                times = commit_times.setdefault(holder.lease_id, [c.t0 for c in cs])
                inside = cs[bisect.bisect_left(times, start):bisect.bisect_left(times, w_end)]
                for c in inside:
                    in_windows[c.type] += 1
                if len(found) < limit:
                    found.append({"key": key, "leases": [holder.lease_id, lease.lease_id], "start": start,
                                  "end": w_end, "duration_ms": (w_end - start) / 1e6,
                                  "ops": [holder.first.i1, lease.first.i1, *(c.i0 for c in inside)],
                                  "commits_by_older_holder": {t: sum(c.type == t for c in inside)
                                                              for t in ("ok", "fail", "info")}})
            if open_end is None or end > open_end:
                open_end, holder = end, lease
    return {"count": count, "total_ms": total / 1e6, "max_ms": longest / 1e6,
            "commits_by_older_holder": in_windows, "windows": found}
