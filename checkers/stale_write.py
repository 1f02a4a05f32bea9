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
from checkers.stale_commit import _hashable, _rev_number, commits_of  # one reading of entries and revisions

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
        commits = [_Write.of(c) for c in commits_of(history) if c.p.type == "ok"]
        known = [w for w in commits if w.lease_id in spans]
        by_entry = {w.entry: w for w in known if w.entry is not None}
        v = Violations(self.max_violations)
        for read in _final_reads(pairs):
            writes = [by_entry.get(_hashable(e)) for e in (read.result.get("entries") or [])]
            _sweep([w for w in writes if w is not None], spans, leases, v, read=read)
        by_doc: dict[tuple, list[_Write]] = defaultdict(list)
        for w in known:
            if w.rev is not None:
                by_doc[(w.p.key, w.doc)].append(w)
        for ws in by_doc.values():
            _sweep(sorted(ws, key=lambda w: w.rev), spans, leases, v, read=None)
        ordered = _ordered_keys(leases, spans)
        res = v.result(accepted_commits=len(commits), commits_with_known_lease=len(known),
                       keys_with_ordered_holders=ordered)
        if not len(v):
            if not known:
                res.update(valid="unknown", reason="no accepted commit of a known lease")
            elif not ordered:
                res.update(valid="unknown", reason="no key had two holders ordered in real time")
        return res


class _Write:
    """An accepted commit: its lease, entry, document and revision."""

    __slots__ = ("p", "lease_id", "entry", "doc", "rev")

    @classmethod
    def of(cls, c: Any) -> "_Write":
        """From stale-commit's `Commit` of the same op (its fields read once for both checkers): what
        `_Write(c.p)` would read."""
        w = cls.__new__(cls)
        w.p = c.p
        w.lease_id, w.entry, w.doc = c.written
        w.rev = c.rev  # both: None for a replayed commit, else the revision as an int (ok commits only here)
        return w

    def __init__(self, p: Pair):
        inv = p.inv.get("value")
        inv = inv if (inv.__class__ is dict or isinstance(inv, dict)) else _EMPTY
        comp = p.result if (p.result.__class__ is dict or isinstance(p.result, dict)) else _EMPTY
        sent = p.sent or _EMPTY
        self.p = p
        # each field as {**completion, **sent, **invocation-without-None} has it, one field at a time (hot path)
        self.lease_id = _field("lease_id", inv, sent, comp)
        e = _field("entry", inv, sent, comp)
        self.entry = _hashable(e) if isinstance(e, list | tuple) else None
        self.doc = _field("doc", inv, sent, comp)
        # a replayed commit may report the document's revision at the retry, not its own write's (as in
        # checkers/stale_commit.py): it is left out of the revision order
        self.rev = None if comp.get("replayed") else _rev_number(comp.get("rev"))


_EMPTY: dict = {}


def _field(name: str, inv: dict, sent: dict, comp: dict) -> Any:
    """One field of {**comp, **sent, **{k: x for k, x in inv.items() if x is not None}}."""
    x = inv.get(name)
    if x is not None:
        return x
    if name in sent:
        return sent[name]
    return comp.get(name)


def _span(lease: Lease, first: dict) -> tuple[int, int]:
    """(start, end) of a lease's acquisition in real time: earliest invocation, first ok completion."""
    start = acquisition_start(lease, first)
    end = lease.granted  # min(p.t1 for p in lease.acquires)
    return start, end


def _sweep(writes: list[_Write], spans: dict, leases: dict, v: Violations, *, read: Pair | None) -> None:
    """Along the store's order, flag a write whose holder precedes an earlier-placed write's holder."""
    best: tuple[int, _Write] | None = None  # the latest acquisition start among writes placed so far
    for w in writes:
        start, end = spans[w.lease_id]
        if best is not None and end < best[0] and leases[w.lease_id].key == leases[best[1].lease_id].key:
            succ = best[1]
            s_lease = leases[succ.lease_id]
            where = f"doc {w.doc!r} " + ("final read" if read is not None else "revision order")
            ops = [s_lease.first.i1, *succ.p.indices, *w.p.indices, *([read.i1] if read is not None else [])]
            v.add("stale-write", [i for i in ops if i is not None],
                  f"{where}: the write of lease {w.lease_id!r} (acquired before lease {succ.lease_id!r} was "
                  f"requested) was accepted after that successor's write",
                  key=w.p.key, doc=w.doc, lease=w.lease_id, successor=succ.lease_id, stale_commit=w.p.i1,
                  successor_commit=succ.p.i1, order="final-read" if read is not None else "rev")
        if best is None or start > best[0]:
            best = (start, w)


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


def _final_reads(pairs: list[Pair]) -> list[Pair]:
    """The last ok read of each document."""
    last: dict[tuple, Pair] = {}
    for p in pairs:
        if p.f == "read" and p.type == "ok" and isinstance(p.result, dict):
            inv = p.inv.get("value")
            k = (p.key, (inv.get("doc") if isinstance(inv, dict) else None) or p.result.get("doc"))
            if k not in last or p.t1 >= last[k].t1:
                last[k] = p
    return list(last.values())
