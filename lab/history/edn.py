"""Jepsen's `history.edn`: import into the op record and export from it (via `edn_format`).

Mapping (see docs/history-format.md, "Jepsen's history.edn"):

- The op's top-level keys are keywords in EDN and strings here (`:type` <-> "type").
  Nested map keys are NOT keywordized on export: a string key stays an EDN
  string, so a lab history survives export + import exactly. On import, keyword
  keys anywhere become strings (Jepsen's nested keyword keys lose their colon).
- Keywords and symbols become strings (`:invoke` -> "invoke", `:nemesis` ->
  "nemesis"); nil <-> None; vectors and lists <-> lists; sets become sorted lists.
  On export `type`, `f` (when it is a valid keyword name) and the nemesis process
  are written as keywords; every other string stays a string.
- `jepsen.independent` tuples: a client op whose value is `[k v]` becomes
  `key: k, value: v`. An exported op with a `key` is written with `:value [k v]`
  and keeps `:key k` (Jepsen ignores unknown keys), so re-import knows which ops
  are keyed. Files we export start with a marker comment; for other files, ops
  without `:key` are unwrapped only when no op carries `:key` and every client
  op's value is a 2-element vector starting with a string or int key (or when
  `independent=True` is passed).
- A Jepsen `:error` that is a vector `[code & details]` becomes
  `{"code": code, "details": [...]}`; a keyword error becomes its name.
- Missing or sparse `:index` values are reassigned densely.

edn_format parses about 13k ops/s; it has no streaming reader, so a file is
parsed whole, and when that fails we bisect over line prefixes to name the line.
"""

from __future__ import annotations

import datetime
import decimal
import fractions
import os
import re
import uuid
import warnings
from pathlib import Path
from typing import Any

import edn_format
from edn_format import ImmutableDict, ImmutableList, Keyword, Symbol

from lab.history.ops import NEMESIS, HistoryError, HistoryWarning, is_client_process, validate_op

__all__ = ["read_edn", "read_edn_report", "write_edn", "EXPORT_MARKER"]

EXPORT_MARKER = ";; fencelab history"
_HEADER = (
    f"{EXPORT_MARKER} (docs/history-format.md): keyword keys at the op's top level only; "
    "ops with :key carry :value [key value]\n"
)
# Conservative EDN keyword names we emit (no '/', ':' or '#', no leading digit), so
# every keyword we write reads back as the same string.
_KEYWORD_NAME = re.compile(r"[A-Za-z_*!?<>=][A-Za-z0-9_*!?<>=+\-.]*\Z")
_CANONICAL_ORDER = ("index", "time", "type", "process", "f", "value")
_EXPORT_ORDER = ("type", "f", "value", "process", "time", "index")  # Jepsen's printing order


def _record_tag(value: Any) -> Any:
    """Jepsen may print ops as `#jepsen.history.Op{...}` records: read them as plain maps."""
    return value


# edn_format keeps one global tag table; registering this tag is harmless to other users.
edn_format.add_tag("jepsen.history.Op", _record_tag)


# -- import -----------------------------------------------------------------------------------


def read_edn(path: str | os.PathLike, *, independent: bool | None = None) -> list[dict]:
    """Read a Jepsen EDN history as ops; recoverable problems become HistoryWarnings."""
    ops, problems = read_edn_report(path, independent=independent)
    for problem in problems:
        warnings.warn(problem, HistoryWarning, stacklevel=2)
    return ops


def read_edn_report(path: str | os.PathLike, *, independent: bool | None = None,
                    need_an_op: bool = False) -> tuple[list[dict], list[str]]:
    """Read a Jepsen EDN history (a vector of maps or one map per line); return (ops, problems).
    `need_an_op`: a bad last line with no whole form before it is a HistoryError, not a torn write."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HistoryError(f"{p}: no such history file") from None
    except UnicodeDecodeError as e:
        raise HistoryError(f"{p}: not UTF-8 text ({e})") from None
    problems: list[str] = []
    forms = _parse_forms(p, text, problems, need_an_op)
    maps = _op_maps(p, forms)
    lines = _form_lines(text, len(maps))
    ops = [_from_edn_op(p, m, i, lines) for i, m in enumerate(maps)]
    _unwrap_independent(p, ops, text.lstrip().startswith(EXPORT_MARKER), independent)
    _assign_indexes(p, ops, problems)
    for i, op in enumerate(ops):
        validate_op(op, _where(p, i, lines))
    _note_time_order(p, ops, problems, lines)
    return ops, problems


def _parse(text: str) -> list:
    """edn_format's parser, without writing ply tables into site-packages."""
    return edn_format.loads_all(text, write_ply_tables=False)


