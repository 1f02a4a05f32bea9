"""HistoryWriter: append the op record to `history.jsonl` as the run goes.

One JSON object per line. The writer assigns `index` densely and `time`
(ns since the test started, from `time.monotonic_ns()`) under one lock, so lines
are in index order and times never decrease, whether the caller is an asyncio
worker or a nemesis thread. Every method is synchronous and short (no awaits,
no syscall on the hot path), so calling it from the event loop is fine.

Durability: by default (`flush="batched"`) each op is serialized at once (so a
bad op is refused to its caller, without consuming an index) and its line
appended to an in-memory batch; a background thread hands the batch to the OS
with one `os.write` every `flush_interval` seconds (0.2 s), and at once when the
batch passes 1 MiB. A SIGKILLed lab therefore keeps every line older than about
`flush_interval` (tests/test_history_durability.py holds it to 1 s), and a kill
during a write leaves at most a torn last line, which readers skip and report.
`flush="each"` writes every line with its own `os.write` instead (nothing is
ever buffered; about 1 us more per record). `flush()` writes the batch now;
`close()` writes it and fsyncs. A write that fails (disk full) is raised by the
next call of the writer, the unwritten lines kept in the batch.

Cost (bench/recording_overhead.py, A; docs/performance.md "Recording"): about
1.8 us of CPU per op (an invocation and its completion: the lock, a few type
checks, orjson, the batch, the flush thread's write), against about 13 us per
op with `json.dumps`, `validate_op` and a flush per line.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import orjson

from lab.history.ops import COMPLETION_TYPES, NEMESIS, HistoryError, validate_op

__all__ = ["HistoryWriter"]

# Fields the writer owns; `extra` may not set them.
_RESERVED = frozenset({"index", "time", "type", "process", "f", "value", "error"})
# A batch this big wakes the flush thread to write it at once instead of at its next tick.
_BATCH_BYTES = 1 << 20
# orjson serializes dataclasses and datetimes on its own; json never did: pass them through to the
# (absent) default so they stay refused as not JSON-serializable, as before.
_ORJSON_OPTS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


class _Sink:
    """The file descriptor and the batch of lines not yet written; shared with the flush thread and the
    finalizer, which must not keep the writer alive."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self.pid = os.getpid()  # a forked child inherits the batch: only this process may write it
        self.lock = threading.Lock()  # guards `batch` (held briefly by every recording call)
        self.io_lock = threading.Lock()  # serializes writes to fd, so batches reach the file in order
        # One bytearray, not a list of lines: keeping orjson's bytes objects alive costs about 2 us each
        # in allocator churn; appending them to a bytearray frees them at once.
        self.batch = bytearray()
        self.error: OSError | None = None
        self.closed = False
        self.broken = False  # closed or error: the one flag the hot path reads
        self.wake = threading.Event()  # set to have the flush thread write now (a big batch, or stopping)
        self.woken = False  # `wake` was set for the current batch (under `lock`)
        self.stopping = False
        self.wakeups = 0  # how many times the flush thread woke (a tick or a wake), for the recording bench
        self.flush_cpu_s = 0.0  # the flush thread's CPU time over its life (set when it ends)

    def write_out(self) -> None:
        """Write the batch to the file (in order, whole); a failure is kept in `error` with the lines unwritten."""
        with self.io_lock:
            with self.lock:
                if not self.batch or self.fd < 0:
                    return
                batch, self.batch = self.batch, bytearray()
                self.woken = False
            data = memoryview(batch)
            try:
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError as e:
                with self.lock:  # put what was not written back in front of what came since
                    self.batch[:0] = data
                    self.error = e
                    self.broken = True

    def flush_periodically(self, interval: float) -> None:
        """Background thread: write the batch every `interval` seconds (or when woken) until stopped."""
        try:
            while not self.stopping:
                self.wake.wait(interval)
                self.wake.clear()
                self.wakeups += 1
                self.write_out()
        finally:
            self.flush_cpu_s = time.thread_time()  # this thread's CPU, its waking up included

    def wake_once(self) -> None:
        """A big batch (under `lock`): have the flush thread write it now; once per batch, as set() costs about
        1 us and the flush thread may take a few ms to get the GIL."""
        if not self.woken:
            self.woken = True
            self.wake.set()

    def stop(self) -> None:
        """Have the flush thread finish."""
        self.stopping = True
        self.wake.set()

    def close(self, fsync: bool = True) -> None:
        """Write the batch, fsync and close the file. Idempotent."""
        self.write_out()
        with self.io_lock:
            if self.fd < 0:
                return
            fd, self.fd = self.fd, -1
            try:
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)


