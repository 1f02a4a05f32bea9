"""Redis-style locks on Valkey as systems under test: `valkey-lock` and `valkey-lock-fenced`.

The lock is redis-py's own `redis.asyncio.lock.Lock` (SET NX PX with a random
token; release and extend are Lua scripts that check the token), used as its
documentation says, not re-implemented. Every Valkey connection has retries
off (`Retry(NoBackoff(), 0)`, no retry on timeout or error): redis-py's
default re-sends a command after a timeout, which would turn one acquire into
two and hide what the lock did.

- `valkey-lock`: the lock alone. It hands out NO fencing token (`fencing_token`
  is null in every lease it reports; `FENCING_TOKENS = False`), so its commits
  can only be unfenced: the client writes to the CouchDB-API store whenever it
  believes it holds the lock (Kleppmann's 2016 setting).
- `valkey-lock-fenced`: the same lock plus a counter taken right after the lock
  is won (`INCR fencelab:fence:<identity>`), the lease's fencing token. Its
  commits go through the store's token guard (`lab.couch.FENCE_VALIDATE`, the
  `validate_doc_update` rule the reference server's commit boundary relies on)
  by default, or on belief alone with `commit_mode = "unfenced"`
  (`test.commit_mode`, `--commit-mode`).

  The INCR is a second command after SET NX, not atomic with it: a holder that
  stalls between the two (a pause, a slow link) can lose the lock by expiry,
  see a successor win it and INCR first, and then take a LARGER token than
  the successor. The guard then refuses the rightful holder's writes and
  accepts the expired one's; docs/third-party.md reports what the runs showed.

Lease mapping: `lease_id` = the lock's random token (the value SET NX stored);
`acquired_at_ms` = Valkey's TIME read right after the SET, `expires_at_ms` =
Valkey's TIME read right before it + the TTL (so the reported validity is never
longer than the real one: no overlap is invented); renew = `extend(ttl,
replace_ttl=True)`; release = `release()`. `inspect` reports the current
holder's lock value and its remaining PTTL (no token: the counter is not tied
to the lock value).

Outcomes: `fail` only when the command definitely did not run (the lock was
taken, not owned any more, the connection could not be made, Valkey refused
it); `info` when it may have run (a timeout or a dropped connection after
sending, our deadline after sending, a SET NX that won but whose INCR did not
answer).

What these systems do not claim, and the lab therefore does not judge (see
`CLAIMS`): idempotent retries by request id (the lock never sees a request id),
and for `valkey-lock` anything that needs a fencing token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import redis.asyncio as aredis
from redis.asyncio.lock import Lock
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted, with a warning each time
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, LockError, ResponseError, TimeoutError

from lab import paths
from lab.client.results import CONNECT_ERROR, CONNECTION_LOST, TIMEOUT, Identity, Lease, Result
from lab.couch import CouchClient
from lab.stack.valkey import PERSISTENCE_MODES, ValkeyProcess
from lab.sut.processes import CLIENTS, LinkSpec, ProcessSpec, SystemProcesses, store_url_for
from lab.sut.protocol import SutError
from lab.testmap import Test

LOCK_PREFIX = "fencelab:lock:"
FENCE_PREFIX = "fencelab:fence:"
FENCED_DB = "fencelab"  # the database with the token guard (the fenced-append workload's)
UNFENCED_DB = "fencelab-unfenced"  # a database with no guard: writes on belief alone
COMMIT_MODES = ("fenced", "unfenced")
COMMIT_ATTEMPTS = 20  # read-modify-write rounds on `_rev` conflicts (the store's MVCC), within the deadline
STALE_TOKEN = "stale_token"  # the guard refused a lower token (C26)
LOCK_TAKEN = "lease_conflict"
NOT_OWNED = "lease_lost"
FENCE_UNKNOWN = "fence_counter_unknown"  # info: the lock was won, the token's INCR did not answer


def lock_name(identity: Identity) -> str:
    """The Valkey key of an identity's lock: the seven fields, percent-quoted, joined by `/`."""
    return LOCK_PREFIX + "/".join(quote(v, safe="") for v in identity.as_dict().values())


