"""The fenced store as a history shows it: the commits (`Commit`) and the final read of each document
(`FinalRead`), each field read once.

What a commit carried (lease, token) is read from the invocation, then the
completion's `value.sent` (what went on the wire), then the rest of the
completion; its `written` is (lease_id, entry, doc) with the invocation first,
as stale-write reads them. Entries are made hashable (`hashable`: lists become
tuples, objects canonical JSON) so a final read's entries can be matched to the
commits that wrote them. Both stale-commit and stale-write judge these records;
a composition builds them once (`LeaseView.commits`, `LeaseView.final_reads`).
"""

from __future__ import annotations

import json
from typing import Any

from checkers.pairs import Pair

__all__ = ["Commit", "FinalRead", "commits_of", "final_reads", "hashable", "rev_number"]


class Commit:
    """A commit op with the fields the rules use, extracted once."""

    __slots__ = ("p", "key", "token", "carried", "validated", "rev", "lease_id", "request_id", "doc", "entry",
                 "returned_lease", "start", "written")

    def __init__(self, p: Pair, first_invoke: dict | None = None, settled: bool = False):
        inv = p.inv.get("value")
        inv = inv if (inv.__class__ is dict or isinstance(inv, dict)) else _EMPTY
        r = p.result
        comp = r if (r.__class__ is dict or isinstance(r, dict)) else _EMPTY
        typ = p.type
        res = comp if typ == "ok" else _EMPTY
        # the client may fill in what it sent (its lease, the entry) only in the completion's value; `sent`
        # (docs/history-format.md) is what went on the wire and outranks the rest of the completion: a field is
        # the sent one, else the invocation's (when not None), else the completion's (`_carried`)
        wire = p.sent
        self.p = p
        self.key = p.key
        # when it may have been accepted from: a replay (a retry with its request_id) from its request's first
        # invocation
        rk = p.rk
        # (`settled`: the pairs' `start` is set, `checkers.pairs.settle_starts`)
        self.start = p.start if settled else p.t0 if first_invoke is None or rk is None else first_invoke.get(rk, p.t0)
        if not wire:
            # no `sent` (the common case, written out: the hot path of a 1M-op history): each field is the
            # invocation's when not None, else the completion's, for this checker and stale-write alike
            self.returned_lease = None
            cg = comp.get
            try:  # subscripts where a plain dict has every field (the hot path), `get` otherwise
                if inv.__class__ is not dict:
                    raise KeyError
                carried, lid, rid, doc, e = (inv["fencing_token"], inv["lease_id"], inv["request_id"], inv["doc"],
                                             inv["entry"])
            except KeyError:
                ig = inv.get
                carried, lid, rid, doc, e = (ig("fencing_token"), ig("lease_id"), ig("request_id"), ig("doc"),
                                             ig("entry"))
            if carried is None:
                carried = cg("fencing_token")
            if lid is None:
                lid = cg("lease_id")
            self.request_id = rid if rid is not None else cg("request_id")
            if doc is None:
                doc = cg("doc")
            if e is None:
                e = cg("entry")
            ec = e.__class__
            he = (e if ec is tuple else tuple(e)) if ec is list or ec is tuple else None
            if he is not None:
                try:
                    hash(he)  # the common case: a list of scalars (else `_hashable` itself)
                except TypeError:
                    he = hashable(e)
            elif isinstance(e, list | tuple):
                he = hashable(e)
            self.entry = he if he is not None and len(he) == 3 else (p.process, carried, hashable(e))
            self.written = (lid, he, doc)
        else:
            # the lease the boundary says it accepted the commit under, when a history with `sent` reports one
            self.returned_lease = res.get("lease_id")
            carried = _carried("fencing_token", wire, inv, comp)
            lid = _carried("lease_id", wire, inv, comp)
            self.request_id = _carried("request_id", wire, inv, comp)
            doc = _carried("doc", wire, inv, comp)
            e = _carried("entry", wire, inv, comp)
            # the entry as the final read lists it: the [process, token, n] triple itself, when it is one
            self.entry = hashable(e) if isinstance(e, list | tuple) and len(e) == 3 else (
                p.process, carried, hashable(e))
            # stale-write reads the same fields with the invocation first ({**completion, **sent, **invocation
            # without None}): (lease_id, entry, doc) as it reads them, computed here once for both checkers
            if inv:
                lid2, e2, doc2 = inv.get("lease_id"), inv.get("entry"), inv.get("doc")
                lid2 = lid2 if lid2 is not None else lid if "lease_id" in wire else comp.get("lease_id")
                e2 = e2 if e2 is not None else e if "entry" in wire else comp.get("entry")
                doc2 = doc2 if doc2 is not None else doc if "doc" in wire else comp.get("doc")
            else:
                lid2, e2, doc2 = lid, e, doc
            self.written = (lid2, hashable(e2) if isinstance(e2, list | tuple) else None, doc2)
        self.carried = carried
        self.lease_id = lid
        self.doc = doc
        if res:
            accepted = res.get("accepted_token")
            self.token = carried if accepted is None else accepted  # what the boundary accepted
            self.validated = res.get("validated_at_ms")
            # a replayed commit (an idempotent retry) may report the document's revision at the time of the
            # retry, not the one its original write made (the reference server does: lab/server/commit.py
            # already_applied): its place in revision order is unknown, so it is left out of that order (the
            # final read still has it)
            rev = res.get("rev")
            self.rev = None if res.get("replayed") else rev if rev.__class__ is int else rev_number(rev)
        else:
            self.token, self.validated, self.rev = carried, None, None


