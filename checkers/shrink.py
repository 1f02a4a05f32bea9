"""Shrinking a convicted history: the smallest sub-history the same checker still convicts of the same violation.

`fencelab check FILE --shrink` (docs/shrinking.md). A history is cut into whole operations
(`history_units`): a client operation is its invocation with its completion (the pairing of
docs/history-format.md, `lab.history.pair`), never half of one; the nemesis's start of a fault and the stop
that ends it are one unit (a fault is kept or removed whole); a nemesis operation that starts or ends
nothing is a unit of its own. `lab.ddmin.ddmin` removes units while the checker still convicts with the
`Target`: a violation of the same `Kind` (the checker's name and the violation's `type`; a linearizability
counterexample is the kind `not-linearizable`) that, by default, names one of the ops the original violation
named (the anchor, which keeps the shrink from ending at a conviction that removing context made). A
candidate is its units' ops in their original order, renumbered 0..n-1 (`sub_history`: the index of an op is
its line), so every candidate is a well-formed history: each process still alternates invocation and
completion, and a process retired by an `info` still never invokes again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from checkers.core import Checker, compose
from checkers.windows import nemesis_phase
from lab.ddmin import DDResult, ddmin
from lab.history.ops import NEMESIS, pair

__all__ = ["NOT_LINEARIZABLE", "Kind", "Shrunk", "Target", "convicts", "first_kind", "history_units", "kinds",
           "shrink_history", "sub_history", "target_of", "violation_message"]

NOT_LINEARIZABLE = "not-linearizable"  # the kind of a linearizability counterexample (it has no violation list)


@dataclass(frozen=True)
class Kind:
    """A kind of conviction: the checker's name and the violation's type."""

    checker: str
    type: str

    def __str__(self) -> str:
        return f"{self.checker}: {self.type}"


@dataclass(frozen=True)
class Target:
    """What a shrunk history must still be convicted of: a violation of `kind` and, unless `anchor` is None,
    one that names at least one of the ops the original violation named (`anchor`: their positions in the
    original history). Without the anchor a shrink may end at a conviction of the same kind that removing
    context made (a `cas 0 -> 1` that was right after a `write 0`, judged alone), blaming an innocent op."""

    kind: Kind
    anchor: frozenset[int] | None = None

    def __str__(self) -> str:
        named = "" if self.anchor is None else f", naming one of ops {sorted(self.anchor)}"
        return f"{self.kind}{named}"


def kinds(result: Mapping[str, Any]) -> list[str]:
    """The violation types one checker's result convicts of, first violation's first (none unless invalid)."""
    if result.get("valid") is not False:
        return []
    first = [str(v.get("type")) for v in result.get("violations") or () if isinstance(v, Mapping)]
    counted = [str(k) for k in result.get("violation_counts") or ()]  # every kind, beyond the list's cap
    out = list(dict.fromkeys(first + counted))
    if not out and result.get("counterexample") is not None:
        out.append(NOT_LINEARIZABLE)
    return out


def first_kind(results: Mapping[str, Any]) -> Kind | None:
    """The first failing checker of a composed result with its first violation's type (None: none failed)."""
    for name, r in (results.get("results") or {}).items():
        found = kinds(r)
        if found:
            return Kind(name, found[0])
    return None


def target_of(results: Mapping[str, Any], *, any_ops: bool = False) -> Target | None:
    """The target of a composed result: its first kind, anchored on the ops of its first violation of that kind
    (`any_ops`: not anchored); None when nothing is convicted."""
    kind = first_kind(results)
    if kind is None:
        return None
    named = _named_ops(results["results"][kind.checker], kind)
    anchor = None if any_ops or not named else frozenset(i for i in named[0][0] if isinstance(i, int))
    return Target(kind, anchor or None)


def _named_ops(r: Mapping[str, Any], kind: Kind) -> list[tuple[list[Any], str]]:
    """Each violation of `kind` in one checker's result: the ops (indices) it names and its message. A
    linearizability counterexample names its window (the ops no linearization gets past)."""
    out = [(list(v.get("ops") or ()), f"{v.get('msg')} (ops {v.get('ops')})")
           for v in r.get("violations") or () if isinstance(v, Mapping) and v.get("type") == kind.type]
    ce = r.get("counterexample")
    if kind.type == NOT_LINEARIZABLE and isinstance(ce, Mapping):
        ops = "; ".join(f"{o.get('index')}: {o.get('op')}" for o in ce.get("window_ops") or ())
        out.append((list(ce.get("window") or ()),
                    f"key {ce.get('key')!r}: no linearization gets past window ops {ce.get('window')} ({ops})"))
    return out


