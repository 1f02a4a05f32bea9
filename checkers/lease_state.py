"""Lease states: terminal states stay terminal, tokens never change, stale ops never succeed.

For each lease (by lease_id) reported by an ok acquire (contract C7, C9, C10,
C12, C13, C15, verification rows 6-7). Violations, each naming the ops:

- `revived`: an ok renew reporting the lease active (state "active" or absent),
  or an ok inspect returning it active, invoked after a release / force-release /
  revoke of that lease completed ok.
- `renew-after-expiry`: an ok renew whose backend time (`renewed_at_ms`) is at or
  after the expiry the lease had before it: the largest `expires_at_ms` among
  its grants (acquire / renew oks) with an earlier `renewed_at_ms`.
- `renew-after-end`: an ok renew strictly after the lease's backend release/revoke
  time, when a release/revoke ok reports one (`released_at_ms`, ...); backend
  times are in ms, so a renew in the release's own millisecond may have come first.
- `token-changed`: an ok renew / release / force-release / revoke (or an acquire
  replay) reports a token other than the lease's acquire token; `lease-mismatch`:
  an ok op on lease L (named by the invocation or by what the client sent,
  `value.sent`) returns another lease_id (C12, C13: the exact lease or nothing);
  `wrong-token-accepted`: an ok op on lease L although the token the client
  sent is not L's.
- `stale-op-succeeded`: a renew / release / force-release / revoke of lease L
  succeeded although a lease with a higher token on the same key had already
  been acquired: its acquire ok completed before the op was invoked, or (renew)
  its `acquired_at_ms` is strictly before the renew's `renewed_at_ms`.

An op whose request_id was first invoked before the event that makes it stale
is an idempotent replay of an earlier attempt and is exempt from the time rules.
The lease an op is about is the one the client sent (`value.sent.lease_id`)
when the history records it, so a stale holder's renew or release that wrongly
succeeds on the successor is `lease-mismatch` and `stale-op-succeeded`, not an
op on the successor. With nothing but first acquisitions succeeding there is
nothing to judge: "unknown" with the reason.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from typing import Any, Mapping

from checkers.core import ViewCheck, Violations
from checkers.pairs import ASK, Lease, Pair, PrefixMax, sent
from checkers.view import LeaseView
from checkers.windows import backend_rules_note

__all__ = ["LeaseStateChecker"]

LEASE_OPS = frozenset(("renew", "release", "force-release", "revoke"))
TERMINAL = frozenset(("released", "revoked", "expired"))
JUDGED_FS = LEASE_OPS | {"acquire", "inspect"}
_EMPTY: dict = {}


class LeaseStateChecker(ViewCheck):
    """Checks lease state transitions in a lease history (see module docstring)."""

    def __init__(self, max_violations: int = 1000):
        self.max_violations = max_violations

    def check_view(self, test: Mapping, view: LeaseView, opts: Mapping) -> dict:
        """Judge every op on a known lease."""
        pairs = view.pairs
        leases = view.leases
        view.starts  # noqa: B018 - every pair's `start` settled (read below)
        realtime, backend = view.successors
        moved = view.faults.clock_moves
        if moved:
            backend = {}
        v = Violations(self.max_violations)
        # a scan of the judged ops, f by f, asks every rule's guard; only when one is broken do all the ops run
        # through the rules in history order (the violations in the order they always had)
        try:
            counts = _scan(view, leases, realtime, backend)
        except TypeError:  # a value the rules cannot compare: they raise it themselves, in history order
            counts = None
        if counts is not None:
            checked, judged = counts
        else:
            checked, judged = _judge_ops(pairs, leases, realtime, backend, v)
        maybe = _maybe_renewed(view.of("renew"))
        for lease in leases.values() if not moved else ():
            _check_renew_times(lease, v, maybe.get(lease.lease_id, []))
        unjudged = None
        if not leases:
            unjudged = "no successful acquisition"
        elif not judged:
            unjudged = "no renew, release, revoke, inspect or acquire replay of an acquired lease succeeded"
        return v.result(leases=len(leases), ops_checked=checked, ops_judged=judged,
                        backend_time_rules=backend_rules_note(moved), unjudged=unjudged)


def _scan(view: LeaseView, leases: dict[Any, Lease], realtime: dict[Any, PrefixMax],
          backend: dict[Any, PrefixMax]) -> tuple[int, int] | None:
    """(ops checked, ops judged) as `_judge_ops` counts them when no rule's guard is broken by any op, else None.

    The same guards as `_judge_ops`, asked of each f's ops apart (`LeaseView.of`: no op of another f is
    visited), the hot path of a 1M-op history."""
    checked = judged = 0
    get = leases.get
    for p in view.of("acquire"):
        if p.type != "ok":
            continue
        lease = get(p.lid)
        if lease is None:
            continue
        checked += 1
        if p is not lease.acquires[0]:  # lease.first
            judged += 1
        r = p.result
        tok = r.get("fencing_token") if (r.__class__ is dict or isinstance(r, dict)) else None
        if tok is not None and tok != lease.token:
            return None
    for f in ("renew", "release", "force-release", "revoke", "inspect"):
        renew = f == "renew"
        for p in view.of(f):
            if p.type != "ok":
                continue
            named = p.lid
            r = p.result
            if r.__class__ is not dict and not isinstance(r, dict):
                r = _EMPTY
            rl = r.get("lease_id")
            if rl is not None and named is not None and rl != named:
                return None
            lease = get(named)
            if lease is None:
                continue
            if f == "inspect":
                return None  # `_check_inspect` is asked of every one (they are rare)
            checked += 1
            judged += 1
            wire, tok, token = p.sent, r.get("fencing_token"), lease.token
            if (wire is not None and wire.get("fencing_token") not in (None, token)) or (
                    tok is not None and tok != token):
                return None
            started = p.start
            if renew and lease.ends and r.get("state") not in TERMINAL:
                for end in lease.ends:
                    if end.type == "ok" and end.t1 < started:
                        return None
            if token is None:
                continue
            nxt = lease.rt_next  # successor_thresholds: one comparison in place of rt.before(started)
            if nxt is ASK or started.__class__ is not int:
                rt = realtime.get(lease.key)
                if rt is not None:
                    i = bisect_left(rt.xs, started)
                    if i and rt.best[i - 1][0] > token:
                        return None
            elif nxt is not None and nxt < started:
                return None
            if renew:
                at = r.get("renewed_at_ms")
                if at is None or lease.key not in backend:  # (backend: {} when the clock was moved)
                    continue
                nxt = lease.bk_next
                if nxt is ASK or at.__class__ is not int:
                    bk = backend[lease.key]
                    i = bisect_left(bk.xs, at)
                    if i and bk.best[i - 1][0] > token:
                        return None
                elif nxt is not None and nxt < at:
                    return None
    return checked, judged


def _judge_ops(pairs: list[Pair], leases: dict[Any, Lease], realtime: dict[Any, PrefixMax],
               backend: dict[Any, PrefixMax], v: Violations) -> tuple[int, int]:
    """Every rule about one op, for every ok op on a known lease in history order; (ops checked, ops judged)."""
    checked = judged = 0
    judged_fs = JUDGED_FS
    # the rules' guards are asked inline and a rule's function runs only where it may be broken
    for p in pairs:
        f = p.f
        if p.type != "ok" or f not in judged_fs:
            continue
        named = p.lid  # op_lease_id(p), read once by the pairing
        r = p.result
        if r.__class__ is not dict and not isinstance(r, dict):
            r = _EMPTY
        if f != "acquire":
            rl = r.get("lease_id")
            if rl is not None and named is not None and rl != named:
                _check_named(p, named, v)
        lease = leases.get(named)
        if lease is None:
            continue
        checked += 1
        judged += f != "acquire" or p is not lease.first
        if f == "inspect":
            _check_inspect(p, lease, v)
            continue
        wire, tok = p.sent, r.get("fencing_token")
        if ((f != "acquire" and wire is not None and wire.get("fencing_token") not in (None, lease.token))
                or (tok is not None and tok != lease.token)):
            _check_identity(p, lease, v)
        if f == "acquire":
            continue
        started = p.start  # first_invocations().get(p.rk, p.t0) (request_key(p)), settled by the view
        if f == "renew" and lease.ends and r.get("state") not in TERMINAL:
            for end in lease.ends:  # _check_revived's question, asked inline
                if end.type == "ok" and end.t1 < started:
                    _check_revived(p, lease, started, v)
                    break
        if lease.token is None:
            continue
        rt = realtime.get(lease.key)
        if rt is not None:
            i = bisect_left(rt.xs, started)
            if i and rt.best[i - 1][0] > lease.token:
                _check_stale(p, lease, started, rt, backend.get(lease.key), v)
                continue
        at = r.get("renewed_at_ms") if f == "renew" else None
        bk = backend.get(lease.key) if at is not None else None
        if bk is not None:
            i = bisect_left(bk.xs, at)
            if i and bk.best[i - 1][0] > lease.token:
                _check_stale(p, lease, started, rt, bk, v)
    return checked, judged


def _res(p: Pair, field: str) -> Any:
    """A field of the completion's value (None when absent)."""
    r = p.result
    return r.get(field) if (r.__class__ is dict or isinstance(r, dict)) else None


