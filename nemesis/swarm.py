"""The kill nemesis of a Swarm stack: `docker kill` through the task's node engine, Swarm's replacement recorded.

`swarm_kill(stack, ...)` is `nemesis.process_faults.KillNemesis` over the stack's `SwarmTask`s (whose `kill`
goes through the node's engine and whose `start` awaits the replacement task Swarm starts instead of starting
the container again, which Swarm refuses); every completion that saw Swarm replace a task carries the
replacements (service, node, the old and new container, the task, seconds until it ran) under `swarm_tasks`,
so a history shows what Swarm did about each kill. Pause needs nothing of its own (`docker pause` on the node:
Swarm does nothing for minutes).
"""

from __future__ import annotations

from typing import Any

from nemesis import process_faults
from lab.testmap import Test

__all__ = ["SwarmKill", "swarm_kill"]


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
