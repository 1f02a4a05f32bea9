"""The generator context: what time it is, which threads exist and are free, who runs which process.

As in Jepsen (jepsen.generator.context), the threads are the integers
0..concurrency-1 plus "nemesis" (when the test has a nemesis); each thread runs
one process at a time. Thread i starts as process i; when process p crashes (an
`info` completion) its thread continues as p + concurrency. A context is
immutable: the interpreter derives a new one per event, and combinators such as
`on_threads` hand their child a *view* restricted to some threads. `rng` is the
run's seeded random.Random (shared, the one impure part, as in Jepsen), and
`ext` is a dict for user data.

Thread sets are bitsets (ints), as in Jepsen's context: bit i is client thread
i, bit `concurrency` the nemesis thread. A view, a count, a busy/free step and
the fair "next free process" are then a few integer operations instead of a
walk over every thread (the interpreter derives several views per operation).
`ThreadFilter(threads)` is Jepsen's make-thread-filter: the set a predicate
selects is computed once per set of threads and reused (predicates are pure).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from typing import Any

__all__ = ["Context", "NEMESIS_THREAD", "ThreadFilter"]

NEMESIS_THREAD = "nemesis"

Thread = int | str

_TABLES: dict[int, tuple[dict, tuple]] = {}


def _table(concurrency: int) -> tuple[dict, tuple]:
    """(thread -> bit, bit index -> thread) for a concurrency, shared by every context of that size."""
    t = _TABLES.get(concurrency)
    if t is None:
        threads = tuple(range(concurrency)) + (NEMESIS_THREAD,)
        t = _TABLES[concurrency] = ({th: 1 << i for i, th in enumerate(threads)}, threads)
    return t


def _members(mask: int, threads: tuple) -> list[Thread]:
    """The threads of a bitset, in table order (clients ascending, then the nemesis)."""
    out = []
    while mask:
        low = mask & -mask
        out.append(threads[low.bit_length() - 1])
        mask ^= low
    return out


def _make(time, concurrency, rng, ext, all_mask, free_mask, procs, next_thread, bits, threads) -> "Context":
    """A context from its fields, without __init__'s defaults (the interpreter makes several per op)."""
    c = object.__new__(Context)
    c.time, c.concurrency, c.rng, c.ext = time, concurrency, rng, ext
    c._all, c._free, c._procs, c._next, c._bits, c._threads = (
        all_mask, free_mask, procs, next_thread, bits, threads)
    return c