def _check_named(p: Pair, named: Any, v: Violations) -> None:
    """An ok op on the lease the client named (invocation, or `sent`) reports that lease, not another (C12, C13)."""
    lid = _res(p, "lease_id")
    if lid is not None and named is not None and lid != named:
        v.add("lease-mismatch", [p.i0, p.i1], f"{p.f} sent for lease {named!r} succeeded on lease {lid!r}",
              key=p.key, lease=named, returned_lease=lid)


def _check_identity(p: Pair, lease: Lease, v: Violations) -> None:
    """The result carries the token the lease was acquired with (its id is `_check_named`'s), and the op
    succeeded only if the client sent that token (C12, C13: every field must match)."""
    wire = sent(p)
    if p.f != "acquire" and wire is not None and wire.get("fencing_token") not in (None, lease.token):
        v.add("wrong-token-accepted", [lease.first.i1, p.i0, p.i1],
              f"{p.f} of lease {lease.lease_id!r} sent token {wire['fencing_token']}, the lease's is {lease.token}, "
              f"and it succeeded", key=p.key, lease=lease.lease_id, token=wire["fencing_token"],
              acquired_token=lease.token)
    tok = _res(p, "fencing_token")
    if tok is not None and tok != lease.token:
        v.add("token-changed", [lease.first.i1, p.i0, p.i1],
              f"{p.f} of lease {lease.lease_id!r} returned token {tok}, acquired with {lease.token}",
              key=p.key, lease=lease.lease_id, token=tok, acquired_token=lease.token)


