"""The generator context: what time it is, which threads exist and are free, who runs which process.

As in Jepsen (jepsen.generator.context), the threads are the integers
0..concurrency-1 plus "nemesis" (when the test has a nemesis); each thread runs
one process at a time. Thread i starts as process i; when process p crashes (an
`info` completion) its thread continues as p + concurrency. A context is
immutable: the interpreter derives a new one per event, and combinators such as
`on_threads` hand their child a *view* restricted to some threads. `rng` is the
run's seeded random.Random (shared, the one impure part, as in Jepsen), and
`ext` is a dict for user data.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable
from typing import Any

__all__ = ["Context", "NEMESIS_THREAD"]

NEMESIS_THREAD = "nemesis"

Thread = int | str


class Context:
    """An immutable view of the interpreter's state, as generators see it."""

    __slots__ = ("time", "concurrency", "rng", "ext", "_all", "_free", "_procs", "_next")

    def __init__(
        self,
        time: int,
        concurrency: int,
        rng: random.Random,
        all_threads: frozenset,
        free_threads: frozenset,
        procs: tuple,
        next_thread: int = 0,
        ext: dict | None = None,
    ) -> None:
        self.time = time
        self.concurrency = concurrency
        self.rng = rng
        self.ext = {} if ext is None else ext
        self._all = all_threads
        self._free = free_threads
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
        everything = frozenset(threads)
        return cls(time, concurrency, random.Random(seed), everything, everything, procs)

    # -- queries ----------------------------------------------------------------------------

    def _index(self, thread: Thread) -> int:
        """Position of a thread in the process table (nemesis last)."""
        return self.concurrency if thread == NEMESIS_THREAD else thread  # type: ignore[return-value]

    def _order(self, threads: Iterable[Thread]) -> list[Thread]:
        """Threads in table order: clients ascending, then the nemesis."""
        return sorted(threads, key=self._index)

    def all_threads(self) -> list[Thread]:
        """Every thread in this view, in order."""
        return self._order(self._all)

    def free_threads(self) -> list[Thread]:
        """Threads in this view not busy with an operation, in order."""
        return self._order(self._free)

    def all_thread_count(self) -> int:
        """How many threads are in this view."""
        return len(self._all)

    def free_thread_count(self) -> int:
        """How many threads in this view are free."""
        return len(self._free)

    def is_free(self, thread: Thread) -> bool:
        """Is `thread` in this view and free?"""
        return thread in self._free

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
        if not self._free:
            return None
        best = None
        wrap = None
        for t in self._free:
            i = self._index(t)
            if i >= self._next:
                if best is None or i < best:
                    best = i
            elif wrap is None or i < wrap:
                wrap = i
        i = best if best is not None else wrap
        return self._procs[i]  # type: ignore[index]

    # -- derived contexts --------------------------------------------------------------------

    def _with(self, **changes: Any) -> "Context":
        """A copy with some fields replaced."""
        fields = {
            "time": self.time,
            "concurrency": self.concurrency,
            "rng": self.rng,
            "all_threads": self._all,
            "free_threads": self._free,
            "procs": self._procs,
            "next_thread": self._next,
            "ext": self.ext,
        }
        fields.update(changes)
        return Context(**fields)

    def with_time(self, time: int) -> "Context":
        """The same context at another time."""
        return self._with(time=time)

    def busy(self, time: int, thread: Thread) -> "Context":
        """`thread` has started an operation at `time`."""
        return self._with(
            time=time, free_threads=self._free - {thread}, next_thread=(self._next + 1) % (self.concurrency + 1)
        )

    def freed(self, time: int, thread: Thread) -> "Context":
        """`thread` has finished its operation at `time`."""
        return self._with(time=time, free_threads=self._free | ({thread} & self._all))

    def with_next_process(self, thread: Thread) -> "Context":
        """`thread`'s process crashed: it continues as process + concurrency (the nemesis keeps its id)."""
        if thread == NEMESIS_THREAD:
            return self
        procs = list(self._procs)
        procs[self._index(thread)] += self.concurrency
        return self._with(procs=tuple(procs))

    def restrict(self, threads: Collection[Thread] | Callable[[Thread], bool]) -> "Context":
        """A view of only the threads in `threads` (a collection or a predicate)."""
        keep = threads if callable(threads) else threads.__contains__
        allowed = frozenset(t for t in self._all if keep(t))
        return self._with(all_threads=allowed, free_threads=self._free & allowed)

    def __repr__(self) -> str:
        return (
            f"Context(time={self.time}, free={self.free_threads()}, all={self.all_threads()}, "
            f"processes={self.all_processes()})"
        )
