"""Stale commits: what the fenced-write boundary accepted, and what the store kept.

Reads the `commit` ops and the final-phase `read` ops of a lease history
(contract C24-C29). Violation kinds, each naming the ops that show it:

- `token-regression`: an accepted commit carries a lower token than one already
  accepted: (a) in real time per key (identity): commit A completed ok before
  commit B was invoked and B was accepted with a lower token (the high-water mark
  is per identity, C26); (b) in the document's revision order (`rev`, an int or
  CouchDB's "N-..." form); (c) in the entry order of the final read.
- `validated-after-expiry`: `validated_at_ms` >= the lease's latest known
  `expires_at_ms` (the largest any acquire/renew ok of that lease_id reported).
- `validated-after-end`: `validated_at_ms` >= the backend release/revoke time,
  when a release/revoke ok reports one (`released_at_ms`, `revoked_at_ms`, `ended_at_ms`).
- `commit-after-release`: accepted although invoked after a release/revoke of its
  lease had completed ok (real time).
- `commit-after-successor`: accepted although a lease with a higher token on the
  same key was acquired before it: strictly earlier `acquired_at_ms` than the
  commit's `validated_at_ms`, or an acquire ok completed before the commit was invoked.
- `token-mismatch`: `accepted_token` differs from the token the commit carried.
- `lease-mismatch`: the commit was accepted under a lease other than the one
  the client sent (`value.sent.lease_id`, C25: this exact lease).
- `lost-commit`: an ok commit that completed before the final read of its doc
  was invoked is missing from that read. It needs the final read: with
  `final_read=True` (a workload whose final phase reads every document it
  committed to, fenced-append), an acknowledged commit whose document has no
  final read (`unread_docs`; an interrupted run) makes the verdict "unknown"
  with that reason instead of a vacuous true.
- `duplicate-entry`: one entry appears twice in a final read (applied twice).
- `failed-commit-visible`: the entry of a commit that failed (definitely did not
  happen) appears in a final read.

Every violation about one stale commit (the token regressions of real time and revisions, the expiry,
end, release and successor rules) names it (`stale_commit`: its completion's index) and the mechanism that
made its holder stale (`mechanism`: stall, client-pause, crash-and-carry-on, partition or unknown, also in
its message; `checkers.origin`).

Replays (a commit whose request_id was first invoked before the event that
would make it stale) are exempt from the real-time rules. Commits whose lease
no ok acquire reported are counted as `unknown_lease` and not timed.
The commit's `entry` is expected to be the `[process, token, n]` triple the
final read lists; any other `entry` is matched as (process, token, entry).
What a commit carried (lease, token) is read from the invocation, then the
completion's `value.sent` (what went on the wire), then the rest of the
completion. With no accepted commit nothing was judged: "unknown" with the reason.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import defaultdict
from typing import Any, Mapping

from checkers.commits import Commit, FinalRead
from checkers.core import ViewCheck, Violations
from checkers.origin import concurrency_of, name_origins
from checkers.pairs import ASK, Lease, PrefixMax, request_key, successor_index
from checkers.view import LeaseView
from checkers.windows import backend_rules_note

__all__ = ["StaleCommitChecker"]


class StaleCommitChecker(ViewCheck):
    """Checks accepted commits against leases, tokens and the final state (see module docstring)."""

    def __init__(self, max_violations: int = 1000, final_read: bool = False):
        """`final_read`: the workload reads back every document it committed to in a final phase (fenced-append),
        so an acknowledged commit whose document has no final read left the lost-commit rule unjudged (an
        interrupted run): the verdict is then "unknown" with that reason, never a vacuous true."""
        self.max_violations = max_violations
        self.final_read = final_read

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge the commits and final reads of a lease history."""
        leases = view.leases
        view.starts  # noqa: B018 - every pair's `start` settled (the commits' starts are read from them)
        commits = view.commits
        reads = view.final_reads
        for read in reads.values():
            if read.entries is None:
                raise ValueError(f"op {read.p.i1}: read entries must be a list, got "
                                 f"{type(read.p.result.get('entries')).__name__}")
        v = Violations(self.max_violations)
        accepted = [c for c in commits if c.p.type == "ok"]
        _check_realtime_order(accepted, v)  # each Commit knows its start (first_invoke)
        _check_rev_order(accepted, v)
        moved = view.faults.clock_moves
        unknown = _check_against_leases(accepted, leases, {}, v, backend_times=not moved,
                                        successors=view.successors,
                                        starts_known=True)  # the view's commits read them from their pairs
        for read in reads.values():
            _check_read(read, v)
        _check_lost_and_phantom(commits, reads, v)
        name_origins(v, view, accepted, concurrency_of(test))
        counts = {"ok": 0, "fail": 0, "info": 0}
        for c in commits:
            counts[c.p.type] += 1
        unread = _unread_docs(accepted, reads)
        unjudged = None
        if not commits:
            unjudged = "no commit"
        elif not accepted:
            unjudged = "no commit was accepted (every one failed or is indeterminate)"
        elif self.final_read and unread:
            unjudged = (f"the final read did not happen for {len(unread)} document(s) with acknowledged commits "
                        f"(docs_read: {len(reads)}; an interrupted run?): the lost-commit rule was not judged for "
                        f"them")
        return v.result(commits=counts, docs_read=len(reads), unknown_lease=unknown,
                        backend_time_rules=backend_rules_note(moved), unjudged=unjudged,
                        **({"unread_docs": sorted(map(str, unread))[:20]} if unread else {}))


