"""Pure, pulled generators (Jepsen's jepsen.generator model, in Python).

A generator answers two questions:

- `op(gen, test, ctx)` -> `(op, next_gen)` when it has an operation, `PENDING`
  when it may have one later (e.g. every thread is busy), `None` when exhausted
  (and forever after). Asking must not change the generator: the caller may
  discard the answer and ask again, so all state lives in `next_gen`.
- `update(gen, test, ctx, event)` -> the generator after an invocation or a
  completion happened (how `until_ok` learns that a read succeeded).

Plain values are generators: `None` is exhausted; a dict is one op (`f`,
`value`, optional `key`, `time` in ns to schedule it, `process`, `type`)
emitted once with the missing fields filled in from the context; a list or
tuple is a sequence (all ops of the first element, then the second...); a
function `f()` or `f(test, ctx)` returns a generator, which is used until
exhausted, and then the function is called again. An iterator is stateful, so
it must be wrapped with `seq(it)` (combinators and `run` do this for you),
which memoizes it into a pure lazy sequence.

Combinators keep Jepsen's names (with `_` for `-`): mix, any_of, limit, once,
repeat, cycle, stagger, rate, delay, time_limit, synchronize, phases, then,
each_thread, each_process, reserve, on_threads, clients, nemesis, until_ok,
concurrency_limit, sleep, log, map_ops, filter_ops, f_map, on_update,
flip_flop, shortest_any, concat. Times are integer nanoseconds; durations given
to combinators are seconds. Randomness comes only from `ctx.rng` (seeded).
A combinator never changes state while answering PENDING, so whether the
interpreter polled once or ten times does not change what is drawn from rng.
"""

from __future__ import annotations

import functools
import inspect
import random
import reprlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from lab.generator.context import NEMESIS_THREAD, Context, ThreadFilter
from lab.testmap import Test

__all__ = [
    "PENDING",
    "GeneratorError",
    "Generator",
    "op",
    "update",
    "seq",
    "as_generator",
    "concat",
    "mix",
    "any_of",
    "shortest_any",
    "limit",
    "once",
    "repeat",
    "cycle",
    "stagger",
    "rate",
    "delay",
    "time_limit",
    "synchronize",
    "phases",
    "then",
    "each_thread",
    "each_process",
    "reserve",
    "on_threads",
    "clients",
    "nemesis",
    "until_ok",
    "concurrency_limit",
    "sleep",
    "log",
    "map_ops",
    "filter_ops",
    "f_map",
    "on_update",
    "flip_flop",
    "secs_to_nanos",
]

NS_PER_S = 1_000_000_000
SPECIAL_TYPES = frozenset({"sleep", "log"})


class _Pending:
    """The PENDING answer: no operation now, maybe later."""

    _instance = None

    def __new__(cls) -> "_Pending":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "PENDING"

    def __reduce__(self) -> str:
        return "PENDING"


PENDING = _Pending()


class GeneratorError(ValueError):
    """A generator was built or behaved wrongly (bad argument, bad op, not a generator)."""


_short = reprlib.Repr()
_short.maxlevel, _short.maxdict, _short.maxlist, _short.maxstring, _short.maxother = 3, 6, 6, 60, 80


class Generator:
    """Base class of the combinators: immutable; override `op`, and `update` when it matters."""

    __slots__ = ()

    def op(self, test: Test, ctx: Context) -> tuple[dict, Any] | _Pending | None:
        """The next operation and the generator after it, PENDING, or None."""
        raise NotImplementedError

    def update(self, test: Test, ctx: Context, event: dict) -> Any:
        """The generator after `event` (an invocation or completion); by default unchanged. A generator is a
        value: an update that changes nothing returns the generator itself (no copy), as the combinators do."""
        return self

    def __repr__(self) -> str:
        public = (s for s in self.__slots__ if not s.startswith("_"))
        fields = ", ".join(f"{s}={_short.repr(getattr(self, s, None))}" for s in public)
        return f"{type(self).__name__}({fields})"


def secs_to_nanos(s: float) -> int:
    """Seconds -> integer nanoseconds (all internal times are ns)."""
    return int(round(s * NS_PER_S))


def _positive_seconds(name: str, s: Any) -> float:
    """Validate a duration argument eagerly."""
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not s > 0:
        raise GeneratorError(f"{name} takes a duration in seconds > 0, got {s!r}")
    return float(s)


def _count(name: str, n: Any, minimum: int = 0) -> int:
    """Validate a count argument eagerly."""
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise GeneratorError(f"{name} takes an int >= {minimum}, got {n!r}")
    return n


# -- dispatch: op and update over plain values ----------------------------------------------------


def op(gen: Any, test: Test, ctx: Context) -> tuple[dict, Any] | _Pending | None:
    """Ask `gen` for its next operation: `(op, next_gen)`, `PENDING`, or `None` (exhausted)."""
    if gen is None:
        return None
    if isinstance(gen, Generator):
        return gen.op(test, ctx)
    if isinstance(gen, dict):
        return _dict_op(gen, ctx)
    return as_generator(gen, allow_iterator=False).op(test, ctx)


def update(gen: Any, test: Test, ctx: Context, event: dict) -> Any:
    """Tell `gen` that `event` (an invocation or a completion) happened; return the new generator."""
    if isinstance(gen, Generator):
        return gen.update(test, ctx, event)
    return gen  # None, dicts, functions and plain sequences ignore updates (their heads start fresh)