def _parse_forms(path: Path, text: str, problems: list[str], need_an_op: bool = False) -> list:
    """Parse all top-level forms; a torn last line is skipped (and reported), other errors name the line
    (a bad only line too, when `need_an_op`: one line of garbage is no history cut short)."""
    try:
        return _parse(text)
    except Exception as whole_error:  # edn_format raises EDNDecodeError, NotImplementedError (tags), ply errors
        error = whole_error
    lines = text.splitlines(keepends=True)
    if text.lstrip().startswith("["):
        raise HistoryError(f"{path}: malformed EDN history ({_describe(error)})")
    # Bisect for the longest prefix of lines that parses: the next line is the bad one.
    good, bad = 0, len(lines)
    while bad - good > 1:
        mid = (good + bad) // 2
        try:
            _parse("".join(lines[:mid]))
            good = mid
        except Exception:
            bad = mid
    rest_blank = all(not ln.strip() or ln.lstrip().startswith(";") for ln in lines[bad:])
    excerpt = lines[bad - 1][:80].rstrip("\n") if lines else ""
    if _unknown_tag(error):  # a whole form the reader cannot take, not a write cut short
        raise HistoryError(f"{path}:{bad}: malformed EDN line ({_describe(error)})")
    if rest_blank:
        try:
            forms = _parse("".join(lines[:good]))
        except Exception as e:
            raise HistoryError(f"{path}: malformed EDN history ({_describe(e)})") from None
        if forms or not need_an_op:
            problems.append(f"{path}:{bad}: torn last line skipped ({_describe(error)}: {excerpt!r})")
            return forms
    raise HistoryError(f"{path}:{bad}: malformed EDN line ({_describe(error)}): {excerpt!r}")


def _unknown_tag(e: BaseException) -> str | None:
    """The tag edn_format has no reader for (`Don't know how to handle tag ImmutableDict(foo/bar)`), or None."""
    if not (isinstance(e, NotImplementedError) and "tag" in str(e)):
        return None
    m = re.search(r"tag\s+(?:\w+\()?([^()\s]+)", str(e))
    return m.group(1) if m else "?"


def _describe(e: BaseException) -> str:
    """A short message for an edn_format error; an unknown tag says what the reader takes instead."""
    tag = _unknown_tag(e)
    if tag:
        return (f"unknown EDN tag #{tag}: a history's ops are plain EDN maps (or #jepsen.history.Op records), "
                "e.g. {:type :invoke, :f :read, :value nil, :process 0} (docs/history-format.md)")
    return f"{type(e).__name__}: {e}"


def _op_maps(path: Path, forms: list) -> list:
    """The op maps: either the elements of one top-level vector, or the top-level maps themselves."""
    if len(forms) == 1 and isinstance(forms[0], (ImmutableList, list, tuple)):
        forms = list(forms[0])
    for i, m in enumerate(forms):
        if not isinstance(m, (ImmutableDict, dict)):
            raise HistoryError(f"{path}: op {i} is not an EDN map but {type(m).__name__}: {str(m)[:80]!r}")
    return forms


def _form_lines(text: str, n: int) -> list[int] | None:
    """Line numbers of the ops when the file has exactly one op per line, else None."""
    numbers = [
        i for i, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.lstrip().startswith((";", "[", "]"))
    ]
    return numbers if len(numbers) == n else None


def _where(path: Path, i: int, lines: list[int] | None) -> str:
    """Where op i is: its line when known, else its position."""
    return f"{path}:{lines[i]}" if lines else f"{path}: op {i}"


def _from_edn_op(path: Path, m: Any, i: int, lines: list[int] | None) -> dict:
    """One EDN op map -> an op dict: keyword keys to strings, values to plain Python."""
    raw = {}
    for k, v in m.items():
        key = _plain_key(k)
        if not isinstance(key, str):
            raise HistoryError(f"{_where(path, i, lines)}: op keys must be keywords or strings, got {k!r}")
        raw[key] = _plain(v)
    op = {k: raw.pop(k) for k in _CANONICAL_ORDER if k in raw}
    op.update(raw)
    if "error" in op:
        op["error"] = _plain_error(op["error"])
    return op


def _plain_key(k: Any) -> Any:
    """A map key as plain Python: keywords and symbols become their names."""
    if isinstance(k, (Keyword, Symbol)):
        return k.name
    if isinstance(k, (str, int, float, bool)) or k is None:
        return k
    return edn_format.dumps(k)  # a composite key: keep its EDN text, a hashable string


def _plain(v: Any) -> Any:
    """An EDN value as plain, JSON-compatible Python."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return str(v) if isinstance(v, str) and type(v) is not str else v  # Char is a str subclass
    if isinstance(v, (Keyword, Symbol)):
        return v.name
    if isinstance(v, (ImmutableList, list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (ImmutableDict, dict)):
        return {_plain_key(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (frozenset, set)):
        items = [_plain(x) for x in v]
        try:
            return sorted(items)
        except TypeError:  # mixed types: keep a stable order anyway
            return sorted(items, key=repr)
    if isinstance(v, (fractions.Fraction, decimal.Decimal)):
        return float(v)
    if isinstance(v, (datetime.datetime, datetime.date)):
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, edn_format.MetadataValue):
        return _plain(v.value)
    return str(v)  # tagged elements and anything else: their EDN text


def _plain_error(e: Any) -> Any:
    """Jepsen errors (keywords, vectors) -> the record's string code or {code, ...} object."""
    if e is None or isinstance(e, (str, dict)):
        return e
    if isinstance(e, list) and e:
        code = e[0] if isinstance(e[0], str) else str(e[0])
        return {"code": code, "details": e[1:]}
    return str(e)


