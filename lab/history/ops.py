"""The op record of docs/history-format.md: validation and invocation/completion pairing.

Ops are plain dicts on the hot path (the writer builds them, readers return them);
`validate_op` checks one eagerly and names the file, line and problem, and
`pair_ops` walks a history once, matching each invocation with its completion by
process (client processes strictly alternate invoke/complete; the nemesis, as in
Jepsen, writes an `info` to start an operation and another `info` to end it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "HistoryError",
    "OP_TYPES",
    "COMPLETION_TYPES",
    "NEMESIS",
    "validate_op",
    "is_client_process",
    "pair_ops",
]

OP_TYPES = frozenset({"invoke", "ok", "fail", "info"})
COMPLETION_TYPES = frozenset({"ok", "fail", "info"})
NEMESIS = "nemesis"
REQUIRED = ("index", "time", "type", "process", "f", "value")


class HistoryError(ValueError):
    """A history file or op does not follow docs/history-format.md."""


def _is_int(x: Any) -> bool:
    """Is x an int (and not a bool, which Python counts as one)?"""
    return type(x) is int or (isinstance(x, int) and not isinstance(x, bool))


def is_client_process(process: Any) -> bool:
    """Is this a client process id (an int), as opposed to the nemesis?"""
    return _is_int(process)


def _problem(d: Any) -> str | None:
    """The first way `d` breaks the op record, or None when it is a valid op."""
    if not isinstance(d, dict):
        return f"an op must be a JSON object, got {type(d).__name__}"
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


def _where(op: dict) -> str:
    """A short locator for error messages: the op's index."""
    return f"op index {op.get('index')}"


def pair_ops(ops: Iterable[dict]) -> Iterator[tuple[dict, dict | None]]:
    """Yield (invocation, completion) pairs in completion order, then (invocation, None) for
    operations never completed (in invocation order). One pass, O(n).

    Raises HistoryError when a process invokes while it has an operation open, when
    a completion has no open invocation, or when a retired process (one that got
    an `info`) invokes again.
    """
    open_: dict[Any, dict] = {}
    retired: dict[Any, int] = {}
    for op in ops:
        process, type_ = op["process"], op["type"]
        if process == NEMESIS:
            # Jepsen's convention: the nemesis writes info (or invoke) to start, info to end.
            started = open_.pop(process, None)
            if started is None:
                if type_ not in ("invoke", "info"):
                    raise HistoryError(f"{_where(op)}: nemesis {type_} with no nemesis operation open")
                open_[process] = op
            else:
                if type_ == "invoke":
                    raise HistoryError(
                        f"{_where(op)}: nemesis invoke while its operation at index {started.get('index')} "
                        "is still open"
                    )
                yield started, op
            continue
        if type_ == "invoke":
            if process in open_:
                raise HistoryError(
                    f"{_where(op)}: process {process} invoked while its operation at index "
                    f"{open_[process].get('index')} is still open"
                )
            if process in retired:
                raise HistoryError(
                    f"{_where(op)}: process {process} invoked again after its info completion at index "
                    f"{retired[process]} (a crashed process is retired; its worker continues under a new process id)"
                )
            open_[process] = op
        else:
            started = open_.pop(process, None)
            if started is None:
                raise HistoryError(f"{_where(op)}: {type_} completion for process {process} with no open invocation")
            if started["f"] != op["f"]:
                raise HistoryError(
                    f"{_where(op)}: completion f={op['f']!r} does not match its invocation f={started['f']!r} "
                    f"at index {started.get('index')}"
                )
            if type_ == "info":
                retired[process] = op.get("index")
            yield started, op
    for started in sorted(open_.values(), key=lambda o: o.get("index", 0)):
        yield started, None
