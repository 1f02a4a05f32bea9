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
commit, the stale commit (invocation and completion) and the read.

Entries are matched to commits by the `entry` the commit carried (the
`[process, token, n]` triple the fenced-append workload writes); an entry
with no matching accepted commit, or a commit whose lease no ok acquire
reported, is skipped. With no accepted commit whose holder is known, or no
key with two ordered holders, nothing was judged: "unknown" with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

from checkers.core import Lease, Pair, Violations, acquisition_start, analyzed, first_invocations, lease_index
from checkers.core import pair_ops
from checkers.stale_commit import _hashable, commits_of, final_reads  # one reading of entries and revisions

__all__ = ["StaleWriteChecker"]


class StaleWriteChecker:
    """Writes of an earlier holder accepted after a later holder's (see module docstring)."""

    def __init__(self, max_violations: int = 1000):
        self.max_violations = max_violations

    @analyzed
    def check(self, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        pairs = pair_ops(history)
        leases = lease_index(history)
        first = first_invocations(pairs)
        spans = {lid: _span(lease, first) for lid, lease in leases.items()}
        # stale-commit's `Commit`s of the same ops, their fields read once for both checkers: `written` is
        # (lease_id, entry, doc) as this checker reads them (`_Write`), `rev` the same
        commits = [c for c in commits_of(history) if c.p.type == "ok"]
        known = [c for c in commits if c.written[0] in spans]
        by_entry = {c.written[1]: c for c in known if c.written[1] is not None}
        v = Violations(self.max_violations)
        for read in final_reads(history).values():
            entries = read.entries
            if entries is None:  # not a list: each item as it iterates
                entries = [_hashable(e) for e in (read.p.result.get("entries") or [])]
            writes = [by_entry.get(e) for e in entries]
            _sweep([w for w in writes if w is not None], spans, leases, v, read=read.p)
        by_doc: dict[tuple, list] = defaultdict(list)
        for c in known:
            if c.rev is not None:
                by_doc[(c.p.key, c.written[2])].append(c)
        for ws in by_doc.values():
            _sweep(sorted(ws, key=_rev), spans, leases, v, read=None)
        ordered = _ordered_keys(leases, spans)
        res = v.result(accepted_commits=len(commits), commits_with_known_lease=len(known),
                       keys_with_ordered_holders=ordered)
        if not len(v):
            if not known:
                res.update(valid="unknown", reason="no accepted commit of a known lease")
            elif not ordered:
                res.update(valid="unknown", reason="no key had two holders ordered in real time")
        return res


def _span(lease: Lease, first: dict) -> tuple[int, int]:
    """(start, end) of a lease's acquisition in real time: earliest invocation, first ok completion."""
    start = acquisition_start(lease, first)
    end = lease.granted  # min(p.t1 for p in lease.acquires)
    return start, end


def _rev(c: Any) -> Any:
    """A commit's revision (a sort key)."""
    return c.rev


def _sweep(writes: list, spans: dict, leases: dict, v: Violations, *, read: Pair | None) -> None:
    """Along the store's order, flag a write whose holder precedes an earlier-placed write's holder.

    `writes`: stale-commit's `Commit`s, (lease_id, entry, doc) as this checker reads them in `written`."""
    best: tuple[int, Any] | None = None  # the latest acquisition start among writes placed so far
    best_start = None
    for w in writes:
        lid, _, doc = w.written
        start, end = spans[lid]
        if best is not None and end < best_start and leases[lid].key == leases[best[1].written[0]].key:
            succ = best[1]
            s_lid = succ.written[0]
            s_lease = leases[s_lid]
            where = f"doc {doc!r} " + ("final read" if read is not None else "revision order")
            ops = [s_lease.first.i1, *succ.p.indices, *w.p.indices, *([read.i1] if read is not None else [])]
            v.add("stale-write", [i for i in ops if i is not None],
                  f"{where}: the write of lease {lid!r} (acquired before lease {s_lid!r} was "
                  f"requested) was accepted after that successor's write",
                  key=w.p.key, doc=doc, lease=lid, successor=s_lid, stale_commit=w.p.i1,
                  successor_commit=succ.p.i1, order="final-read" if read is not None else "rev")
        if best is None or start > best_start:
            best, best_start = (start, w), start


def _ordered_keys(leases: dict, spans: dict) -> int:
    """How many keys have two leases ordered in real time (something this rule can judge)."""
    by_key: dict[Any, list] = defaultdict(list)
    for lid, lease in leases.items():
        by_key[lease.key].append(spans[lid])
    n = 0
    for ss in by_key.values():
        if len(ss) > 1 and min(e for _, e in ss) < max(s for s, _ in ss):
            n += 1
    return n
