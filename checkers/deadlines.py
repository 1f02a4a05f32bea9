"""Deadlines (every call finishes within its deadline) and availability (success rate, latency).

`deadlines` (contract C22, C23): an invocation's `value` carries its deadline,
either `deadline_ms` (relative to the invocation) or `deadline_at_ms` (absolute
Unix ms; needs the wall-clock start of the test, `start_unix_ms` given to the
checker or in the test map, to be placed on the history's monotonic clock).
Every completion (ok, fail or info) must come at most `slack_ms` after the
deadline (`deadline-exceeded`); an invocation that never completed although the
history runs past its deadline plus slack is a `no-completion` violation.
Ops that overlap a `client-pause` window are not judged (`client_paused`): the
lab held its own client there, so a late completion says nothing about the
system; nor are definite failures of calls that never started (`not_started`:
`deadline_exceeded`, C23's "not started before the deadline", and
`connect_error`): the system did no work past the deadline, and when the
caller gave up is the caller's. Ops without a deadline are counted (`no_deadline`); with `require_deadline=True`
each one is a `missing-deadline` violation. With no op carrying a deadline it
can place the checker has nothing to judge: "unknown" with the reason.

`availability` is informational: per f and per nemesis window, the success rate
(ok / all invocations, info and never-completed included) and latency quantiles
(p50/p95/p99/max in ms over completed ops). Windows come from
`checkers.windows.Faults.windows` (value `{"phase": "start"|"end"}` or
`start-<fault>` / `stop-<fault>` f names); an op belongs to every window its
invocation falls in, and to `outside` when it falls in none. It is valid unless a
configured `min_success_rate` (a float for all ops, or {f: float}) is not met;
with no operation, or none that succeeded (a wrong URL, a wrong key), it is
"unknown" with the reason: a run that exercised nothing passes nothing.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Mapping

import numpy as np

from checkers.core import ViewCheck, Violations
from checkers.pairs import Pair, error_code
from checkers.view import LeaseView

__all__ = ["AvailabilityChecker", "DeadlinesChecker"]

TYPES = ("ok", "fail", "info")
# Faults that hold the lab's own clients (a paused worker completes late through no fault of the system).
LAB_PAUSES = frozenset(("client-pause",))
# Definite failures of calls that never started in the system (C23: not started before the deadline; the
# client could not connect): the system did no work past the deadline, and when the caller gave up is its own.
NOT_STARTED = frozenset(("deadline_exceeded", "connect_error"))


class DeadlinesChecker(ViewCheck):
    """Checks every completion against its invocation's deadline plus a slack."""

    def __init__(self, slack_ms: float = 100.0, require_deadline: bool = False,
                 start_unix_ms: int | None = None, max_violations: int = 1000):
        if slack_ms < 0:
            raise ValueError(f"slack_ms must be >= 0, got {slack_ms}")
        self.slack_ms = slack_ms
        self.require_deadline = require_deadline
        self.start_unix_ms = start_unix_ms
        self.max_violations = max_violations

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge every client op that carries a deadline."""
        anchor = self.start_unix_ms if self.start_unix_ms is not None else (test or {}).get("start_unix_ms")
        slack = int(self.slack_ms * 1_000_000)
        end = None  # the history's end (view.faults.end), when first needed (a pass over every op of the history)
        v = Violations(self.max_violations)
        checked = no_deadline = unanchored = paused = not_started = 0
        worst = 0
        held = [(w["start"], w["end"]) for w in view.faults.windows if w["fault"] in LAB_PAUSES]
        if held:
            end = view.faults.end
        for p in view.pairs:
            if held and _overlaps(p, held, end):
                paused += 1  # the lab held this client: its lateness is the lab's, not the system's
                continue
            if p.type == "fail" and error_code(p.comp) in NOT_STARTED:
                not_started += 1  # never ran in the system: when the caller gave up is the caller's
                continue
            rel = p.dl  # _deadline_ns(p, anchor), its common case inline (1M-op histories): read while pairing
            limit = p.t0 + int(rel * 1_000_000) if rel is not None else _deadline_ns(p, anchor)
            if limit is None:
                missing = _has_absolute(p)
                unanchored += missing
                no_deadline += not missing
                if self.require_deadline and not missing:
                    v.add("missing-deadline", [p.i0], f"{p.f} by process {p.process} has no deadline", f=p.f)
                continue
            checked += 1
            done = p.t1
            if done is None:
                if end is None:
                    end = view.faults.end
                done = end
            over = done - limit
            if over > worst:
                worst = over
            if over <= slack:
                continue
            if p.t1 is None:
                v.add("no-completion", [p.i0], f"{p.f} by process {p.process} never completed, "
                      f"{over / 1e6:.1f} ms past its deadline", f=p.f, overrun_ms=over / 1e6)
            else:
                v.add("deadline-exceeded", p.indices, f"{p.f} by process {p.process} completed ({p.type}) "
                      f"{over / 1e6:.1f} ms after its deadline", f=p.f, overrun_ms=over / 1e6)
        unjudged = None
        if not checked:
            unjudged = ("no operations" if not no_deadline and not unanchored else
                        "no operation carries a deadline the checker can place (deadline_ms, or deadline_at_ms "
                        "with the test's start_unix_ms)")
        return v.result(slack_ms=self.slack_ms, checked=checked, no_deadline=no_deadline,
                        unanchored=unanchored, client_paused=paused, not_started=not_started,
                        max_overrun_ms=worst / 1e6, unjudged=unjudged)


def _overlaps(p: Pair, windows: list[tuple[int, int]], end: int) -> bool:
    """Whether the op's span [invoked, completed] meets one of the windows."""
    t1 = p.t1 if p.t1 is not None else end
    return any(p.t0 <= w_end and t1 >= w_start for w_start, w_end in windows)