class Context:
    """An immutable view of the interpreter's state, as generators see it."""

    __slots__ = ("time", "concurrency", "rng", "ext", "_all", "_free", "_procs", "_next", "_bits", "_threads")

    def __init__(
        self,
        time: int,
        concurrency: int,
        rng: random.Random,
        all_threads: Collection[Thread],
        free_threads: Collection[Thread],
        procs: tuple,
        next_thread: int = 0,
        ext: dict | None = None,
    ) -> None:
        self.time = time
        self.concurrency = concurrency
        self.rng = rng
        self.ext = {} if ext is None else ext
        self._bits, self._threads = _table(concurrency)
        self._all = self._mask(all_threads)
        self._free = self._mask(free_threads)
        self._procs = procs  # process per thread index; the nemesis thread has index `concurrency`
        self._next = next_thread

    @classmethod
    def initial(cls, concurrency: int, *, nemesis: bool = True, seed: int = 0, time: int = 0) -> "Context":
        """A fresh context: every thread free, thread i running process i."""
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        threads: list[Thread] = list(range(concurrency))
        if nemesis:
            threads.append(NEMESIS_THREAD)
        procs = tuple(range(concurrency)) + (NEMESIS_THREAD,)
        return cls(time, concurrency, random.Random(seed), threads, threads, procs)

    def _mask(self, threads: Collection[Thread]) -> int:
        """The bitset of the known threads among `threads`."""
        bits, m = self._bits, 0
        for t in threads:
            m |= bits.get(t, 0)
        return m

    # -- queries ----------------------------------------------------------------------------

    def _index(self, thread: Thread) -> int:
        """Position of a thread in the process table (nemesis last)."""
        return self.concurrency if thread == NEMESIS_THREAD else thread  # type: ignore[return-value]

    def all_threads(self) -> list[Thread]:
        """Every thread in this view, in order."""
        return _members(self._all, self._threads)

    def free_threads(self) -> list[Thread]:
        """Threads in this view not busy with an operation, in order."""
        return _members(self._free, self._threads)

    def all_thread_count(self) -> int:
        """How many threads are in this view."""
        return self._all.bit_count()

    def free_thread_count(self) -> int:
        """How many threads in this view are free."""
        return self._free.bit_count()

    def is_free(self, thread: Thread) -> bool:
        """Is `thread` in this view and free?"""
        return bool(self._free & self._bits.get(thread, 0))

    def process_of(self, thread: Thread) -> int | str:
        """The process `thread` is currently running."""
        return self._procs[self._index(thread)]

    def thread_of(self, process: Any) -> Thread | None:
        """The thread that runs (or ran) `process`; None for something that is not a process."""
        if process == NEMESIS_THREAD:
            return NEMESIS_THREAD
        if isinstance(process, int) and not isinstance(process, bool) and process >= 0:
            return process % self.concurrency
        return None

    def all_processes(self) -> list:
        """The processes currently run by this view's threads."""
        return [self.process_of(t) for t in self.all_threads()]

    def free_processes(self) -> list:
        """The processes of this view's free threads."""
        return [self.process_of(t) for t in self.free_threads()]

    def some_free_process(self) -> int | str | None:
        """A free process, rotating fairly over threads (Jepsen's rule); None when all are busy."""
        free = self._free
        if not free:
            return None
        # the lowest free index >= _next, else the lowest free index
        m = (free >> self._next) << self._next or free
        return self._procs[(m & -m).bit_length() - 1]

    # -- derived contexts --------------------------------------------------------------------

    def _view(self, all_mask: int, free_mask: int) -> "Context":
        """The same context with other thread sets."""
        return _make(self.time, self.concurrency, self.rng, self.ext, all_mask, free_mask, self._procs, self._next,
                     self._bits, self._threads)

    def with_time(self, time: int) -> "Context":
        """The same context at another time."""
        return _make(time, self.concurrency, self.rng, self.ext, self._all, self._free, self._procs, self._next,
                     self._bits, self._threads)

    def busy(self, time: int, thread: Thread) -> "Context":
        """`thread` has started an operation at `time`."""
        return _make(time, self.concurrency, self.rng, self.ext, self._all, self._free & ~self._bits.get(thread, 0),
                     self._procs, (self._next + 1) % (self.concurrency + 1), self._bits, self._threads)

    def freed(self, time: int, thread: Thread) -> "Context":
        """`thread` has finished its operation at `time`."""
        return _make(time, self.concurrency, self.rng, self.ext, self._all,
                     self._free | (self._bits.get(thread, 0) & self._all), self._procs, self._next, self._bits,
                     self._threads)

    def with_next_process(self, thread: Thread) -> "Context":
        """`thread`'s process crashed: it continues as process + concurrency (the nemesis keeps its id)."""
        if thread == NEMESIS_THREAD:
            return self
        procs = list(self._procs)
        procs[self._index(thread)] += self.concurrency
        return _make(self.time, self.concurrency, self.rng, self.ext, self._all, self._free, tuple(procs), self._next,
                     self._bits, self._threads)

    def restrict(self, threads: Collection[Thread] | Callable[[Thread], bool]) -> "Context":
        """A view of only the threads in `threads` (a collection or a predicate)."""
        if isinstance(threads, (set, frozenset)):  # the same hash lookup as `t in threads`, over the smaller side
            allowed = self._all & self._mask(threads)
        else:
            keep = threads if callable(threads) else threads.__contains__
            allowed = self._mask([t for t in _members(self._all, self._threads) if keep(t)])
        return self._view(allowed, self._free & allowed)

    def only(self, thread: Thread) -> "Context":
        """A view of one thread: `restrict((thread,))`, in O(1)."""
        allowed = self._all & self._bits.get(thread, 0)
        c = object.__new__(Context)  # _make, inlined: each_thread makes one such view per free thread per op
        c.time, c.concurrency, c.rng, c.ext = self.time, self.concurrency, self.rng, self.ext
        c._all, c._free, c._procs, c._next, c._bits, c._threads = (
            allowed, self._free & allowed, self._procs, self._next, self._bits, self._threads)
        return c

    def __repr__(self) -> str:
        return (
            f"Context(time={self.time}, free={self.free_threads()}, all={self.all_threads()}, "
            f"processes={self.all_processes()})"
        )


class ThreadFilter:
    """Jepsen's make-thread-filter: `f(ctx)` is `ctx.restrict(threads)`, with the selected set remembered per
    set of threads it was applied to (the predicate is evaluated once per thread, not once per operation).
    The memo is a cache of a pure function, so a filter behaves as immutable."""

    __slots__ = ("threads", "_memo")

    def __init__(self, threads: Collection[Thread] | Callable[[Thread], bool]) -> None:
        self.threads = threads
        self._memo: dict[tuple, int] = {}  # (concurrency, all-threads bitset) -> the selected bitset

    def __call__(self, ctx: Context) -> Context:
        key = (ctx.concurrency, ctx._all)
        allowed = self._memo.get(key)
        if allowed is None:
            if len(self._memo) > 1024:  # views of many different thread sets (nested filters): bound the memo
                self._memo.clear()
            allowed = self._memo[key] = ctx.restrict(self.threads)._all
        return ctx._view(allowed, ctx._free & allowed)

    def __repr__(self) -> str:
        return repr(self.threads)
