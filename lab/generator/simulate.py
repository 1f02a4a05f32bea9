"""A deterministic, instant simulation of the interpreter, for testing generators.

`simulate(gen)` runs a generator against imaginary clients in simulated time
(no asyncio, no sleeping): each invocation completes `latency` ns later with
whatever `complete(op)` says (default: ok with the invocation's value). It
follows the interpreter's rules exactly (completions are fed back before new
ops are asked for; scheduled times are honoured; an `info` retires the process)
and returns the history it would have recorded, so combinators can be tested
op by op. Jepsen's jepsen.generator.test plays the same role.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from lab.generator.context import NEMESIS_THREAD, Context
from lab.generator.core import PENDING, SPECIAL_TYPES, GeneratorError, as_generator, op, secs_to_nanos, update
from lab.testmap import Test

__all__ = ["simulate"]


def _default_complete(o: dict) -> dict:
    """Every op succeeds and returns its own value."""
    return {"type": "ok", "value": o["value"]}


def simulate(
    gen: Any,
    *,
    concurrency: int = 2,
    nemesis: bool = False,
    seed: int = 0,
    latency: int | Callable[[dict], int] = 0,
    complete: Callable[[dict], dict] = _default_complete,
    test: Test | None = None,
    max_ops: int = 100_000,
) -> list[dict]:
    """The history (invocations and completions, with index and simulated time) of running gen."""
    ctx = Context.initial(concurrency, nemesis=nemesis, seed=seed)
    gen = as_generator(gen)
    history: list[dict] = []
    in_flight: list = []  # heap of (completion time, sequence, thread, invocation)
    counter = 0
    invocations = 0
    latency_of = latency if callable(latency) else (lambda _o: latency)
    marks: dict[Any, dict] = {}  # thread -> fields its next invocation records (as the interpreter's)

    def record(o: dict) -> dict:
        """Append an op in the writer's field order (index, time, type, process, f, value, extras)."""
        rec = {"index": len(history), "time": o["time"], "type": o["type"], "process": o["process"], "f": o["f"],
               "value": o["value"]}  # fmt: skip
        rec.update((k, v) for k, v in o.items() if k not in rec)
        history.append(rec)
        return rec

    def finish_next() -> None:
        nonlocal ctx, gen
        t, _, thread, inv = heapq.heappop(in_flight)
        t = max(t, ctx.time)
        if inv["type"] in SPECIAL_TYPES:
            event = {**inv, "time": t}
        else:
            c = complete(inv) if inv["process"] != NEMESIS_THREAD else {"type": "info", "value": inv["value"]}
            fields = {"type": c["type"], "process": inv["process"], "time": t, "f": inv["f"],
                      "value": c.get("value", inv["value"])}  # fmt: skip
            fields.update({k: inv[k] for k in ("key", "node") if k in inv})  # carried, as HistoryWriter does
            fields.update({k: v for k, v in c.items() if k not in fields})
            event = record(fields)
        ctx = ctx.freed(t, thread)
        if event["type"] == "info" and thread != NEMESIS_THREAD:
            ctx = ctx.with_next_process(thread)
            marks.setdefault(thread, {})["reopened"] = True
        gen = update(gen, test, ctx, event)

    while True:
        result = op(gen, test, ctx) if ctx.free_thread_count() else PENDING
        if result is None or result is PENDING:
            if in_flight:
                finish_next()
                continue
            if result is None:
                return history
            raise GeneratorError("the generator is PENDING with no operation in flight: it would wait forever")
        o, nxt = result
        if in_flight and in_flight[0][0] <= o["time"]:
            finish_next()  # that completion happens first; the generator must be asked again
            continue
        invocations += 1
        if invocations > max_ops:
            raise GeneratorError(
                f"the generator emitted more than {max_ops} ops; bound it with limit() or time_limit()"
            )
        t = max(o["time"], ctx.time)
        thread = ctx.thread_of(o["process"])
        if thread is None or not ctx.is_free(thread):
            raise GeneratorError(f"generator emitted {o!r} for a process that is not free")
        if o["type"] in SPECIAL_TYPES:
            rec = {**o, "time": t}
            done = t + (secs_to_nanos(o["value"]) if o["type"] == "sleep" else 0)
            if isinstance(o.get("mark"), dict):
                marks.setdefault(thread, {}).update(o["mark"])
        else:
            rec = record({**marks.pop(thread, {}), **o, "time": t})
            done = t + int(latency_of(rec))
        ctx = ctx.busy(t, thread)
        gen = update(nxt, test, ctx, rec)
        counter += 1
        heapq.heappush(in_flight, (done, counter, thread, rec))
