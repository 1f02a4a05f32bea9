"""The nemeses of a Swarm stack: kill with Swarm's replacement recorded, clocks written inside each task.

`swarm_kill(stack, ...)` is `nemesis.process_faults.KillNemesis` over the stack's `SwarmTask`s (whose `kill`
goes through the node's engine and whose `start` awaits the replacement task Swarm starts instead of starting
the container again, which Swarm refuses); every completion that saw Swarm replace a task carries the
replacements (service, node, the old and new container, the task, seconds until it ran) under `swarm_tasks`,
so a history shows what Swarm did about each kill. Pause needs nothing of its own (`docker pause` on the node:
Swarm does nothing for minutes).

`swarm_clock(stack, inner)` is the `clock` or `server-clock` nemesis as the registry builds and draws it, each
target's offset file being the task's own (`lab.stack.swarm.TaskClock`: inside its container, written by
`docker exec` through its node's engine); every completion that moved or reset a clock carries, under
`swarm_clocks`, which node, task and container got which offset (and whether it is written yet: a paused task
takes it once resumed).
"""

from __future__ import annotations

import asyncio
from typing import Any

from lab.stack.errors import StackError
from nemesis import process_faults
from nemesis.core import NemesisUnavailable
from lab.testmap import Test

__all__ = ["SwarmClock", "SwarmKill", "swarm_clock", "swarm_kill"]


# Swarm's replacement answers 4-15 s after the kill here (scheduling, a new container, the server's start-up on
# a loaded machine): more than the 15 s a local restart is given would be a lost race, not a verdict
REPLACEMENT_TIMEOUT_S = 90.0


def swarm_kill(stack: Any, *, rng: Any) -> "SwarmKill":
    """The kill nemesis over a Swarm stack's tasks, recording Swarm's replacement tasks."""
    return SwarmKill(stack, process_faults.kill(process_faults.stack_targets(stack), rng=rng,
                                                restart_timeout_s=REPLACEMENT_TIMEOUT_S))


class SwarmKill:
    """`inner` (a KillNemesis) whose completions carry the replacement tasks the stack saw Swarm start."""

    def __init__(self, stack: Any, inner: Any):
        self.stack, self.inner = stack, inner

    @property
    def fs(self) -> frozenset[str]:
        return self.inner.fs

    def __getattr__(self, name: str) -> Any:  # the inner nemesis's other surface (schedules, windows)
        return getattr(self.inner, name)

    async def setup(self, test: Test) -> None:
        await self.inner.setup(test)

    async def invoke(self, test: Test, op: dict) -> dict:
        done = await self.inner.invoke(test, op)
        replaced = self.stack.replacements()
        if replaced and isinstance(done.get("value"), dict):
            done["value"] = {**done["value"], "swarm_tasks": replaced}
        return done

    async def teardown(self, test: Test) -> None:
        await self.inner.teardown(test)
        self.stack.replacements()  # a replacement awaited at teardown has no op to go into


def swarm_clock(stack: Any, inner: Any) -> "SwarmClock":
    """`inner` (a ClockNemesis over the stack's clock names) writing each offset inside its task's container."""
    clocks = stack.clocks()
    missing = sorted(set(inner.files) - set(clocks))
    if not clocks or missing:
        raise NemesisUnavailable("clock: the swarm stack was started without fake clocks (fake_clocks=True)")
    inner.files = {n: clocks[n] for n in inner.files}  # same names, each file inside its task
    return SwarmClock(inner)


class SwarmClock:
    """`inner` (a ClockNemesis) whose completions say where each offset went (`swarm_clocks`)."""

    FLUSH_S = 3.0  # a bump's record waits this long for its writes (a paused task's comes once it resumes)

    def __init__(self, inner: Any):
        self.inner = inner

    @property
    def fs(self) -> frozenset[str]:
        return self.inner.fs

    def __getattr__(self, name: str) -> Any:  # the inner nemesis's other surface
        return getattr(self.inner, name)

    async def setup(self, test: Test) -> None:
        """Every task's offset file must be there (the clock wrapper made it at +0): read each once."""
        for name, fc in self.inner.files.items():
            try:
                await asyncio.to_thread(fc.read)
            except StackError as e:
                raise NemesisUnavailable(f"clock: cannot read {name}'s offset file {fc.path} in its task: {e}") from e
        await self.inner.setup(test)

    async def invoke(self, test: Test, op: dict) -> dict:
        done = await self.inner.invoke(test, op)
        value = done.get("value")
        if isinstance(value, dict) and value.get("phase") in ("start", "end"):
            names = [n for n in (value.get("targets") or self.inner.files) if n in self.inner.files]
            records = await asyncio.to_thread(self._flush, names)
            done["value"] = {**value, "swarm_clocks": records}
        return done

    def _flush(self, names: list[str]) -> dict[str, Any]:
        return {n: self.inner.files[n].flush(self.FLUSH_S) for n in names}

    async def teardown(self, test: Test) -> None:
        try:
            await self.inner.teardown(test)
        finally:
            await asyncio.to_thread(self._close)

    def _close(self) -> None:
        for fc in self.inner.files.values():
            fc.close()
