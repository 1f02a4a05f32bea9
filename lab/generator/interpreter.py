"""The interpreter: runs a generator against clients and a nemesis on asyncio, recording the history.

One worker task per logical thread (`concurrency` client threads, plus the
nemesis thread when there is a nemesis). The main loop, like Jepsen's
jepsen.generator.interpreter:

1. feeds every completion that has arrived back into the generator (`update`)
   and frees its thread, BEFORE asking for anything new, so the interpreter
   never invents concurrency;
2. asks the generator for an op; if its `time` is in the future it waits
   (asyncio) until then or until a completion arrives, whichever is first,
   and asks again;
3. records the invocation in the history, marks the thread busy, updates the
   generator with the invocation, and hands the op to the thread's worker.

Workers record completions as they happen. An `info` completion retires the
client process: the thread continues as process + concurrency with a freshly
opened client, and that process's first invocation records `reopened: true`
(a workload session may carry on across it: docs/history-format.md,
"Where a stale holder came from"). A sleep op's `mark` (an object) is
recorded on its thread's next invocation, so an unrecorded pause still says
where it was (a workload's stall: `mechanism: "stall"`). A client exception
becomes an `info` completion carrying the error (a crash). The run ends when
the generator is exhausted and no op is in flight.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from typing import Any

from lab.generator.context import NEMESIS_THREAD, Context
from lab.generator.core import PENDING, SPECIAL_TYPES, GeneratorError, _short, as_generator, op, update
from lab.history.ops import COMPLETION_TYPES, HistoryError
from lab.testmap import Test

__all__ = ["run"]

log = logging.getLogger("lab.generator")

_EXIT = object()
# Fields of a generated op that are not passed to HistoryWriter.invoke as extras.
_OP_FIELDS = frozenset({"type", "time", "process", "f", "value"})
_FORBIDDEN_IN_OPS = frozenset({"index", "error"})
_COMPLETION_OWN = frozenset({"index", "time", "type", "process", "f", "value", "error"})


async def _call(fn: Any, *args: Any) -> Any:
    """Call a protocol method that may be a coroutine function or a plain one."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _require_methods(what: str, obj: Any, names: tuple[str, ...], protocol: str) -> None:
    """Eagerly refuse a client or nemesis missing protocol methods."""
    missing = [n for n in names if not callable(getattr(obj, n, None))]
    if missing:
        raise TypeError(f"{what} {obj!r} lacks {', '.join(missing)}; see lab.generator.{protocol}")


async def run(
    test: Test,
    gen: Any,
    client_factory: Any,
    *,
    nemesis: Any = None,
    history_writer: Any,
    concurrency: int,
    seed: int = 0,
    lifecycle: bool = True,
    pending_poll: float = 0.01,
) -> None:
    """Run `gen` to exhaustion: `concurrency` client workers (plus the nemesis worker), history in
    `history_writer`. With `lifecycle`, clients are opened and set up per node (test.live.nodes) and the
    nemesis set up before the run, and torn down after it, even when the run fails."""
    _require_methods("client_factory", client_factory, ("open",), "Client")
    if nemesis is not None:
        _require_methods("nemesis", nemesis, ("invoke",), "Nemesis")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not pending_poll > 0:
        raise ValueError(f"pending_poll must be > 0 seconds, got {pending_poll!r}")
    for name in ("invoke", "complete", "now"):
        if not callable(getattr(history_writer, name, None)):
            raise TypeError(f"history_writer must be a lab.history.HistoryWriter (it lacks {name}())")

    nodes = list(test.live.nodes) or [None]
    setup_clients: list = []
    errors: list[BaseException] = []
    try:
        if lifecycle:
            for node in nodes:
                setup_clients.append(await _call(client_factory.open, test, node))
            for c in setup_clients:
                if callable(getattr(c, "setup", None)):
                    await _call(c.setup, test)
            if nemesis is not None and callable(getattr(nemesis, "setup", None)):
                replaced = await _call(nemesis.setup, test)
                nemesis = replaced if replaced is not None else nemesis
        await _Interpreter(
            test, gen, client_factory, nemesis, history_writer, concurrency, seed, nodes, pending_poll
        ).run()
    finally:
        if lifecycle:
            if nemesis is not None and callable(getattr(nemesis, "teardown", None)):
                await _quietly(errors, "nemesis teardown", nemesis.teardown, test)
            for c in setup_clients:
                if callable(getattr(c, "teardown", None)):
                    await _quietly(errors, "client teardown", c.teardown, test)
                if callable(getattr(c, "close", None)):
                    await _quietly(errors, "client close", c.close, test)
    if errors:
        raise errors[0]


