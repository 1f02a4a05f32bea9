"""The Valkey side of the server: the key layout and one-round-trip script calls.

Every lease operation is ONE `EVALSHA` of its script (lab/server/lua), bounded
by the request's remaining deadline. Retries are off everywhere
(`retry=Retry(NoBackoff(), 0)`, no retry_on_timeout / retry_on_error): a
silent re-send would execute a mutation twice and corrupt the histories the lab
records. The only re-send is after `NOSCRIPT`, which Valkey answers without
executing anything.

The connection handling is hand-written over redis-py's `Connection` (instead
of its pool and client) because the server must know exactly where the
submission boundary is (C19, C23): a failure before the command is written is
a definite "not executed" (`BackendUnavailable`, or `NotStarted` when the
deadline ran out first); a failure or timeout after it may have executed
(`OutcomeUnknown`).

Connections are shared and pipelined (`_Pipe`, issue 13): the calls made in
one event-loop turn go out in one write, and one reader task per connection
hands each reply to the call that sent its command (RESP answers in request
order). A call whose caller stops waiting (deadline, cancellation) before
the write is never written; after it, its late reply is read and dropped, so
it can never be read as another request's answer and the connection stays in
use. A broken connection fails every call on it: `OutcomeUnknown` for those
written, `BackendUnavailable` for the rest. Under the bench's load
(bench/server_throughput.py) Valkey then serves about a dozen script calls per
read and per write instead of one, which took its CPU per operation under HTTP
load down to that of pipelined raw script calls, and cut the servers' own.

Key layout (L = the lock key of C3, `starintel:target-lease:v1:<b64>`):
  L                 hash: the current lease record (deleted on release/revoke;
                    PEXPIREAT expires_at + retention; treated as expired from expires_at)
  L:fence           string: the durable fencing counter (INCR; never a TTL, never reset)
  L:hwm             string: the commit high-water mark (C26): the highest token validated for a commit
  L:history         list: terminal evidence, newest first, capped
  P:lease:<id>      hash {k: L, i: identity json, s: state}: lease_id -> identity and end state
  P:idem:<b64>      string: idempotency record {d: digest, c: code, r: result}
  P:active          zset (score 0, lexicographic): lock keys with a record, for list
  P:quota:<principal> zset lock key -> expires_at: the principal's active leases
  P:audit           stream: audit events (XADD MAXLEN ~)
  P:recovery        string: the epoch, floor and run_id of the last recovery (informational)
where P = `starintel:target-lease:v1:`.

The incarnation stamp (the recovery rule's enforcement, see recovery.py): with
`stamp_incarnation` on, every (re)connected connection asks Valkey for its
`run_id` (`INFO server`) before any other command is written on it, and keeps
it (`Stamped.valkey_run_id`; redis-py's `_connect` clears it on every
reconnect). A call made with `incarnation=R` is written only on a connection
stamped R, else it is answered `["recovering", "0"]` without anything being
sent. A TCP connection reaches one Valkey process for its whole life and a
restarted or restored Valkey has a new `run_id`, so this is the same check the
scripts used to make with `INFO server` in every call (which cost Valkey about
13 us of each operation), made once per connection.

`connect_hook`, when set, runs on every new connection after its handshake and
stamp and before any command is written on it (the recovery rule compares the
stamped `run_id` there, see recovery.py); a failure in it is still "not submitted".
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import logging
import re
from typing import Any, Awaitable, Callable, Sequence

import orjson
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lab.server.identity import KEY_PREFIX
from lab.server.scripts import Script, load_scripts
from lab.server.settings import Settings

log = logging.getLogger("lab.server.backend")

ACTIVE_INDEX = KEY_PREFIX + "active"
AUDIT_STREAM = KEY_PREFIX + "audit"
RECOVERY_KEY = KEY_PREFIX + "recovery"
_RUN_ID_RE = re.compile(r"^run_id:([0-9a-f]+)\r?$", re.MULTILINE)


# -- key layout -------------------------------------------------------------

def fence_key(lock_key: str) -> str:
    return lock_key + ":fence"


def hwm_key(lock_key: str) -> str:
    """The per-identity commit high-water mark of the fenced-write boundary (C26)."""
    return lock_key + ":hwm"


def history_key(lock_key: str) -> str:
    return lock_key + ":history"


def lease_index_key(lease_id: str) -> str:
    return KEY_PREFIX + "lease:" + lease_id


def quota_key(principal_id: str) -> str:
    return KEY_PREFIX + "quota:" + principal_id


def idempotency_key(operation: str, lock_key: str, principal_id: str, request_id: str) -> str:
    """The key of the idempotency record of (operation, lock_key, principal, request_id) (C16)."""
    material = orjson.dumps([operation, lock_key, principal_id, request_id])
    return KEY_PREFIX + "idem:" + base64.urlsafe_b64encode(hashlib.sha256(material).digest()).rstrip(b"=").decode()


# -- errors -------------------------------------------------------------------

class BackendError(Exception):
    """A backend call did not produce a reply."""


class NotStarted(BackendError):
    """The deadline ran out before the command was submitted: nothing happened."""


class BackendUnavailable(BackendError):
    """Valkey could not be reached; the command was definitely not executed."""


class OutcomeUnknown(BackendError):
    """The command was submitted but no reply arrived in time: it may have executed."""


class BackendFault(BackendError):
    """Valkey answered with an error (a script error, a wrong-type key): fail closed."""


def run_id_of(info: Any) -> str:
    """Valkey's `run_id` from an `INFO server` reply (raw text); ValueError when it has none."""
    if isinstance(info, bytes):
        info = info.decode("utf-8", "replace")
    m = _RUN_ID_RE.search(info) if isinstance(info, str) else None
    if m is None:
        raise ValueError("INFO server reply without a run_id")
    return m.group(1)


