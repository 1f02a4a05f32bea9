"""Audit events (contract section 11): one per lease request, to a Valkey stream and a JSONL file.

Every lease request, accepted or refused, emits one event with the closed
field set `AUDIT_FIELDS`; values are ids, states, codes and numbers, never
secrets, API keys, raw backend keys, metadata bodies or backend commands.

Each stream entry has two fields: `event_type` and `event`, the event as a JSON
object (the same object as the file line). Ordinary events are written to the
file at once (buffered) and sent to the stream
`starintel:target-lease:v1:audit` in batches (one pipeline of
`XADD MAXLEN ~` per batch) by a background task, so the request path spends no
backend round trip on auditing and a refused request touches no lease key. The
batch queue is bounded (`audit_queue_max`); when Valkey is down, stream events
beyond it are dropped and counted (`dropped`), the file still has them.

Force-release and revoke are different (C15): their script appends the event to
the stream in the same atomic step as the state change, and the server writes
and fsyncs the file line before it reports success.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from pathlib import Path
from typing import Any

import orjson

from lab.server.backend import AUDIT_STREAM, Backend, BackendError

log = logging.getLogger("lab.server.audit")

EVENT_TYPES = ("target_lease_acquire", "target_lease_renew", "target_lease_release", "target_lease_force_release",
               "target_lease_revoke", "target_lease_inspect", "target_lease_list", "target_lease_commit_rejected",
               # accepted commits: an extension of section 11's closed set, which names only the rejection
               "target_lease_commit")

AUDIT_FIELDS = (
    "event_type", "server_instance_id", "observed_at_ms", "backend_time_ms", "latency_ms",
    "request_id", "correlation_id", "trace_id", "execution_id", "job_id",
    "principal_id", "credential_id", "service_instance_id",
    "tenant_id", "program_id", "target_namespace", "target_id", "actor_name", "workflow_name", "operation_class",
    "lease_id", "fencing_token", "requested_ttl_ms", "effective_ttl_ms", "previous_state", "resulting_state",
    "result_code", "http_status", "retryable", "backend_health", "admin_reason", "incident_id", "replayed",
)
_FIELD_SET = frozenset(AUDIT_FIELDS)


def event_from_stream(fields: dict[Any, Any]) -> dict[str, Any]:
    """The event of one stream entry (as XRANGE returns its fields, bytes or text)."""
    raw = fields.get("event", fields.get(b"event"))
    if raw is None:
        raise ValueError("not an audit stream entry: no `event` field")
    return orjson.loads(raw)


class AuditLog:
    """The audit sink of one server instance."""

    def __init__(self, backend: Backend, path: str | None, *, stream_maxlen: int, queue_max: int):
        self.backend = backend
        self.path = Path(path) if path else None
        self.stream_maxlen = stream_maxlen
        self._queue: collections.deque[list[Any]] = collections.deque()
        self._queue_max = queue_max
        self._file = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._flushed = asyncio.Event()
        self.dropped = 0
        self.written = 0

    async def start(self) -> None:
        """Open the file (append) and start the stream writer."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab", buffering=1 << 16)
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def close(self) -> None:
        """Send what is queued (briefly), then close the file."""
        try:
            async with asyncio.timeout(2.0):  # not wait_for: 3.11's can swallow a cancellation
                await self.flush()
        except (TimeoutError, asyncio.TimeoutError):
            log.warning("audit: %d stream events not sent at shutdown", len(self._queue))
        # re-cancel until done: Python 3.11's timeout blocks (in backend calls) can swallow one cancellation
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task], timeout=0.5)
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None

    def emit(self, event: dict[str, Any], *, in_stream: bool = False) -> None:
        """Record one event: file now, stream soon (unless a script already put it there)."""
        unknown = set(event) - _FIELD_SET
        if unknown:
            raise ValueError(f"audit event has fields outside the closed set: {sorted(unknown)}")
        if event.get("event_type") not in EVENT_TYPES:
            raise ValueError(f"audit event_type {event.get('event_type')!r} is not in the closed set")
        line = orjson.dumps(event)
        if self._file is not None:
            self._file.write(line + b"\n")
        self.written += 1
        if not in_stream:
            if len(self._queue) >= self._queue_max:
                self.dropped += 1
            else:
                self._queue.append(["event_type", event["event_type"], "event", line])
        self._flushed.clear()
        self._wake.set()

    async def emit_durable(self, event: dict[str, Any], *, in_stream: bool) -> None:
        """Record one event and fsync the file before returning (admin operations, C15)."""
        self.emit(event, in_stream=in_stream)
        if self._file is not None:
            self._file.flush()
            await asyncio.to_thread(os.fsync, self._file.fileno())

    async def flush(self) -> None:
        """Wait until every queued event has been sent (or dropped) and the file flushed."""
        while self._queue or not self._flushed.is_set():
            self._wake.set()
            await self._flushed.wait()
            if self._queue:
                await asyncio.sleep(0.01)

    async def _run(self) -> None:
        """Background writer: batch queued events into one XADD pipeline at a time."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._file is not None:
                self._file.flush()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(256, len(self._queue)))]
                commands = [("XADD", AUDIT_STREAM, "MAXLEN", "~", self.stream_maxlen, "*", *fields) for fields in batch]
                try:
                    await self.backend.pipeline(commands, loop.time() + 1.0)
                except BackendError as e:
                    self.dropped += len(batch)
                    log.warning("audit: %d stream events dropped (%s)", len(batch), type(e).__name__)
                    await asyncio.sleep(0.2)
            self._flushed.set()
