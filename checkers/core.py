"""The checker protocol and how checkers compose: safe checks, merged verdicts, the registry.

A checker is anything with `check(test, history, opts) -> dict` whose result has
`"valid": True | False | "unknown"` (Jepsen's protocol). Results merge
false > unknown > true. `compose({name: checker})` runs several checkers on one
history; an exception inside one becomes `{"valid": "unknown", "error": ...}`
instead of a crashed analysis.

A checker that judges a lease history from the indexes the domain checkers
share (pairs, lease index, first invocations, clock moves: `checkers.view.LeaseView`)
is a `ViewChecker`: it also has `check_view(test, view, opts)`. `Compose` builds
one view per history, when any of its checkers is one, and hands it to each;
`ViewCheck` (their base) gives each its `check`, which builds its own view when
the checker runs alone. The views themselves are `checkers.pairs` (pairing,
lease index) and `checkers.windows` (what the nemesis did).

`CHECKERS` maps checker names to factories; the modules behind them are
imported lazily, so a broken or unfinished checker does not break the others.
"""

from __future__ import annotations

import gc
import importlib
import time as _time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

from checkers.view import LeaseView, lease_view
from lab.history.ops import NEMESIS, HistoryError

__all__ = [
    "CHECKERS",
    "DOMAIN_CHECKERS",
    "MEASURES",
    "SUBJECT_FS",
    "Checker",
    "Compose",
    "ViewCheck",
    "ViewChecker",
    "Violations",
    "applicable_checkers",
    "compose",
    "gc_paused",
    "get_checker",
    "merge_valid",
    "safe_check",
]

Valid = bool | str  # True, False or "unknown"


@runtime_checkable
class Checker(Protocol):
    """Anything that judges a history: returns a dict with "valid" True, False or "unknown"."""

    def check(self, test: Mapping[str, Any], history: list[dict], opts: Mapping[str, Any]) -> dict: ...


@runtime_checkable
class ViewChecker(Checker, Protocol):
    """A checker that judges a lease history from its `LeaseView`: `Compose` builds the view once and calls
    `check_view` with it; `check` (alone) builds one itself (`ViewCheck`)."""

    def check_view(self, test: Mapping[str, Any], view: LeaseView, opts: Mapping[str, Any]) -> dict: ...


class ViewCheck:
    """The base of a `ViewChecker`: a subclass writes `check_view(test, view, opts)`; its `check(test, history,
    opts)`, for a checker run alone, builds the view, with the GC paused, and judges a malformed history (the
    strict pairing's `HistoryError`) "unknown" with the error, as `safe_check` and the linearizability checker
    say it: no checker judges a history it cannot read."""

    def check(self, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        """Judge `history` alone: its own view, released before the GC runs again (see `Compose.check`)."""
        with gc_paused():
            try:
                return self.check_view(test, lease_view(history), opts)  # type: ignore[attr-defined]
            except HistoryError as e:
                return {"valid": "unknown", "error": f"HistoryError: {e}"}


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
    return _safely(checker.check, test, history, opts)


def _safely(check: Callable[..., Any], *args: Any) -> dict:
    """`check(*args)`, an exception or a malformed result made valid "unknown" with the error."""
    try:
        res = check(*args)
    except Exception as e:  # noqa: BLE001 - exception safety is the point (Jepsen's check-safe)
        return _failed(e)
    if not isinstance(res, dict) or "valid" not in res:
        return {"valid": "unknown", "error": f"checker returned {type(res).__name__} without 'valid'"}
    return res


def _failed(e: Exception) -> dict:
    """The result of a check that raised `e`."""
    return {"valid": "unknown", "error": f"{type(e).__name__}: {e}"}


class Compose:
    """Runs several named checkers on one history: {"valid": merged, "results": {name: result}}.

    When any of them is a `ViewChecker`, the history's `LeaseView` is built once (by `lease_view`, when the
    first of them runs: its time counts in that checker's `elapsed_s`) and each of them judges that view.
    """

    def __init__(self, checkers: Mapping[str, Checker]):
        if not checkers:
            raise ValueError("compose needs at least one checker")
        for name, c in checkers.items():
            if not isinstance(c, Checker):
                raise TypeError(f"checker {name!r} has no check(test, history, opts) method")
        self.checkers = dict(checkers)

    def check(self, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        """Run every checker safely (sharing one view of the history), time each, merge their validity.

        A history with no client operation at all is "unknown" whatever the checkers say (nothing was tested).
        """
        results: dict[str, dict] = {}
        timings: dict[str, float] = {}
        # the GC paused while the view lives, and the view released (with `_run`'s frame) before the GC runs
        # again: otherwise the first collection after a checker traverses every object of it (1.3 s at 1M ops)
        with gc_paused():
            self._run(test, history, opts, results, timings)
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

    def _run(self, test: Mapping, history: list[dict], opts: Mapping, results: dict, timings: dict) -> None:
        """Each checker's result and seconds into `results` / `timings`; the view built once, when first wanted
        (a history it cannot read is every view checker's "unknown", with the error)."""
        view: LeaseView | None = None
        unread: dict | None = None  # the result of every view checker when the view could not be built
        for name, c in self.checkers.items():
            t0 = _time.perf_counter()
            if isinstance(c, ViewChecker):
                if view is None and unread is None:
                    try:
                        view = lease_view(history)
                    except Exception as e:  # noqa: BLE001 - as safe_check: the checkers' verdict is "unknown"
                        unread = _failed(e)
                results[name] = dict(unread) if unread is not None else _safely(c.check_view, test, view, opts)
            else:
                results[name] = _safely(c.check, test, history, opts)
            timings[name] = round(_time.perf_counter() - t0, 6)


def compose(checkers: Mapping[str, Checker]) -> Compose:
    """Compose named checkers into one (see `Compose`)."""
    return Compose(checkers)


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
