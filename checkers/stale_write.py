"""Stale writes (Kleppmann, 2016): a write accepted into the store after a write of a LATER lock holder.

Needs no fencing token, so it judges locks that hand out none (`valkey-lock`)
as well as those that do. The holder order comes from real time alone: lease
A precedes lease B on a key when A's acquisition completed (ok) before B's
acquisition was invoked (a replay's first attempt counts as its start).
Leases whose acquisitions overlap in real time are not ordered.

The store's order is read twice: the entry order of each document's final
read, and the revision order of accepted commits (`rev`, "N-..." or an int).
A `stale-write` violation is a write whose holder precedes the holder of a
write the store had already accepted: the paused holder's commit landing after
its successor's. Its ops are the successor's acquisition, the successor's
commit, the stale commit (invocation and completion) and the read; it names
the mechanism that made the stale holder (`mechanism`: stall, client-pause,
crash-and-carry-on, partition or unknown, also in its message; `checkers.origin`).

Entries are matched to commits by the `entry` the commit carried (the
`[process, token, n]` triple the fenced-append workload writes); an entry
with no matching accepted commit, or a commit whose lease no ok acquire
reported, is skipped. With no accepted commit whose holder is known, or no
key with two ordered holders, nothing was judged: "unknown" with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

from checkers.commits import hashable
from checkers.core import ViewCheck, Violations
from checkers.origin import concurrency_of, name_origins
from checkers.pairs import Pair, acquisition_start
from checkers.view import LeaseView

__all__ = ["StaleWriteChecker"]


class StaleWriteChecker(ViewCheck):
    """Writes of an earlier holder accepted after a later holder's (see module docstring)."""

    def __init__(self, max_violations: int = 1000):
        self.max_violations = max_violations

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge the accepted commits of a fenced-append history against the holders' real-time order."""
        leases = view.leases
        view.starts  # noqa: B018 - every pair's `start` settled: `acquisition_start(lease, None)` reads them
        first = None
        spans = {}  # lease_id -> `_span`, written out (the hot path: every lease of a 1M-op history)
        for lid, lease in leases.items():
            start = lease.started
            spans[lid] = (acquisition_start(lease, first) if start is None else start, lease.granted)
        # the view's `Commit`s (checkers.commits), their fields read once for stale-commit and this checker:
        # `written` is (lease_id, entry, doc) as this checker reads them, `rev` the same
        commits = [c for c in view.commits if c.p.type == "ok"]
        known = []  # (acquisition start, end, commit) of each accepted commit of a known lease
        for c in commits:
            span = spans.get(c.written[0])
            if span is not None:
                known.append((*span, c))
        by_entry = {w[2].written[1]: w for w in known if w[2].written[1] is not None}
        v = Violations(self.max_violations)
        for read in view.final_reads.values():
            entries = read.entries
            if entries is None:  # not a list: each item as it iterates
                entries = [hashable(e) for e in (read.p.result.get("entries") or [])]
            writes = [by_entry.get(e) for e in entries]
            _sweep([w for w in writes if w is not None], leases, v, read=read.p)
        by_doc: dict[tuple, list] = defaultdict(list)
        for w in known:
            c = w[2]
            if c.rev is not None:
                by_doc[(c.p.key, c.written[2])].append(w)
        for ws in by_doc.values():
            _sweep(sorted(ws, key=_rev), leases, v, read=None)
        name_origins(v, view, commits, concurrency_of(test), lease_of=lambda c: c.written[0])
        ordered = _ordered_keys(leases, spans)
        res = v.result(accepted_commits=len(commits), commits_with_known_lease=len(known),
                       keys_with_ordered_holders=ordered)
        if not len(v):
            if not known:
                res.update(valid="unknown", reason="no accepted commit of a known lease")
            elif not ordered:
                res.update(valid="unknown", reason="no key had two holders ordered in real time")
        return res


def _rev(w: tuple) -> Any:
    """The revision of a (start, end, commit) (a sort key)."""
    return w[2].rev


def _sweep(writes: list[tuple], leases: dict, v: Violations, *, read: Pair | None) -> None:
    """Along the store's order, flag a write whose holder precedes an earlier-placed write's holder.

    `writes`: (acquisition start, acquisition end, `checkers.commits.Commit`) of the lease of each write, in the
    store's order; (lease_id, entry, doc) as this checker reads them are the commit's `written`."""
    if not writes:
        return
    best_start, _, best = writes[0]  # the latest acquisition start among writes placed so far, and its write
    for i in range(1, len(writes)):
        start, end, w = writes[i]
        if end < best_start and leases[w.written[0]].key == leases[best.written[0]].key:
            lid, _, doc = w.written
            succ = best
            s_lid = succ.written[0]
            s_lease = leases[s_lid]
            where = f"doc {doc!r} " + ("final read" if read is not None else "revision order")
            ops = [s_lease.first.i1, *succ.p.indices, *w.p.indices, *([read.i1] if read is not None else [])]
            v.add("stale-write", [i for i in ops if i is not None],
                  f"{where}: the write of lease {lid!r} (acquired before lease {s_lid!r} was "
                  f"requested) was accepted after that successor's write",
                  key=w.p.key, doc=doc, lease=lid, successor=s_lid, stale_commit=w.p.i1,
                  successor_commit=succ.p.i1, order="final-read" if read is not None else "rev")
        if start > best_start:
            best_start, best = start, w


def _ordered_keys(leases: dict, spans: dict) -> int:
    """How many keys have two leases ordered in real time (something this rule can judge): per key, the
    earliest acquisition end before the latest start."""
    lo: dict[Any, Any] = {}  # key -> the earliest acquisition end
    hi: dict[Any, Any] = {}  # key -> the latest acquisition start
    many: set = set()  # keys with two leases or more
    for lid, lease in leases.items():
        s, e = spans[lid]
        k = lease.key
        if k in lo:
            many.add(k)
            if e < lo[k]:
                lo[k] = e
            if s > hi[k]:
                hi[k] = s
        else:
            lo[k], hi[k] = e, s
    return sum(1 for k in many if lo[k] < hi[k])
