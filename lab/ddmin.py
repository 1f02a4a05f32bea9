"""Delta debugging (Zeller and Hildebrandt's ddmin): the smallest sublist of items that still fails a test.

`ddmin(items, fails, max_tests=N)` splits the current list into n chunks and tries, in order, each chunk
alone ("reduce to subset", n back to 2), then each complement ("reduce to complement", n down by one),
then doubles n; it stops when n reaches the list's length and no complement fails: then removing any one
more item makes `fails` false, the list is 1-minimal. Every candidate keeps the items' order. Each distinct
candidate is tested once (a cache keyed on the kept positions); `max_tests` bounds the calls of `fails`,
and Ctrl-C (KeyboardInterrupt inside `fails`) ends the search too: both return the smallest failing list
found so far, saying why the search stopped. Nothing here knows what an item is: `fencelab check --shrink`
hands it a history's whole operations (`checkers.shrink`); a run-level shrinker can hand it a fault schedule.
"""

# Hand-written: PyPI's delta debuggers are not well kept or do not fit (picire's last release is 2021 and
# drives file-based testers; `ddmin` 0.0.1 is from 2019); Hypothesis shrinks the inputs it generates itself,
# not a list we are given and must keep whole.

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["DDResult", "ddmin"]

T = TypeVar("T")

DONE, BUDGET, INTERRUPTED = "done", "budget", "interrupted"


@dataclass(frozen=True)
class DDResult(Generic[T]):
    """What `ddmin` ended with: the smallest failing list found, the positions of its items in the input,
    the calls of `fails` it made (`tests`, the cache's answers not counted), the seconds it took, and why it
    stopped: `done` (1-minimal), `budget` (max_tests reached) or `interrupted` (Ctrl-C)."""

    items: list[T]
    kept: tuple[int, ...]
    tests: int
    elapsed_s: float
    stopped: str

    @property
    def minimal(self) -> bool:
        """Is the result 1-minimal (the search ran to its end)?"""
        return self.stopped == DONE


class _OutOfBudget(Exception):
    """The search has used its calls of `fails`."""


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool], *, max_tests: int = 2000,
          known_failing: bool = False, on_test: Callable[[int, int, bool], None] | None = None) -> DDResult[T]:
    """The smallest sublist of `items` (order kept) for which `fails` is true, by ddmin.

    `fails(items)` must be true of the whole list (tested first, unless `known_failing`); a ValueError
    says so when it is not. `on_test(tests, size, failed)`, when given, is told of every call of `fails`.
    """
    if max_tests < 1:
        raise ValueError(f"max_tests must be >= 1, got {max_tests}")
    t0 = time.perf_counter()
    # keyed on (length, hash) of the kept positions, not the positions: keeping each candidate whole would hold
    # up to max_tests copies of a long list; a false hit among 2,000 64-bit hashes has odds of about 1e-13
    cache: dict[tuple[int, int], bool] = {}
    tests = 0

    def test(kept: tuple[int, ...]) -> bool:
        """Does the sublist at positions `kept` fail? (cached; counted against the budget)"""
        nonlocal tests
        key = (len(kept), hash(kept))
        hit = cache.get(key)
        if hit is not None:
            return hit
        if tests >= max_tests:
            raise _OutOfBudget
        tests += 1
        failed = bool(fails([items[i] for i in kept]))
        cache[key] = failed
        if on_test is not None:
            on_test(tests, len(kept), failed)
        return failed

    current = tuple(range(len(items)))
    stopped = DONE
    try:
        if known_failing:
            cache[(len(current), hash(current))] = True
        elif not test(current):
            raise ValueError("ddmin needs a list that fails the test to start from")
        n = 2
        while len(current) >= 2:
            n = min(n, len(current))
            chunks = _split(current, n)
            reduced = next((c for c in chunks if test(c)), None)
            if reduced is not None:  # reduce to subset
                current, n = reduced, 2
                continue
            if n > 2:  # with two chunks each complement is the other chunk, just tested
                reduced = next((r for c in chunks if test(r := _without(current, c))), None)
                if reduced is not None:  # reduce to complement
                    current, n = reduced, max(n - 1, 2)
                    continue
            if n >= len(current):  # every single item's complement passes: 1-minimal
                break
            n = min(2 * n, len(current))
    except _OutOfBudget:
        stopped = BUDGET
    except KeyboardInterrupt:
        stopped = INTERRUPTED
    return DDResult([items[i] for i in current], current, tests, time.perf_counter() - t0, stopped)


def _split(seq: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    """`seq` cut into `n` contiguous chunks of sizes differing by at most one."""
    q, r = divmod(len(seq), n)
    out, start = [], 0
    for i in range(n):
        end = start + q + (1 if i < r else 0)
        out.append(seq[start:end])
        start = end
    return out


def _without(seq: tuple[int, ...], chunk: tuple[int, ...]) -> tuple[int, ...]:
    """`seq` less the items of `chunk` (a contiguous run of it)."""
    drop = set(chunk)
    return tuple(i for i in seq if i not in drop)