def _is_pair(v: Any) -> bool:
    """Is v a 2-element list, i.e. possibly a jepsen.independent [k v] tuple?"""
    return isinstance(v, list) and len(v) == 2


def _is_key(k: Any) -> bool:
    """Could k be an independent key of the record (a string or an int)?"""
    return isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool))


def _unwrap_independent(path: Path, ops: list[dict], exported: bool, independent: bool | None) -> None:
    """Turn `value: [k v]` into `key: k, value: v` where the history says ops are keyed."""
    if independent is False:
        return
    clients = [op for op in ops if is_client_process(op.get("process"))]
    keyed = any("key" in op for op in ops)
    if independent is True:
        for op in clients:
            if not _is_pair(op.get("value")):
                raise HistoryError(
                    f"{path}: independent=True but op {op.get('index', '?')} has value {op.get('value')!r}, "
                    "not [key value]"
                )
        every = True
    else:
        every = (
            not exported
            and not keyed
            and bool(clients)
            and all(_is_pair(op.get("value")) and _is_key(op["value"][0]) for op in clients)
        )
    for op in clients:
        v = op.get("value")
        if not _is_pair(v):
            continue
        if "key" in op:
            if v[0] == op["key"]:
                op["value"] = v[1]
        elif every:
            op["key"], op["value"] = v[0], v[1]


def _assign_indexes(path: Path, ops: list[dict], problems: list[str]) -> None:
    """Give every op a dense index when any is missing or they are not 0..n-1."""
    present = [op.get("index") for op in ops]
    if present == list(range(len(ops))):
        return
    if any(i is not None for i in present):
        problems.append(f"{path}: indexes were missing or not dense; reassigned 0..{len(ops) - 1}")
    for i, op in enumerate(ops):
        ops[i] = {"index": i, **{k: v for k, v in op.items() if k != "index"}}


def _note_time_order(path: Path, ops: list[dict], problems: list[str], lines: list[int] | None) -> None:
    """Report (once) a time that goes backwards: Jepsen's times should never decrease."""
    last = 0
    for i, op in enumerate(ops):
        if op["time"] < last:
            problems.append(f"{_where(path, i, lines)}: time {op['time']} is before the previous op's time {last}")
            return
        last = op["time"]


# -- export -----------------------------------------------------------------------------------


def write_edn(ops: list[dict] | Any, path: str | os.PathLike, *, overwrite: bool = False) -> int:
    """Write ops as a Jepsen EDN history, one map per line; return the count."""
    p = Path(path)
    try:
        f = open(p, "w" if overwrite else "x", encoding="utf-8")
    except FileExistsError:
        raise HistoryError(f"{p}: a file already exists there (pass overwrite=True to replace it)") from None
    n = 0
    with f:
        f.write(_HEADER)
        for op in ops:
            validate_op(op, f"op {n}")
            try:
                f.write(edn_format.dumps(_to_edn_op(op)) + "\n")
            except NotImplementedError as e:
                raise HistoryError(f"op {n} has a value EDN cannot encode ({e})") from None
            n += 1
    return n


def _keyword_or_string(s: str) -> Any:
    """A keyword when `s` is a safe keyword name, else the string itself."""
    return Keyword(s) if _KEYWORD_NAME.match(s) else s


def _to_edn_op(op: dict) -> dict:
    """One op -> an EDN-ready map: keyword keys at the top level, keyword type/f/nemesis."""
    out: dict = {}
    for k in _EXPORT_ORDER:
        v = op[k]
        if k == "type":
            v = Keyword(v)
        elif k == "f":
            v = _keyword_or_string(v)
        elif k == "process" and v == NEMESIS:
            v = Keyword(NEMESIS)
        elif k == "value" and "key" in op and is_client_process(op["process"]):
            v = [op["key"], v]
        out[Keyword(k)] = _to_edn(v)
    for k, v in op.items():
        if k not in _EXPORT_ORDER:
            out[_keyword_or_string(k)] = _to_edn(v)
    return out


def _to_edn(v: Any) -> Any:
    """Plain values -> edn_format values; tuples become vectors (JSON has no lists-vs-vectors)."""
    if isinstance(v, tuple):
        return [_to_edn(x) for x in v]
    if isinstance(v, list):
        return [_to_edn(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_edn(x) for k, x in v.items()}
    return v