def _pack_command(args: Sequence[Any]) -> bytes:
    """One command in RESP2 (hand-written: redis-py's generic encoder was a tenth of the request CPU)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode("utf-8")
        elif isinstance(a, int):  # includes bool, never passed
            a = b"%d" % a
        elif not isinstance(a, (bytes, bytearray)):
            raise TypeError(f"cannot send {type(a).__name__} to Valkey")
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


class Stamped:
    """Mixed into the pool's connection class: the `run_id` of the Valkey a connection reaches (None until stamped)."""

    valkey_run_id: str | None = None

    async def _connect(self) -> None:
        self.valkey_run_id = None  # a new socket may reach another Valkey incarnation: stamp it again
        await super()._connect()  # type: ignore[misc]


def stamped(cls: type) -> type:
    """`cls` (TCP, TLS or unix-socket connection, as the URL chose) with the stamp mixed in."""
    return cls if issubclass(cls, Stamped) else type("Stamped" + cls.__name__, (Stamped, cls), {})


RECOVERING_REPLY = ("recovering", "0")  # what a call on a connection to another Valkey incarnation gets, unsent


try:  # hiredis's C encoder (hiredis >= 2.1): the same bytes at a third of the CPU of _pack_command
    from hiredis import pack_command as _hiredis_pack_command
except ImportError:  # pragma: no cover - older hiredis
    _hiredis_pack_command = None


def pack_command(args: Sequence[Any]) -> bytes:
    """One command in RESP2: str (UTF-8), bytes and int arguments."""
    if _hiredis_pack_command is not None:
        return _hiredis_pack_command(tuple(args))
    return _pack_command(args)


def redis_kwargs(settings: Settings) -> dict[str, Any]:
    """Connection options: retries off, no read timeout of its own (deadlines bound every read)."""
    return dict(
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=None,
        socket_connect_timeout=settings.valkey_connect_timeout_ms / 1000,
        health_check_interval=0,
        driver_info=None,
        client_name=f"fencelab-lease:{settings.instance_id}",
    )


class _Lost(Exception):
    """The connection broke before a reply: `sent` says whether the request had been written."""

    def __init__(self, sent: bool):
        super().__init__("connection lost")
        self.sent = sent


