"""The Client and Nemesis protocols the interpreter drives (Jepsen's, with async methods).

A Client value is a *prototype*: `open(test, node)` returns a connected client
for one worker process (the interpreter opens a fresh one whenever a worker's
process changes, i.e. after a crash). `setup`/`teardown` run once per node
around the run, on clients opened for that purpose. `invoke(test, op)` returns
the completion: a dict with `type` ("ok", "fail" or "info"), and usually
`value` (defaults to the invocation's) and `error`; raising is a crash, which
the interpreter records as `info`. `invoke` must return or raise in bounded
time (give every request a timeout): the interpreter waits for it.

The Nemesis handles ops of process "nemesis": `setup(test)` (may return a
replacement nemesis), `invoke(test, op)` -> completion (recorded as `info`, the
record's convention for nemesis ops), `teardown(test)`, and `fs`, the set of
`f`s it handles (empty means "any").

Methods may be coroutines or plain functions; the interpreter awaits results
that are awaitable.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable
from lab.testmap import Test

__all__ = ["Client", "Nemesis"]


@runtime_checkable
class Client(Protocol):
    """A client of the system under test; see the module docstring for the lifecycle."""

    async def open(self, test: Test, node: Any) -> "Client":
        """A connected client for one worker process, talking to `node`."""
        ...

    async def setup(self, test: Test) -> None:
        """Once per node before the run (e.g. create the keys)."""
        ...

    async def invoke(self, test: Test, op: dict) -> dict:
        """Perform `op`; return its completion {type, value?, error?}."""
        ...

    async def teardown(self, test: Test) -> None:
        """Once per node after the run."""
        ...

    async def close(self, test: Test) -> None:
        """Release connections."""
        ...


@runtime_checkable
class Nemesis(Protocol):
    """A fault injector driven by the nemesis lane of the generator."""

    async def setup(self, test: Test) -> "Nemesis | None":
        """Prepare (e.g. create proxies); may return a replacement nemesis."""
        ...

    async def invoke(self, test: Test, op: dict) -> dict:
        """Start or stop a fault; return the completion (its value describes what happened)."""
        ...

    async def teardown(self, test: Test) -> None:
        """Heal everything and clean up."""
        ...

    @property
    def fs(self) -> frozenset[str]:
        """The `f`s this nemesis handles (empty: any)."""
        ...