def _has_absolute(p: Pair) -> bool:
    """The op carries an absolute deadline (that could not be placed on the monotonic clock)."""
    val = p.inv.get("value")
    return isinstance(val, dict) and val.get("deadline_at_ms") is not None


def _deadline_ns(p: Pair, anchor: int | None) -> int | None:
    """The op's deadline on the history's monotonic clock (ns), or None when it has none we can place."""
    val = p.inv.get("value")
    if not isinstance(val, dict):
        return None
    rel = val.get("deadline_ms")
    if rel is not None:
        return p.t0 + int(rel * 1_000_000)
    at = val.get("deadline_at_ms")
    if at is not None and anchor is not None:
        return int((at - anchor) * 1_000_000)
    return None


# --------------------------------------------------------------------------- availability


class AvailabilityChecker(ViewCheck):
    """Success rates and latency quantiles per f and per nemesis window; valid unless under a minimum."""

    def __init__(self, min_success_rate: float | Mapping[str, float] | None = None):
        rates = min_success_rate.values() if isinstance(min_success_rate, Mapping) else [min_success_rate]
        for r in rates:
            if r is not None and not 0 <= r <= 1:
                raise ValueError(f"min_success_rate must be within [0, 1], got {r}")
        self.min_success_rate = min_success_rate

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Measure availability overall, per f, and inside / outside each nemesis window."""
        pairs = view.pairs
        cols = _columns(pairs)
        windows = view.faults.windows
        everything = np.ones(len(pairs), dtype=bool)
        outside = everything.copy()
        per_window = []
        t0 = cols["t0"]
        # pairs come in invocation order: with times that never go backwards a window's ops are one slice,
        # found by bisection (the same ops in the same order as the mask would select)
        ordered = t0.size < 2 or bool((t0[1:] >= t0[:-1]).all())
        for w in windows:
            if ordered and _int64(w["start"]) and _int64(w["end"]):
                a, b = np.searchsorted(t0, w["start"], "left"), np.searchsorted(t0, w["end"], "right")
                outside[a:b] = False
                per_window.append({**w, **_stats(cols, slice(a, b))})
                continue
            inside = (t0 >= w["start"]) & (t0 <= w["end"])
            outside &= ~inside
            per_window.append({**w, **_stats(cols, inside)})
        overall = _stats(cols, everything)
        v = Violations()
        self._check_minimum(overall, pairs, v)
        unjudged = None
        if not pairs:
            unjudged = "no operations"
        elif not overall["ok"]:
            unjudged = "every operation failed" if overall["fail"] == len(pairs) else "no operation succeeded"
        return v.result(overall=overall, windows=per_window, outside=_stats(cols, outside), unjudged=unjudged)

    def _check_minimum(self, overall: dict, pairs: list[Pair], v: Violations) -> None:
        """Report each success rate below its configured minimum."""
        wanted = self.min_success_rate
        if wanted is None:
            return
        targets = wanted.items() if isinstance(wanted, Mapping) else [(None, wanted)]
        for f, minimum in targets:
            got = overall["success_rate"] if f is None else overall["by_f"].get(f, {}).get("success_rate")
            if got is None or got >= minimum:
                continue
            bad = [p.i0 for p in pairs if p.type != "ok" and (f is None or p.f == f)][:20]
            v.add("availability", bad, f"success rate of {f or 'all ops'} {got:.3f} is below {minimum}",
                  f=f, success_rate=got, minimum=minimum)


def _int64(x: object) -> bool:
    """An int numpy compares exactly (not a bool, within int64)."""
    return x.__class__ is int and -(1 << 62) < x < (1 << 62)


def _columns(pairs: list[Pair]) -> dict:
    """The pairs as numpy columns: invoke time, latency (ms, NaN if never completed), type, f index."""
    n = len(pairs)
    try:
        fs = set(map(attrgetter("f"), pairs))
        strs = all(f.__class__ is str for f in fs)
    except TypeError:  # an f that cannot be hashed (it is named by its str)
        strs = False
    names = sorted(fs if strs else {str(p.f) for p in pairs})
    fid = {f: i for i, f in enumerate(names)}
    tid = {t: i for i, t in enumerate(TYPES)}
    # map and attrgetter where they do: the per-op loops in C (1M-op histories)
    t0 = np.fromiter(map(attrgetter("t0"), pairs), dtype=np.int64, count=n)
    # completion times with NaN for the never completed, the latency then computed on the arrays
    t1 = np.array(list(map(attrgetter("t1"), pairs)), dtype=np.float64)  # None becomes NaN
    if t1.shape != (n,):
        t1 = np.fromiter([t if t is not None else np.nan for t in map(attrgetter("t1"), pairs)], dtype=np.float64,
                         count=n)
    lat = (t1 - t0) / 1e6
    typ = np.fromiter(map(tid.__getitem__, map(attrgetter("type"), pairs)), dtype=np.int8, count=n)
    f = (np.fromiter(map(fid.__getitem__, map(attrgetter("f"), pairs)), dtype=np.int32, count=n) if strs else
         np.fromiter([fid[p.f] if p.f.__class__ is str else fid[str(p.f)] for p in pairs], dtype=np.int32, count=n))
    return {"names": names, "t0": t0, "lat": lat, "typ": typ, "f": f}


def _summary(lat: np.ndarray, typ: np.ndarray) -> dict:
    """Counts by type, success rate and latency quantiles of one selection of ops."""
    n = int(typ.size)
    counts = np.bincount(typ, minlength=len(TYPES))
    done = lat[~np.isnan(lat)]
    q = np.percentile(done, [50, 95, 99]).tolist() if done.size else [None] * 3
    return {"count": n, **{t: int(c) for t, c in zip(TYPES, counts)},
            "success_rate": float(counts[0]) / n if n else None,
            "latency_ms": {"p50": q[0], "p95": q[1], "p99": q[2], "max": float(done.max()) if done.size else None}}


def _stats(cols: dict, mask: np.ndarray | slice) -> dict:
    """Summary of the masked ops (a boolean mask, or a slice), overall and per f."""
    lat, typ, f = cols["lat"][mask], cols["typ"][mask], cols["f"][mask]
    by_f = {}
    for i, name in enumerate(cols["names"]):
        sel = f == i
        if sel.any():
            by_f[name] = _summary(lat[sel], typ[sel])
    return {**_summary(lat, typ), "by_f": by_f}