def _check_realtime_order(accepted: list[Commit], v: Violations, first_invoke: dict | None = None) -> None:
    """Per key: a commit accepted after another completed must not carry a lower token.

    A replay (a retry with its request_id) starts at its request's first invocation: its acceptance may date
    from then (`Commit.start`; `first_invoke` for commits built without it)."""
    by_key: dict[Any, list[Commit]] = defaultdict(list)
    for c in accepted:
        if c.token is not None:
            by_key[c.key].append(c)
    for key, cs in by_key.items():
        by_end = sorted([(c.p.t1, c) for c in cs], key=_first)
        j, n, best, best_token = 0, len(by_end), None, None
        starts = [(c.start if first_invoke is None else first_invoke.get(request_key(c.p), c.p.t0), c) for c in cs]
        starts.sort(key=_first)
        for start, c in starts:
            while j < n and by_end[j][0] < start:
                d = by_end[j][1]
                if best is None or d.token > best_token:
                    best, best_token = d, d.token
                j += 1
            if best is not None and c.token < best_token:
                v.add("token-regression", [best.p.i1, c.p.i0, c.p.i1],
                      f"key {key!r}: commit accepted with token {c.token} after token {best.token} was accepted",
                      key=key, order="realtime", token=c.token, earlier_token=best.token, stale_commit=c.p.i1)


def _first(t: tuple) -> Any:
    """A tuple's first item (a sort key: ties keep their order, as sorting by the key alone did)."""
    return t[0]


def _check_rev_order(accepted: list[Commit], v: Violations) -> None:
    """Per document: tokens never decrease along the revision order."""
    by_doc: dict[tuple, list[Commit]] = defaultdict(list)
    for c in accepted:
        if c.rev is not None and c.token is not None:
            by_doc[(c.key, c.doc)].append(c)
    for (key, doc), cs in by_doc.items():
        cs.sort(key=lambda c: c.rev)
        best = None
        for c in cs:
            if best is not None and c.token < best.token:
                v.add("token-regression", [best.p.i1, c.p.i1],
                      f"doc {doc!r}: rev {c.rev} accepted token {c.token} after rev {best.rev} accepted {best.token}",
                      key=key, doc=doc, order="rev", token=c.token, earlier_token=best.token, stale_commit=c.p.i1)
            if best is None or c.token > best.token:
                best = c