def fence_name(identity: Identity) -> str:
    """The Valkey key of an identity's fencing counter."""
    return FENCE_PREFIX + lock_name(identity)[len(LOCK_PREFIX):]


def _definitely_unsent(e: BaseException) -> bool:
    """A redis error raised while connecting, before any command of ours was written.

    redis-py words every connect-phase failure as "Timeout connecting to server"
    or "Error N connecting to host:port"; it has no separate exception class for it.
    """
    return "connecting to" in str(e).lower()


class _Unsent(Exception):
    """The deadline was spent before a request was sent: nothing of it reached anyone."""


class _Budget:
    """What is left of an op's deadline, not counting the time its worker was held at the pause gate."""

    def __init__(self, deadline_s: float | None):
        self.deadline_s = deadline_s
        self.t0 = time.monotonic()
        self.paused = 0.0

    def left(self) -> float | None:
        if self.deadline_s is None:
            return None
        return self.deadline_s - (time.monotonic() - self.t0 - self.paused)


@dataclass
class _Held:
    """A lock this client won: redis-py's Lock object (it carries the token) and its lease record."""

    lock: Any
    lease: Lease


class ValkeyLockSystem:
    """`valkey-lock`: redis-py's Lock on Valkey, no fencing token; commits are writes on belief alone."""

    capabilities = frozenset({"commit"})
    FENCING_TOKENS = False
    # contract features this system does not claim: the lab neither runs nor judges them
    CLAIMS_NOT = frozenset({"idempotent_retries", "fencing_token"})

    def __init__(self, valkey_url: str, store_url: str | None = None, *, service_instance_id: str = "",
                 timeout_s: float = 5.0, commit_mode: str = "unfenced"):
        if commit_mode not in COMMIT_MODES:
            raise ValueError(f"commit_mode must be one of {', '.join(COMMIT_MODES)}, not {commit_mode!r}")
        if commit_mode == "fenced" and not self.FENCING_TOKENS:
            raise ValueError(f"{type(self).__name__} hands out no fencing token: it can only commit unfenced")
        self.valkey_url = valkey_url
        self.store_url = store_url
        self.service_instance_id = service_instance_id
        self.timeout_s = timeout_s
        self.commit_mode = commit_mode
        # retries off: redis-py's default Retry re-sends a command after a timeout (one acquire would become two)
        self.redis = aredis.Redis.from_url(valkey_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                           retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                                           retry_on_error=[])
        self._held: dict[str, _Held] = {}  # lease_id -> the Lock that won it
        self._couch = None
        self._dbs_ready: set[str] = set()
        # set by the workload client per op: awaited before every request this system sends, so the client-pause
        # nemesis stops a worker mid-op too (between SET NX and INCR; between the store read and its write)
        self.pause_gate: Callable[[], Awaitable[None]] | None = None

    # -- helpers ---------------------------------------------------------------------------------------------
    def _lock(self, identity: Identity, ttl_ms: int):
        """A redis-py Lock for the identity: non-blocking, TTL in seconds, token not thread-local (asyncio)."""
        return Lock(self.redis, lock_name(identity), timeout=ttl_ms / 1000.0, blocking=False, thread_local=False)

    async def _backend_ms(self) -> int:
        """Valkey's own clock (TIME), in integer Unix ms."""
        sec, usec = await self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    def _error(self, e: BaseException, *, sent: bool, op: str) -> Result:
        """A redis / deadline error as a Result: `fail` when nothing of ours ran, `info` when it may have."""
        msg = f"{op}: {type(e).__name__}: {e}"[:300]
        if isinstance(e, BusyLoadingError | ResponseError):  # Valkey refused the command (loading, OOM, ...)
            return Result("fail", "lease_backend_unavailable", msg=msg)
        if not sent or _definitely_unsent(e):
            return Result("fail", CONNECT_ERROR if isinstance(e, ConnectionError) else "deadline_exceeded", msg=msg)
        if isinstance(e, TimeoutError | asyncio.TimeoutError):
            return Result("info", TIMEOUT, msg=msg)
        return Result("info", CONNECTION_LOST, msg=msg)

    async def _deadline(self, coro, deadline_s: float | None):
        """Run `coro` under the caller's deadline (asyncio.TimeoutError when it passes)."""
        if deadline_s is None:
            return await coro
        async with asyncio.timeout(deadline_s):  # not wait_for: 3.11's can swallow a Ctrl-C's cancellation
            return await coro

    async def _step(self, make: Callable[[], Awaitable[Any]], budget: "_Budget",
                    on_send: Callable[[], None] | None = None) -> Any:
        """One request: wait at the pause gate, then send it under what is left of the deadline.

        Time held at the gate does not count against the deadline (the worker was stopped, not slow); a
        deadline already spent raises `_Unsent` (nothing was sent)."""
        if self.pause_gate is not None:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await self.pause_gate()
            budget.paused += loop.time() - t0
        left = budget.left()
        if left is not None and left <= 0:
            raise _Unsent("the deadline passed before the request was sent")
        if on_send is not None:
            on_send()
        return await self._deadline(make(), left)

    def _lease(self, identity: Identity, lock_value: str, token: int | None, ttl_ms: int, acquired_at_ms: int | None,
               expires_at_ms: int | None, state: str = "active", renewed_at_ms: int | None = None) -> Lease:
        d = identity.as_dict()
        return Lease(lease_id=lock_value, fencing_token=token, state=state, acquired_at_ms=acquired_at_ms,
                     renewed_at_ms=renewed_at_ms, expires_at_ms=expires_at_ms, ttl_ms=ttl_ms,
                     lock_key=lock_name(identity), service_instance_id=self.service_instance_id or None, **d)

    async def _fencing_token(self, identity: Identity) -> int | None:
        """No token: this variant has none."""
        return None

    # -- the LeaseSystem operations ---------------------------------------------------------------------------
    async def acquire(self, identity: Identity, *, ttl_ms: int, request_id: str | None = None,
                      deadline_s: float | None = None) -> Result:
        """SET NX PX through redis-py's Lock (non-blocking): ok with a lease, `lease_conflict` when held."""
        lock = self._lock(identity, ttl_ms)
        stage = "time"
        budget = _Budget(deadline_s)
        try:
            before = await self._step(self._backend_ms, budget)
            stage = "set"
            won = await self._step(lambda: lock.acquire(blocking=False), budget)
            if not won:
                return Result("fail", LOCK_TAKEN, msg="the lock is held (SET NX refused)")
            stage = "fence"
            token = await self._step(lambda: self._fencing_token(identity), budget) if self.FENCING_TOKENS else None
        except Exception as e:  # noqa: BLE001 - every failure becomes a typed outcome
            if stage == "fence":
                return Result("info", FENCE_UNKNOWN, msg=f"the lock was won; its fencing token did not answer: "
                                                           f"{type(e).__name__}: {e}"[:300])
            if isinstance(e, _Unsent):
                return Result("fail", "deadline_exceeded", msg=f"acquire: {e}")
            return self._error(e, sent=stage == "set", op="acquire")
        try:
            after = await self._backend_ms()
        except Exception:  # noqa: BLE001 - the lock is held; only its backend time is unknown
            after = None
        value = lock.local.token.decode() if isinstance(lock.local.token, bytes) else str(lock.local.token)
        lease = self._lease(identity, value, token, ttl_ms, after, before + ttl_ms)
        self._held[value] = _Held(lock, lease)
        return Result("ok", "lease_acquired", lease=lease)

    def _held_lock(self, lease: Lease, identity: Identity | None) -> _Held:
        """The Lock that won `lease` (rebuilt from the lease's token when another client won it)."""
        held = self._held.get(lease.lease_id)
        if held is None:
            ident = identity or lease.identity
            lock = self._lock(ident, lease.ttl_ms or 1000)
            lock.local.token = lease.lease_id.encode()
            held = _Held(lock, lease)
        return held

    async def renew(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                    deadline_s: float | None = None) -> Result:
        """`extend(ttl, replace_ttl=True)`: ok while the lock still holds this lease's token."""
        held = self._held_lock(lease, identity)
        ttl_ms = lease.ttl_ms or 1000
        stage = "time"  # TIME only reads: a failure there changed nothing
        budget = _Budget(deadline_s)
        try:
            before = await self._step(self._backend_ms, budget)
            stage = "extend"
            await self._step(lambda: held.lock.extend(ttl_ms / 1000.0, replace_ttl=True), budget)
        except LockError as e:  # LockNotOwnedError: the key is gone or holds another token (the script ran)
            self._held.pop(lease.lease_id, None)
            return Result("fail", NOT_OWNED, msg=f"renew: {e}")
        except _Unsent as e:
            return Result("fail", "deadline_exceeded", msg=f"renew: {e}")
        except Exception as e:  # noqa: BLE001
            return self._error(e, sent=stage == "extend", op="renew")
        new = self._lease(held.lease.identity, lease.lease_id, lease.fencing_token, ttl_ms, lease.acquired_at_ms,
                          before + ttl_ms, renewed_at_ms=before)
        held.lease = new
        self._held[lease.lease_id] = held
        return Result("ok", "lease_renewed", lease=new)

    async def release(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                      deadline_s: float | None = None) -> Result:
        """`release()`: deletes the key only while it holds this lease's token."""
        held = self._held_lock(lease, identity)
        try:
            await self._step(held.lock.release, _Budget(deadline_s))
        except LockError as e:
            self._held.pop(lease.lease_id, None)
            return Result("fail", NOT_OWNED, msg=f"release: {e}")
        except _Unsent as e:
            return Result("fail", "deadline_exceeded", msg=f"release: {e}")
        except Exception as e:  # noqa: BLE001
            return self._error(e, sent=True, op="release")
        self._held.pop(lease.lease_id, None)
        old = held.lease
        ended = self._lease(old.identity, lease.lease_id, lease.fencing_token, old.ttl_ms or 0, old.acquired_at_ms,
                            old.expires_at_ms, state="released", renewed_at_ms=old.renewed_at_ms)
        return Result("ok", "lease_released", lease=ended)

    async def inspect(self, target: Identity | str, *, deadline_s: float | None = None) -> Result:
        """The lock's current value and remaining time (GET, PTTL, TIME in one MULTI)."""
        if not isinstance(target, Identity):
            return Result("fail", "invalid_lease_request", msg="valkey-lock inspects by identity only")
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.get(lock_name(target)).pttl(lock_name(target)).time()
                value, pttl, (sec, usec) = await self._step(pipe.execute, _Budget(deadline_s))
        except Exception as e:  # noqa: BLE001 - a read: whatever happened changed nothing
            return Result("fail", "lease_backend_unavailable", msg=f"inspect: {type(e).__name__}: {e}"[:300])
        if value is None or pttl is None or pttl < 0:
            return Result("fail", "lease_not_found")
        now = int(sec) * 1000 + int(usec) // 1000
        value = value.decode() if isinstance(value, bytes) else str(value)
        return Result("ok", "lease_inspected", lease=self._lease(target, value, None, None, None, now + int(pttl)))

    # -- commits: writes to the CouchDB-API store ------------------------------------------------------------
    async def commit(self, lease: Lease, doc: str, body: Any, *, identity: Identity | None = None,
                     request_id: str | None = None, deadline_s: float | None = None) -> Result:
        """Append `body["append"]` to `doc` (read, rebuild, write conditional on `_rev`).

        Unfenced: into a database without a guard, whenever this client believes
        it holds the lock (it does not ask Valkey). Fenced: the document carries
        the lease's token as `fence_token` and the store's `validate_doc_update`
        refuses a lower one (403: `stale_token`, a definite failure).
        """
        if not isinstance(body, dict) or "append" not in body:
            return Result("fail", "invalid_lease_request", msg="commit body must be {\"append\": entry}")
        if self.store_url is None:
            return Result("fail", "lease_backend_unavailable", msg="no store URL: the system has no store")
        fenced = self.commit_mode == "fenced"
        db = FENCED_DB if fenced else UNFENCED_DB
        state = {"put_sent": False}
        try:
            return await self._write(db, doc, body["append"], lease, fenced, state, _Budget(deadline_s))
        except Exception as e:  # noqa: BLE001 - a write that broke: did any PUT leave?
            msg = f"commit: {type(e).__name__}: {e}"[:300]
            if not state["put_sent"] or isinstance(e, _Unsent):
                return Result("fail", CONNECT_ERROR if _is_connect(e) else "deadline_exceeded", msg=msg)
            return Result("info", TIMEOUT if isinstance(e, (asyncio.TimeoutError, *_timeout_types())) else
                          CONNECTION_LOST, msg=msg)

    async def _write(self, db: str, doc: str, entry: Any, lease: Lease, fenced: bool, state: dict,
                     budget: "_Budget") -> Result:
        # shared with lab.sut.etcd (called with its own self): only attributes both have, and this class's _step

        if self._couch is None:
            self._couch = CouchClient(self.store_url, timeout_s=self.timeout_s)
        couch = self._couch
        if db not in self._dbs_ready:  # the fenced system's guard is part of the system
            await ValkeyLockSystem._step(self, lambda: couch.ensure_db(db, fenced=fenced), budget)
            self._dbs_ready.add(db)
        for _ in range(COMMIT_ATTEMPTS):
            current = await ValkeyLockSystem._step(self, lambda: couch.get(db, doc), budget)
            if current is not None and entry in (current.get("entries") or []):
                # a retry of a write that already landed (its entry is unique): applying it again would duplicate
                # it; which revision applied it is unknown, so no rev is reported
                data = {"doc": doc, "db": db, "rev": None, "replayed": True, "validated_at_ms": None,
                        "accepted_token": lease.fencing_token if fenced else None, "fenced": fenced}
                return Result("ok", "commit_accepted", data={"commit": data})
            new = dict(current) if current is not None else {"_id": doc}
            new["entries"] = [*(new.get("entries") or []), entry]
            if fenced:
                new.update(fence_token=lease.fencing_token, fence_lease_id=lease.lease_id)
            else:
                new.update(writer_token=lease.fencing_token, writer_lease_id=lease.lease_id)
            # a pause here is Kleppmann's: the client believes it holds the lock, read the document, then stops
            res = await ValkeyLockSystem._step(self, lambda: couch.put(db, doc, new), budget, on_send=lambda: state.update(put_sent=True))
            if res.ok:
                data = {"doc": doc, "db": db, "rev": res.rev,
                        "accepted_token": lease.fencing_token if fenced else None, "validated_at_ms": None,
                        "fenced": fenced}
                return Result("ok", "commit_accepted", data={"commit": data})
            if res.forbidden:
                return Result("fail", STALE_TOKEN, msg=f"the store's guard refused the write: {res.reason}")
            state["put_sent"] = False  # 409: this PUT definitely did not apply; read again and retry
        return Result("fail", "lease_backend_unavailable", msg=f"doc {doc!r} kept changing under concurrent writes")

    async def aclose(self) -> None:
        if self._couch is not None:
            await self._couch.close()
            self._couch = None
        await self.redis.aclose()


