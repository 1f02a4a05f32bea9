"""From a history of op records to the operations the linearizability search works on.

An invocation and its completion are paired by `lab.history.pair` (the one
pairing, strict: docs/history-format.md's rules, a malformed history is a
`lab.history.HistoryError` naming the op): the next `ok`/`fail`/`info` of the
process that invoked completes it, a process retired by an `info` never invokes
again. `fail`
ops are dropped (they did not happen), nemesis ops are ignored, and an `info`
completion or an invocation that never completed becomes an indeterminate op:
it may take effect at any point after its invocation, or never (its return is
at +infinity). Event order is the order of the history's lines; an op's `call`
and `ret` are positions in it, so a return precedes a call iff its line does.
An op's input is its invocation's value with what the client sent (its
completion's `value.sent`: request id, lease, token) merged in (`_as_sent`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from checkers.models import SCALARS, Input, Model, Output, freeze, merge_retries
from lab.history.ops import HistoryError, pair

__all__ = ["HistoryError", "Op", "merge_retries", "pair_history", "pair_partitions", "partition_ops"]


class Op:
    """One operation: invocation paired with its completion (ret None: indeterminate)."""

    __slots__ = ("index", "process", "f", "key", "input", "output", "call", "ret", "merged")

    def __init__(self, index: int, process: Any, f: str, key: Any, inp: Input, out: Output,
                 call: int, ret: int | None):
        # _pair_walk sets these slots itself, without this call: keep the two in step
        self.index = index  # the invocation's `index`
        self.process = process
        self.f = f
        self.key = key
        self.input = inp
        self.output = out
        self.call = call
        self.ret = ret
        self.merged: tuple[int, ...] = ()  # indices of retries merged into this op

    @property
    def info(self) -> bool:
        """Whether the op is indeterminate (may or may not have taken effect)."""
        return self.ret is None

    def __repr__(self) -> str:
        return f"Op(#{self.index} p{self.process} {self.input!r} -> {self.output!r} [{self.call}, {self.ret}])"


_INFO = Output("info", None)
_new_tuple = tuple.__new__  # builds Input/Output without NamedTuple's Python-level __new__ (hot path)


def pair_history(history: Iterable[dict]) -> list[Op]:
    """Pair invocations with completions by process (`lab.history.pair`, strict: a malformed history is a
    `HistoryError` naming the op); drop fails and nemesis ops (see module doc)."""
    # `make` builds each Op as the pairing meets its completion, while both records are still in the CPU's
    # cache (a second pass over 100,000 scattered dicts costs more in cache misses than the work it does).
    return [op for op in pair(history, strict=True, make=_recorder()).pairs if op is not None]


_RETIRED = object()  # _pair_partitions' mark of a process an info retired (no tuple: one class test tells it)


class _Irregular(Exception):
    """Raised inside `pair_partitions`'s fast pass at anything but a plain well-formed record."""


def pair_partitions(history: Iterable[dict], model: Model) -> tuple[int, list[tuple[Any, list[Op]]]]:
    """`partition_ops(pair_history(history), model)` and the number of ops, in one pass over the history.

    The pass pairs a well-formed history exactly as `lab.history.pair` does (an invocation with the next
    completion of its process; nemesis ops skipped; `fail`s dropped; never-completed ops indeterminate) and
    files each op into its partition's list at its invocation's place, so each list is in call order. At
    anything else -- a record that is not a plain op, a rule of the pairing broken, an unhashable key --
    it stops and the history goes through `pair_history` and `partition_ops`, the one pairing, which
    raises the `HistoryError` naming the problem. Why a second walk of the pairing rule: the general one
    builds a slot per invocation and a tuple or `make` call per pair, then a second pass partitions; on a
    50,000-op history that costs as much as the whole search (bench/checker/run.py).
    tests/test_history_pairing.py checks it gives what the one pairing gives, on valid and broken histories.
    """
    if not isinstance(history, list | tuple):
        history = list(history)  # an iterator: read once, as the fallback may need to read it again
    if model.partition is None:
        try:
            return _pair_partitions(history)
        except _Irregular:
            pass
    ops = pair_history(history)
    return len(ops), partition_ops(ops, model)


def _pair_partitions(history: list[dict]) -> tuple[int, list[tuple[Any, list[Op]]]]:
    """`pair_partitions`' fast pass (by `key`); `_Irregular` at anything it does not handle.

    What an op needs from its invocation is read while that record is in the CPU's cache (at the invoke),
    into the open-operation tuple: a second visit, at the completion, would miss it. The common ops
    (int or null values, two-int cas lists) are built inline with `_recorder`'s shared inputs and outputs;
    any other op through `_recorder` itself.
    """
    try:
        return _pair_walk(history)
    except (KeyError, TypeError):  # a field missing, an unhashable key, a record not a dict: the general path's
        raise _Irregular from None