def _finalize(sink: _Sink) -> None:
    """A writer dropped (or the interpreter exiting) without close(): its lines are still written."""
    if os.getpid() != sink.pid:  # a forked child exiting: the parent owns these lines
        return
    sink.stop()
    try:
        sink.close(fsync=False)
    except OSError:  # nowhere left to report it
        pass


class HistoryWriter:
    """Appends ops to a JSONL history file; assigns `index` and `time`; thread-safe."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        start_ns: int | None = None,
        keep: bool = False,
        flush: str = "batched",
        flush_interval: float = 0.2,
        overwrite: bool = False,
        validate: bool = True,
    ) -> None:
        if flush not in ("batched", "each"):
            raise ValueError(f"flush must be 'batched' or 'each', got {flush!r}")
        if not flush_interval > 0:
            raise ValueError(f"flush_interval must be > 0 seconds, got {flush_interval!r}")
        self.path = Path(path)
        self.start_ns = time.monotonic_ns() if start_ns is None else int(start_ns)
        self._keep = keep
        self.ops: list[dict] = []
        self._validate = validate
        # The value types whose ops skip the NaN scan: none when ops are not checked (then key, node, process or f
        # may be a float).
        self._scalars = _SCALARS if validate else frozenset()
        self._each = flush == "each"
        self._plain = not self._each and not keep  # the hot path's one test for the default policy
        self._index = 0
        self._last_time = 0
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        try:
            fd = os.open(self.path, flags, 0o666)
        except FileExistsError:
            raise HistoryError(
                f"{self.path}: a history already exists there (pass overwrite=True to replace it)"
            ) from None
        self._sink = _Sink(fd, self.path)
        self._lock = self._sink.lock
        self._flusher: threading.Thread | None = None
        self._finalizer = weakref.finalize(self, _finalize, self._sink)
        if not self._each:
            self._flusher = threading.Thread(
                target=self._sink.flush_periodically,
                args=(flush_interval,),
                name=f"history-flush:{self.path.name}",
                daemon=True,
            )
            self._flusher.start()

    # -- public API ---------------------------------------------------------------------------

    def now(self) -> int:
        """Nanoseconds since the test started, on the writer's clock."""
        return _monotonic_ns() - self.start_ns

    @property
    def keep(self) -> bool:
        """Are the ops kept in `ops` (fixed at construction)?"""
        return self._keep

    @property
    def flush_thread_stats(self) -> tuple[int, float]:
        """(wake-ups, CPU seconds) of the flush thread, once close() has stopped it; (0, 0.0) with flush="each"."""
        return self._sink.wakeups, self._sink.flush_cpu_s

    @property
    def count(self) -> int:
        """How many ops have been written."""
        return self._index

    def invoke(self, process: int | str, f: str, value: Any, **extra: Any) -> dict:
        """Record an invocation (for the nemesis: an `info` op, Jepsen's convention); return the op."""
        # The hot path, spelled out here and in complete() (the same steps: a shared frame would cost about 0.1 us
        # per record): under the lock (so lines are in index order, whatever thread calls), build the op with
        # the next index and the current time, check it, serialize it, add the line to the batch.
        if extra:
            _check_extra(extra)
        lock = self._lock
        # A lock, not the GIL alone: taking the index and the time and appending the line must be one step for
        # every thread, and a thread switch may fall between any two bytecodes. acquire/release: 50 ns less than with.
        lock.acquire()
        try:
            sink = self._sink
            if sink.broken:
                self._check_open()
            t = _monotonic_ns() - self.start_ns
            if t < self._last_time and t >= 0:  # only after append() was given a time ahead of the clock
                t = self._last_time
            index = self._index
            op = {"index": index, "time": t,
                  "type": "info" if type(process) is not int and process == NEMESIS else "invoke",
                  "process": process, "f": f, "value": value}
            if extra:
                op.update(extra)
            # The common valid op passes these few type checks, the subset of validate_op's rules that the
            # fields the caller chose can break; anything else gets validate_op's verdict and message
            # (tests/test_history.py::test_writer_refuses_exactly_what_validate_op_refuses).
            if self._validate and not (
                t >= 0
                and ((type(process) is int and process >= 0) or process == NEMESIS)
                and type(f) is str
                and f
                and (not extra or _keyed_ok(op))
            ):
                validate_op(op, f"{self.path}: op {index}")
            try:
                line = _dumps(op, option=_ORJSON_OPTS)
            except TypeError:
                line = _json_line(op, self.path)
            else:
                # orjson writes NaN and Infinity as null: refuse them as json does. Only a float can be one, so a
                # checked op with a scalar value and no extras skips the scan (about 0.1 us; find: faster than `in`).
                if (extra or type(value) not in self._scalars) and line.find(b"null") >= 0 and _has_nonfinite(op):
                    line = _json_line(op, self.path)
            if self._plain:  # batched, keeping no ops (the default): add the line to the batch
                batch = sink.batch
                batch += line
                if len(batch) > _BATCH_BYTES:
                    sink.wake_once()
                self._index = index + 1
                self._last_time = t
                return op
            return self._record(op, line)
        finally:
            lock.release()

    def complete(self, invoke_op: dict, type: str, value: Any, error: Any = None, **extra: Any) -> dict:
        """Record the completion (`ok`, `fail` or `info`) of `invoke_op`; return the op."""
        # The same steps as invoke()'s, for a completion.
        if type not in COMPLETION_TYPES:
            raise HistoryError(f"completion type must be ok, fail or info; got {type!r}")
        if extra:
            _check_extra(extra)
        process, f = invoke_op["process"], invoke_op["f"]
        lock = self._lock
        lock.acquire()
        try:
            sink = self._sink
            if sink.broken:
                self._check_open()
            t = _monotonic_ns() - self.start_ns
            if t < self._last_time and t >= 0:
                t = self._last_time
            index = self._index
            op = {"index": index, "time": t, "type": type, "process": process, "f": f, "value": value}
            if error is not None:
                op["error"] = error
            keyed = False
            if "key" in invoke_op:  # key and node carry over from the invocation (extra may override them)
                op["key"] = invoke_op["key"]
                keyed = True
            if "node" in invoke_op:
                op["node"] = invoke_op["node"]
                keyed = True
            if extra:
                op.update(extra)
                keyed = True
            if self._validate and not (  # as in invoke(), and the error
                t >= 0
                and (_type(process) is int and process >= 0 or process == NEMESIS)
                and _type(f) is str
                and f
                and (error is None or _type(error) is str or _type(error) is dict)
                and (not keyed or _keyed_ok(op))
            ):
                validate_op(op, f"{self.path}: op {index}")
            try:
                line = _dumps(op, option=_ORJSON_OPTS)
            except TypeError:
                line = _json_line(op, self.path)
            else:
                if ((extra or _type(value) not in self._scalars or (error is not None and _type(error) is not str))
                        and line.find(b"null") >= 0 and _has_nonfinite(op)):
                    line = _json_line(op, self.path)
            if self._plain:
                batch = sink.batch
                batch += line
                if len(batch) > _BATCH_BYTES:
                    sink.wake_once()
                self._index = index + 1
                self._last_time = t
                return op
            return self._record(op, line)
        finally:
            lock.release()

    def append(self, op: dict) -> dict:
        """Record a prepared op: `index` is always assigned; `time` is assigned when absent."""
        with self._lock:
            self._check_open()
            t = op.get("time")
            if t is None:
                t = _monotonic_ns() - self.start_ns
                if 0 <= t < self._last_time:
                    t = self._last_time
            elif t < self._last_time:
                raise HistoryError(f"{self.path}: op time {t} is before the previous op's time {self._last_time}")
            out = {"index": self._index, "time": t}
            out.update((k, v) for k, v in op.items() if k not in ("index", "time"))
            return self._emit(out)

    def flush(self) -> None:
        """Hand buffered lines to the OS now."""
        self._sink.write_out()
        self._raise_write_error()

    def close(self) -> None:
        """Write what is buffered, fsync and close the file; stop the flush thread. Idempotent."""
        self._sink.stop()
        if self._flusher is not None:
            self._flusher.join()
        with self._lock:
            already = self._sink.closed
            self._sink.closed = self._sink.broken = True
        if already:
            return
        self._finalizer.detach()
        try:
            self._sink.close()
        except OSError as e:  # fsync or close failed: after a failed write, that one is the news
            self._raise_write_error()
            raise HistoryError(f"{self.path}: closing the history failed: {e}") from None
        self._raise_write_error()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HistoryWriter({str(self.path)!r}, ops={self._index})"

    # -- internals ----------------------------------------------------------------------------

    def _emit(self, op: dict) -> dict:
        """Record a prepared op (append's path): validate, serialize, then write it or add it to the batch."""
        if self._validate:
            validate_op(op, f"{self.path}: op {op['index']}")
        return self._record(op)

    def _record(self, op: dict, line: bytes | None = None) -> dict:
        """A valid op, under the lock: serialize it (unless its line is given), then write it or add it to the
        batch; the next index. (append's path, and invoke's and complete's with flush="each" or keep.)"""
        if line is None:
            try:
                line = _dumps(op, option=_ORJSON_OPTS)
            except TypeError:
                line = _json_line(op, self.path)
            else:
                if line.find(b"null") >= 0 and _has_nonfinite(op):  # orjson writes NaN and Infinity as null
                    line = _json_line(op, self.path)
        if self._each:
            self._write_line(line, op["index"])
        else:
            self._sink.batch += line
            if len(self._sink.batch) > _BATCH_BYTES:
                self._sink.wake_once()
        self._index += 1
        self._last_time = op["time"]
        if self._keep:
            self.ops.append(op)
        return op

    def _write_line(self, line: bytes, index: int) -> None:
        """flush="each": hand one line to the OS now (under the lock)."""
        data = memoryview(line)
        try:
            while data:
                data = data[os.write(self._sink.fd, data):]
        except OSError as e:  # a part of the line may be out: nothing may follow it
            self._sink.error = e
            self._sink.broken = True
            raise HistoryError(f"{self.path}: writing op {index} failed: {e}") from None

    def _check_open(self) -> None:
        """Refuse to record on a closed writer or after a write failed (held under the lock)."""
        if self._sink.closed:
            raise HistoryError(f"{self.path}: the history writer is closed")
        if self._sink.error is not None:
            raise HistoryError(f"{self.path}: writing the history failed: {self._sink.error}")

    def _raise_write_error(self) -> None:
        """Report a failed write (the lines it could not write are still in the batch)."""
        if self._sink.error is not None:
            raise HistoryError(f"{self.path}: writing the history failed: {self._sink.error}")