def as_generator(gen: Any, *, allow_iterator: bool = True) -> Any:
    """Normalize a plain value to a generator: lists -> Seq, functions -> Fn, iterators -> lazy Seq."""
    if gen is None or isinstance(gen, (Generator, dict)):
        return gen
    if isinstance(gen, (str, bytes)):
        raise GeneratorError(f"a string is not a generator: {gen!r} (did you mean {{'f': {gen!r}}}?)")
    if isinstance(gen, Sequence):
        return Seq(None, _ListCursor(gen, 0)) if len(gen) else None
    if callable(gen):
        return Fn(gen)
    if isinstance(gen, Iterator):
        if not allow_iterator:
            raise GeneratorError(
                f"{_short.repr(gen)} is an iterator, which is stateful: wrap it with lab.generator.seq(...) "
                "so it can be asked twice"
            )
        return Seq(None, _LazyCell(gen))
    if isinstance(gen, Mapping):
        return dict(gen)
    raise GeneratorError(
        f"{_short.repr(gen)} ({type(gen).__name__}) is not a generator: use None, an op dict, a list/tuple, "
        "a function, an iterator wrapped in seq(), or a combinator"
    )


def _dict_op(d: dict, ctx: Context) -> tuple[dict, None] | _Pending:
    """A map is a one-shot generator: fill in type, process and time from the context."""
    type_ = d.get("type")
    if type_ not in SPECIAL_TYPES and "f" not in d:
        raise GeneratorError(f"op {_short.repr(d)} has no 'f' (every op names its function)")
    process = d["process"] if "process" in d else ctx.some_free_process()
    if process is None:
        return PENDING
    if type_ is None:
        type_ = "info" if process == NEMESIS_THREAD else "invoke"
        if "type" in d:  # an explicit None: the filled-in type must stay
            out = {"type": type_, "process": process, "time": d.get("time", ctx.time), "f": d.get("f"),
                   "value": d.get("value")}
            for k, v in d.items():
                if k not in out:
                    out[k] = v
            return out, None
    out = {"type": type_, "process": process, "time": ctx.time, "f": None, "value": None}
    out.update(d)  # d's own type/process/time/f/value are the ones above; its other fields follow, in its order
    return out, None


# -- sequences ----------------------------------------------------------------------------------


class _ListCursor:
    """Position in a list/tuple (read in place, not copied)."""

    __slots__ = ("items", "i")

    def __init__(self, items: Sequence, i: int) -> None:
        self.items, self.i = items, i

    def empty(self) -> bool:
        return self.i >= len(self.items)

    def first(self) -> Any:
        # An iterator inside a list would be consumed anew on every ask: it must come wrapped in seq().
        return as_generator(self.items[self.i], allow_iterator=False)

    def rest(self) -> "_ListCursor | None":
        return _ListCursor(self.items, self.i + 1) if self.i + 1 < len(self.items) else None


class _LazyCell:
    """A memoized cons cell over an iterator, so a lazy sequence can be re-read (a pure view)."""

    __slots__ = ("_it", "_done", "_head", "_tail")
    _END = object()

    def __init__(self, it: Iterator) -> None:
        self._it, self._done, self._head, self._tail = it, False, None, None

    def _realize(self) -> None:
        """Pull one element from the iterator, once (the memoization is why this mutates)."""
        if not self._done:
            try:
                self._head, self._tail = as_generator(next(self._it)), _LazyCell(self._it)
            except StopIteration:
                self._head, self._tail = self._END, None
            self._done, self._it = True, None

    def empty(self) -> bool:
        self._realize()
        return self._head is self._END

    def first(self) -> Any:
        self._realize()
        return self._head

    def rest(self) -> "_LazyCell | None":
        self._realize()
        return self._tail


class Seq(Generator):
    """All ops of the head generator, then of each following element in turn. Updates go to the head."""

    __slots__ = ("head", "tail")

    def __init__(self, head: Any, tail: Any) -> None:
        self.head, self.tail = head, tail

    def op(self, test, ctx):
        head, tail = self.head, self.tail
        while True:
            # op(head, ...), with its three common cases inlined (this is the innermost loop of a run)
            if head is None:  # op(None): exhausted (a sequence's state between two elements)
                r = None
            elif isinstance(head, Generator):
                r = head.op(test, ctx)
            elif type(head) is dict:
                r = _dict_op(head, ctx)
            else:
                r = op(head, test, ctx)
            if r is PENDING:
                return PENDING
            if r is not None:
                o, nxt = r
                return (o, Seq(nxt, tail) if tail is not None else nxt)
            if tail is None:
                return None
            if type(tail) is _ListCursor:  # the common case, inlined: empty(), first(), rest()
                items, i = tail.items, tail.i
                if i >= len(items):
                    return None
                head = as_generator(items[i], allow_iterator=False)
                tail = _ListCursor(items, i + 1) if i + 1 < len(items) else None
                continue
            if tail.empty():
                return None
            head, tail = tail.first(), tail.rest()

    def update(self, test, ctx, event):
        head = update(self.head, test, ctx, event)
        return self if head is self.head else Seq(head, self.tail)


def seq(items: Any) -> Any:
    """A sequence generator over a list, tuple or (lazily, memoized) any iterable."""
    if isinstance(items, (list, tuple)):
        return as_generator(items)
    return Seq(None, _LazyCell(iter(items)))