async def _quietly(errors: list, what: str, fn: Any, *args: Any) -> None:
    """Run a cleanup step; log and remember a failure instead of skipping the other steps."""
    try:
        await _call(fn, *args)
    except Exception as e:  # cleanup must go on; the first error is re-raised by run()
        log.warning("%s failed: %s", what, e, exc_info=True)
        errors.append(e)


class _Interpreter:
    """The state of one run: context, generator, workers and the completion queue."""

    def __init__(self, test, gen, client_factory, nemesis, writer, concurrency, seed, nodes, pending_poll) -> None:
        self.test = test
        self.gen = as_generator(gen)
        self.client_factory = client_factory
        self.nemesis = nemesis
        self.nemesis_fs = frozenset(getattr(nemesis, "fs", None) or ()) if nemesis is not None else frozenset()
        self.writer = writer
        self.nodes = nodes
        self.pending_poll = pending_poll
        self.ctx = Context.initial(concurrency, nemesis=nemesis is not None, seed=seed, time=max(0, writer.now()))
        self.completions: collections.deque = collections.deque()
        self.wakeup = asyncio.Event()
        self.inboxes: dict[Any, asyncio.Queue] = {}
        self.failure: BaseException | None = None
        self.outstanding = 0
        self.marks: dict[Any, dict] = {}  # thread -> fields its next invocation records (a sleep's mark, reopened)

    # -- main loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Start the workers, drive the generator to exhaustion, stop the workers."""
        tasks = []
        for thread in self.ctx.all_threads():
            self.inboxes[thread] = asyncio.Queue()
            worker = self._nemesis_worker if thread == NEMESIS_THREAD else self._client_worker
            tasks.append(asyncio.create_task(worker(thread), name=f"worker {thread}"))
        try:
            await self._loop()
        except BaseException:
            await _cancel_all(tasks)
            raise
        for q in self.inboxes.values():
            q.put_nowait(_EXIT)
        await asyncio.gather(*tasks)

    async def _loop(self) -> None:
        """Jepsen's interpreter loop: completions first, then the next op, then wait."""
        while True:
            self._drain()
            if self.ctx.free_thread_count() == 0:
                await self._wait(None)
                continue
            now = self.writer.now()
            ctx = self.ctx.with_time(max(now, self.ctx.time))
            result = self._ask(ctx)
            if result is None:
                if self.outstanding == 0:
                    return
                await self._wait(None)
            elif result is PENDING:
                await self._wait(self.pending_poll)
            else:
                o, nxt = result
                t = o.get("time")
                if isinstance(t, int) and not isinstance(t, bool) and t > ctx.time:
                    await self._wait((t - ctx.time) / 1e9)
                    continue
                self._dispatch(ctx, o, nxt)

    def _ask(self, ctx: Context):
        """Ask the generator for an op, turning its exceptions into a GeneratorError with context."""
        try:
            return op(self.gen, self.test, ctx)
        except GeneratorError:
            raise
        except Exception as e:
            raise GeneratorError(
                f"generator raised {type(e).__name__}: {e} when asked for an op\n  generator: {_short.repr(self.gen)}\n"
                f"  context: {ctx!r}"
            ) from e

    def _update(self, ctx: Context, gen: Any, event: dict) -> Any:
        """Update the generator, turning its exceptions into a GeneratorError with the event."""
        try:
            return update(gen, self.test, ctx, event)
        except Exception as e:
            raise GeneratorError(
                f"generator raised {type(e).__name__}: {e} when updated with {event!r}\n"
                f"  generator: {_short.repr(gen)}"
            ) from e

    def _drain(self) -> None:
        """Feed every arrived completion into the context and the generator."""
        if self.failure is not None:
            raise self.failure
        while self.completions:
            thread, event = self.completions.popleft()
            ctx = self.ctx.freed(max(event["time"], self.ctx.time), thread)
            if event["type"] == "info" and thread != NEMESIS_THREAD:
                ctx = ctx.with_next_process(thread)
                self.marks.setdefault(thread, {})["reopened"] = True  # its next process opens a fresh client
            self.ctx = ctx
            self.gen = self._update(ctx, self.gen, event)
            self.outstanding -= 1

    async def _wait(self, timeout: float | None) -> None:
        """Sleep until a completion arrives or `timeout` seconds pass."""
        if self.completions or self.failure is not None:
            return
        self.wakeup.clear()
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for swallows a Ctrl-C that lands as a completion wakes it
            async with asyncio.timeout(timeout):
                await self.wakeup.wait()
        except TimeoutError:
            pass

    def _dispatch(self, ctx: Context, o: dict, nxt: Any) -> None:
        """Record the invocation, mark its thread busy, update the generator, hand the op to the worker."""
        thread = self._check(ctx, o, nxt)
        if o["type"] in SPECIAL_TYPES:
            rec = {**o, "time": max(self.writer.now(), ctx.time)}
            if isinstance(o.get("mark"), dict):
                self.marks.setdefault(thread, {}).update(o["mark"])
        else:
            extra = {k: v for k, v in o.items() if k not in _OP_FIELDS}
            if thread in self.marks:
                extra = {**self.marks.pop(thread), **extra}
            rec = self.writer.invoke(o["process"], o["f"], o["value"], **extra)
        self.ctx = ctx.busy(rec["time"], thread)
        self.gen = self._update(self.ctx, nxt, rec)
        self.outstanding += 1
        self.inboxes[thread].put_nowait(rec)

    def _check(self, ctx: Context, o: Any, nxt: Any) -> Any:
        """Jepsen's validate: the generator must emit well-formed ops for free processes."""
        problems = []
        if not isinstance(o, dict):
            raise GeneratorError(f"generator emitted {o!r}, not an op dict\n  generator: {_short.repr(self.gen)}")
        type_, process = o.get("type"), o.get("process")
        thread = ctx.thread_of(process)
        if type_ not in ("invoke", "info", "sleep", "log"):
            problems.append(f"type must be invoke, info, sleep or log, got {type_!r}")
        t = o.get("time")
        if isinstance(t, bool) or not isinstance(t, int):
            problems.append(f"time must be an int (ns since the test started), got {t!r}")
        if thread is None or thread not in self.inboxes:
            why = " (run() was given no nemesis)" if process == NEMESIS_THREAD else ""
            problems.append(f"process {process!r} belongs to no thread of this run{why}")
        elif ctx.process_of(thread) != process:
            running = ctx.process_of(thread)
            problems.append(f"process {process!r} is not running (thread {thread} runs process {running!r})")
        elif not ctx.is_free(thread):
            problems.append(f"process {process!r} is busy with another operation")
        if type_ in ("invoke", "info"):
            if not isinstance(o.get("f"), str) or not o.get("f"):
                problems.append(f"f must be a non-empty string, got {o.get('f')!r}")
            if type_ == "info" and process != NEMESIS_THREAD:
                problems.append("client ops are invoked with type invoke (info is the nemesis's)")
            if process == NEMESIS_THREAD and self.nemesis_fs and o.get("f") not in self.nemesis_fs:
                problems.append(f"the nemesis handles f in {sorted(self.nemesis_fs)}, not {o.get('f')!r}")
        clash = _FORBIDDEN_IN_OPS.intersection(o)
        if clash:
            problems.append(f"generated ops may not set {', '.join(sorted(clash))}")
        if problems:
            raise GeneratorError(
                "generator emitted an invalid op " + _short.repr(o) + ":\n  - " + "\n  - ".join(problems)
                + f"\n  generator: {_short.repr(self.gen)}\n  context: {ctx!r}"
            )
        return thread

    # -- workers ----------------------------------------------------------------------------

    def _complete(self, thread: Any, event: dict) -> None:
        """Hand a completion (or a finished sleep/log) back to the main loop."""
        self.completions.append((thread, event))
        self.wakeup.set()

    async def _special(self, thread: Any, o: dict) -> None:
        """Perform a sleep or log op (not recorded in the history)."""
        if o["type"] == "sleep":
            await asyncio.sleep(float(o["value"]))
        else:
            log.info("%s", o["value"])
        self._complete(thread, {**o, "time": self.writer.now()})

    def _record(self, invocation: dict, completion: Any, *, nemesis: bool) -> dict:
        """Record a client's (or the nemesis's) completion, repairing invalid ones into info ops."""
        type_, value, error, extra = _normalize(invocation, completion)
        if nemesis and type_ != "info":
            type_ = "info"
        try:
            return self.writer.complete(invocation, type_, value, error, **extra)
        except HistoryError as e:
            bad = {"code": "invalid_completion", "msg": f"the completion could not be recorded: {e}"}
            return self.writer.complete(invocation, "info", None, bad)

    async def _client_worker(self, thread: Any) -> None:
        """One client thread: opens a client per process, invokes ops, records completions."""
        node = self.nodes[thread % len(self.nodes)]
        client, client_process = None, None
        inbox = self.inboxes[thread]
        try:
            while True:
                o = await inbox.get()
                if o is _EXIT:
                    return
                if o["type"] in SPECIAL_TYPES:
                    await self._special(thread, o)
                    continue
                if client is None or client_process != o["process"]:
                    if client is not None:
                        await _close(client, self.test)
                        client = None
                    try:
                        client = await _call(self.client_factory.open, self.test, node)
                        client_process = o["process"]
                    except Exception as e:
                        log.warning("opening a client for process %s failed: %s", o["process"], e)
                        err = {"code": "no_client", "msg": f"{type(e).__name__}: {e}"}
                        self._complete(thread, self.writer.complete(o, "fail", o["value"], err))
                        continue
                try:
                    completion = await _call(client.invoke, self.test, dict(o))
                except Exception as e:
                    log.warning("process %s crashed on %s: %s", o["process"], o["f"], e)
                    completion = {"type": "info", "error": {"code": "crash", "msg": f"{type(e).__name__}: {e}"}}
                self._complete(thread, self._record(o, completion, nemesis=False))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a broken writer, say: stop the run instead of hanging it
            self.failure = e
            self.wakeup.set()
        finally:
            if client is not None:
                await _close(client, self.test)

    async def _nemesis_worker(self, thread: Any) -> None:
        """The nemesis thread: invokes the nemesis; its completions are info ops."""
        inbox = self.inboxes[thread]
        try:
            while True:
                o = await inbox.get()
                if o is _EXIT:
                    return
                if o["type"] in SPECIAL_TYPES:
                    await self._special(thread, o)
                    continue
                try:
                    completion = await _call(self.nemesis.invoke, self.test, dict(o))
                except Exception as e:
                    log.warning("nemesis crashed on %s: %s", o["f"], e)
                    completion = {"type": "info", "error": {"code": "crash", "msg": f"{type(e).__name__}: {e}"}}
                self._complete(thread, self._record(o, completion, nemesis=True))
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self.failure = e
            self.wakeup.set()