def _check_against_leases(accepted: list[Commit], leases: dict[Any, Lease],
                          first_invoke: dict[Any, int], v: Violations, *, backend_times: bool = True,
                          successors: tuple[dict, dict] | None = None, starts_known: bool = False) -> int:
    """Expiry, release and successor rules for each accepted commit; returns how many had no known lease.

    Without `backend_times` (the backend's clock was moved) only the real-time rules run. `successors`:
    `LeaseView.successors` when the caller has it (shared), else built from `leases`."""
    by_realtime, by_backend = successors if successors is not None else successor_index(leases)
    if not backend_times:
        by_backend = {}
    unknown = 0
    for c in accepted:
        p = c.p
        if c.carried is not None and c.token != c.carried:
            v.add("token-mismatch", p.indices, f"commit carried token {c.carried} but was accepted as {c.token}",
                  key=c.key, token=c.carried, accepted_token=c.token)
        if c.returned_lease is not None and c.lease_id is not None and c.returned_lease != c.lease_id:
            v.add("lease-mismatch", p.indices, f"commit sent with lease {c.lease_id!r} was accepted under lease "
                  f"{c.returned_lease!r}", key=c.key, lease=c.lease_id, returned_lease=c.returned_lease)
        lease = leases.get(c.lease_id)
        if lease is None:
            unknown += 1
            continue
        # when it may have been accepted from: `Commit.start` when the commits were built from `first_invoke`
        started = c.start if starts_known else first_invoke.get(p.rk, p.t0) if p.rk is not None else p.t0
        at = c.validated
        if backend_times and at is not None and (
                (lease.expires_at_ms is not None and at >= lease.expires_at_ms)
                or (lease.ended_at_ms is not None and at >= lease.ended_at_ms)):
            _check_times(c, lease, v)  # only where a rule is broken (the hot path: 1M-op histories)
        for end in lease.ends:
            if end.type == "ok" and end.t1 < started:
                v.add("commit-after-release", [end.i1, p.i0, p.i1],
                      f"commit on lease {lease.lease_id!r} accepted after its {end.f} completed",
                      key=c.key, lease=lease.lease_id, stale_commit=p.i1)
                break
        tok = c.token
        if tok is None:
            continue
        rt_next, bk_next = lease.rt_next, lease.bk_next
        if (rt_next is not ASK and tok.__class__ is int and tok == lease.token and c.key == lease.key
                and started.__class__ is int and (not by_backend or at is None or (
                    bk_next is not ASK and at.__class__ is int))):
            # the lease's thresholds (`successor_thresholds`) answer both questions below for its token and key:
            # a comparison each in place of a bisection
            if ((by_backend and at is not None and bk_next is not None and bk_next < at)
                    or (rt_next is not None and rt_next < started)):
                _check_successor(c, started, by_backend.get(c.key), by_realtime.get(c.key), v)
            continue
        # _check_successor's question, asked inline: a higher token among leases of the key acquired before
        backend, realtime = by_backend.get(c.key), by_realtime.get(c.key)
        if backend is not None and at is not None:
            i = bisect_left(backend.xs, at)
            if i and backend.best[i - 1][0] > tok:
                _check_successor(c, started, backend, realtime, v)
                continue
        if realtime is not None:
            i = bisect_left(realtime.xs, started)
            if i and realtime.best[i - 1][0] > tok:
                _check_successor(c, started, backend, realtime, v)
    return unknown


def _check_successor(c: Commit, started: int, backend: PrefixMax | None, realtime: PrefixMax | None,
                     v: Violations) -> None:
    """No commit is accepted after a higher-token lease on its key was acquired."""
    succ = backend.before(c.validated) if backend is not None and c.validated is not None else None
    if (succ is None or succ[0] <= c.token) and realtime is not None:
        succ = realtime.before(started)
    if succ is not None and succ[0] > c.token:
        s: Lease = succ[1]
        v.add("commit-after-successor", [s.first.i1, c.p.i0, c.p.i1],
              f"commit with token {c.token} accepted after lease {s.lease_id!r} (token {s.token}) was acquired",
              key=c.key, token=c.token, successor=s.lease_id, successor_token=s.token, stale_commit=c.p.i1)


