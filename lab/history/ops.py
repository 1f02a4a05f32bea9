"""The op record of docs/history-format.md: validation and invocation/completion pairing.

Ops are plain dicts on the hot path (the writer builds them, readers return them);
`validate_op` checks one eagerly and names the file, line and problem. `pair` is
the one pairing of the code base (every checker, the linearizability engine, the
frame and the reports read histories through it): it walks a history once,
matching each invocation with its completion by process (client processes
strictly alternate invoke/complete, a process retired by an `info` never invokes
again; the nemesis, as in Jepsen, writes an `info` to start an operation and
another `info` to end it), strictly (a broken rule is a `HistoryError`) or
leniently (each broken rule listed, the pairing continuing by fixed rules), as
its caller chooses. `HistoryError`, `HistoryWarning` and `NEMESIS` (the nemesis's
process name) live here too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

__all__ = [
    "HistoryError",
    "HistoryWarning",
    "OP_TYPES",
    "COMPLETION_TYPES",
    "NEMESIS",
    "validate_op",
    "is_client_process",
    "pair",
    "pair_ops",
    "Pairing",
    "where",
]

OP_TYPES = frozenset({"invoke", "ok", "fail", "info"})
COMPLETION_TYPES = frozenset({"ok", "fail", "info"})
NEMESIS = "nemesis"
REQUIRED = ("index", "time", "type", "process", "f", "value")


class HistoryError(ValueError):
    """A history file or op does not follow docs/history-format.md (the one such error: readers, writers,
    the pairing, the checkers and the linearizability engine all raise this)."""


class HistoryWarning(UserWarning):
    """A history was read with a recoverable problem (a torn last line skipped, a lenient pairing's problem)."""


def _is_int(x: Any) -> bool:
    """Is x an int (and not a bool, which Python counts as one)?"""
    return type(x) is int or (isinstance(x, int) and not isinstance(x, bool))


def is_client_process(process: Any) -> bool:
    """Is this a client process id (an int), as opposed to the nemesis?"""
    return _is_int(process)


def _problem(d: Any) -> str | None:
    """The first way `d` breaks the op record, or None when it is a valid op."""
    if not isinstance(d, dict):
        hint = " (a JSON array? one op object per line: docs/history-format.md)" if isinstance(d, list) else ""
        return f"an op must be a JSON object, got {type(d).__name__}{hint}"
    missing = [k for k in REQUIRED if k not in d]
    if missing:
        return f"op is missing required field(s) {', '.join(missing)}"
    index, time, type_, process, f = d["index"], d["time"], d["type"], d["process"], d["f"]
    if not _is_int(index) or index < 0:
        return f"'index' must be an int >= 0, got {index!r}"
    if not _is_int(time) or time < 0:
        return f"'time' must be an int >= 0 (ns since the test started), got {time!r}"
    if type_ not in OP_TYPES:
        return f"'type' must be one of invoke, ok, fail, info; got {type_!r}"
    if not ((_is_int(process) and process >= 0) or process == NEMESIS):
        return f"'process' must be an int >= 0 or \"nemesis\", got {process!r}"
    if not isinstance(f, str) or not f:
        return f"'f' must be a non-empty string, got {f!r}"
    if "error" in d and d["error"] is not None and not isinstance(d["error"], (str, dict)):
        return f"'error' must be a string code or an object {{code, msg}}, got {d['error']!r}"
    if "key" in d and not (isinstance(d["key"], str) or _is_int(d["key"])):
        return f"'key' must be a string or an int, got {d['key']!r}"
    if "node" in d and d["node"] is not None and not isinstance(d["node"], str):
        return f"'node' must be a string, got {d['node']!r}"
    return None


def validate_op(d: Any, where: str = "op") -> dict:
    """Return `d` if it is a valid op, else raise HistoryError naming `where` and the problem."""
    problem = _problem(d)
    if problem is not None:
        raise HistoryError(f"{where}: {problem}")
    return d


def where(pos: int, op: Any) -> str:
    """How to name an op in a message: its line (1-based position in the history) and its index."""
    if isinstance(op, dict) and "index" in op:
        return f"op at line {pos + 1} (index {op['index']!r})"
    return f"op at line {pos + 1}"


class Pairing(NamedTuple):
    """What `pair` found: the operations, and the ways the history broke the pairing rules (lenient only)."""

    pairs: list[tuple[dict, dict | None, int, int | None]]  # (invocation, completion, its line, its line)
    problems: list[str]
    nemesis: list[int]  # the positions of the nemesis's ops (for readers of fault windows: no second scan)


def pair(ops: Iterable[dict], *, strict: bool, nemesis: bool = False,
         make: Callable[[dict, dict | None, int, int | None], Any] | None = None) -> Pairing:
    """THE pairing of docs/history-format.md: each invocation with the next completion of its process.

    Returns `Pairing(pairs, problems, nemesis)`: `pairs` in invocation order, each `(invocation, completion, inv_pos,
    comp_pos)` with positions in `ops` (completion and comp_pos None for an operation never completed).
    Client processes alternate invoke / completion; a process that got an `info` is retired and must not
    invoke again. With `nemesis=True` the nemesis's operations are paired too (Jepsen's convention: an
    `info` or `invoke` starts one, the next `info` ends it); else nemesis ops are skipped.

    `strict` is the caller's explicit choice of what a broken history means:
    - strict=True: the first problem raises `HistoryError` naming the op and the rule (checkers: a verdict
      about a malformed history would be a verdict about something else);
    - strict=False: every problem is listed in `problems` and the pairing goes on by fixed rules (readers
      that show a history: reports, plots). A second invoke while one is open leaves the first never
      completed; an invoke after an `info` is paired as usual; a completion with no open invocation is
      dropped; a completion whose `f` differs from its invocation's still completes it; an op that is not
      an op record (not an object, no type / process / f, a bad type or process) is dropped.
    `make(invocation, completion, inv_pos, comp_pos)`, when given, builds each client pair in place of the
    tuple (the checkers' `Pair`: no second pass over a million pairs). One pass, O(n); the hot path of every
    checker.
    """
    problems: list[str] = []

    def bad(msg: str) -> None:
        if strict:
            raise HistoryError(msg)
        problems.append(msg)

    slots: list[Any] = []  # in invocation order: the pair, or [invocation, inv_pos] while open
    nemesis_at: list[int] = []
    open_: dict[Any, int] = {}  # process -> its open slot
    retired: dict[Any, tuple] = {}  # process -> (index, position) of the info that retired it
    for pos, op in enumerate(ops):
        try:
            typ = op["type"]
            proc = op["process"]
        except KeyError as e:
            bad(f"{where(pos, op)} has no {e.args[0]!r} field")
            continue
        except TypeError:
            bad(f"{where(pos, op)} is a {type(op).__name__}, not an object")
            continue
        if proc.__class__ is not int:
            if proc == NEMESIS:
                nemesis_at.append(pos)
                if nemesis:
                    _pair_nemesis(pos, op, typ, slots, open_, bad)
                continue
            # any other string is a synthetic process (a model's recovery ops, checkers.models); files cannot
            # hold one (validate_op)
            if not isinstance(proc, int | str) or isinstance(proc, bool):
                bad(f"{where(pos, op)} has process {proc!r}; expected an integer or \"nemesis\"")
                continue
        if typ == "invoke":
            if "f" not in op:
                bad(f"{where(pos, op)} has no 'f' field")
                continue
            i = open_.get(proc)
            if i is not None:
                inv, ipos = slots[i]
                bad(f"{where(pos, op)}: process {proc} invoked while its operation at index {inv.get('index')!r} "
                    f"is still open (line {ipos + 1})")
                slots[i] = (inv, None, ipos, None) if make is None else make(inv, None, ipos, None)
            if proc in retired:
                bad(f"{where(pos, op)}: process {proc} invoked again after its info completion at index "
                    f"{retired[proc][0]!r} (line {retired[proc][1] + 1}; a crashed process is retired, its worker "
                    "continues under a new process id)")
            open_[proc] = len(slots)
            slots.append([op, pos])
            continue
        if typ not in COMPLETION_TYPES:
            bad(f"{where(pos, op)} has type {typ!r}; expected invoke, ok, fail or info")
            continue
        i = open_.pop(proc, None)
        if i is None:
            bad(f"{where(pos, op)}: {typ} completion for process {proc} with no open invocation")
            continue
        inv, ipos = slots[i]
        if inv["f"] != op.get("f"):
            bad(f"{where(pos, op)}: completion f={op.get('f')!r} does not match its invocation f={inv['f']!r} "
                f"at line {ipos + 1}")
        if typ == "info":
            retired[proc] = (op.get("index"), pos)
        slots[i] = (inv, op, ipos, pos) if make is None else make(inv, op, ipos, pos)
    for proc, i in open_.items():  # never completed
        inv, ipos = slots[i]
        slots[i] = (inv, None, ipos, None) if make is None or proc == NEMESIS else make(inv, None, ipos, None)
    return Pairing(slots, problems, nemesis_at)


def _pair_nemesis(pos: int, op: dict, typ: Any, slots: list, open_: dict, bad: Callable[[str], None]) -> None:
    """One nemesis op of `pair` (Jepsen's convention: info or invoke starts, the next info ends)."""
    i = open_.pop(NEMESIS, None)
    if i is None:
        if typ not in ("invoke", "info"):
            bad(f"{where(pos, op)}: nemesis {typ} with no nemesis operation open")
            return
        open_[NEMESIS] = len(slots)
        slots.append([op, pos])
        return
    inv, ipos = slots[i]
    if typ == "invoke":
        bad(f"{where(pos, op)}: nemesis invoke while its operation at line {ipos + 1} is still open")
        slots[i] = (inv, None, ipos, None)
        open_[NEMESIS] = len(slots)
        slots.append([op, pos])
        return
    slots[i] = (inv, op, ipos, pos)


def pair_ops(ops: Iterable[dict], *, strict: bool = True) -> Iterator[tuple[dict, dict | None]]:
    """`pair` (nemesis included) as (invocation, completion) in completion order, then (invocation, None)
    for operations never completed, in invocation order. Lenient (strict=False): each problem is a
    HistoryWarning."""
    pairs, problems, _ = pair(ops, strict=strict, nemesis=True)
    for problem in problems:
        warnings.warn(problem, HistoryWarning, stacklevel=2)
    done = sorted((p for p in pairs if p[3] is not None), key=lambda p: p[3])
    for inv, comp, _, _ in done:
        yield inv, comp
    for inv, comp, _, _ in pairs:
        if comp is None:
            yield inv, None
