"""HistoryWriter: append the op record to `history.jsonl` as the run goes.

One JSON object per line. The writer assigns `index` densely and `time`
(ns since the test started, from `time.monotonic_ns()`) under one lock, so lines
are in index order and times never decrease, whether the caller is an asyncio
worker or a nemesis thread. Every method is synchronous and short (no awaits,
no fsync on the hot path), so calling it from the event loop is fine.

Durability: by default (`flush="each"`) every line is handed to the OS as it
is written, so a crash of the lab process (SIGKILL) loses at most the line
being written (a torn last line, which readers skip and report). Measured cost:
about 1.2 us per op (165k ops/s against 209k ops/s batched, 200k lease ops),
far below the cost of any real operation, and no timer thread to manage.
`flush="batched"` buffers and lets a background timer flush every
`flush_interval` seconds (0.1 s) instead, for very large synthetic runs.
`close()` flushes and fsyncs either way.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from lab.history.ops import COMPLETION_TYPES, NEMESIS, HistoryError, validate_op

__all__ = ["HistoryWriter"]

# Fields the writer owns; `extra` may not set them.
_RESERVED = frozenset({"index", "time", "type", "process", "f", "value", "error"})
# Fields copied from an invocation onto its completion when the completion does not set them.
_CARRIED = ("key", "node")


class HistoryWriter:
    """Appends ops to a JSONL history file; assigns `index` and `time`; thread-safe."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        start_ns: int | None = None,
        keep: bool = False,
        flush: str = "each",
        flush_interval: float = 0.1,
        overwrite: bool = False,
        validate: bool = True,
    ) -> None:
        if flush not in ("batched", "each"):
            raise ValueError(f"flush must be 'batched' or 'each', got {flush!r}")
        if not flush_interval > 0:
            raise ValueError(f"flush_interval must be > 0 seconds, got {flush_interval!r}")
        self.path = Path(path)
        self.start_ns = time.monotonic_ns() if start_ns is None else int(start_ns)
        self.keep = keep
        self.ops: list[dict] = []
        self._validate = validate
        self._each = flush == "each"
        self._lock = threading.Lock()
        self._index = 0
        self._last_time = 0
        self._dirty = False
        self._closed = False
        try:
            self._file = open(self.path, "w" if overwrite else "x", encoding="utf-8")
        except FileExistsError:
            raise HistoryError(
                f"{self.path}: a history already exists there (pass overwrite=True to replace it)"
            ) from None
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if not self._each:
            self._flusher = threading.Thread(
                target=self._flush_periodically,
                args=(flush_interval,),
                name=f"history-flush:{self.path.name}",
                daemon=True,
            )
            self._flusher.start()

    # -- public API ---------------------------------------------------------------------------

    def now(self) -> int:
        """Nanoseconds since the test started, on the writer's clock."""
        return time.monotonic_ns() - self.start_ns

    @property
    def count(self) -> int:
        """How many ops have been written."""
        return self._index

    def invoke(self, process: int | str, f: str, value: Any, **extra: Any) -> dict:
        """Record an invocation (for the nemesis: an `info` op, Jepsen's convention); return the op."""
        _check_extra(extra)
        op = {"type": "info" if process == NEMESIS else "invoke", "process": process, "f": f, "value": value}
        op.update(extra)
        return self._write(op)

    def complete(self, invoke_op: dict, type: str, value: Any, error: Any = None, **extra: Any) -> dict:
        """Record the completion (`ok`, `fail` or `info`) of `invoke_op`; return the op."""
        if type not in COMPLETION_TYPES:
            raise HistoryError(f"completion type must be ok, fail or info; got {type!r}")
        _check_extra(extra)
        op = {"type": type, "process": invoke_op["process"], "f": invoke_op["f"], "value": value}
        if error is not None:
            op["error"] = error
        for k in _CARRIED:
            if k in invoke_op and k not in extra:
                op[k] = invoke_op[k]
        op.update(extra)
        return self._write(op)

    def append(self, op: dict) -> dict:
        """Record a prepared op: `index` is always assigned; `time` is assigned when absent."""
        op = {k: v for k, v in op.items() if k != "index"}
        return self._write(op)

    def flush(self) -> None:
        """Hand buffered lines to the OS now."""
        with self._lock:
            if not self._closed:
                self._file.flush()
                self._dirty = False

    def close(self) -> None:
        """Flush, fsync and close the file; stop the flush timer. Idempotent."""
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HistoryWriter({str(self.path)!r}, ops={self._index})"

    # -- internals ----------------------------------------------------------------------------

    def _write(self, fields: dict) -> dict:
        """Assign index and time, serialize, and write one line under the lock."""
        with self._lock:
            if self._closed:
                raise HistoryError(f"{self.path}: the history writer is closed")
            t = fields.get("time")
            if t is None:
                t = time.monotonic_ns() - self.start_ns
            elif t < self._last_time:
                raise HistoryError(f"{self.path}: op time {t} is before the previous op's time {self._last_time}")
            op = {"index": self._index, "time": t}
            op.update(fields)
            if self._validate:
                validate_op(op, f"{self.path}: op {self._index}")
            try:
                line = json.dumps(op, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as e:
                raise HistoryError(f"{self.path}: op {self._index} is not JSON-serializable ({e}): {op!r}") from None
            self._file.write(line + "\n")
            if self._each:
                self._file.flush()
            else:
                self._dirty = True
            self._index += 1
            self._last_time = t
            if self.keep:
                self.ops.append(op)
            return op

    def _flush_periodically(self, interval: float) -> None:
        """Background timer: flush buffered lines every `interval` seconds until closed."""
        while not self._stop.wait(interval):
            with self._lock:
                if self._dirty and not self._closed:
                    self._file.flush()
                    self._dirty = False


def _check_extra(extra: dict) -> None:
    """Refuse extra fields that would overwrite the record's own fields."""
    clash = _RESERVED.intersection(extra)
    if clash:
        raise HistoryError(f"extra fields may not set {', '.join(sorted(clash))}; pass them as arguments")
