"""Reading histories from disk: JSONL (ours) and Jepsen's EDN, chosen by extension or content.

Readers are strict about the middle of a file and forgiving about its end: a
torn LAST line (the lab was killed mid-write) is skipped and reported as a
problem, while a malformed line anywhere else is a HistoryError naming the
file and line. With `need_an_op=True` (files the lab did not write: `fencelab
check`) a bad line with no whole op before it is an error too: one line of
garbage is no history cut short. The lab's own readers keep the default: its
history, read while it is written or killed in its first op, may be one torn
line. `iter_jsonl` streams (constant memory) for big runs.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from lab.history.edn import read_edn_report
from lab.history.ops import HistoryError, HistoryWarning, validate_op

__all__ = ["iter_jsonl", "read_history", "read_history_report", "detect_format", "write_jsonl", "HistoryWarning"]

FORMATS = ("jsonl", "edn")


def detect_format(path: str | os.PathLike) -> str:
    """'jsonl' or 'edn': by extension (.jsonl / .edn), else by the first non-space characters."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".edn":
        return "edn"
    with open(p, "rb") as f:
        head = f.read(4096).decode("utf-8", errors="replace").lstrip()
    if not head:
        return "jsonl"
    if re.match(r'\[\s*\{\s*"', head):  # `[{"type": ...`: JSON, not EDN (whose map keys are keywords)
        raise HistoryError(f"{p}: a JSON array, not a history: fencelab reads JSONL, one op object per line "
                           f"(docs/history-format.md), or Jepsen's EDN; e.g. jq -c '.[]' {p} > history.jsonl")
    if head[0] in "[;#(":
        return "edn"
    if head[0] == "{":
        rest = head[1:].lstrip()
        if rest.startswith(":"):
            return "edn"
        if rest.startswith('"') or rest.startswith("}"):
            return "jsonl"
    raise HistoryError(
        f"{p}: cannot tell whether this is a JSONL or an EDN history (starts with {head[:20]!r}); "
        "name it *.jsonl or *.edn or pass format="
    )


def _warn(problem: str) -> None:
    """Default problem sink: a HistoryWarning."""
    warnings.warn(problem, HistoryWarning, stacklevel=3)


def iter_jsonl(
    path: str | os.PathLike,
    *,
    validate: bool = True,
    on_problem: Callable[[str], None] | None = None,
    need_an_op: bool = False,
) -> Iterator[dict]:
    """Stream the ops of a JSONL history. A torn last line is skipped and passed to
    `on_problem` (default: a HistoryWarning); any other bad line raises HistoryError, as does a bad
    last line with no whole op before it when `need_an_op` (the module docstring says why)."""
    report = on_problem or _warn
    p = Path(path)
    expected_index = 0
    last_time = 0
    read_one = False  # a whole op came before the last line
    pending: tuple[int, bytes] | None = None  # one line of lookahead: is the bad line the last one?
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            if pending is not None:
                op = _parse_line(p, *pending, last=False, report=report)
                if validate:
                    expected_index, last_time = _check(p, pending[0], op, expected_index, last_time)
                read_one = True
                yield op
            pending = (lineno, raw)
        if pending is not None:
            op = _parse_line(p, *pending, last=read_one or not need_an_op, report=report)
            if op is not None:
                if validate:
                    _check(p, pending[0], op, expected_index, last_time)
                yield op


def _parse_line(path: Path, lineno: int, raw: bytes, *, last: bool, report: Callable[[str], None]) -> dict | None:
    """Decode one line; a failure on the last line is a torn write (reported, None), elsewhere an error."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        excerpt = raw[:80].decode("utf-8", errors="replace").rstrip("\n")
        if last:
            report(f"{path}:{lineno}: torn last line skipped ({len(raw)} bytes, {e.__class__.__name__}: {excerpt!r})")
            return None
        raise HistoryError(f"{path}:{lineno}: malformed line (not JSON: {e}): {excerpt!r}") from None


def _check(path: Path, lineno: int, op: dict, expected_index: int, last_time: int) -> tuple[int, int]:
    """Validate one op and the file-level rules (dense index, time never decreasing)."""
    where = f"{path}:{lineno}"
    validate_op(op, where)
    if op["index"] != expected_index:
        raise HistoryError(
            f"{where}: index {op['index']} but {expected_index} was expected (indexes are dense, one per line)"
        )
    if op["time"] < last_time:
        raise HistoryError(f"{where}: time {op['time']} is before the previous op's time {last_time}")
    return expected_index + 1, op["time"]


def read_history_report(path: str | os.PathLike, format: str | None = None, *,
                        need_an_op: bool = False) -> tuple[list[dict], list[str]]:
    """Read a whole history (JSONL or EDN); return (ops, problems), problems being recoverable ones.
    `need_an_op`: a bad last line with no whole op before it is a HistoryError, not a torn write."""
    fmt = _resolve_format(path, format)
    problems: list[str] = []
    if fmt == "jsonl":
        ops = list(iter_jsonl(path, on_problem=problems.append, need_an_op=need_an_op))
    else:
        ops, problems = read_edn_report(path, need_an_op=need_an_op)
    return ops, problems


def read_history(path: str | os.PathLike, format: str | None = None) -> list[dict]:
    """Read a whole history (JSONL or EDN); recoverable problems become HistoryWarnings."""
    ops, problems = read_history_report(path, format)
    for problem in problems:
        warnings.warn(problem, HistoryWarning, stacklevel=2)
    return ops


def _resolve_format(path: str | os.PathLike, format: str | None) -> str:
    """Check an explicit format or detect one; a missing file is a clear error."""
    if not Path(path).exists():
        raise HistoryError(f"{path}: no such history file")
    if format is None:
        return detect_format(path)
    if format not in FORMATS:
        raise HistoryError(f"format must be one of {', '.join(FORMATS)} (or None to detect), got {format!r}")
    return format


def write_jsonl(ops: Iterable[dict], path: str | os.PathLike, *, overwrite: bool = False) -> int:
    """Write complete ops (index and time already set) as a JSONL history; return the count."""
    p = Path(path)
    n = 0
    try:
        f = open(p, "w" if overwrite else "x", encoding="utf-8")
    except FileExistsError:
        raise HistoryError(f"{p}: a history already exists there (pass overwrite=True to replace it)") from None
    with f:
        for op in ops:
            validate_op(op, f"op {n}")
            try:
                f.write(json.dumps(op, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n")
            except (TypeError, ValueError) as e:
                raise HistoryError(f"op {n} is not JSON-serializable ({e}): {op!r}") from None
            n += 1
        f.flush()
        os.fsync(f.fileno())
    return n