class _Submission:
    """One write's worth of commands on a pipe: its bytes, a future per reply, and whether it was written."""

    __slots__ = ("data", "futures", "sent")

    def __init__(self, data: bytes, futures: list[asyncio.Future]):
        self.data, self.futures, self.sent = data, futures, False


class _Pipe:
    """One Valkey connection shared by concurrent calls (pipelining).

    Calls made in the same event-loop turn are written together in one write at the end of the turn;
    one reader task reads replies in order and hands each to the call that sent its command (RESP
    answers in request order, so a reply can only ever reach its own request, also after that
    request's caller stopped waiting: a late reply is read and dropped, and the connection goes on).
    A call whose caller gives up before the write is never written: "not submitted" stays exact.
    """

    def __init__(self, conn: Connection, on_broken: Callable[["_Pipe"], None]):
        self.conn = conn
        self.loop = asyncio.get_running_loop()
        self.unsent: list[_Submission] = []
        self.unsent_calls = 0  # the futures in `unsent`
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.broken = False
        self._on_broken = on_broken
        self.reader = self.loop.create_task(self._read(), name="valkey-pipe-reader")

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + self.unsent_calls

    def submit(self, data: bytes, n: int) -> _Submission:
        """Queue `n` packed commands for this turn's write."""
        sub = _Submission(data, [self.loop.create_future() for _ in range(n)])
        if not self.unsent:
            self.loop.call_soon(self._flush)
        self.unsent.append(sub)
        self.unsent_calls += n
        return sub

    def _flush(self) -> None:
        subs, self.unsent, self.unsent_calls = self.unsent, [], 0
        # a submission whose callers all gave up (deadline, cancellation) before this write is never sent
        subs = [sub for sub in subs if not all(f.done() for f in sub.futures)]
        if not subs:
            return
        if self.broken:
            for sub in subs:
                _fail(sub.futures, _Lost(sent=False))
            return
        try:
            # asyncio's StreamWriter.write (redis-py's connection keeps it as _writer): buffered, never blocks
            self.conn._writer.write(b"".join(sub.data for sub in subs))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - a closed or missing transport: nothing of this turn was written
            for sub in subs:
                _fail(sub.futures, _Lost(sent=False))
            self.close()
            return
        for sub in subs:
            sub.sent = True
            self.waiting.extend(sub.futures)

    async def _read(self) -> None:
        try:
            while True:
                try:
                    reply: Any = await self.conn.read_response()
                except ResponseError as e:
                    reply = e
                if not self.waiting:
                    raise RedisConnectionError("a reply nobody asked for")
                fut = self.waiting.popleft()
                if not fut.done():
                    fut.set_result(reply)
        except BaseException as e:  # noqa: BLE001 - EOF, reset, cancellation: the pipe is done either way
            self.close()
            if not isinstance(e, (Exception, asyncio.CancelledError)):
                raise

    def close(self) -> None:
        """Break the pipe: every call still waiting gets _Lost (written or not), the socket is closed."""
        if self.broken:
            return
        self.broken = True
        waiting, self.waiting = list(self.waiting), collections.deque()
        _fail(waiting, _Lost(sent=True))
        unsent, self.unsent, self.unsent_calls = self.unsent, [], 0
        for sub in unsent:
            _fail(sub.futures, _Lost(sent=False))
        if self.reader is not asyncio.current_task():
            self.reader.cancel()
        self._on_broken(self)
        self.loop.create_task(self.conn.disconnect(nowait=True))


def _fail(futures: Sequence[asyncio.Future], exc: BaseException) -> None:
    for f in futures:
        if not f.done():
            f.set_exception(exc)
            f.exception()  # retrieved: a caller that stopped waiting must not make asyncio log it


PIPE_DEPTH = 32  # calls in flight on one connection before another one is opened