def _pair_walk(history: list[dict]) -> tuple[int, list[tuple[Any, list[Op]]]]:
    """`_pair_partitions`' walk; KeyError or TypeError at a record it cannot read (a field missing, an
    unhashable key). Fields are read by subscript (cheaper than `.get` on CPython 3.11): every one but
    `key` is required by the record format (docs/history-format.md), and a record without one goes the
    general path."""
    record, oks, oks2, ins = _recorder(shared=True)
    new_tuple, info, OpC, new_op = _new_tuple, _INFO, Op, object.__new__
    by_key: dict[Any, list] = {}
    get = by_key.get
    # process -> (f, key, value, index, position, partition list or None, slot, inv), or _RETIRED for a process
    # an info retired (one lookup per invoke tells both rules)
    open_: dict[Any, Any] = {}
    pop = open_.pop
    retired = _RETIRED
    holes: set = set()  # keys of lists with a failed op's empty slot
    late: list = []  # (invocation, position, completion, its position) of invocations that name no key
    n = 0
    for pos, op in enumerate(history):
        typ = op["type"]
        proc = op["process"]
        if proc.__class__ is not int:
            if proc == "nemesis":
                continue
            if proc.__class__ is not str:
                raise _Irregular
        if typ == "invoke":
            if proc in open_:  # still open, or retired
                raise _Irregular
            f = op["f"]
            try:
                key = op["key"]
            except KeyError:
                key = None
            if key is None:
                open_[proc] = (f, None, None, None, pos, None, 0, op)
                continue
            lst = get(key)  # TypeError for an unhashable key: partition_ops freezes it
            if lst is None:
                lst = by_key[key] = []
            index = op["index"]
            if index == pos and index.__class__ is int:
                pos = index  # the record's own int object: no new int per op to allocate and free
            open_[proc] = (f, key, op["value"], index, pos, lst, len(lst), op)
            lst.append(None)
            continue
        t = pop(proc, None)
        if t.__class__ is not tuple:  # nothing open, or retired
            raise _Irregular
        f, key, iv, index, ipos, lst, i, inv = t
        if f != op["f"]:
            raise _Irregular
        if lst is None:
            if typ != "ok" and typ != "info" and typ != "fail":
                raise _Irregular
            if typ == "info":
                open_[proc] = retired
            late.append((inv, ipos, op, pos))
            continue
        if typ == "ok":
            cv = op["value"]
            if cv is None or cv.__class__ is int:
                out = oks.get(cv)
                if out is None:
                    out = oks[cv] = new_tuple(Output, ("ok", cv))
            elif cv.__class__ is list and len(cv) == 2 and cv[0].__class__ is int and cv[1].__class__ is int:
                k = (cv[0], cv[1])
                out = oks2.get(k)
                if out is None:
                    out = oks2[k] = new_tuple(Output, ("ok", k))
            else:  # a dict (what was sent: _as_sent) or another value: the general path
                lst[i] = record(inv, op, ipos, pos)
                n += 1
                continue
            ret = op["index"]
            if ret != pos or ret.__class__ is not int:
                ret = pos
        elif typ == "info":
            open_[proc] = retired
            if op["value"].__class__ is dict:
                lst[i] = record(inv, op, ipos, pos)
                n += 1
                continue
            out, ret = info, None
        elif typ == "fail":  # it did not happen
            holes.add(key)
            continue
        else:
            raise _Irregular
        if iv is None or iv.__class__ is int:
            inp = ins.get((f, iv))
        elif iv.__class__ is list and len(iv) == 2 and iv[0].__class__ is int and iv[1].__class__ is int:
            inp = ins.get((f, iv[0], iv[1]))
        else:
            lst[i] = record(inv, op, ipos, pos)
            n += 1
            continue
        if inp is None:
            lst[i] = record(inv, op, ipos, pos)  # builds and shares the input
        else:
            # Op's __init__ written out: object.__new__ and slot stores cost 0.6x a call of the class (CPython
            # 3.11 has no fast path for a Python __init__); every slot is set, as __init__ sets them
            lst[i] = o = new_op(OpC)
            o.index = index
            o.process = proc
            o.f = f
            o.key = key
            o.input = inp
            o.output = out
            o.call = ipos
            o.ret = ret
            o.merged = ()
        n += 1
    for t in open_.values():  # never completed
        if t is retired:
            continue
        f, key, iv, index, ipos, lst, i, inv = t
        if lst is None:
            late.append((inv, ipos, None, None))
        else:
            lst[i] = record(inv, None, ipos, None)
            n += 1
    for key in holes:
        by_key[key] = [o for o in by_key[key] if o is not None]
    if late:  # no key on the invocation: the completion's, or None; filed in call order afterwards
        late.sort(key=lambda t: t[1])
        touched = set()
        for inv, ipos, comp, pos in late:
            o = record(inv, comp, ipos, pos)
            if o is None:
                continue
            lst = get(o.key)
            if lst is None:
                lst = by_key[o.key] = []
            lst.append(o)
            touched.add(o.key)
            n += 1
        for key in touched:
            by_key[key].sort(key=lambda o: o.call)
    parts = [kv for kv in by_key.items() if kv[1]]
    parts.sort(key=lambda kv: kv[1][0].call)  # partition_ops' order: by each partition's first op
    return n, parts


