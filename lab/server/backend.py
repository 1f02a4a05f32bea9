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
(`OutcomeUnknown`). A timed-out connection is closed, never reused, so a late
reply can never be read as another request's answer.

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


def pack_command(args: Sequence[Any]) -> bytes:
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


class Backend:
    """Script calls and pipelines over a bounded set of Valkey connections."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.scripts: dict[str, Script] = load_scripts(settings.script_dir or None)
        self._template = aioredis.ConnectionPool.from_url(settings.valkey_url, **redis_kwargs(settings))
        self._template.connection_class = stamped(self._template.connection_class)
        self._idle: list[Connection] = []
        self._slots = asyncio.Semaphore(settings.valkey_max_connections)
        self._closed = False
        self.scripts_loaded = False
        self.connect_hook: Callable[[Connection], Awaitable[None]] | None = None
        self.stamp_incarnation = False  # the recovery rule turns it on: stamp every connection with its run_id

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
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect(nowait=True)

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
        return await self._call(deadline, lambda conn: self._evalsha(conn, script, keys, args), incarnation)

    async def pipeline(self, commands: Sequence[Sequence[Any]], deadline: float) -> list:
        """Send several commands in one write and read every reply (audit batches, script loads)."""
        async def go(conn: Connection) -> list:
            await conn.send_packed_command(b"".join(map(pack_command, commands)), check_health=False)
            replies = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as e:
                    replies.append(e)
            return replies
        return await self._call(deadline, go)

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

    async def _evalsha(self, conn: Connection, script: Script, keys: Sequence[str], args: Sequence[Any]) -> list:
        for attempt in (1, 2):
            await conn.send_packed_command(pack_command(("EVALSHA", script.sha, len(keys), *keys, *args)),
                                           check_health=False)
            try:
                return await conn.read_response()
            except ResponseError as e:
                if attempt == 1 and isinstance(e, NoScriptError):
                    # Valkey executed nothing; load the script on this connection and send once more.
                    await conn.send_command("SCRIPT", "LOAD", script.source, check_health=False)
                    await conn.read_response()
                    continue
                raise BackendFault(f"{script.name} script error: {e}") from None
        raise BackendFault(f"{script.name}: NOSCRIPT after SCRIPT LOAD")  # pragma: no cover

    async def stamp(self, conn: Connection) -> str:
        """The run_id of the Valkey at the other end of `conn` (asked once per connection: `INFO server`)."""
        run_id = getattr(conn, "valkey_run_id", None)
        if run_id is None:
            await conn.send_command("INFO", "server", check_health=False)
            try:
                run_id = run_id_of(await conn.read_response())
            except ValueError:
                raise RedisConnectionError("INFO server without a run_id") from None
            conn.valkey_run_id = run_id
        return run_id

    async def _call(self, deadline: float, body, incarnation: str = "") -> Any:
        """Run `body(conn)` on one connection; classify failures by the submission boundary.

        With `incarnation`, `body` runs only on a connection stamped with that run_id; on any other
        the answer is RECOVERING_REPLY, definitely not submitted (the stamp is read before submission).
        """
        if self._closed:
            raise BackendUnavailable("backend closed")
        loop = asyncio.get_running_loop()
        if deadline <= loop.time():
            raise NotStarted("deadline passed before submission")
        submitted = False
        conn: Connection | None = None
        try:
            async with asyncio.timeout_at(deadline):
                await self._slots.acquire()
                clean = False
                try:
                    conn = self._idle.pop() if self._idle else self._template.make_connection()
                    await self._ensure_connected(conn)
                    if incarnation and await self.stamp(conn) != incarnation:
                        clean = True
                        return list(RECOVERING_REPLY)
                    submitted = True
                    try:
                        result = await body(conn)
                    except BackendFault:
                        clean = True  # Valkey's error reply was read in full
                        raise
                    clean = True
                    return result
                finally:
                    if conn is not None:
                        if not clean or self._closed:
                            # unread bytes may follow: this connection must never serve another request
                            await conn.disconnect(nowait=True)
                        if not self._closed:
                            self._idle.append(conn)
                    self._slots.release()
        except TimeoutError:
            raise (OutcomeUnknown if submitted else NotStarted)("no reply before the deadline") from None
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:
            raise (OutcomeUnknown if submitted else BackendUnavailable)(type(e).__name__) from None
        except BackendFault:
            raise
        except RedisError as e:
            raise BackendFault(type(e).__name__) from None

    async def _ensure_connected(self, conn: Connection) -> None:
        """Connect a new or dropped connection; drop a pooled one the server has closed."""
        if conn.is_connected:
            try:
                if await conn.can_read():  # data or EOF on an idle connection: unusable
                    raise RedisConnectionError("stale connection")
                return
            except (RedisConnectionError, OSError):
                await conn.disconnect(nowait=True)
        conn.valkey_run_id = None  # (Stamped._connect clears it too, on any reconnect)
        await conn.connect()
        if self.stamp_incarnation:
            await self.stamp(conn)
        if self.connect_hook is not None:
            await self.connect_hook(conn)