def _ended_before(lease: Lease, t: int) -> Pair | None:
    """An ok release/revoke of the lease that completed before monotonic time t."""
    return next((e for e in lease.ends if e.type == "ok" and e.t1 < t), None)


def _check_revived(p: Pair, lease: Lease, started: int, v: Violations) -> None:
    """A renew that reports the lease active after it ended."""
    if _res(p, "state") in TERMINAL:
        return  # a replay reporting the lease's current terminal state (C18)
    end = _ended_before(lease, started)
    if end is not None:
        v.add("revived", [end.i1, p.i0, p.i1], f"renew of lease {lease.lease_id!r} succeeded after its {end.f} "
              f"completed", key=p.key, lease=lease.lease_id)


def _check_inspect(p: Pair, lease: Lease, v: Violations) -> None:
    """An inspect that shows the lease active after it ended."""
    if _res(p, "state") not in (None, "active"):
        return
    end = _ended_before(lease, p.t0)
    if end is not None:
        v.add("revived", [end.i1, p.i0, p.i1], f"inspect shows lease {lease.lease_id!r} active after its {end.f} "
              f"completed", key=p.key, lease=lease.lease_id)


def _maybe_renewed(pairs: list[Pair]) -> dict[Any, list[Pair]]:
    """lease_id -> renews of it whose outcome is unknown (info, or never completed): each may have extended it."""
    out: dict[Any, list[Pair]] = defaultdict(list)
    for p in pairs:
        if p.f == "renew" and p.type == "info":
            lid = p.lid  # op_lease_id(p)
            if lid is not None:
                out[lid].append(p)
    return out