def concat(*gens: Any) -> Any:
    """The generators one after the other (not synchronized; see `phases`)."""
    return as_generator([g for g in gens if g is not None]) if any(g is not None for g in gens) else None


@functools.lru_cache(maxsize=4096)
def _arity(f: Callable) -> int:
    """0 for f(), 2 for f(test, ctx); anything else is an error."""
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return 2
    required = [
        p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(required) == 2:
        return 2
    if not required:
        return 0
    raise GeneratorError(f"a function generator takes () or (test, ctx), but {f!r} takes {len(required)} argument(s)")


class Fn(Generator):
    """A function as a generator: call it for a generator, exhaust that, call it again.

    A call that returns None, or a generator that is exhausted at once, ends it
    (Jepsen would loop forever). With no free thread it answers PENDING without
    calling the function, so random draws do not depend on polling.
    """

    __slots__ = ("f", "_arity")

    def __init__(self, f: Callable) -> None:
        self.f, self._arity = f, _arity(f)

    def op(self, test, ctx):
        if ctx.free_thread_count() == 0:
            return PENDING
        g = as_generator(self.f() if self._arity == 0 else self.f(test, ctx))
        r = op(g, test, ctx)
        if r is None or r is PENDING:
            return r
        o, nxt = r
        return o, Seq(nxt, _ListCursor((self,), 0))


class Bind(Generator):
    """Call `f(test, ctx)` once, when first asked with a free thread, and become the generator it returns."""

    __slots__ = ("f", "_arity")

    def __init__(self, f: Callable) -> None:
        self.f, self._arity = f, _arity(f)  # fails early on a bad signature

    def op(self, test, ctx):
        if ctx.free_thread_count() == 0:
            return PENDING
        g = self.f() if self._arity == 0 else self.f(test, ctx)
        if type(g) is list and g and type(g[0]) is dict:
            # op(as_generator(g)), inlined for the common answer, a list of op dicts: its first op, then the rest
            r = _dict_op(g[0], ctx)
            if r is PENDING:
                return PENDING
            return r[0], (Seq(None, _ListCursor(g, 1)) if len(g) > 1 else None)
        g = as_generator(g)
        return None if g is None else op(g, test, ctx)


def bind(f: Callable) -> Any:
    """`f(test, ctx)` called once, its generator used until exhausted (a function generator calls f again).

    For choices shared by every op of a group, e.g. one random key that every
    thread then acquires: `gen.bind(lambda test, ctx: gen.each_thread(ops_on(pick(ctx))))`.
    """
    return Bind(f)


# -- choosing between generators --------------------------------------------------------------


def _soonest(candidates: list[tuple[dict, Any, Any, int]], rng) -> tuple[dict, Any, Any] | None:
    """The candidate op with the lowest time; ties broken at random, weighted (Jepsen's soonest-op-map)."""
    best = None
    total = 0
    for o, nxt, tag, weight in candidates:
        if best is None or o["time"] < best[0]["time"]:
            best, total = (o, nxt, tag), weight
        elif o["time"] == best[0]["time"]:
            total += weight
            if rng.randrange(total) < weight:
                best = (o, nxt, tag)
    return best


class Any_(Generator):
    """Ops from whichever generator has the soonest one; updates go to all."""

    __slots__ = ("gens",)

    def __init__(self, gens: tuple) -> None:
        self.gens = gens

    def op(self, test, ctx):
        candidates, pending = [], False
        for i, g in enumerate(self.gens):
            r = op(g, test, ctx)
            if r is PENDING:
                pending = True
            elif r is not None:
                candidates.append((r[0], r[1], i, 1))
        best = _soonest(candidates, ctx.rng)
        if best is None:
            return PENDING if pending else None
        o, nxt, i = best
        gens = self.gens[:i] + (nxt,) + self.gens[i + 1 :]
        return o, Any_(gens)

    def update(self, test, ctx, event):
        gens = tuple(g for g in (update(g, test, ctx, event) for g in self.gens) if g is not None)
        return Any_(gens) if gens else None


def any_of(*gens: Any) -> Any:
    """Ops from any of the generators, soonest first; exhausted when all are. Updates go to all."""
    gens = tuple(as_generator(g) for g in gens if g is not None)
    if not gens:
        return None
    return gens[0] if len(gens) == 1 else Any_(gens)


class ShortestAny(Any_):
    """Like any_of, but exhausted as soon as any one generator is."""

    __slots__ = ()

    def op(self, test, ctx):
        candidates, pending = [], False
        for i, g in enumerate(self.gens):
            r = op(g, test, ctx)
            if r is None:
                return None
            if r is PENDING:
                pending = True
            else:
                candidates.append((r[0], r[1], i, 1))
        best = _soonest(candidates, ctx.rng)
        if best is None:
            return PENDING if pending else None
        o, nxt, i = best
        if nxt is None:
            return o, None
        return o, ShortestAny(self.gens[:i] + (nxt,) + self.gens[i + 1 :])

    def update(self, test, ctx, event):
        gens = tuple(update(g, test, ctx, event) for g in self.gens)
        return None if any(g is None for g in gens) else ShortestAny(gens)


def shortest_any(*gens: Any) -> Any:
    """Ops from any of the generators; stops when the first one is exhausted."""
    gens = tuple(as_generator(g) for g in gens)
    if any(g is None for g in gens) or not gens:
        return None
    return gens[0] if len(gens) == 1 else ShortestAny(gens)


class Mix(Generator):
    """Each op from one generator picked uniformly at random (ctx.rng); ignores updates."""

    __slots__ = ("gens", "i")

    def __init__(self, gens: tuple, i: int | None) -> None:
        self.gens, self.i = gens, i

    def op(self, test, ctx):
        if ctx.free_thread_count() == 0:
            return PENDING  # no draw from rng while nothing can run: polling must not change choices
        gens = self.gens
        i = ctx.rng.randrange(len(gens)) if self.i is None else self.i
        while True:
            r = op(gens[i], test, ctx)
            if r is PENDING:
                return PENDING
            if r is not None:
                o, nxt = r
                return o, Mix(gens[:i] + (nxt,) + gens[i + 1 :], ctx.rng.randrange(len(gens)))
            gens = gens[:i] + gens[i + 1 :]
            if not gens:
                return None
            i = ctx.rng.randrange(len(gens))


def mix(gens: Sequence[Any]) -> Any:
    """A random mixture: each op comes from one of `gens`, chosen uniformly with ctx.rng."""
    if isinstance(gens, (str, bytes, dict)) or not isinstance(gens, (Sequence, Collection)):
        raise GeneratorError(f"mix takes a list of generators, got {_short.repr(gens)}")
    gens = tuple(as_generator(g) for g in gens if g is not None)
    return Mix(gens, None) if gens else None


class FlipFlop(Generator):
    """Alternates between generators; stops when the one due is exhausted."""

    __slots__ = ("gens", "i")

    def __init__(self, gens: tuple, i: int) -> None:
        self.gens, self.i = gens, i

    def op(self, test, ctx):
        r = op(self.gens[self.i], test, ctx)
        if r is None or r is PENDING:
            return r
        o, nxt = r
        gens = self.gens[: self.i] + (nxt,) + self.gens[self.i + 1 :]
        return o, FlipFlop(gens, (self.i + 1) % len(gens))


def flip_flop(a: Any, b: Any) -> Any:
    """An op from a, then from b, then a again...; stops when the one due is exhausted."""
    return FlipFlop((as_generator(a), as_generator(b)), 0)


# -- counting -----------------------------------------------------------------------------------


class Limit(Generator):
    """At most `remaining` ops from gen."""

    __slots__ = ("remaining", "gen")

    def __init__(self, remaining: int, gen: Any) -> None:
        self.remaining, self.gen = remaining, gen

    def op(self, test, ctx):
        if self.remaining <= 0:
            return None
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        return r[0], Limit(self.remaining - 1, r[1])

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else Limit(self.remaining, g)


def limit(n: int, gen: Any) -> Any:
    """At most n operations from gen."""
    n = _count("limit", n)
    gen = as_generator(gen)
    return Limit(n, gen) if gen is not None else None


def once(gen: Any) -> Any:
    """Only the first operation of gen."""
    return limit(1, gen)


class Repeat(Generator):
    """Asks the SAME generator again for every op (times < 0: forever)."""

    __slots__ = ("remaining", "gen")

    def __init__(self, remaining: int, gen: Any) -> None:
        self.remaining, self.gen = remaining, gen

    def op(self, test, ctx):
        if self.remaining == 0:
            return None
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        return r[0], Repeat(max(-1, self.remaining - 1), self.gen)

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else Repeat(self.remaining, g)


def repeat(gen: Any, times: int | None = None) -> Any:
    """Emit gen's first op again and again (a fresh op each time for functions); `times` bounds it."""
    gen = as_generator(gen)
    if gen is None:
        return None
    return Repeat(-1 if times is None else _count("repeat times", times), gen)


class Cycle(Generator):
    """Runs gen to exhaustion, then starts it over from its original state."""

    __slots__ = ("remaining", "original", "gen")

    def __init__(self, remaining: int, original: Any, gen: Any) -> None:
        self.remaining, self.original, self.gen = remaining, original, gen

    def op(self, test, ctx):
        if self.remaining == 0:
            return None
        g = self.gen
        r = g.op(test, ctx) if isinstance(g, Generator) else op(g, test, ctx)
        if r is PENDING:
            return PENDING
        if r is not None:
            return r[0], Cycle(self.remaining, self.original, r[1])
        left = self.remaining - 1 if self.remaining > 0 else -1
        if left == 0:
            return None
        r = op(self.original, test, ctx)
        if r is None or r is PENDING:  # an original that is empty right away would cycle forever
            return r
        return r[0], Cycle(left, self.original, r[1])

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else Cycle(self.remaining, self.original, g)


def cycle(gen: Any, times: int | None = None) -> Any:
    """Run a finite gen over and over (`times` rounds, or forever)."""
    gen = as_generator(gen)
    if gen is None:
        return None
    return Cycle(-1 if times is None else _count("cycle times", times, 1), gen, gen)


# -- time ---------------------------------------------------------------------------------------


class Stagger(Generator):
    """Schedules ops at uniformly random intervals in [0, 2*dt) (total rate, not per thread)."""

    __slots__ = ("dt", "next_time", "gen")

    def __init__(self, dt: int, next_time: int | None, gen: Any) -> None:
        self.dt, self.next_time, self.gen = dt, next_time, gen

    def _gap(self, rng) -> int:
        return rng.randrange(self.dt) if self.dt > 0 else 0

    def op(self, test, ctx):
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        o, nxt = r
        next_time = ctx.time if self.next_time is None else self.next_time
        if next_time <= o["time"]:
            return o, Stagger(self.dt, o["time"] + self._gap(ctx.rng), nxt)
        return {**o, "time": next_time}, Stagger(self.dt, next_time + self._gap(ctx.rng), nxt)

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else Stagger(self.dt, self.next_time, g)


def stagger(dt: float, gen: Any) -> Any:
    """Ops roughly every dt seconds overall: random gaps uniform in [0, 2*dt)."""
    dt = _positive_seconds("stagger", dt)
    gen = as_generator(gen)
    return Stagger(secs_to_nanos(2 * dt), None, gen) if gen is not None else None


def rate(per_s: float, gen: Any) -> Any:
    """About `per_s` ops per second overall (stagger with dt = 1/per_s)."""
    per_s = _positive_seconds("rate (ops per second)", per_s)
    return stagger(1.0 / per_s, gen)


class Delay(Generator):
    """Schedules ops exactly dt apart (catching up when behind)."""

    __slots__ = ("dt", "next_time", "gen")

    def __init__(self, dt: int, next_time: int | None, gen: Any) -> None:
        self.dt, self.next_time, self.gen = dt, next_time, gen

    def op(self, test, ctx):
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        o, nxt = r
        if self.next_time is not None and o["time"] < self.next_time:
            o = {**o, "time": self.next_time}
        return o, Delay(self.dt, o["time"] + self.dt, nxt)

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else Delay(self.dt, self.next_time, g)


def delay(dt: float, gen: Any) -> Any:
    """Ops dt seconds apart (overall, not per thread)."""
    dt = _positive_seconds("delay", dt)
    gen = as_generator(gen)
    return Delay(secs_to_nanos(dt), None, gen) if gen is not None else None


class TimeLimit(Generator):
    """Ops only during `limit` ns after the first op's time."""

    __slots__ = ("limit", "cutoff", "gen")

    def __init__(self, limit: int, cutoff: int | None, gen: Any) -> None:
        self.limit, self.cutoff, self.gen = limit, cutoff, gen

    def op(self, test, ctx):
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        o, nxt = r
        cutoff = o["time"] + self.limit if self.cutoff is None else self.cutoff
        if o["time"] >= cutoff:
            return None
        return o, TimeLimit(self.limit, cutoff, nxt)

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else TimeLimit(self.limit, self.cutoff, g)


def time_limit(seconds: float, gen: Any) -> Any:
    """Once gen emits its first op, emit ops for `seconds` more, then stop."""
    seconds = _positive_seconds("time_limit", seconds)
    gen = as_generator(gen)
    return TimeLimit(secs_to_nanos(seconds), None, gen) if gen is not None else None


def sleep(seconds: float) -> dict:
    """One special op: the thread that takes it does nothing for `seconds` (not recorded)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise GeneratorError(f"sleep takes seconds >= 0, got {seconds!r}")
    return {"type": "sleep", "value": seconds}


def log(msg: str) -> dict:
    """One special op: log `msg` (at INFO, logger lab.generator) when reached (not recorded)."""
    return {"type": "log", "value": str(msg)}


# -- synchronization ----------------------------------------------------------------------------


class Synchronize(Generator):
    """Waits until every thread (of this context) is free, then becomes gen."""

    __slots__ = ("gen",)

    def __init__(self, gen: Any) -> None:
        self.gen = gen

    def op(self, test, ctx):
        if ctx.free_thread_count() != ctx.all_thread_count():
            return PENDING
        return op(self.gen, test, ctx)

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else Synchronize(g)


def synchronize(gen: Any) -> Any:
    """Start gen only once all threads are free (every earlier op has completed)."""
    gen = as_generator(gen)
    return Synchronize(gen) if gen is not None else None


def phases(*gens: Any) -> Any:
    """Each generator in turn; a phase starts only when every op of the previous one has completed."""
    return concat(*(synchronize(g) for g in gens if g is not None))


def then(a: Any, b: Any) -> Any:
    """b, then (synchronized) a: reads well in pipelines, `then(final_read, workload)`."""
    if a is None:
        return as_generator(b)
    if b is None:
        return as_generator(a)
    return concat(b, synchronize(a))


class UntilOk(Generator):
    """Ops from gen until one of them completes ok."""

    __slots__ = ("gen", "done", "active")

    def __init__(self, gen: Any, done: bool, active: frozenset) -> None:
        self.gen, self.done, self.active = gen, done, active

    def op(self, test, ctx):
        if self.done:
            return None
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        o, nxt = r
        return o, UntilOk(nxt, False, self.active | {o["process"]})

    def update(self, test, ctx, event):
        gen = update(self.gen, test, ctx, event)
        p, t = event.get("process"), event.get("type")
        if p in self.active:
            if t == "ok":
                return UntilOk(gen, True, self.active - {p})
            if t in ("fail", "info"):
                return UntilOk(gen, self.done, self.active - {p})
        return UntilOk(gen, self.done, self.active)


def until_ok(gen: Any) -> Any:
    """Ops from gen until one completes with type ok (e.g. a final read that must succeed)."""
    gen = as_generator(gen)
    return UntilOk(gen, False, frozenset()) if gen is not None else None


class ConcurrencyLimit(Generator):
    """PENDING while n or more threads (of this context) are busy."""

    __slots__ = ("n", "gen")

    def __init__(self, n: int, gen: Any) -> None:
        self.n, self.gen = n, gen

    def op(self, test, ctx):
        if ctx.all_thread_count() - ctx.free_thread_count() >= self.n:
            return PENDING
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        return r[0], ConcurrencyLimit(self.n, r[1])

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else ConcurrencyLimit(self.n, g)


def concurrency_limit(n: int, gen: Any) -> Any:
    """At most n of gen's operations in flight at once."""
    n = _count("concurrency_limit", n, 1)
    gen = as_generator(gen)
    return ConcurrencyLimit(n, gen) if gen is not None else None


# -- threads ------------------------------------------------------------------------------------


class _ThreadSet:
    """A named thread predicate (readable in reprs): clients only, or exactly some threads."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Callable[[Any], bool]) -> None:
        self.name, self.fn = name, fn

    def __call__(self, thread: Any) -> bool:
        return self.fn(thread)

    def __repr__(self) -> str:
        return self.name


CLIENT_THREADS = _ThreadSet("client threads", lambda t: t != NEMESIS_THREAD)
NEMESIS_THREADS = _ThreadSet("the nemesis thread", lambda t: t == NEMESIS_THREAD)


def _thread_pred(threads: Any) -> Callable[[Any], bool]:
    """A predicate from a predicate or a collection of threads."""
    if callable(threads):
        return threads
    if isinstance(threads, (str, int)):
        threads = (threads,)
    members = frozenset(threads)
    return _ThreadSet(f"threads {sorted(members, key=str)}", members.__contains__)


class OnThreads(Generator):
    """gen sees only the threads matching pred, and only their updates."""

    __slots__ = ("pred", "gen", "_view")

    def __init__(self, pred: Callable[[Any], bool], gen: Any, view: ThreadFilter | None = None) -> None:
        self.pred, self.gen = pred, gen
        self._view = ThreadFilter(pred) if view is None else view  # shared by every state of this generator

    def op(self, test, ctx):
        r = op(self.gen, test, self._view(ctx))
        if r is None or r is PENDING:
            return r
        return r[0], OnThreads(self.pred, r[1], self._view)

    def update(self, test, ctx, event):
        thread = ctx.thread_of(event.get("process"))
        if thread is None or not self.pred(thread):
            return self
        g = update(self.gen, test, self._view(ctx), event)
        return self if g is self.gen else OnThreads(self.pred, g, self._view)


def on_threads(threads: Any, gen: Any) -> Any:
    """Restrict gen to some threads: a predicate on threads (pure: evaluated once per set of threads, as in
    Jepsen's make-thread-filter), or a collection of them."""
    gen = as_generator(gen)
    return OnThreads(_thread_pred(threads), gen) if gen is not None else None


def clients(gen: Any, nemesis_gen: Any = None) -> Any:
    """gen for client threads only; with a second generator, that one drives the nemesis."""
    client_part = on_threads(CLIENT_THREADS, gen)
    if nemesis_gen is None:
        return client_part
    return any_of(client_part, nemesis(nemesis_gen))


def nemesis(gen: Any, client_gen: Any = None) -> Any:
    """gen for the nemesis thread only (process "nemesis"); with a second generator, that one drives clients."""
    nemesis_part = on_threads(NEMESIS_THREADS, gen)
    if client_gen is None:
        return nemesis_part
    return any_of(nemesis_part, clients(client_gen))


_UNSEEN = object()


def _assoc(d: dict, k: Any, v: Any) -> dict:
    """A copy of d with d[k] = v (dict.copy is a block copy: cheaper than {**d, k: v})."""
    d = d.copy()
    d[k] = v
    return d


def _per_thread_op(test, ctx: Context, pick: Callable[[Any], Any]) -> tuple[dict, Any, Any] | _Pending | None:
    """Ask each free thread's generator (in a one-thread view) for an op; the soonest wins."""
    candidates, pending = [], False
    for thread in ctx.free_threads():
        r = op(pick(thread), test, ctx.only(thread))
        if r is PENDING:
            pending = True
        elif r is not None:
            candidates.append((r[0], r[1], thread, 1))
    best = _soonest(candidates, ctx.rng)
    if best is not None:
        return best
    if pending or ctx.free_thread_count() != ctx.all_thread_count():
        return PENDING
    return None


def _asks_nothing(g: Any) -> bool:
    """Is g's next op a plain op dict that is next in a sequence, with no time or process of its own?

    Then asking g draws nothing from ctx.rng and changes nothing, and in a one-thread view of a free thread the
    answer is that dict at ctx.time for the thread's process: `each_thread` need not build the op of such a
    thread unless it wins. The common shapes only (a sequence's next dict, under cycle, limit and until_ok);
    anything else is asked as usual."""
    while True:
        t = type(g)
        if t is dict:
            return "time" not in g and "process" not in g and ("f" in g or g.get("type") in SPECIAL_TYPES)
        if t is Seq:
            head = g.head
            if head is None:  # the next element of its list (an empty rest, or a lazy one: asked as usual)
                tail = g.tail
                if type(tail) is not _ListCursor or tail.i >= len(tail.items):
                    return False
                head = tail.items[tail.i]
            g = head
        elif t is Cycle or t is Limit:
            if g.remaining == 0:
                return False
            g = g.gen
        elif t is UntilOk:
            if g.done:
                return False
            g = g.gen
        else:
            return False


class EachThread(Generator):
    """An independent copy of gen for every thread."""

    __slots__ = ("fresh", "gens", "_memo")

    def __init__(self, fresh: Any, gens: dict, memo: dict | None = None) -> None:
        self.fresh, self.gens = fresh, gens
        # thread -> (its generator, _asks_nothing(it)): a cache of a pure function of an immutable generator,
        # shared by every state of this each_thread (a thread's generator stays the same object until it wins)
        self._memo = {} if memo is None else memo

    def _gen(self, thread):
        return self.gens.get(thread, self.fresh)

    def op(self, test, ctx):
        # _per_thread_op, inlined (the hot loop of a run: one ask per free thread per op), and the soonest op
        # chosen as _soonest does (same comparisons, same draws from ctx.rng) without building the op of a
        # thread whose answer is a plain dict at ctx.time (_asks_nothing) unless that thread wins
        gens, fresh, memo, now = self.gens, self.fresh, self._memo, ctx.time
        candidates, pending = [], False
        for thread in ctx.free_threads():
            g = gens.get(thread, fresh)
            m = memo.get(thread)
            if m is None or m[0] is not g:
                m = memo[thread] = (g, _asks_nothing(g))
            if m[1]:
                candidates.append((now, thread, None))
                continue
            r = g.op(test, ctx.only(thread)) if isinstance(g, Generator) else op(g, test, ctx.only(thread))
            if r is PENDING:
                pending = True
            elif r is not None:
                candidates.append((r[0]["time"], thread, r))
        if not candidates:
            return PENDING if pending or ctx.free_thread_count() != ctx.all_thread_count() else None
        best = candidates[0]
        if len(candidates) > 1:
            rng = ctx.rng
            # rng.randrange(n), as random.Random computes it (the same getrandbits calls), without its Python
            # argument handling; any other rng is asked as such
            getrandbits = rng.getrandbits if type(rng) is random.Random else None
            best_t, total = best[0], 1
            for c in candidates[1:]:
                t = c[0]
                if t < best_t:
                    best, best_t, total = c, t, 1
                elif t == best_t:
                    total += 1
                    if getrandbits is None:
                        if rng.randrange(total) < 1:
                            best = c
                    else:
                        k = total.bit_length()
                        x = getrandbits(k)
                        while x >= total:
                            x = getrandbits(k)
                        if x < 1:
                            best = c
        _, thread, r = best
        if r is None:
            g = gens.get(thread, fresh)
            r = g.op(test, ctx.only(thread)) if isinstance(g, Generator) else op(g, test, ctx.only(thread))
        o, nxt = r
        return o, EachThread(fresh, _assoc(gens, thread, nxt), memo)

    def update(self, test, ctx, event):
        thread = ctx.thread_of(event.get("process"))
        if thread is None:
            return self
        before = self._gen(thread)
        g = update(before, test, ctx.only(thread), event)
        if g is before and thread in self.gens:
            return self
        return EachThread(self.fresh, _assoc(self.gens, thread, g), self._memo)


def each_thread(gen: Any) -> Any:
    """Run a separate copy of gen on each thread (e.g. every thread does one final read)."""
    gen = as_generator(gen)
    return EachThread(gen, {}) if gen is not None else None


class EachProcess(Generator):
    """An independent copy of gen for every process: a thread whose process crashed starts afresh."""

    __slots__ = ("fresh", "gens", "procs")

    def __init__(self, fresh: Any, gens: dict, procs: dict) -> None:
        self.fresh, self.gens, self.procs = fresh, gens, procs

    def op(self, test, ctx):
        def pick(thread):
            same = self.procs.get(thread, _UNSEEN) == ctx.process_of(thread)
            return self.gens[thread] if same else self.fresh

        r = _per_thread_op(test, ctx, pick)
        if r is None or r is PENDING:
            return r
        o, nxt, thread = r
        return o, EachProcess(self.fresh, _assoc(self.gens, thread, nxt), _assoc(self.procs, thread, ctx.process_of(thread)))

    def update(self, test, ctx, event):
        thread = ctx.thread_of(event.get("process"))
        if thread is None or self.procs.get(thread, _UNSEEN) != event.get("process"):
            return self
        g = update(self.gens[thread], test, ctx.only(thread), event)
        return self if g is self.gens[thread] else EachProcess(self.fresh, _assoc(self.gens, thread, g), self.procs)


def each_process(gen: Any) -> Any:
    """Run a separate copy of gen for each process (a crashed process's successor starts over)."""
    gen = as_generator(gen)
    return EachProcess(gen, {}, {}) if gen is not None else None


class Reserve(Generator):
    """Dedicated threads per generator: the first n1 threads run g1, the next n2 run g2, the rest the default."""

    __slots__ = ("counts", "gens", "ranges", "_views")

    def __init__(self, counts: tuple, gens: tuple, ranges: tuple | None, views: tuple | None = None) -> None:
        self.counts, self.gens, self.ranges = counts, gens, ranges
        if views is None and ranges is not None:
            views = tuple(ThreadFilter(r) for r in ranges)
        self._views = views  # one ThreadFilter per range, shared by every state once the ranges are known

    def _filters(self, ranges: tuple) -> tuple:
        return self._views if ranges is self.ranges else tuple(ThreadFilter(r) for r in ranges)

    def _resolve(self, ctx: Context) -> tuple:
        """The thread ranges: computed from the first context seen, then carried in the next state."""
        if self.ranges is not None:
            return self.ranges
        threads = ctx.all_threads()
        if sum(self.counts) + 1 > len(threads):
            raise GeneratorError(
                f"reserve needs {sum(self.counts)} reserved threads plus at least 1 for the default generator, "
                f"but only {len(threads)} threads are available"
            )
        ranges, start = [], 0
        for n in self.counts:
            ranges.append(frozenset(threads[start : start + n]))
            start += n
        ranges.append(frozenset(threads[start:]))
        return tuple(ranges)

    def op(self, test, ctx):
        ranges = self._resolve(ctx)
        views = self._filters(ranges)
        candidates, pending = [], False
        for i, (threads, g) in enumerate(zip(ranges, self.gens)):
            r = op(g, test, views[i](ctx))
            if r is PENDING:
                pending = True
            elif r is not None:
                candidates.append((r[0], r[1], i, max(1, len(threads))))
        best = _soonest(candidates, ctx.rng)
        if best is None:
            return PENDING if pending else None
        o, nxt, i = best
        return o, Reserve(self.counts, self.gens[:i] + (nxt,) + self.gens[i + 1 :], ranges, views)

    def update(self, test, ctx, event):
        ranges = self._resolve(ctx)
        thread = ctx.thread_of(event.get("process"))
        for i, threads in enumerate(ranges):
            if thread in threads:
                views = self._filters(ranges)
                g = update(self.gens[i], test, views[i](ctx), event)
                if g is self.gens[i] and ranges is self.ranges:
                    return self
                return Reserve(self.counts, self.gens[:i] + (g,) + self.gens[i + 1 :], ranges, views)
        return self


def reserve(*args: Any) -> Any:
    """reserve(n1, g1, n2, g2, ..., default): n1 threads for g1, n2 for g2, the rest for default."""
    if len(args) % 2 != 1:
        raise GeneratorError("reserve takes (count, generator) pairs followed by a default generator")
    counts = tuple(_count("reserve thread count", n, 0) for n in args[:-1:2])
    gens = tuple(as_generator(g) for g in args[1:-1:2]) + (as_generator(args[-1]),)
    return Reserve(counts, gens, None)


# -- transforming ops ---------------------------------------------------------------------------


class MapOps(Generator):
    """Transforms each op with f(op) or f(op, test, ctx)."""

    __slots__ = ("f", "arity", "gen")

    def __init__(self, f: Callable, arity: int, gen: Any) -> None:
        self.f, self.arity, self.gen = f, arity, gen

    def op(self, test, ctx):
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        o = self.f(r[0]) if self.arity == 1 else self.f(r[0], test, ctx)
        return o, MapOps(self.f, self.arity, r[1])

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else MapOps(self.f, self.arity, g)


def map_ops(f: Callable, gen: Any) -> Any:
    """Jepsen's gen/map: transform every op gen emits with f(op) or f(op, test, ctx)."""
    try:
        n = len([p for p in inspect.signature(f).parameters.values() if p.default is p.empty])
    except (TypeError, ValueError):
        n = 1
    if n not in (1, 3):
        raise GeneratorError(f"map_ops needs f(op) or f(op, test, ctx); {f!r} takes {n} argument(s)")
    gen = as_generator(gen)
    return MapOps(f, n, gen) if gen is not None else None


def f_map(mapping: Mapping[str, str], gen: Any) -> Any:
    """Rename op functions (`f`) through `mapping`, e.g. to compose nemeses."""
    table = dict(mapping)
    return map_ops(lambda o: {**o, "f": table.get(o["f"], o["f"])}, gen)


class FilterOps(Generator):
    """Only ops for which pred(op) is true."""

    __slots__ = ("pred", "gen")

    def __init__(self, pred: Callable[[dict], bool], gen: Any) -> None:
        self.pred, self.gen = pred, gen

    def op(self, test, ctx):
        gen = self.gen
        while True:
            r = op(gen, test, ctx)
            if r is None or r is PENDING:
                return r
            if self.pred(r[0]):
                return r[0], FilterOps(self.pred, r[1])
            gen = r[1]

    def update(self, test, ctx, event):
        g = update(self.gen, test, ctx, event)
        return self if g is self.gen else FilterOps(self.pred, g)


def filter_ops(pred: Callable[[dict], bool], gen: Any) -> Any:
    """Jepsen's gen/filter: drop ops for which pred(op) is false."""
    gen = as_generator(gen)
    return FilterOps(pred, gen) if gen is not None else None


class OnUpdate(Generator):
    """Delegates ops to gen; updates call f(self, test, ctx, event), which returns the new generator."""

    __slots__ = ("f", "gen")

    def __init__(self, f: Callable, gen: Any) -> None:
        self.f, self.gen = f, gen

    def op(self, test, ctx):
        r = op(self.gen, test, ctx)
        if r is None or r is PENDING:
            return r
        return r[0], OnUpdate(self.f, r[1])

    def update(self, test, ctx, event):
        return self.f(self, test, ctx, event)


def on_update(f: Callable, gen: Any) -> Any:
    """Handle updates yourself: f(this, test, ctx, event) -> the generator to continue with."""
    return OnUpdate(f, as_generator(gen))