async def _cancel_all(tasks: list[asyncio.Task], every_s: float = 2.0) -> None:
    """Cancel the workers and wait for them, cancelling again any still running every `every_s` seconds: on
    3.11 under load a worker was seen to lose its cancellation and wait on its inbox again, which hung Ctrl-C
    (4 runs in 25, tests/test_cli_safety.py)."""
    for t in tasks:
        t.cancel()
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=every_s)
        for t in pending:
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)  # all done: retrieves their exceptions, as before


async def _close(client: Any, test: Test) -> None:
    """Close a worker's client, logging (not raising) a failure."""
    if callable(getattr(client, "close", None)):
        try:
            await _call(client.close, test)
        except Exception as e:  # a failing close must not stop the worker
            log.warning("closing a client failed: %s", e)


def _normalize(invocation: dict, completion: Any) -> tuple[str, Any, Any, dict]:
    """(type, value, error, extra) from what a client returned; anything invalid becomes info."""
    def invalid(why: str):
        return "info", None, {"code": "invalid_completion", "msg": why}, {}

    if not isinstance(completion, dict):
        return invalid(f"the client returned {_short.repr(completion)}, not a completion dict")
    type_ = completion.get("type")
    if type_ not in COMPLETION_TYPES:
        return invalid(f"completion type must be ok, fail or info, got {type_!r}")
    for k in ("process", "f"):
        if k in completion and completion[k] != invocation[k]:
            return invalid(f"completion {k}={completion[k]!r} does not match the invocation's {invocation[k]!r}")
    value = completion["value"] if "value" in completion else invocation["value"]
    extra = {k: v for k, v in completion.items() if k not in _COMPLETION_OWN and invocation.get(k, _MISSING) != v}
    return type_, value, completion.get("error"), extra


_MISSING = object()