class FencedValkeyLockSystem(ValkeyLockSystem):
    """`valkey-lock-fenced`: redis-py's Lock plus an INCR counter taken after the win, the fencing token."""

    FENCING_TOKENS = True
    CLAIMS_NOT = frozenset({"idempotent_retries"})

    def __init__(self, valkey_url: str, store_url: str | None = None, *, service_instance_id: str = "",
                 timeout_s: float = 5.0, commit_mode: str = "fenced"):
        super().__init__(valkey_url, store_url, service_instance_id=service_instance_id, timeout_s=timeout_s,
                         commit_mode=commit_mode)

    async def _fencing_token(self, identity: Identity) -> int | None:
        """INCR on the identity's counter, right after SET NX won (a second command: not atomic with it)."""
        return int(await self.redis.incr(fence_name(identity)))


def _is_connect(e: BaseException) -> bool:
    return isinstance(e, httpx.ConnectError | httpx.ConnectTimeout)


def _timeout_types() -> tuple[type, ...]:
    return (httpx.TimeoutException,)


# -- factories for the registry ----------------------------------------------------------------------------------

def _urls(test: Test, node: str) -> tuple[str, str | None]:
    """The Valkey URL a worker talks to (`node`, its client group's proxy) and the store its group writes to."""
    node_is_valkey = isinstance(node, str) and node.startswith(("redis://", "rediss://", "unix://"))
    valkey = node if node_is_valkey else test.live.valkey
    if not valkey:
        raise SutError("valkey-lock needs a Valkey URL (redis://host:port/0): run it on a lab stack")

    return valkey, store_url_for(test, node)


