"""The checker protocol, result merging, composition, and the history helpers every checker shares.

A checker is anything with `check(test, history, opts) -> dict` whose result has
`"valid": True | False | "unknown"` (Jepsen's protocol). Results merge
false > unknown > true. `compose({name: checker})` runs several checkers on one
history; an exception inside one becomes `{"valid": "unknown", "error": ...}`
instead of a crashed analysis.

Histories are lists of op dicts in the format of docs/history-format.md.
`pair_ops` turns one into `Pair`s through `lab.history.pair`, the one pairing
(strict: a malformed history is a `HistoryError`, so every checker's verdict on
it is "unknown" with the error; nemesis ops skipped), which is what the domain
checkers consume, and
`nemesis_windows` finds the fault windows the nemesis marked.

`CHECKERS` maps checker names to factories; the modules behind them are
imported lazily, so a broken or unfinished checker does not break the others.
"""

from __future__ import annotations

import bisect
import functools
import gc
import importlib
import time as _time
from operator import itemgetter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

from lab.history.ops import NEMESIS, HistoryError, pair

__all__ = [
    "CHECKERS",
    "DOMAIN_CHECKERS",
    "NEMESIS",
    "Checker",
    "Compose",
    "Lease",
    "Pair",
    "PrefixMax",
    "SUBJECT_FS",
    "Violations",
    "analysis",
    "applicable_checkers",
    "analyzed",
    "compose",
    "error_code",
    "gc_paused",
    "get_checker",
    "history_end_time",
    "index_leases",
    "lease_index",
    "acquisition_start",
    "successor_index",
    "merge_valid",
    "nemesis_phase",
    "backend_clock_moves",
    "clock_strobe_windows",
    "valkey_losses",
    "backend_rules_note",
    "clock_segments",
    "segment_of",
    "nemesis_ops",
    "nemesis_windows",
    "op_lease_id",
    "first_invocations",
    "pair_ops",
    "pairs_of",
    "request_key",
    "safe_check",
    "sent",
]

Valid = bool | str  # True, False or "unknown"


@runtime_checkable
class Checker(Protocol):
    """Anything that judges a history: returns a dict with "valid" True, False or "unknown"."""

    def check(self, test: Mapping[str, Any], history: list[dict], opts: Mapping[str, Any]) -> dict: ...


def merge_valid(values: Iterable[Any]) -> Valid:
    """Merge validities: any False wins, then "unknown" (or anything that is not a bool), else True."""
    merged: Valid = True
    for v in values:
        if v is False:
            return False
        if v is not True:
            merged = "unknown"
    return merged


def safe_check(checker: Checker, test: Mapping, history: list[dict], opts: Mapping) -> dict:
    """Run one checker; an exception or a malformed result becomes valid "unknown" with the error."""
    try:
        res = checker.check(test, history, opts)
    except Exception as e:  # noqa: BLE001 - exception safety is the point (Jepsen's check-safe)
        return {"valid": "unknown", "error": f"{type(e).__name__}: {e}"}
    if not isinstance(res, dict) or "valid" not in res:
        return {"valid": "unknown", "error": f"checker returned {type(res).__name__} without 'valid'"}
    return res


