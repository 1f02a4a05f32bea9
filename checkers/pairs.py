"""The pairing views: a history's client operations as `Pair`s, and the lease index built on them.

`pair_ops` turns a history (docs/history-format.md) into `Pair`s through
`lab.history.pair`, the one pairing (strict: a malformed history is a
`HistoryError`, so every checker's verdict on it is "unknown" with the error;
nemesis ops skipped). `index_leases` reads the leases the ok acquires reported
(`Lease`: key, token, backend times, grants and ends), `first_invocations` the
earliest attempt of each idempotency key, `successor_index` the per-key
"largest token acquired before x" questions (`PrefixMax`).

Every function here computes what it is asked from what it is given, every
time; two of them also write what they found onto the records they were given,
for the rules to read as attributes on the hot path of a 1M-op history:
`settle_starts` (each `Pair.start`) and `successor_thresholds` (each
`Lease.rt_next` / `bk_next`). What a composition shares is built once by
`checkers.view.lease_view` and handed to each checker explicitly.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any

import numpy as np

from lab.history.ops import pair

__all__ = [
    "END_FS",
    "LEASE_FS",
    "Lease",
    "Pair",
    "PrefixMax",
    "acquisition_start",
    "by_f",
    "error_code",
    "first_invocations",
    "settle_starts",
    "index_leases",
    "op_lease_id",
    "pair_ops",
    "request_key",
    "sent",
    "successor_index",
    "successor_thresholds",
]


class Pair:
    """One client operation: its invocation, and its completion (None when it never completed).

    Besides the op's fields, what every lease checker asks of it is read once here (the hot path of a
    million-op history): `result` (the completion's value), `sent` (what the client put on the wire, see
    `sent()`), `rk` (its idempotency key, `request_key()`), `lid` (the lease it is about, `op_lease_id()`),
    `dl` (the invocation's `deadline_ms`) and `vrid` (whether the invocation carries a request_id). `start`
    (when the op's request was first invoked) is its `t0` until `settle_starts` settles it.
    """

    __slots__ = ("inv", "comp", "type", "f", "key", "process", "t0", "t1", "i0", "i1", "result", "sent", "rk",
                 "lid", "dl", "vrid", "start")

    def __init__(self, inv: dict, comp: dict | None, ipos: int, cpos: int | None):
        """From an invocation and its completion (None: never completed) at positions `ipos` / `cpos` of the
        history: `i0` / `i1` are their `index` fields, else those positions."""
        self.inv = inv
        self.comp = comp
        f = self.f = inv["f"]  # `pair` saw to f, process and type
        self.process = inv["process"]
        # subscripts where an op has every field (a plain dict: the hot path), `get` with the defaults otherwise
        try:
            if inv.__class__ is not dict:
                raise KeyError
            key, t0, self.i0, v = inv["key"], inv["time"], inv["index"], inv["value"]
        except KeyError:
            key, t0, self.i0, v = inv.get("key"), inv.get("time", 0), inv.get("index", ipos), inv.get("value")
        self.key = key
        self.t0 = self.start = t0  # `start`: a retry's is settled by `settle_starts`
        if comp is None:
            self.type = "info"  # an invocation with no completion counts as info
            self.t1: int | None = None
            self.i1: int | None = None
            r = self.result = None  # the completion's value (None when it never completed)
        else:
            self.type = comp["type"]
            try:
                if comp.__class__ is not dict:
                    raise KeyError
                self.t1, self.i1, r = comp["time"], comp["index"], comp["value"]
            except KeyError:
                self.t1, self.i1, r = comp.get("time", t0), comp.get("index", cpos), comp.get("value")
            self.result = r
        # exact-type checks first (JSON objects are dicts), any dict subclass next: the hot path of every checker
        rid = lid = s = None
        if r.__class__ is dict or isinstance(r, dict):
            s = r.get("sent")
            if s.__class__ is dict:
                lid = s.get("lease_id")  # what went on the wire outranks the rest
            else:
                s = None
        else:
            r = None
        self.sent = s
        if v.__class__ is dict or isinstance(v, dict):
            rid = v.get("request_id")
            if lid is None:
                lid = v.get("lease_id")
            # read here, while the invocation is in the CPU's cache (a later pass over a 1M-op history's dicts
            # costs ~0.3 s): its relative deadline, and whether it carries a request_id
            self.dl = v.get("deadline_ms")
            self.vrid = rid is not None
        else:
            self.dl, self.vrid = None, False
        if r is not None:
            if rid is None:
                rid = r.get("request_id")
            if lid is None:
                lid = r.get("lease_id")
        self.rk = None if rid is None else (f, key, rid)
        self.lid = lid

    @property
    def value(self) -> Any:
        """The invocation's argument."""
        return self.inv.get("value")

    @property
    def indices(self) -> list[int]:
        """The history indices of this op (invocation, and completion when there is one)."""
        return [self.i0] if self.i1 is None else [self.i0, self.i1]

    def __repr__(self) -> str:
        return f"Pair({self.f} p={self.process} {self.type} [{self.i0}..{self.i1}])"


def request_key(p: Pair) -> tuple | None:
    """(f, key, request_id) of an op: its idempotency key as far as the history shows it (the invocation's
    request_id, else the completion's)."""
    return p.rk


def first_invocations(pairs: list[Pair]) -> dict[tuple, int]:
    """Idempotency key -> the earliest invocation time carrying it: a retry is as old as its first attempt,
    so the real-time rules exempt replays of requests sent before the event that would make them stale.

    Pairs come in invocation order, so the first seen is the earliest unless a history's times go backwards
    (then the min is kept)."""
    first: dict[tuple, int] = {}
    put = first.setdefault
    for p in pairs:
        k = p.rk
        if k is not None:
            t0 = p.t0
            t = put(k, t0)  # one lookup for a request_id seen the first time (most of them)
            if t is not t0 and (t is None or t0 < t):
                first[k] = t0
    return first


_UNSEEN = object()


def settle_starts(pairs: list[Pair]) -> tuple[dict[tuple, Pair], list[Pair]]:
    """Set each pair's `start` to `first_invocations(pairs)[p.rk]` (its own `t0` when it has no key), by the
    same rule: the rules then read an attribute instead of hashing the key again for each op (`LeaseView`).

    Only the pairs whose key was seen before (retries: few) and the first pair of their key change. Returns
    what it found: (key -> the first pair carrying it, in order of first use; the pairs whose key an earlier
    pair carried, in order)."""
    firstp: dict[tuple, Pair] = {}  # key -> its first pair (pairs, not times: `is` tells a new key apart)
    putp = firstp.setdefault
    again: list[Pair] = []
    for p in pairs:
        k = p.rk
        if k is not None and putp(k, p) is not p:
            again.append(p)
    first: dict[tuple, Any] = {}
    for p in again:  # first_invocations' rule, in the same order, for the keys seen twice
        k, t0 = p.rk, p.t0
        t = first.get(k, _UNSEEN)
        if t is _UNSEEN:
            t = first[k] = firstp[k].t0
        if t is not t0 and (t is None or t0 < t):
            first[k] = t0
    for p in again:
        firstp[p.rk].start = p.start = first[p.rk]
    return firstp, again


def pair_ops(history: list[dict], *, strict: bool = True) -> list[Pair]:
    """The client operations of `history` as `Pair`s, in invocation order, paired by `lab.history.pair`.

    Nemesis ops are skipped; an invocation that never completes is `info` with `t1 = None`. `strict`
    (what every checker uses): a history that breaks the pairing rules (a second invoke while one is open, an
    invoke after an `info` retired the process, a completion with nothing open, ...) raises `HistoryError`,
    which the checkers, `safe_check` and `Compose` turn into `"unknown"` with the error: no checker judges a
    malformed history. strict=False (renderers) pairs it by `pair`'s lenient rules. A new list every call.
    """
    return pair(history, strict=strict, make=Pair).pairs


def by_f(pairs: list[Pair]) -> dict[Any, list[Pair]] | None:
    """The pairs grouped by f, each group in order (a rule about one f reads its ops, not every op of a 1M-op
    history); None when an f cannot be a dict key."""
    groups: dict[Any, list[Pair]] = {}
    try:
        for p in pairs:
            ps = groups.get(p.f)
            if ps is None:
                groups[p.f] = [p]
            else:
                ps.append(p)
    except TypeError:
        return None
    return groups


def error_code(op: Mapping | None) -> str | None:
    """The contract code of an op's error: the string itself, or the object's "code"."""
    if op is None:
        return None
    err = op.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        return None if code is None else str(code)
    return None if err is None else str(err)


# --------------------------------------------------------------------------- lease histories

LEASE_FS = frozenset(("acquire", "renew", "release", "force-release", "revoke"))
END_FS = frozenset(("release", "force-release", "revoke"))
# Backend end time of a lease in a release/revoke ok value. Not (yet) in docs/history-format.md;
# used when a server reports it, otherwise the checkers fall back on real-time order.
END_TIME_FIELDS = ("released_at_ms", "revoked_at_ms", "ended_at_ms")


ASK = object()  # a `Lease.rt_next` / `bk_next` not computed: ask the `PrefixMax`


class Lease:
    """What the history says about one lease (by lease_id): its key, token, backend times, ops."""

    __slots__ = ("lease_id", "key", "token", "acquired_at_ms", "expires_at_ms", "ended_at_ms",
                 "acquires", "grants", "ends", "granted", "started", "rt_next", "bk_next")

    def __init__(self, lease_id: Any, key: Any, token: Any, acquired_at_ms: Any):
        self.lease_id = lease_id
        self.key = key
        self.token = token
        self.acquired_at_ms = acquired_at_ms
        self.expires_at_ms: int | None = None  # the latest expiry any acquire/renew ok reported
        self.ended_at_ms: int | None = None  # backend release/revoke time, when a server reports one
        self.acquires: list[Pair] = []  # ok acquires that returned this lease (replays included)
        self.grants: list[Pair] = []  # ok acquires and renews of this lease
        self.ends: list[Pair] = []  # release / force-release / revoke that ok'd or may have (info)
        self.granted: int = 0  # monotonic time of the first ok acquire's completion (min t1 of `acquires`)
        self.started: int | None = None  # `acquisition_start`, once asked
        # when a higher token on the key was first acquired (`successor_thresholds`): ASK until computed
        self.rt_next: Any = ASK
        self.bk_next: Any = ASK

    @property
    def first(self) -> Pair:
        """The ok acquire that first reported this lease (in invocation order)."""
        return self.acquires[0]


def sent(p: Pair) -> dict | None:
    """What the client put on the wire for this op (`value.sent` of its completion), or None when not recorded.

    docs/history-format.md: every completion of acquire / renew / release / commit carries it; a
    completion without it either sent nothing (`not_held`) or comes from a run that predates it.
    """
    return p.sent


def op_lease_id(p: Pair) -> Any:
    """The lease an op is about: the one the client sent (`value.sent`) or the invocation names, else the one
    it returned.

    For renew / release / commit what was sent is what the op is about: a reply naming another lease
    is the server acting on a lease the client did not name.
    """
    return p.lid


def index_leases(pairs: list[Pair], acquires: list[Pair] | None = None) -> dict[Any, Lease]:
    """Every lease an ok acquire reported, with its grants (acquire/renew oks) and end ops. `acquires`: the
    acquire pairs of `pairs` in order, when the caller has them (`LeaseView.of`)."""
    leases: dict[Any, Lease] = {}
    for p in pairs if acquires is None else acquires:
        if p.f == "acquire" and p.type == "ok":
            r = p.result  # the completion's value (None unless a dict)
            if not isinstance(r, dict) or r.get("lease_id") is None:
                continue
            lid = r["lease_id"]
            lease = leases.get(lid)
            if lease is None:
                lease = leases[lid] = Lease(lid, p.key, r.get("fencing_token"), r.get("acquired_at_ms"))
            lease.acquires.append(p)
            if len(lease.acquires) == 1 or p.t1 < lease.granted:
                lease.granted = p.t1
    for p in pairs:
        f = p.f
        if f not in LEASE_FS or p.type == "fail" or (p.type == "info" and f not in END_FS):
            continue  # grants count when ok; ends when ok or maybe (info)
        lease = leases.get(p.lid)  # op_lease_id(p)
        if lease is None:
            continue
        r = p.result if p.type == "ok" else None
        if f in ("acquire", "renew"):
            lease.grants.append(p)
            exp = r.get("expires_at_ms") if isinstance(r, dict) else None
            if exp is not None and (lease.expires_at_ms is None or exp > lease.expires_at_ms):
                lease.expires_at_ms = exp
        else:
            lease.ends.append(p)
            if isinstance(r, dict):
                for field in END_TIME_FIELDS:
                    t = r.get(field)
                    if t is not None and (lease.ended_at_ms is None or t < lease.ended_at_ms):
                        lease.ended_at_ms = t
    return leases


def acquisition_start(lease: Lease, first: dict[tuple, int] | None) -> int:
    """When the lease's acquisition began in real time: the earliest invocation of any request that returned
    it (`first`: `first_invocations` of the pairs the lease was indexed from, or None when `settle_starts` set
    their `start`; computed once per lease)."""
    s = lease.started
    if s is None:
        if first is None:
            acquires = lease.acquires
            s = lease.started = acquires[0].start if len(acquires) == 1 else min(p.start for p in acquires)
        else:
            s = lease.started = min(first.get(p.rk, p.t0) if p.rk is not None else p.t0 for p in lease.acquires)
    return s


def successor_index(leases: dict[Any, Lease]) -> tuple[dict[Any, "PrefixMax"], dict[Any, "PrefixMax"]]:
    """Per key, the leases as two PrefixMax of tokens: (by first acquire-ok completion time, by
    `acquired_at_ms`), the "was a higher-token successor acquired before x" questions of lease-state and
    stale-commit."""
    realtime: dict[Any, list] = {}
    backend: dict[Any, list] = {}
    for lease in leases.values():
        k = lease.key
        if k not in realtime:
            realtime[k], backend[k] = [], []
        realtime[k].append((lease.granted, lease.token, lease))
        backend[k].append((lease.acquired_at_ms, lease.token, lease))
    return ({k: PrefixMax(v) for k, v in realtime.items()}, {k: PrefixMax(v) for k, v in backend.items()})


def successor_thresholds(leases: dict[Any, Lease], realtime: dict[Any, "PrefixMax"],
                         backend: dict[Any, "PrefixMax"]) -> None:
    """Set each lease's `rt_next` / `bk_next`: the smallest x of its key's `realtime` / `backend` PrefixMax
    (`successor_index`) whose running max token exceeds the lease's token (None: no such point). Then
    `P.before(x)` has a token above the lease's iff that threshold is not None and < x, a comparison of two
    ints per question in place of a bisection (the lease rules ask it of every op of a 1M-op history).

    Only where every x and token of the key's PrefixMax and the lease's token are ints (int64): elsewhere the
    thresholds stay `ASK` and the rules ask the PrefixMax. numpy's searchsorted over each key's running max."""
    by_key: dict[Any, list[Lease]] = {}
    for lease in leases.values():
        if lease.token.__class__ is int:
            ls = by_key.get(lease.key)
            if ls is None:
                by_key[lease.key] = [lease]
            else:
                ls.append(lease)
    for key, ls in by_key.items():
        tokens = None
        for slot, table in (("rt_next", realtime), ("bk_next", backend)):
            pm = table.get(key)
            if pm is None:
                continue
            xs = pm.xs
            best = [b[0] for b in pm.best]
            if not all(x.__class__ is int for x in xs) or not all(t.__class__ is int for t in best):
                continue
            try:
                axs, abest = np.array(xs, dtype=np.int64), np.array(best, dtype=np.int64)
                if tokens is None:
                    tokens = np.array([lease.token for lease in ls], dtype=np.int64)
            except OverflowError:
                break
            j = np.searchsorted(abest, tokens, side="right")  # first point whose running max > the token
            found = j < len(xs)
            at = np.where(found, axs[np.minimum(j, len(xs) - 1)] if len(xs) else 0, 0).tolist()
            for lease, t, ok in zip(ls, at, found.tolist()):
                setattr(lease, slot, t if ok else None)


class PrefixMax:
    """Answers "the largest token among points before x" in O(log n): sorted xs, running max."""

    def __init__(self, points: Iterable[tuple[Any, Any, Any]]):
        pts = sorted((p for p in points if p[0] is not None and p[1] is not None), key=itemgetter(0))
        self.xs = [p[0] for p in pts]
        self.best: list[tuple[Any, Any]] = []  # (max token so far, the ref that carries it)
        cur: tuple[Any, Any] | None = None
        for _, token, ref in pts:
            if cur is None or token > cur[0]:
                cur = (token, ref)
            self.best.append(cur)

    def before(self, x: Any) -> tuple[Any, Any] | None:
        """(max token, its ref) over points with x' < x, or None."""
        i = bisect.bisect_left(self.xs, x)
        return self.best[i - 1] if i else None