def valkey_processes(test: Test):
    """The one process these systems bring: a lab-owned valkey-server, dialled by every client group."""
    chosen = test.extra.get("valkey_persistence")
    if chosen is not None and chosen not in PERSISTENCE_MODES:
        raise SutError(f"valkey_persistence must be one of {', '.join(PERSISTENCE_MODES)}, not {chosen!r}")

    def make(placement):
        # persistence: test.extra["valkey_persistence"] when given (a Valkey that forgets on a kill: "none"),
        # else what the nemeses asked of a Valkey (kill: always, valkey-crash: everysec), else none
        return ValkeyProcess(placement.root, name="valkey", port=placement.port("valkey"),
                             persistence=chosen or getattr(placement, "persistence", "none"),
                             env=placement.env("valkey"))

    def installed():
        paths.valkey_server()

    return SystemProcesses(system=test.sut_name(), processes=(ProcessSpec("valkey", make=make, ports=("client",)),),
                           links=(LinkSpec(CLIENTS, "valkey", "client"),), client_url=lambda a: f"redis://{a}/0",
                           install="run `make install`", check_installed=installed)


# what redis-py's Lock does not claim beyond its fencing style (the store-side token rules follow from
# `fencing="store"` / `"none"` at registration: lab.sut.registry.FENCING_STYLES)
NOT_CLAIMED = {"idempotency": "redis-py's Lock never sees a request id: retries by request id are not a feature it "
                              "claims",
               "linearizable": "the lease model holds retries sharing a request id to one operation (C17) and "
                               "grants to increasing tokens; redis-py's Lock never sees a request id"}


