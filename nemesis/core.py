"""The nemesis protocol, composition, and a heal that always runs.

A nemesis is Jepsen's: `setup(test)`, `invoke(test, op) -> completion`,
`teardown(test)`, and the set `fs` of the `f`s it handles. Its operations belong
to process `"nemesis"` and complete as `info` ops whose `value` says exactly
what was done; a value with `"phase": "start"` opens a fault window and one with
`"phase": "end"` closes it (reports shade the window between them).

`compose` routes each op to the one nemesis that handles its `f`. `running` and
`heal_all` make the heal unconditional: teardown runs on success, on an
exception, on Ctrl-C (which `asyncio.run` turns into a cancellation of the main
task) and on cancellation, and a cancellation that arrives while healing does
not interrupt the heal.
"""

from __future__ import annotations

import random

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from lab.generator.protocols import Nemesis  # the one nemesis protocol (the interpreter's), re-exported here
from lab.stack.errors import NemesisUnavailable  # raised by the stack's fault substrates too; re-exported here
from lab.testmap import Test

__all__ = [
    "invocation",
    "as_rng",
    "Nemesis",
    "NemesisUnavailable",
    "NEMESIS_PROCESS",
    "PHASES",
    "compose",
    "Composed",
    "completion",
    "heal_all",
    "running",
]

NEMESIS_PROCESS = "nemesis"
PHASES = ("start", "end", "none")


def completion(op: dict, value: Any, error: Any = None) -> dict:
    """The `info` completion of nemesis op `op` with `value` (and `error` when something went wrong)."""
    done = {"type": "info", "process": op.get("process", NEMESIS_PROCESS), "f": op["f"], "value": value}
    if error is not None:
        done["error"] = error
    return done


class Composed:
    """Several nemeses as one: each op goes to the nemesis whose `fs` holds its `f`."""

    def __init__(self, nemeses: Iterable[Nemesis]):
        self.nemeses = list(nemeses)
        self._route: dict[str, Nemesis] = {}
        for n in self.nemeses:
            if not isinstance(n, Nemesis):
                raise TypeError(f"compose: {n!r} is not a nemesis (needs fs, setup, invoke, teardown)")
            for f in sorted(n.fs):  # sorted: the same overlap is reported every run
                if f in self._route:
                    raise ValueError(f"compose: f {f!r} is handled by both {_name(self._route[f])} and {_name(n)}")
                self._route[f] = n

    @property
    def fs(self) -> frozenset[str]:
        """Every `f` any member handles."""
        return frozenset(self._route)

    async def setup(self, test: Test) -> None:
        """Set up each member in order; if one fails, heal the ones already set up and re-raise."""
        done: list[Nemesis] = []
        try:
            for n in self.nemeses:
                await n.setup(test)
                done.append(n)
        except BaseException:
            await _teardown_each(reversed(done), test)
            raise

    async def invoke(self, test: Test, op: dict) -> dict:
        """Route `op` by its `f`."""
        f = op.get("f")
        if f not in self._route:
            raise ValueError(f"no nemesis handles f {f!r}; handled: {', '.join(sorted(self._route))}")
        return await self._route[f].invoke(test, op)

    async def teardown(self, test: Test) -> None:
        """Tear every member down (last set up, first healed), even if some fail; then raise the failures."""
        await _teardown_each(reversed(self.nemeses), test)

    def __repr__(self) -> str:
        return f"Composed({', '.join(_name(n) for n in self.nemeses)})"


def compose(nemeses: Iterable[Nemesis]) -> Composed:
    """One nemesis routing each `f` to the member that handles it (an `f` handled twice is an error)."""
    return Composed(nemeses)


def _name(n: Any) -> str:
    """A short name for messages."""
    return getattr(n, "name", None) or type(n).__name__


async def _teardown_each(nemeses: Iterable[Nemesis], test: Test) -> None:
    """Run every teardown; collect failures and raise them together at the end."""
    errors: list[Exception] = []
    for n in nemeses:
        try:
            await n.teardown(test)
        except Exception as e:  # keep healing the others
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup("several nemeses failed to heal", errors)


async def heal_all(nemesis: Nemesis, test: Test) -> None:
    """Run `nemesis.teardown(test)` to completion even if the caller is cancelled meanwhile.

    The teardown runs as its own task behind `asyncio.shield`; a cancellation of
    the caller waits for the heal to finish and is then re-raised.
    """
    task = asyncio.ensure_future(nemesis.teardown(test))
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True  # finish the heal first, then honour the cancellation
        except Exception:
            break  # the heal failed: reported below
    task.result()  # a failed heal is reported before the cancellation
    if cancelled:
        raise asyncio.CancelledError()


@asynccontextmanager
async def running(nemesis: Nemesis, test: Test) -> AsyncIterator[Nemesis]:
    """`async with running(n, test):` sets `n` up and always heals it on the way out."""
    try:
        await nemesis.setup(test)
        yield nemesis
    finally:
        await heal_all(nemesis, test)


def as_rng(rng: Any) -> random.Random:
    """A `random.Random` from a Random or an int seed, or ValueError naming `rng`."""
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, int) and not isinstance(rng, bool):
        return random.Random(rng)
    raise ValueError(f"rng must be a random.Random or an int seed, got {rng!r}")


class Rounds:
    """Seeded draws in shuffled rounds: each choice once per round, in an order the rng picks.

    A nemesis draws its targets (a process, a grudge, a scope, a client thread) this way rather than
    independently, so a short run with as many windows as choices sees every one of them (a run of four
    kills over valkey, store, lease-1 and lease-2 kills each once), and the same seed replays the same order.
    """

    def __init__(self, rng: random.Random):
        self.rng = rng
        self._left: dict[str, list] = {}

    def pick(self, name: str, choices: Any) -> Any:
        """The next draw for `name` from `choices` (a new shuffled round when the last one is used up)."""
        choices = list(choices)
        if not choices:
            raise ValueError(f"no {name} to choose from")
        left = self._left.get(name)
        if not left or any(c not in choices for c in left):
            left = list(choices)
            self.rng.shuffle(left)
            self._left[name] = left
        return left.pop()


def invocation(f: str, value: Any = None) -> dict:
    """A nemesis op as the interpreter hands it to `invoke` (for driving a nemesis by hand, e.g. in tests)."""
    return {"type": "info", "process": NEMESIS_PROCESS, "f": f, "value": value}