def _match(result: Mapping[str, Any], target: Target, positions: list[int] | None) -> str | None:
    """The message of the first violation of a composed result that meets `target` (None: none does); a
    candidate's op indices are mapped to the original's positions through `positions` (None: the same)."""
    r = (result.get("results") or {}).get(target.kind.checker)
    if r is None or target.kind.type not in kinds(r):
        return None
    named = _named_ops(r, target.kind)
    if target.anchor is None:
        return named[0][1] if named else f"{target.kind.type} (beyond the capped violation list)"
    for ops, msg in named:
        original = {i if positions is None else positions[i] for i in ops
                    if isinstance(i, int) and (positions is None or 0 <= i < len(positions))}
        if original & target.anchor:
            return msg
    return None


def convicts(result: Mapping[str, Any], target: Target | Kind, positions: list[int] | None = None) -> bool:
    """Does a composed result convict with the target (a bare `Kind`: any violation of that kind)? `positions`
    maps the judged history's indices to the original's (`Shrunk.positions`; None: they are the original's)."""
    return _match(result, target if isinstance(target, Target) else Target(target), positions) is not None


def violation_message(result: Mapping[str, Any], target: Target, positions: list[int] | None = None) -> str:
    """The message of the violation that meets the target, for the user."""
    return _match(result, target, positions) or f"{target} (no such violation in this result)"


def history_units(history: list[dict]) -> list[tuple[int, ...]]:
    """The history cut into whole operations: each unit the positions of its ops, units in the order of their
    first op. A client operation is its invocation and completion (or the invocation alone, never completed);
    a fault's start and the stop that ends it are one unit (their nemesis operations: an op that starts one and
    the op that ends it); an op the pairing cannot place (a lenient pairing's leftover) is its own unit."""
    pairing = pair(history, strict=False, nemesis=True)
    units: list[tuple[int, ...]] = []
    faults_open: dict[str, tuple[int, ...]] = {}  # fault -> the positions of its start operation, until it stops
    for inv, comp, ipos, cpos in pairing.pairs:
        ops = (ipos,) if cpos is None else (ipos, cpos)
        if inv.get("process") != NEMESIS:
            units.append(ops)
            continue
        # the lab's invocation says only `start-pause`; its completion says {"fault", "phase"}: ask it first
        value = comp.get("value") if comp is not None else None
        changed_nothing = isinstance(value, Mapping) and value.get("phase") == "none"
        phase = None if changed_nothing else (nemesis_phase(comp) if comp is not None else None) or nemesis_phase(inv)
        if phase is None:
            units.append(ops)
        elif phase[1] == "start" and phase[0] not in faults_open:
            faults_open[phase[0]] = ops
        elif phase[1] == "end" and phase[0] in faults_open:
            units.append(faults_open.pop(phase[0]) + ops)
        else:  # a start while that fault is open, an end with none open: whole on its own (as one that changed
            # nothing: its completion says `"phase": "none"`)
            units.append(ops)
    units.extend(faults_open.values())  # a fault never stopped: its start alone
    placed = {p for u in units for p in u}
    units.extend((p,) for p in range(len(history)) if p not in placed)
    units.sort(key=min)
    return units


def sub_history(history: list[dict], units: Iterable[tuple[int, ...]]) -> list[dict]:
    """The ops of `units` in their original order, copied and renumbered 0..n-1 (times kept)."""
    return [{**history[p], "index": i} for i, p in enumerate(_positions(units))]


def _positions(units: Iterable[tuple[int, ...]]) -> list[int]:
    """The original positions of the ops of `units`, in order."""
    return sorted(p for u in units for p in u)


@dataclass(frozen=True)
class Shrunk:
    """A shrink's outcome: the sub-history, where each of its ops was in the original (`positions`), the number
    of whole operations before and after, and the ddmin run that found it."""

    history: list[dict]
    positions: list[int]
    units_before: int
    units_after: int
    search: DDResult


def shrink_history(history: list[dict], target: Target | Kind, checker: Checker, *, max_checks: int = 2000,
                   test: Mapping[str, Any] | None = None,
                   on_check: Callable[[int, int, bool], None] | None = None) -> Shrunk:
    """The smallest sub-history of whole operations that `checker` (the one the target names) still convicts
    with the target; at most `max_checks` checker calls, Ctrl-C ending the search with the best so far. Only
    this checker runs during the search (composed alone, so an empty history is "unknown" as in `check`)."""
    target = target if isinstance(target, Target) else Target(target)
    judge = compose({target.kind.checker: checker})
    test = dict(test or {})
    units = history_units(history)

    def fails(kept: list[tuple[int, ...]]) -> bool:
        """Is this candidate still convicted with the target?"""
        return convicts(judge.check(test, sub_history(history, kept), {}), target, _positions(kept))

    search = ddmin(units, fails, max_tests=max_checks, on_test=on_check)
    return Shrunk(sub_history(history, search.items), _positions(search.items), len(units), len(search.items),
                  search)