def _recorder(shared: bool = False) -> Any:
    """`pair`'s `make` for one history: the Op of a pair, or None for a `fail` (it did not happen).

    Inputs and outputs are immutable and a history repeats a few dozen of them, so those of int or null
    values (and of two-int lists, a cas) are shared, built once per history: a dict lookup is cheaper
    than a NamedTuple per op. With `shared`: (the function, and its tables of outputs, two-int outputs
    and inputs, for `_pair_partitions` to build the common ops inline).
    """
    oks: dict[Any, Output] = {}  # int or None -> Output("ok", it)  (bool, float, str: equal ints, not shared)
    oks2: dict[tuple[int, int], Output] = {}  # a two-int list -> Output("ok", (int, int))
    ins: dict[Any, Input] = {}  # (f, int or None) or (f, int, int) -> Input(f, it / (int, int))
    new_tuple, scalars, info, frz = _new_tuple, SCALARS, _INFO, freeze

    def record(inv: dict, comp: dict | None, ipos: int, pos: int | None) -> Op | None:
        if comp is None:  # never completed: indeterminate
            return _make(inv, None, ipos, None)
        typ = comp["type"]
        if typ == "fail":
            return None
        cv = comp.get("value")
        if typ == "ok":  # the interning below is the one-pass loop's, written out again: a call per op costs more
            if cv is None or cv.__class__ is int:
                out = oks.get(cv)
                if out is None:
                    out = oks[cv] = new_tuple(Output, ("ok", cv))
            elif cv.__class__ is list and len(cv) == 2 and cv[0].__class__ is int and cv[1].__class__ is int:
                k = (cv[0], cv[1])
                out = oks2.get(k)
                if out is None:
                    out = oks2[k] = new_tuple(Output, ("ok", k))
            else:
                out = new_tuple(Output, ("ok", cv if cv.__class__ in scalars else frz(cv)))
            ret = pos
        else:
            out, ret = info, None
        f = inv["f"]
        key = inv.get("key")
        if key is None:
            key = comp.get("key")
        iv = inv.get("value")
        if cv.__class__ is dict and (iv is None or iv.__class__ is dict):
            iv = _as_sent(iv, cv, typ)
        if iv is None or iv.__class__ is int:
            k = (f, iv)
        elif iv.__class__ is list and len(iv) == 2 and iv[0].__class__ is int and iv[1].__class__ is int:
            k = (f, iv[0], iv[1])
        else:
            k = None
        inp = None if k is None else ins.get(k)
        if inp is None:
            inp = new_tuple(Input, (f, iv if iv.__class__ in scalars else frz(iv)))
            if k is not None:
                ins[k] = inp
        return Op(inv.get("index", ipos), inv["process"], f, key, inp, out, ipos, ret)

    return (record, oks, oks2, ins) if shared else record


_SENT_FIELDS = ("request_id", "lease_id", "fencing_token")


def _as_sent(iv: dict | None, cv: dict, typ: str) -> dict | None:
    """The invocation value with what the client put on the wire, as its completion records it.

    The workloads record an op before the client picks the lease it holds, so the lease a renew,
    release or commit named is in its completion: `value.sent` (docs/history-format.md), which is
    the truth and wins; in older histories an `info` completion's value is what was attempted and
    only fills fields the invocation lacks.
    """
    sent = cv.get("sent")
    if sent.__class__ is dict:
        extra = {k: sent[k] for k in _SENT_FIELDS if sent.get(k) is not None}
        return {**(iv or {}), **extra} if extra else iv
    if typ != "info":
        return iv
    extra = {k: cv[k] for k in _SENT_FIELDS if cv.get(k) is not None and (iv is None or k not in iv)}
    return {**(iv or {}), **extra} if extra else iv


def _make(inv: dict, comp: dict | None, call: int, ret: int | None) -> Op:
    """Build an Op from an invocation and its completion (None: never completed)."""
    key = inv.get("key")
    if key is None and comp is not None:
        key = comp.get("key")
    f = inv["f"]
    out = _INFO if ret is None else _new_tuple(Output, ("ok", freeze(comp.get("value"))))
    return Op(inv.get("index", call), inv["process"], f, key, _new_tuple(Input, (f, freeze(inv.get("value")))),
              out, call, ret)


def partition_ops(ops: list[Op], model: Model) -> list[tuple[Any, list[Op]]]:
    """Split ops into independent partitions: `model.partition`, or by `key` by default."""
    if model.partition is not None:
        parts = model.partition(ops)
        return [(_common_key(p, i), list(p)) for i, p in enumerate(parts)]
    by_key: dict[Any, list[Op]] = {}
    get = by_key.get
    for op in ops:
        k = op.key
        try:
            part = get(k)
        except TypeError:  # an unhashable key (a JSON list/object): freeze it
            k = freeze(k)
            part = get(k)
        if part is None:
            by_key[k] = [op]
        else:
            part.append(op)
    return list(by_key.items())


def _common_key(part: list[Op], i: int) -> Any:
    """The key shared by every op of a partition, or the partition's number."""
    keys = {repr(op.key) for op in part}
    return part[0].key if len(keys) == 1 and part else i