class Backend:
    """Script calls and pipelines over a small set of shared (pipelined) Valkey connections."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.scripts: dict[str, Script] = load_scripts(settings.script_dir or None)
        self._template = aioredis.ConnectionPool.from_url(settings.valkey_url, **redis_kwargs(settings))
        self._template.connection_class = stamped(self._template.connection_class)
        self._pipes: list[_Pipe] = []
        self._connecting = asyncio.Lock()
        self._closed = False
        self.scripts_loaded = False
        self.connect_hook: Callable[[Connection], Awaitable[None]] | None = None
        self.stamp_incarnation = False  # the recovery rule turns it on: stamp every connection with its run_id

    @property
    def _idle(self) -> list[Connection]:
        """The open connections (each shared by the calls in flight on it)."""
        return [p.conn for p in self._pipes if not p.broken]

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        """Load the scripts now if Valkey answers (else lazily, on the first NOSCRIPT)."""
        loop = asyncio.get_running_loop()
        try:
            await self.load_scripts(loop.time() + self.settings.valkey_connect_timeout_ms / 1000 + 1)
        except BackendError as e:
            log.warning("valkey not reachable at start-up (%s); scripts will load on first use", type(e).__name__)

    async def close(self) -> None:
        """Close every connection."""
        self._closed = True
        pipes, self._pipes = self._pipes, []
        for pipe in pipes:
            pipe.close()
            with contextlib.suppress(BaseException):
                await pipe.reader
            await pipe.conn.disconnect(nowait=True)

    async def load_scripts(self, deadline: float) -> None:
        """SCRIPT LOAD every operation script and check Valkey's SHA-1 against ours."""
        commands = [("SCRIPT", "LOAD", s.source) for s in self.scripts.values()]
        replies = await self.pipeline(commands, deadline)
        for script, sha in zip(self.scripts.values(), replies):
            if sha != script.sha:
                raise BackendFault(f"SCRIPT LOAD of {script.name} returned {sha!r}, expected {script.sha}")
        self.scripts_loaded = True

    # -- calls --------------------------------------------------------------
    async def run(self, name: str, keys: Sequence[str], args: Sequence[Any], deadline: float,
                  incarnation: str = "") -> list:
        """EVALSHA script `name` once, bounded by `deadline` (event-loop time).

        With `incarnation` (a Valkey run_id), only on a connection to that Valkey incarnation; on any
        other the answer is `["recovering", "0"]` and nothing was sent (see the module docstring).
        """
        script = self.scripts[name]
        evalsha = pack_command(("EVALSHA", script.sha, len(keys), *keys, *args))
        (reply,) = await self._call(deadline, evalsha, 1, incarnation)
        if isinstance(reply, NoScriptError):
            # Valkey executed nothing; load the script and send once more (in one write, in this order)
            _, reply = await self._call(deadline, pack_command(("SCRIPT", "LOAD", script.source)) + evalsha, 2,
                                        incarnation)
            if isinstance(reply, NoScriptError):  # pragma: no cover
                raise BackendFault(f"{script.name}: NOSCRIPT after SCRIPT LOAD")
        if isinstance(reply, ResponseError):
            raise BackendFault(f"{script.name} script error: {reply}")
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Any]], deadline: float) -> list:
        """Send several commands in one write and read every reply (audit batches, script loads); an error
        reply is returned in place (a ResponseError)."""
        return await self._call(deadline, b"".join(map(pack_command, commands)), len(commands))

    async def command(self, deadline: float, *args: Any) -> Any:
        """One plain command (recovery's INFO / SCAN / GET); an error reply is a BackendFault."""
        (reply,) = await self.pipeline([args], deadline)
        if isinstance(reply, ResponseError):
            raise BackendFault(f"{args[0]}: {reply}")
        return reply

    async def run_id(self, deadline: float) -> str:
        """The run_id of the Valkey incarnation answering now."""
        try:
            return run_id_of(await self.command(deadline, "INFO", "server"))
        except ValueError as e:
            raise BackendFault(str(e)) from None

    async def ping(self, deadline: float) -> bool:
        """Does Valkey answer PING before `deadline`?"""
        try:
            replies = await self.pipeline([("PING",)], deadline)
        except BackendError:
            return False
        return replies == [True] or replies == ["PONG"]

    async def stamp(self, conn: Connection) -> str:
        """The run_id of the Valkey at the other end of `conn` (asked once, before the connection serves calls)."""
        run_id = getattr(conn, "valkey_run_id", None)
        if run_id is None:
            await conn.send_command("INFO", "server", check_health=False)
            try:
                run_id = run_id_of(await conn.read_response())
            except ValueError:
                raise RedisConnectionError("INFO server without a run_id") from None
            conn.valkey_run_id = run_id
        return run_id

    async def _call(self, deadline: float, data: bytes, n: int, incarnation: str = "") -> list:
        """Send `n` packed commands in one write on a shared connection and return their replies (error
        replies in place); classify failures by the submission boundary (C19, C23).

        With `incarnation`, only on a connection stamped with that run_id; on any other the answer is
        [RECOVERING_REPLY], definitely not submitted (the stamp is read when the connection opens).
        """
        if self._closed:
            raise BackendUnavailable("backend closed")
        loop = asyncio.get_running_loop()
        if deadline <= loop.time():
            raise NotStarted("deadline passed before submission")
        sub: _Submission | None = None
        try:
            async with asyncio.timeout_at(deadline):
                pipe = await self._pipe()
                if incarnation and await self._stamp_of(pipe) != incarnation:
                    return [list(RECOVERING_REPLY)]
                sub = pipe.submit(data, n)
                try:
                    return [await f for f in sub.futures]
                except BaseException:
                    for f in sub.futures:  # so an unwritten submission is never written (_Pipe._flush)
                        f.cancel()
                    raise
        except TimeoutError:
            raise (OutcomeUnknown if sub is not None and sub.sent else NotStarted)(
                "no reply before the deadline") from None
        except _Lost as e:
            raise (OutcomeUnknown if e.sent else BackendUnavailable)("connection lost") from None
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:
            # only connecting raises these here: nothing was written
            raise BackendUnavailable(type(e).__name__) from None
        except RedisError as e:
            raise BackendFault(type(e).__name__) from None

    async def _stamp_of(self, pipe: _Pipe) -> str:
        """The run_id `pipe`'s connection was stamped with; asked on it now if it opened before stamping was
        on. Nothing of the caller's was written yet, so any failure here is "not submitted"."""
        run_id = pipe.conn.valkey_run_id
        if run_id is None:
            sub = pipe.submit(pack_command(("INFO", "server")), 1)
            try:
                reply = await sub.futures[0]
            except _Lost:
                raise BackendUnavailable("connection lost") from None
            except BaseException:
                sub.futures[0].cancel()
                raise
            try:
                run_id = run_id_of(reply)
            except ValueError:
                raise BackendFault("INFO server reply without a run_id") from None
            pipe.conn.valkey_run_id = run_id
        return run_id

    async def _pipe(self) -> _Pipe:
        """A connection to send on: the first open one with room, else a new one (connected, stamped and
        passed through `connect_hook` before anything else is written on it)."""
        for pipe in self._pipes:
            if not pipe.broken and pipe.in_flight < PIPE_DEPTH:
                return pipe
        async with self._connecting:
            live = [p for p in self._pipes if not p.broken]
            for pipe in live:
                if pipe.in_flight < PIPE_DEPTH:
                    return pipe
            if live and len(live) >= self.settings.valkey_max_connections:
                return min(live, key=lambda p: p.in_flight)
            conn = self._template.make_connection()
            try:
                conn.valkey_run_id = None  # (Stamped._connect clears it too, on any reconnect)
                await conn.connect()
                if self.stamp_incarnation:
                    await self.stamp(conn)
                if self.connect_hook is not None:
                    await self.connect_hook(conn)
            except BaseException:
                await conn.disconnect(nowait=True)
                raise
            if self._closed:
                await conn.disconnect(nowait=True)
                raise BackendUnavailable("backend closed")
            pipe = _Pipe(conn, self._drop)
            self._pipes.append(pipe)
            return pipe

    def _drop(self, pipe: _Pipe) -> None:
        with contextlib.suppress(ValueError):
            self._pipes.remove(pipe)