_dumps = orjson.dumps
_type = type  # complete()'s `type` argument shadows the builtin
# Values that cannot hold a float (so no NaN or Infinity); key and node, when the fast checks pass, are str or int.
_SCALARS = frozenset({int, str, bool, type(None)})
_monotonic_ns = time.monotonic_ns


def _json_line(op: dict, path: Path) -> bytes:
    """One JSON line with json, the reference, for what orjson refuses or would silently change:
    non-string keys, ints beyond 64 bits, NaN and Infinity (orjson writes null), lone surrogates."""
    try:
        return (json.dumps(op, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n").encode()
    except (TypeError, ValueError) as e:  # UnicodeEncodeError (a lone surrogate) is a ValueError
        raise HistoryError(f"{path}: op {op['index']} is not JSON-serializable ({e}): {op!r}") from None


def _has_nonfinite(x: Any) -> bool:
    """Does `x` hold a NaN or an infinity anywhere? (Only asked of lines where orjson wrote a null.)"""
    if isinstance(x, float):
        return not math.isfinite(x)
    if isinstance(x, dict):
        return any(_has_nonfinite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_nonfinite(v) for v in x)
    return False


def _keyed_ok(op: dict) -> bool:
    """The fast check of an op's key and node (validate_op says what is wrong with them)."""
    return (type(k := op.get("key", "")) is str or type(k) is int) and ((n := op.get("node")) is None or type(n) is str)


def _check_extra(extra: dict) -> None:
    """Refuse extra fields that would overwrite the record's own fields."""
    if not _RESERVED.isdisjoint(extra):  # isdisjoint: no set built in the common case
        clash = ", ".join(sorted(_RESERVED.intersection(extra)))
        raise HistoryError(f"extra fields may not set {clash}; pass them as arguments")