def commit_mode_of(test: Test, default: str) -> str:
    """`test.commit_mode` (fenced / unfenced), else the system's default."""
    mode = test.commit_mode or default
    return mode


def valkey_lock_system(test: Test, node: str, service_instance_id: str, *, timeout_s: float = 5.0):
    """redis-py's Lock on Valkey (SET NX PX, token-checked release/extend); no fencing token, unfenced writes."""
    valkey, store = _urls(test, node)
    return ValkeyLockSystem(valkey, store, service_instance_id=service_instance_id, timeout_s=timeout_s,
                            commit_mode=commit_mode_of(test, "unfenced"))


def fenced_valkey_lock_system(test: Test, node: str, service_instance_id: str, *, timeout_s: float = 5.0):
    """redis-py's Lock plus an INCR fencing token; commits through the store's token guard (or unfenced)."""
    valkey, store = _urls(test, node)
    return FencedValkeyLockSystem(valkey, store, service_instance_id=service_instance_id, timeout_s=timeout_s,
                                  commit_mode=commit_mode_of(test, "fenced"))


def check_valkey_lock(test: Test) -> None:
    """Before anything starts: `valkey-lock` cannot commit fenced (it has no token); modes are known."""
    mode = test.commit_mode
    if mode is not None and mode not in COMMIT_MODES:
        raise SutError(f"--commit-mode must be one of {', '.join(COMMIT_MODES)}, not {mode!r}")
    if mode == "fenced" and test.sut_name() == "valkey-lock":
        raise SutError("SUT 'valkey-lock' hands out no fencing token, so it cannot commit through the store's token "
                       "guard: use --commit-mode unfenced, or SUT 'valkey-lock-fenced'")
    if test.urls:
        raise SutError(f"SUT {test.sut_name()!r} talks to Valkey directly: it runs on a lab stack, not with --url")