_EMPTY: dict = {}


def _carried(field: str, wire: dict, inv: dict, comp: dict) -> Any:
    """What a commit carried in `field`: what was sent (`value.sent`), else the invocation's value when not
    None, else the completion's (the merge {**completion, **invocation-without-None, **sent}, one field)."""
    if field in wire:
        return wire[field]
    x = inv.get(field)
    return x if x is not None else comp.get(field)


def commits_of(commit_pairs: list[Pair], first_invoke: dict[tuple, int] | None = None,
               settled: bool = False) -> list[Commit]:
    """The commit ops (`commit_pairs`, in invocation order) as `Commit`s; `first_invoke`: `first_invocations`
    of the history's pairs (a replay's acceptance may date from its first attempt)."""
    return [Commit(p, first_invoke, settled) for p in commit_pairs]


def hashable(x: Any) -> Any:
    """A hashable, comparable stand-in for a JSON value (lists become tuples, objects canonical JSON)."""
    if isinstance(x, list | tuple):
        t = tuple(x)
        try:
            hash(t)  # the common case: a list of scalars
            return t
        except TypeError:
            return tuple(hashable(e) for e in x)
    if isinstance(x, dict):
        return json.dumps(x, sort_keys=True)
    return x


def rev_number(rev: Any) -> int | None:
    """A revision as an int: ints as they are, CouchDB's "N-hash" as N, else None."""
    if isinstance(rev, int) and not isinstance(rev, bool):
        return rev
    if isinstance(rev, str):
        head = rev.split("-", 1)[0]
        return int(head) if head.isdigit() else None
    return None


class FinalRead:
    """The last ok read of one document, with its entries as hashable tuples (None when not a list)."""

    __slots__ = ("p", "key", "doc", "entries")

    def __init__(self, p: Pair):
        val = p.inv.get("value")
        self.p = p
        self.key = p.key
        self.doc = (val.get("doc") if isinstance(val, dict) else None) or p.result.get("doc")
        entries = p.result.get("entries") or []
        self.entries = [hashable(e) for e in entries] if isinstance(entries, list) else None


def final_reads(read_pairs: list[Pair]) -> dict[tuple, FinalRead]:
    """(key, doc) -> the last ok read of that document (by completion), of `read_pairs` (the history's reads)."""
    last: dict[tuple, Pair] = {}
    for p in read_pairs:
        if p.f == "read" and p.type == "ok" and isinstance(p.result, dict):
            val = p.inv.get("value")
            k = (p.key, (val.get("doc") if isinstance(val, dict) else None) or p.result.get("doc"))
            if k not in last or p.t1 >= last[k].t1:
                last[k] = p
    return {k: FinalRead(p) for k, p in last.items()}