def _check_renew_times(lease: Lease, v: Violations, maybe: list[Pair] = ()) -> None:
    """Each renew's backend time is before the expiry in force and before the lease's end.

    Grants are swept in `renewed_at_ms` order with the running max expiry of strictly earlier grants.
    A renew whose outcome is unknown (`maybe`: info, C19) may have extended the lease unseen, by at most
    one TTL each, so an ok renew is after the expiry only past that too.
    """
    ended = lease.ended_at_ms
    if ended is None and len(lease.grants) < 2:
        return  # a lone grant has no earlier expiry to be late for, and no end time to be after
    grants = []  # (renewed_at_ms, expires_at_ms, grant), each read once (the hot path: every grant of every lease)
    for g in lease.grants:
        r = g.result
        if r.__class__ is dict or isinstance(r, dict):
            at = r.get("renewed_at_ms")
            if at is not None:
                grants.append((at, r.get("expires_at_ms"), g))
    if len(grants) > 1:
        grants.sort(key=_first)
    best: Pair | None = None  # the earlier grant with the latest expiry
    best_exp = None
    i, n = 0, len(grants)
    while i < n:
        at = grants[i][0]
        j = i
        while j < n and grants[j][0] == at:
            j += 1
        for _, _, p in grants[i:j]:
            if p.f == "renew" and (best is not None or ended is not None):
                unseen = _unseen_extension(p, best, maybe) if maybe else 0
                # _check_renew_at's questions asked here, the function run only where a rule is broken
                if (best is not None and at >= best_exp + unseen) or (ended is not None and at > ended):
                    _check_renew_at(p, at, best, lease, v, unseen, best_exp)
        for _, exp, g in grants[i:j]:
            if exp is not None and (best is None or exp > best_exp):
                best, best_exp = g, exp
        i = j


def _first(t: tuple) -> Any:
    """A tuple's first item (a sort key)."""
    return t[0]


def _unseen_extension(p: Pair, best: Pair | None, maybe: list[Pair]) -> int:
    """How far renews of unknown outcome, invoked before `p` completed, may have moved the expiry past `best`'s."""
    if best is None or not maybe:
        return 0
    ttl = _res(best, "ttl_ms")
    n = sum(1 for m in maybe if p.t1 is None or m.t0 < p.t1)
    return n * ttl if isinstance(ttl, int) and ttl > 0 else (0 if not n else 1 << 62)


def _check_renew_at(p: Pair, at: int, best: Pair | None, lease: Lease, v: Violations, unseen: int = 0,
                    best_exp: Any = None) -> None:
    """One renew at backend time `at` against the expiry in force (plus what unknown renews may have added)."""
    exp = _res(best, "expires_at_ms") if best is not None and best_exp is None else best_exp
    if best is not None and at >= exp + unseen:
        v.add("renew-after-expiry", [best.i1, p.i0, p.i1], f"lease {lease.lease_id!r} renewed at {at} ms, "
              f"it had expired at {exp} ms", key=p.key, lease=lease.lease_id, renewed_at_ms=at, expires_at_ms=exp)
    if lease.ended_at_ms is not None and at > lease.ended_at_ms:
        ends = [e.i1 for e in lease.ends if e.i1 is not None]
        v.add("renew-after-end", [*ends, p.i0, p.i1], f"lease {lease.lease_id!r} renewed at {at} ms, it ended at "
              f"{lease.ended_at_ms} ms", key=p.key, lease=lease.lease_id, renewed_at_ms=at)


def _check_stale(p: Pair, lease: Lease, started: int, realtime: PrefixMax | None,
                 backend: PrefixMax | None, v: Violations) -> None:
    """An op on a lease succeeding after a higher-token successor was acquired."""
    if lease.token is None:
        return
    succ = realtime.before(started) if realtime is not None else None
    at = _res(p, "renewed_at_ms") if p.f == "renew" else None
    if (succ is None or succ[0] <= lease.token) and at is not None and backend is not None:
        succ = backend.before(at)
    if succ is not None and succ[0] > lease.token:
        s: Lease = succ[1]
        v.add("stale-op-succeeded", [s.first.i1, p.i0, p.i1], f"{p.f} of lease {lease.lease_id!r} (token "
              f"{lease.token}) succeeded after lease {s.lease_id!r} (token {s.token}) was acquired",
              key=p.key, lease=lease.lease_id, successor=s.lease_id, successor_token=s.token)