def _check_times(c: Commit, lease: Lease, v: Violations) -> None:
    """validated_at_ms must be before the lease's expiry and its backend end time."""
    at, p = c.validated, c.p
    if at is None:
        return
    if lease.expires_at_ms is not None and at >= lease.expires_at_ms:
        grant = max(lease.grants, key=lambda g: (g.result.get("expires_at_ms") if isinstance(g.result, dict)
                                                 else None) or 0)
        v.add("validated-after-expiry", [grant.i1, p.i0, p.i1],
              f"commit validated at {at} ms, lease {lease.lease_id!r} expired at {lease.expires_at_ms} ms",
              key=c.key, lease=lease.lease_id, validated_at_ms=at, expires_at_ms=lease.expires_at_ms,
              stale_commit=p.i1)
    if lease.ended_at_ms is not None and at >= lease.ended_at_ms:
        ends = [e.i1 for e in lease.ends if e.i1 is not None]
        v.add("validated-after-end", [*ends, p.i0, p.i1],
              f"commit validated at {at} ms, lease {lease.lease_id!r} ended at {lease.ended_at_ms} ms",
              key=c.key, lease=lease.lease_id, validated_at_ms=at, ended_at_ms=lease.ended_at_ms,
              stale_commit=p.i1)


def _check_read(read: FinalRead, v: Violations) -> None:
    """A final read lists no entry twice, and its tokens never decrease."""
    seen: set = set()
    best = None
    for pos, e in enumerate(read.entries):
        if e in seen:
            v.add("duplicate-entry", [read.p.i1], f"doc {read.doc!r}: entry {_show(e)} appears twice "
                  f"(position {pos})", key=read.key, doc=read.doc, entry=e, position=pos)
        seen.add(e)
        tok = e[1] if isinstance(e, tuple) and len(e) == 3 else None
        if tok is None:
            continue
        if best is not None and tok < best[1]:
            v.add("token-regression", [read.p.i1],
                  f"doc {read.doc!r}: entry {pos} has token {tok} after entry {best[0]} with token {best[1]}",
                  key=read.key, doc=read.doc, order="final-read", position=pos, token=tok, earlier_token=best[1])
        if best is None or tok > best[1]:
            best = (pos, tok)


def _show(entry: Any) -> str:
    """An entry as JSON text, for messages."""
    return json.dumps(entry, default=str)


def _unread_docs(accepted: list[Commit], reads: dict[tuple, FinalRead]) -> set:
    """The documents of acknowledged commits that no final read covers (the lost-commit rule cannot judge them)."""
    return {c.doc for c in accepted if (c.key, c.doc) not in reads and (None, c.doc) not in reads}


def _check_lost_and_phantom(commits: list[Commit], reads: dict[tuple, FinalRead], v: Violations) -> None:
    """Acknowledged commits are in the final read; failed ones are not."""
    present = {k: set(r.entries) for k, r in reads.items()}
    maybe: list[set] = []  # entries of commits that did not fail: a retry may carry the same entry (when needed)

    def maybe_applied() -> set:
        if not maybe:
            maybe.append({c.entry for c in commits if c.p.type != "fail"})
        return maybe[0]

    for c in commits:
        p = c.p
        if p.type == "info":
            continue
        k = (c.key, c.doc)
        read = reads.get(k)
        if read is None:
            k = (None, c.doc)
            read = reads.get(k)
            if read is None:
                continue
        entries = present[k]
        if p.type == "ok" and p.t1 < read.p.t0 and c.entry not in entries:
            v.add("lost-commit", [p.i0, p.i1, read.p.i1], f"acknowledged commit {_show(c.entry)} missing from the "
                  f"final read of doc {c.doc!r}", key=c.key, doc=c.doc, entry=c.entry)
        elif p.type == "fail" and c.entry in entries and c.entry not in maybe_applied():
            v.add("failed-commit-visible", [p.i0, p.i1, read.p.i1], f"failed commit {_show(c.entry)} appears in "
                  f"the final read of doc {c.doc!r}", key=c.key, doc=c.doc, entry=c.entry)