class Compose:
    """Runs several named checkers on one history: {"valid": merged, "results": {name: result}}."""

    def __init__(self, checkers: Mapping[str, Checker]):
        if not checkers:
            raise ValueError("compose needs at least one checker")
        for name, c in checkers.items():
            if not isinstance(c, Checker):
                raise TypeError(f"checker {name!r} has no check(test, history, opts) method")
        self.checkers = dict(checkers)

    def check(self, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        """Run every checker safely (sharing one analysis of the history), time each, merge their validity.

        A history with no client operation at all is "unknown" whatever the checkers say (nothing was tested).
        """
        results, timings = {}, {}
        # the GC paused around the shared analysis, which is released before the GC runs again: otherwise the
        # first collection after a checker traverses every object of the analysis still alive (1.3 s at 1M ops)
        with gc_paused(), analysis(history):
            for name, c in self.checkers.items():
                t0 = _time.perf_counter()
                results[name] = safe_check(c, test, history, opts)
                timings[name] = round(_time.perf_counter() - t0, 6)
        valid = merge_valid(r.get("valid") for r in results.values())
        out = {"valid": valid, "results": results, "elapsed_s": timings}
        malformed = next((r["error"] for r in results.values()
                          if str(r.get("error", "")).startswith("HistoryError: ")), None)
        if malformed is not None and valid is not False:  # no checker judged it (strict pairing)
            out["reason"] = "malformed history: " + malformed.removeprefix("HistoryError: ")
            return out
        if valid is not False and not any(op.get("process") != NEMESIS for op in history):
            out["valid"], out["reason"] = "unknown", "empty history: no client operation"
        return out


def compose(checkers: Mapping[str, Checker]) -> Compose:
    """Compose named checkers into one (see `Compose`)."""
    return Compose(checkers)


# --------------------------------------------------------------------------- shared analysis

_SHARED: ContextVar[dict | None] = ContextVar("fencelab_checker_analysis", default=None)


@contextmanager
def analysis(history: list[dict]) -> Iterator[None]:
    """Within this block, checkers of `history` share what they derive from it (pairs, lease index).

    Re-entering for the same history reuses the outer block.
    """
    current = _SHARED.get()
    if current is not None and current["history"] is history:
        yield
        return
    token = _SHARED.set({"history": history, "n": len(history)})
    try:
        yield
    finally:
        _SHARED.reset(token)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC, restoring its previous state on exit.

    The domain checkers allocate millions of small acyclic objects, and the
    collector would rescan the whole history again and again (2x slower at
    1M ops, measured).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def analyzed(check: Callable) -> Callable:
    """Decorate a domain checker's `check(self, test, history, opts)`: shared analysis, GC paused, and a
    malformed history (the strict pairing's `HistoryError`) judged "unknown" with the error, as
    `safe_check` and the linearizability checker say it: no checker judges a history it cannot read."""

    @functools.wraps(check)
    def wrapper(self: Any, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        with gc_paused(), analysis(history):  # the analysis released before the GC runs again (see Compose)
            try:
                return check(self, test, history, opts)
            except HistoryError as e:
                return {"valid": "unknown", "error": f"HistoryError: {e}"}

    return wrapper


def _shared(name: str, history: list[dict], build: Callable[[], Any]) -> Any:
    """`build()`, computed once per `analysis` block of this history (every time outside one)."""
    shared = _SHARED.get()
    if shared is None or shared["history"] is not history or shared["n"] != len(history):
        return build()
    if name not in shared:
        shared[name] = build()
    return shared[name]


# --------------------------------------------------------------------------- history helpers


class Pair:
    """One client operation: its invocation, and its completion (None when it never completed).

    Besides the op's fields, what every lease checker asks of it is read once here (the hot path of a
    million-op history): `result` (the completion's value), `sent` (what the client put on the wire, see
    `sent()`), `rk` (its idempotency key, `request_key()`), `lid` (the lease it is about, `op_lease_id()`),
    `dl` (the invocation's `deadline_ms`) and `vrid` (whether the invocation carries a request_id).
    """

    __slots__ = ("inv", "comp", "type", "f", "key", "process", "t0", "t1", "i0", "i1", "result", "sent", "rk",
                 "lid", "dl", "vrid")

    def __init__(self, inv: dict, comp: dict | None, ipos: int, cpos: int | None):
        """From an invocation and its completion (None: never completed) at positions `ipos` / `cpos` of the
        history: `i0` / `i1` are their `index` fields, else those positions."""
        self.inv = inv
        self.comp = comp
        f = self.f = inv["f"]  # `pair` saw to f, process and type
        key = self.key = inv.get("key")
        self.process = inv["process"]
        t0 = self.t0 = inv.get("time", 0)
        self.i0 = inv.get("index", ipos)
        v = inv.get("value")
        if comp is None:
            self.type = "info"  # an invocation with no completion counts as info
            self.t1: int | None = None
            self.i1: int | None = None
            r = self.result = None  # the completion's value (None when it never completed)
        else:
            self.type = comp["type"]
            self.t1 = comp.get("time", t0)
            self.i1 = comp.get("index", cpos)
            r = self.result = comp.get("value")
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
    Of `pair_ops(history)` inside `analysis(history)`: computed once and shared, do not mutate it."""
    shared = _SHARED.get()
    if shared is not None and shared.get("pairs") is pairs:
        if "first" not in shared:
            shared["first"] = _first_invocations(pairs)
        return shared["first"]
    return _first_invocations(pairs)


def _first_invocations(pairs: list[Pair]) -> dict[tuple, int]:
    """`first_invocations` itself: pairs come in invocation order, so the first seen is the earliest
    unless a history's times go backwards (then the min is kept)."""
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


def pair_ops(history: list[dict], *, strict: bool = True) -> list[Pair]:
    """The client operations of `history` as `Pair`s, in invocation order, paired by `lab.history.pair`.

    Nemesis ops are skipped; an invocation that never completes is `info` with `t1 = None`. `strict`
    (what every checker uses): a history that breaks the pairing rules (a second invoke while one is open, an
    invoke after an `info` retired the process, a completion with nothing open, ...) raises `HistoryError`,
    which `analyzed` / `safe_check` / `Compose` turn into `"unknown"` with the error: no checker judges a
    malformed history. strict=False (renderers) pairs it by `pair`'s lenient rules.
    Inside `analysis(history)` the list is computed once and shared: do not mutate it.
    """
    if strict:
        return _shared("pairs", history, lambda: _pair_ops(history, True))
    return _shared("pairs-lenient", history, lambda: _pair_ops(history, False))


def _pair_ops(history: list[dict], strict: bool) -> list[Pair]:
    """The pairing itself (see `pair_ops`): `lab.history.pair`, as Pairs with history indices. The nemesis
    ops it found are kept for `_nemesis_positions` (no second scan of the history)."""
    pairing = pair(history, strict=strict, make=Pair)
    shared = _SHARED.get()
    if shared is not None and shared["history"] is history and "nemesis" not in shared:
        shared["nemesis"] = [(pos, history[pos]) for pos in pairing.nemesis]
    return pairing.pairs



def pairs_of(history: list[dict], f: str) -> list[Pair]:
    """The pairs of `pair_ops(history)` whose f is `f`, in invocation order: inside `analysis(history)` from
    one grouping of the pairs by f, shared (a rule about one f reads its ops, not every op of a 1M-op
    history): do not mutate it."""
    by_f = _shared("by-f", history, lambda: _by_f(pair_ops(history)))
    if by_f is None:  # an f that is no dict key
        return [p for p in pair_ops(history) if p.f == f]
    return by_f.get(f, [])


def _by_f(pairs: list[Pair]) -> dict[Any, list[Pair]] | None:
    """`pairs_of`'s grouping: f -> its pairs in order (None when an f cannot be a key)."""
    by_f: dict[Any, list[Pair]] = {}
    try:
        for p in pairs:
            ps = by_f.get(p.f)
            if ps is None:
                by_f[p.f] = [p]
            else:
                ps.append(p)
    except TypeError:
        return None
    return by_f


def error_code(op: Mapping | None) -> str | None:
    """The contract code of an op's error: the string itself, or the object's "code"."""
    if op is None:
        return None
    err = op.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        return None if code is None else str(code)
    return None if err is None else str(err)


def history_end_time(history: list[dict]) -> int:
    """The latest `time` in the history (0 when empty); shared inside `analysis(history)`."""
    return _shared("end", history, lambda: max((op.get("time", 0) for op in history), default=0))


def _nemesis_positions(history: list[dict]) -> list[tuple[int, dict]]:
    """(position, op) of every nemesis op, shared inside `analysis(history)`: the fault helpers below read
    these few ops, not the whole history, each time."""
    return _shared("nemesis", history,
                   lambda: [(pos, op) for pos, op in enumerate(history) if op.get("process") == NEMESIS])


_PHASES = {"start": "start", "begin": "start", "stop": "end", "end": "end", "heal": "end"}


def nemesis_phase(op: Mapping) -> tuple[str, str] | None:
    """Classify a nemesis op as (fault, "start"|"end"), or None when it marks neither.

    Two conventions are understood: fencelab's `value: {"phase": "start"|"end"}`
    with the fault in `f`, and Jepsen's f names `start-<fault>` / `stop-<fault>`
    (also `<fault>-start` / `<fault>-stop`, and bare `start` / `stop` for the fault "nemesis").
    """
    f = str(op.get("f"))
    value = op.get("value")
    if isinstance(value, dict) and value.get("phase") in _PHASES:
        return str(value.get("fault") or f), _PHASES[value["phase"]]
    if f in _PHASES:
        return NEMESIS, _PHASES[f]
    head, sep, tail = f.partition("-")
    if sep and head in _PHASES and tail:
        return tail, _PHASES[head]
    head, sep, tail = f.rpartition("-")
    if sep and tail in _PHASES and head:
        return head, _PHASES[tail]
    return None


def nemesis_ops(history: list[dict]) -> list[dict]:
    """The nemesis ops, named by the fault they report and without the operations that changed nothing.

    The nemesis's completions carry the fault in `value.fault` while `f` is the
    operation (`start-partition`): such ops are renamed to their fault, so the
    invocation and the completion of one start mark one window; an operation
    whose completion says
    `"phase": "none"` (a start while already active, a stop with nothing
    active, an error that was rolled back) is dropped with its invocation.
    Ops pair as docs/history-format.md says: one starts, the next one ends.
    """
    out: list[dict] = []
    opened: int | None = None  # position in `out` of the nemesis op that started the open operation
    for _, op in _nemesis_positions(history):
        v = op.get("value")
        phase = v.get("phase") if isinstance(v, dict) else None
        if phase in ("start", "end", "none") and v.get("fault"):
            op = dict(op, f=str(v["fault"]))
        if opened is None and op.get("type") in ("invoke", "info"):
            opened = len(out)
            out.append(op)
            continue
        if phase == "none" and opened is not None:
            del out[opened]  # nothing changed: neither op marks a fault window
        else:
            out.append(op)
        opened = None
    return out


def backend_clock_moves(history: list[dict]) -> list[int]:
    """Indices of nemesis ops that moved the backend's (Valkey's) clock.

    Backend times come from Valkey's clock. Once a nemesis has moved it,
    backend times of different moments are no longer comparable (a later
    acquisition may carry an earlier `acquired_at_ms`), so rules that order
    ops by backend time would convict a correct server. Checkers skip those
    rules in such a history and say so; their real-time rules still apply.
    """
    moved = []
    for pos, op in _nemesis_positions(history):
        v = op.get("value")
        if not isinstance(v, dict) or v.get("fault") != "clock":
            continue
        targets = set(v.get("targets") or ()) | set(v.get("offsets") or ())
        if v.get("phase") == "start" and "valkey" in targets:
            moved.append(op.get("index", pos))
    return moved


def clock_segments(history: list[dict]) -> list[int]:
    """Monotonic times of every nemesis op of the clock fault, sorted: the borders of the stretches of a run
    within which backend times stay comparable (the clock moves only while such an op is under way)."""
    bounds = []
    for _, op in _nemesis_positions(history):
        v = op.get("value")
        if "clock" in str(op.get("f")) or (isinstance(v, dict) and v.get("fault") == "clock"):
            bounds.append(op.get("time", 0))
    return sorted(bounds)


def valkey_losses(history: list[dict]) -> list[tuple[int, int]]:
    """(began, completed) times of the nemesis ops after which Valkey may have lost or rolled back state: a crash,
    a kill of Valkey, a restore from an older snapshot (the contract's backup / restore row)."""
    out, invoked = [], {}
    for _, op in _nemesis_positions(history):
        if op.get("type") != "info" or not isinstance(op.get("time"), int):
            continue
        v = op.get("value")
        if not isinstance(v, dict) or "phase" not in v:  # the invocation (its completion carries the phase)
            invoked[op.get("f")] = op["time"]
            continue
        fault, phase = v.get("fault"), v.get("phase")
        killed = fault == "valkey-crash" and phase == "start"
        killed = killed or (fault == "kill" and phase == "start" and "valkey" in (v.get("targets") or ()))
        # a restore that failed after killing Valkey is still a crash (it restarted from its own files)
        restored = fault == "valkey-restore" and phase == "end" and (v.get("restored") is True
                                                                       or v.get("killed_pid") is not None)
        began = invoked.pop(op.get("f"), op["time"])
        if killed or restored:
            out.append((began, op["time"]))
    return out


def clock_strobe_windows(history: list[dict]) -> list[tuple[int, int]]:
    """(start, end) monotonic times during which a strobe kept flipping a clock with no op of its own: from a
    `strobe-clock` start to the next reset (or the history's end). No two backend times inside one are comparable."""
    windows, start = [], None
    end_of_history = history_end_time(history)
    for _, op in _nemesis_positions(history):
        if op.get("type") != "info":
            continue
        v = op.get("value") if isinstance(op.get("value"), dict) else {}
        if op.get("f") == "strobe-clock" and v.get("phase") == "start" and start is None:
            start = op.get("time", 0)
        elif op.get("f") == "reset-clock" and start is not None and v:
            windows.append((start, op.get("time", 0)))
            start = None
    if start is not None:
        windows.append((start, end_of_history))
    return windows


def segment_of(pairs: Iterable[Pair], bounds: list[int]) -> int | None:
    """The stretch between two clock borders (an index) that every one of `pairs` lies in, with no border
    inside any of them; None when they straddle a border, or one never completed."""
    seg = None
    for p in pairs:
        if p.t1 is None:
            return None
        a, b = bisect.bisect_right(bounds, p.t0), bisect.bisect_left(bounds, p.t1)
        if a != b or (seg is not None and seg != a):
            return None
        seg = a
    return seg


def backend_rules_note(moved: list[int]) -> str:
    """The result field that says why backend-time rules were skipped."""
    return (f"skipped: the nemesis moved Valkey's clock (ops {moved[:5]}{' ...' if len(moved) > 5 else ''}), "
            "so backend times are not comparable across the run; real-time rules still apply") if moved else "applied"


def nemesis_windows(history: list[dict]) -> list[dict]:
    """Fault windows marked by the nemesis: [{fault, start, end, start_index, end_index, open}].

    Inside `analysis(history)` the list is computed once and shared: do not mutate it.
    """
    return _shared("windows", history, lambda: _nemesis_windows(history))


def _nemesis_windows(history: list[dict]) -> list[dict]:
    """The windows themselves (see `nemesis_windows`).

    A window opens at the first start op of a fault (its invoke, when the nemesis
    logs invoke + info) and closes at the last op of the matching end (its
    completion). A window never closed ends at the history's last time, `open: True`.
    """
    windows: list[dict] = []
    opened: dict[str, dict] = {}
    closing: dict[str, dict] = {}  # fault -> window whose end op may still get a completion
    for pos, op in enumerate(nemesis_ops(history)):
        if op.get("process") != NEMESIS:
            continue
        cls = nemesis_phase(op)
        if cls is None:
            continue
        fault, phase = cls
        t, idx = op.get("time", 0), op.get("index", pos)
        if phase == "start":
            closing.pop(fault, None)
            if fault not in opened:
                w = {"fault": fault, "start": t, "end": None, "start_index": idx, "end_index": None, "open": False}
                opened[fault] = w
                windows.append(w)
        elif fault in opened:
            w = opened.pop(fault)
            w["end"], w["end_index"] = t, idx
            closing[fault] = w
        elif fault in closing:  # the completion of the end op we already saw
            closing[fault]["end"], closing[fault]["end_index"] = t, idx
    if opened:  # (the history's end only when asked: a pass over every op of the history)
        end = history_end_time(history)
        for w in opened.values():
            w["end"], w["open"] = end, True
    return windows


# --------------------------------------------------------------------------- lease histories

LEASE_FS = frozenset(("acquire", "renew", "release", "force-release", "revoke"))
END_FS = frozenset(("release", "force-release", "revoke"))
# Backend end time of a lease in a release/revoke ok value. Not (yet) in docs/history-format.md;
# used when a server reports it, otherwise the checkers fall back on real-time order.
END_TIME_FIELDS = ("released_at_ms", "revoked_at_ms", "ended_at_ms")


class Lease:
    """What the history says about one lease (by lease_id): its key, token, backend times, ops."""

    __slots__ = ("lease_id", "key", "token", "acquired_at_ms", "expires_at_ms", "ended_at_ms",
                 "acquires", "grants", "ends", "granted", "started")

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
    acquire pairs of `pairs` in order, when the caller has them (`pairs_of`)."""
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


def acquisition_start(lease: Lease, first: dict[tuple, int]) -> int:
    """When the lease's acquisition began in real time: the earliest invocation of any request that returned
    it (`first`: `first_invocations` of the pairs the lease was indexed from; computed once per lease)."""
    s = lease.started
    if s is None:
        s = lease.started = min(first.get(p.rk, p.t0) if p.rk is not None else p.t0 for p in lease.acquires)
    return s


def lease_index(history: list[dict]) -> dict[Any, Lease]:
    """`index_leases(pair_ops(history))`, shared inside `analysis(history)`: do not mutate it."""
    return _shared("leases", history, lambda: index_leases(pair_ops(history), pairs_of(history, "acquire")))


def successor_index(history: list[dict]) -> tuple[dict[Any, "PrefixMax"], dict[Any, "PrefixMax"]]:
    """Per key, the leases of `lease_index(history)` as two PrefixMax of tokens: (by first acquire-ok
    completion time, by `acquired_at_ms`), the "was a higher-token successor acquired before x" questions
    of lease-state and stale-commit. Shared inside `analysis(history)`: do not mutate it."""
    return _shared("successors", history, lambda: _successor_index(lease_index(history)))


def _successor_index(leases: dict[Any, Lease]) -> tuple[dict[Any, "PrefixMax"], dict[Any, "PrefixMax"]]:
    """`successor_index` itself."""
    realtime: dict[Any, list] = {}
    backend: dict[Any, list] = {}
    for lease in leases.values():
        k = lease.key
        if k not in realtime:
            realtime[k], backend[k] = [], []
        realtime[k].append((lease.granted, lease.token, lease))
        backend[k].append((lease.acquired_at_ms, lease.token, lease))
    return ({k: PrefixMax(v) for k, v in realtime.items()}, {k: PrefixMax(v) for k, v in backend.items()})


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


# --------------------------------------------------------------------------- results


class Violations:
    """Collects violations (kind, the op indices involved, a message), keeping at most `limit` of them."""

    def __init__(self, limit: int = 1000):
        self.limit = limit
        self.items: list[dict] = []
        self.counts: dict[str, int] = {}

    def add(self, kind: str, ops: Iterable[int], msg: str, **details: Any) -> None:
        """Record one violation of `kind` naming the ops (history indices) that show it."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if len(self.items) < self.limit:
            self.items.append({"type": kind, "ops": sorted(set(ops)), "msg": msg, **details})

    def __len__(self) -> int:
        return sum(self.counts.values())

    def result(self, *, unjudged: str | None = None, **extra: Any) -> dict:
        """The checker result: valid iff no violation, the (capped) list, and counts by kind.

        `unjudged` is the reason the checker had nothing to judge (no successful acquisition, no
        commit, ...): with no violation the verdict is then "unknown" with that reason, never a vacuous true.
        """
        n = len(self)
        extra = {**extra, "reason": unjudged} if unjudged and n == 0 else extra
        return {
            "valid": False if n else ("unknown" if unjudged else True),
            "violation_count": n,
            "violation_counts": dict(self.counts),
            "violations": self.items,
            "truncated": n > len(self.items),
            **extra,
        }


# --------------------------------------------------------------------------- registry


def _lazy(module: str, attr: str) -> Callable[..., Checker]:
    """A factory that imports `module.attr` only when a checker is asked for."""

    def factory(**kw: Any) -> Checker:
        return getattr(importlib.import_module(module), attr)(**kw)

    factory.__doc__ = f"{module}.{attr}"
    return factory


def _linearizable(model: Any = None, time_limit: float | None = None, **kw: Any) -> Checker:
    """The linearizability checker for a model (a name from checkers.models, or a model object)."""
    if model is None:
        raise ValueError("the linearizable checker needs a model (e.g. --model cas-register)")
    if isinstance(model, str):
        model = importlib.import_module("checkers.models").get_model(model)
    return importlib.import_module("checkers.linear").Linearizable(model, time_limit, **kw)


CHECKERS: dict[str, Callable[..., Checker]] = {
    "linearizable": _linearizable,
    "fencing": _lazy("checkers.fencing", "FencingChecker"),
    "stale-commit": _lazy("checkers.stale_commit", "StaleCommitChecker"),
    "stale-write": _lazy("checkers.stale_write", "StaleWriteChecker"),  # token-free (docs/third-party.md)
    "mutual-exclusion": _lazy("checkers.mutex", "MutualExclusionChecker"),
    "idempotency": _lazy("checkers.idempotency", "IdempotencyChecker"),
    "lease-state": _lazy("checkers.lease_state", "LeaseStateChecker"),
    "deadlines": _lazy("checkers.deadlines", "DeadlinesChecker"),
    "availability": _lazy("checkers.deadlines", "AvailabilityChecker"),
}

DOMAIN_CHECKERS = tuple(n for n in CHECKERS if n != "linearizable")

# The operations (f) each domain checker judges: without them in a history it has nothing to check.
# A checker that only measures (MEASURES) runs next to one that applies. `deadlines` is not chosen by
# default: what it times is the caller's client (for the lab's workloads, the lab itself, whose own
# deadlines of a few ms complete late on a loaded machine), so it runs only where a workload, scenario
# or `--checker deadlines` asks for it. A domain checker in none of these never runs by default.
SUBJECT_FS: dict[str, frozenset[str]] = {
    "fencing": frozenset(("acquire",)),
    "mutual-exclusion": frozenset(("acquire",)),
    "lease-state": frozenset(("renew", "release", "force-release", "revoke", "inspect")),
    "stale-commit": frozenset(("commit",)),
    "idempotency": frozenset(("acquire", "renew", "release", "force-release", "revoke", "commit")),
}
MEASURES = frozenset(("availability",))


def applicable_checkers(history: list[dict]) -> tuple[list[str], str | None]:
    """The domain checkers whose operations appear in `history` (in DOMAIN_CHECKERS order), and when there
    is none, why: a register history must not pass lease checkers that had nothing to check."""
    fs: set[str] = set()
    with_rid: set[str] = set()  # idempotency judges only ops that carry a request_id
    for op in history:
        if op.get("process") == NEMESIS or op.get("type") != "invoke":
            continue
        f = str(op.get("f"))
        fs.add(f)
        v = op.get("value")
        if isinstance(v, dict) and v.get("request_id") is not None:
            with_rid.add(f)
    if not fs:
        return [], "empty history: no client operation"
    judges = {name for name, subject in SUBJECT_FS.items()
              if subject & (with_rid if name == "idempotency" else fs)}
    if not judges:
        return [], (f"no checker applies: the history has no operation a domain checker judges (its operations: "
                    f"{', '.join(sorted(fs))}); give --model NAME to check it for linearizability")
    return [n for n in DOMAIN_CHECKERS if n in judges or n in MEASURES], None


def get_checker(name: str, **kw: Any) -> Checker:
    """Build the checker registered as `name` with keyword options; unknown names list the known ones."""
    try:
        factory = CHECKERS[name]
    except KeyError:
        raise ValueError(f"unknown checker {name!r}; known checkers: {', '.join(CHECKERS)}") from None
    return factory(**kw)
