"""The Python side of the planted bugs: the classes a mutant server is built from (see lab/server/mutants).

`server_parts(settings)` is the one entry point `LeaseServer` calls, and only
when `settings.mutant` is set: it returns the mutant's settings and the backend,
lease-service and commit-service classes to build the server from. Every mutant
gets `MutantBackend`, whose scripts carry the mutant's Lua patches (none for the
settings-only mutants); a few replace more:

- `NonatomicAcquireService` (nonatomic-acquire): acquire as GET then SET. The
  server reads the record in one round trip and decides "free" itself, then runs
  the write step (the acquire script without its free-check) in another. An
  awaited hook between the two (`hooks["between"]`) lets tests hold one acquire
  there deterministically; lab runs rely on ordinary concurrency.
- `LocalClockBackend` (local-clock): every script call gets the server's
  `time.time()` as its last argument, which the patched `now_ms()` returns.
- `NoIdempotencyCommits` (no-idempotency): a commit's final idempotency record
  is not written either (the scripts neither read nor write theirs).
- `RenewWithoutBackendService` (renew-without-backend): a circuit breaker
  around Valkey that answers renewals from the server's own memory of the
  leases it granted while Valkey is failing or slow.
- `RestartDropsLeasesBackend` (restart-drops-leases): at start-up, deletes
  every unexpired lease record.
- `IdleHolderRefencedService` (idle-holder-refenced): a renew or release from a
  holder silent for a second gets the lease a fresh fencing token.
- `LateUnguardedCommits` (late-unguarded-commit): a commit validated with less
  than a fifth of its lease's TTL left is written a fifth of the TTL later, and
  that write does not show its token to the store's guard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import re
import time
from typing import Any, Awaitable, Callable, Sequence

from lab.server import backend as keys
from lab.server.backend import ACTIVE_INDEX, Backend, BackendError, NotStarted
from lab.server.identity import KEY_PREFIX
from lab.server.commit import CommitService
from lab.server.errors import LeaseError
from lab.server.mutants import LuaPatch, Mutant, get_mutant
from lab.server.scripts import LUA_DIR, Script
from lab.server.service import LeaseService, Outcome, rfc3339_ms
from lab.server.settings import Settings
from lab.server.wire import now_ms

log = logging.getLogger("lab.server.mutants")

Hook = Callable[[], Awaitable[None]]


class MutantError(RuntimeError):
    """A mutant's Lua patch does not apply to the scripts (the built-in Lua changed)."""


def patch_scripts(scripts: dict[str, Script], patches: Sequence[LuaPatch]) -> dict[str, Script]:
    """The scripts with every patch applied: `common` patches to every script's helpers, others to one body."""
    common = (LUA_DIR / "common.lua").read_text(encoding="utf-8")
    out = {}
    for name, script in scripts.items():
        if not script.source.startswith(common + "\n"):  # pragma: no cover - scripts.py prepends it
            raise MutantError(f"{name}: the script does not start with common.lua")
        head, body = common, script.source[len(common) + 1:]
        for p in patches:
            if p.part == "common":
                head = _replace_once(head, p, "common.lua")
            elif p.part == name:
                body = _replace_once(body, p, f"{name}.lua")
        source = head + "\n" + body
        changed = source != script.source
        out[name] = Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest(),
                           script.overridden or changed)
    unknown = {p.part for p in patches} - set(scripts) - {"common"}
    if unknown:
        raise MutantError(f"a patch names {sorted(unknown)[0]!r}, which is not a script")
    return out


def _replace_once(text: str, patch: LuaPatch, where: str) -> str:
    """`text` with `patch.old` replaced; MutantError unless it occurs exactly once."""
    n = text.count(patch.old)
    if n != 1:
        raise MutantError(f"{where}: the text a mutant patch replaces occurs {n} times, not once: {patch.old!r}")
    return text.replace(patch.old, patch.new)


class MutantBackend(Backend):
    """The backend with the mutant's Lua patches applied to every script it loads."""

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.mutant: Mutant = get_mutant(settings.mutant)
        self.scripts = patch_scripts(self.scripts, self.mutant.patches)


_LOCK_KEY = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]{43}\Z")  # a lease record's key (the lock key)


class RestartDropsLeasesBackend(MutantBackend):
    """restart-drops-leases: at start-up the server deletes every unexpired lease record.

    MUTANT(restart-drops-leases). "Clean start" housekeeping when a server instance starts: it takes
    every live lease for one granted to a client of its previous life, dead with it, and deletes the
    record (DEL lock key, out of the active index). No holder is told: a holder that still runs, on
    another server or reconnecting to this one, holds a lease whose identity is free again, and the next
    acquirer gets it (C9: a lease ends by expiry, release or an audited admin action). Only a server
    (re)start runs it: a run whose servers start once, over an empty Valkey, never shows it.
    """

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        try:
            deadline = loop.time() + 5.0
            now_s, us = await self.command(deadline, "TIME")
            now = int(now_s) * 1000 + int(us) // 1000
            cursor, dropped = "0", 0
            while True:
                cursor, names = await self.command(deadline, "SCAN", cursor, "MATCH", KEY_PREFIX + "*", "COUNT", 1000)
                for name in names:
                    if not _LOCK_KEY.match(name):
                        continue  # a counter, a high-water mark, an index: not a lease record
                    expires = await self.command(deadline, "HGET", name, "expires_at")
                    if expires is not None and int(expires) > now:  # MUTANT(restart-drops-leases): dropped
                        await self.command(deadline, "DEL", name)
                        await self.command(deadline, "ZREM", ACTIVE_INDEX, name)
                        dropped += 1
                if str(cursor) == "0":
                    break
            log.warning("restart-drops-leases: deleted %d live lease records at start-up", dropped)
        except Exception as e:  # noqa: BLE001 - a planted bug's housekeeping must not stop the server
            log.warning("restart-drops-leases: %s", type(e).__name__)


class LocalClockBackend(MutantBackend):
    """local-clock: the server's wall clock rides along as every script's last argument."""

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Any], deadline: float,
                  incarnation: str = "") -> list:
        return await super().run(name, keys, [*args, int(time.time() * 1000)], deadline, incarnation)


class NonatomicAcquireService(LeaseService):
    """nonatomic-acquire: the free-check is a separate read, so concurrent acquires can all pass it."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.hooks: dict[str, Hook] = {}  # "between": awaited after the read, before the write

    async def run(self, name: str, key_list: list[str], args: list[Any], deadline: float, *, mutation: bool,
                  incarnation: str = "") -> list:
        if name != "acquire":
            return await super().run(name, key_list, args, deadline, mutation=mutation, incarnation=incarnation)
        lock_key, idempotency_key = key_list[0], key_list[3]
        try:
            (now_s, us), (expires,), replay = await self.backend.pipeline(
                [("TIME",), ("HMGET", lock_key, "expires_at"), ("EXISTS", idempotency_key)], deadline)
        except NotStarted:
            raise LeaseError("deadline_exceeded", "the deadline passed before the request reached the lease store",
                             backend_health="not_contacted") from None
        except (BackendError, ValueError, TypeError):
            raise LeaseError("lease_backend_unavailable", "the lease store is unavailable; nothing was changed",
                             retry_after_ms=200, backend_health="unavailable") from None
        now = int(now_s) * 1000 + int(us) // 1000
        if not replay and expires is not None and expires.isdigit() and int(expires) > now:
            return ["lease_conflict", str(now), str(int(expires) - now)]
        hook = self.hooks.get("between")
        if hook is not None:
            await hook()
        return await super().run(name, key_list, args, deadline, mutation=mutation, incarnation=incarnation)


class NoIdempotencyCommits(CommitService):
    """no-idempotency: the commit's final idempotency record is not written (nothing would read it)."""

    async def remember(self, *args: Any, **kw: Any) -> None:
        return None


_UNAVAILABLE = frozenset(("lease_backend_unavailable", "lease_outcome_unknown"))


class RenewWithoutBackendService(LeaseService):
    """renew-without-backend: while Valkey is down or slow, renewals are answered from the server's memory.

    MUTANT(renew-without-backend). A "circuit breaker" meant to ride out backend trouble: the server
    remembers every lease it granted or renewed. A renew that Valkey refuses outright (connection refused:
    Valkey is down) is answered `lease_renewed` from memory, the expiry moved by the server's clock. The
    breaker probes Valkey (PING every `PROBE_S`) and watches acquires and renews: every `SLOW_S` that one of
    them waits for Valkey is a strike (a call hanging for 0.5 s strikes four times); once `STRIKES` strikes
    span at least `SUSTAINED_S` within a second (sustained trouble, not one slow reply or one stall of this
    process), the breaker opens for `OPEN_S` and renewals are answered from memory without waiting for
    Valkey. Valkey never extends those leases: their holders believe them valid after Valkey let them
    expire, and after a successor took the identity (C12, C20; races table: backend unavailable, "no assumed
    success").
    """

    PROBE_S = 0.1
    SLOW_S = 0.12
    STRIKES = 3
    SUSTAINED_S = 0.2
    OPEN_S = 5.0

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.granted: dict[str, dict[str, Any]] = {}  # lease_id -> the lease object last returned
        self.strikes: list[float] = []
        self.open_until = 0.0
        self._probe: asyncio.Task | None = None

    def _remember(self, out: Outcome) -> Outcome:
        lease = out.lease
        if isinstance(lease, dict) and lease.get("lease_id") and lease.get("state", "active") == "active":
            self.granted[lease["lease_id"]] = dict(lease)
        return out

    def _start_probe(self) -> None:
        if self._probe is None:
            self._probe = asyncio.create_task(self._probing(), name="renew-without-backend probe")

    async def _probing(self) -> None:
        """PING Valkey every PROBE_S; a strike for every SLOW_S a ping waits."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.PROBE_S)
            try:
                await (await self._timed(self.backend.command(loop.time() + 1.0, "PING")))
            except Exception:  # noqa: BLE001 - a failed probe is a strike; the prober never dies
                self._strike()

    def _strike(self) -> None:
        now = asyncio.get_running_loop().time()
        self.strikes = [t for t in self.strikes if now - t < 1.0] + [now]
        if len(self.strikes) >= self.STRIKES and self.strikes[-1] - self.strikes[0] >= self.SUSTAINED_S:
            if not self._open():
                log.warning("renew-without-backend: breaker open for %.1f s (Valkey slow or silent)", self.OPEN_S)
            self.open_until = now + self.OPEN_S

    def _open(self) -> bool:
        return asyncio.get_running_loop().time() < self.open_until

    async def _timed(self, coro: Any) -> asyncio.Future:
        """Start the call; a strike every SLOW_S it waits for Valkey (until it answers or the breaker opens)."""
        task = asyncio.ensure_future(coro)
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=self.SLOW_S)
            if done:
                break
            self._strike()
            if self._open():
                break
        return task

    def _from_memory(self, principal: Any, req: Any) -> Outcome | None:
        lease = self.granted.get(req.lease_id)
        if lease is None or lease.get("fencing_token") != req.fields.get("fencing_token") \
                or lease.get("owner_principal_id") != principal.principal_id \
                or lease.get("service_instance_id") != req.service_instance_id:
            return None
        now = now_ms()
        ttl = int(req.fields.get("ttl_ms") or lease["ttl_ms"])
        expires = min(now + ttl, int(lease["acquired_at_ms"]) + int(lease["maximum_lifetime_ms"]))
        lease = dict(lease, renewed_at=rfc3339_ms(now), renewed_at_ms=now, expires_at=rfc3339_ms(expires),
                     expires_at_ms=expires, ttl_ms=ttl, state="active")
        self.granted[req.lease_id] = lease
        return Outcome("lease_renewed", lease, {"backend_time_ms": now},
                       {"backend_time_ms": now, "lease_id": lease["lease_id"], "fencing_token": lease["fencing_token"],
                        "effective_ttl_ms": ttl, "previous_state": "active", "resulting_state": "active"})

    async def acquire(self, principal: Any, req: Any) -> Outcome:
        self._start_probe()
        task = await self._timed(super().acquire(principal, req))
        return self._remember(await task)

    async def renew(self, principal: Any, req: Any) -> Outcome:
        self._start_probe()
        if self._open():  # MUTANT(renew-without-backend): breaker open, Valkey is not asked
            out = self._from_memory(principal, req)
            if out is not None:
                return out
        task = await self._timed(super().renew(principal, req))
        if not task.done() and self._open():
            out = self._from_memory(principal, req)  # MUTANT(renew-without-backend): assumed success
            if out is not None:
                task.cancel()
                return out
        try:
            return self._remember(await task)
        except LeaseError as e:
            if e.code == "lease_lost":
                self.granted.pop(req.lease_id, None)
                raise
            if e.code not in _UNAVAILABLE:
                raise
            self._strike()
            if e.submitted is False or self._open():  # Valkey refused (down), or the breaker opened meanwhile
                out = self._from_memory(principal, req)  # MUTANT(renew-without-backend): assumed success
                if out is not None:
                    return out
            raise

    async def release(self, principal: Any, req: Any) -> Outcome:
        self.granted.pop(req.lease_id, None)
        return await super().release(principal, req)


class IdleHolderRefencedService(LeaseService):
    """idle-holder-refenced: a holder that calls after a second of silence gets its lease "re-fenced".

    MUTANT(idle-holder-refenced). The server remembers when the holder of each lease it granted last
    called it. A renew or release from a holder that has been silent for `IDLE_S` is taken for a client
    that reconnected after a pause and, "to be safe", the lease gets a fresh fencing token: the identity's
    counter is incremented, the record rewritten, and the answer carries the new token. The lease id stays,
    so the holder keeps acting on one lease whose token changed under it (C7: a lease's token never
    changes; C12, C13). A holder that never comes back, or calls without a pause, never sees it.
    """

    IDLE_S = 1.0

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.last_call: dict[str, float] = {}  # lease_id -> when its holder last called (loop time)

    def _idle(self, lease_id: str) -> bool:
        now = asyncio.get_running_loop().time()
        last = self.last_call.get(lease_id)
        self.last_call[lease_id] = now
        return last is not None and now - last >= self.IDLE_S

    async def _refence(self, out: Outcome, lock_key: str, rewrite: bool) -> Outcome:
        """MUTANT(idle-holder-refenced): a new token for the lease, in Valkey (when still held) and in the answer."""
        lease = out.lease
        if not isinstance(lease, dict):
            return out
        deadline = asyncio.get_running_loop().time() + 1.0
        token = int(await self.backend.command(deadline, "INCR", keys.fence_key(lock_key)))
        if rewrite:
            await self.backend.command(deadline, "HSET", lock_key, "fencing_token", token)
        log.warning("idle-holder-refenced: lease %s token %s -> %s", lease.get("lease_id"), lease.get("fencing_token"),
                    token)
        return Outcome(out.code, dict(lease, fencing_token=token), out.extra, dict(out.audit, fencing_token=token))

    async def acquire(self, principal: Any, req: Any) -> Outcome:
        out = await super().acquire(principal, req)
        if isinstance(out.lease, dict) and out.lease.get("lease_id"):
            self.last_call[out.lease["lease_id"]] = asyncio.get_running_loop().time()
        return out

    async def renew(self, principal: Any, req: Any) -> Outcome:
        idle = self._idle(req.lease_id)
        out = await super().renew(principal, req)
        return await self._refence(out, req.identity.lock_key(), True) if idle else out

    async def release(self, principal: Any, req: Any) -> Outcome:
        idle = self._idle(req.lease_id)
        self.last_call.pop(req.lease_id, None)
        out = await super().release(principal, req)
        return await self._refence(out, req.identity.lock_key(), False) if idle else out


class LateUnguardedCommits(CommitService):
    """late-unguarded-commit: a commit validated near its lease's expiry is written later, past the guard.

    MUTANT(late-unguarded-commit). The server expects a store write to take up to a fifth of the lease's TTL;
    a commit validated with less than that left on its lease is handed to a "late path" that waits that long
    (a slow store connection, a write-behind queue) and then writes conditional on `_rev` only: where the
    document already holds a newer token, the write keeps the document's fence fields, so the store's guard
    never sees the stale token. A successor that takes the identity at the expiry and commits at once lands
    first; the late write appends the older token's entry after it (C27: the write must be guarded by the
    token, not only the validation; C29). Commits validated earlier in their lease take the fenced path.
    """

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._late: set[int] = set()  # the requests on the late path (by identity: a request is not hashable)

    async def conditional_write(self, principal: Any, req: Any, token: int, validated_at: int, deadline: float,
                                db: str) -> Any:
        late_s = await self._late_by(req, validated_at, deadline)
        if late_s is None:
            return await super().conditional_write(principal, req, token, validated_at, deadline, db)
        await self._hook("late", req)  # tests hold a late write here (the lab's runs never set it)
        await asyncio.sleep(max(0.0, min(late_s, deadline - asyncio.get_running_loop().time() - 0.05)))
        self._late.add(id(req))  # the base's read-rebuild-write loop, with `build` keeping a newer fence record
        try:
            return await super().conditional_write(principal, req, token, validated_at, deadline, db)
        finally:
            self._late.discard(id(req))

    def build(self, current: Any, principal: Any, req: Any, token: int, validated_at: int) -> Any:
        new = super().build(current, principal, req, token, validated_at)
        if (id(req) in self._late and current is not None and isinstance(current.get("fence_token"), int)
                and current["fence_token"] > token):
            for k, v in current.items():  # the newer holder's fence record stays: the guard sees no regression
                if k.startswith("fence_") and k != "fence_applied":
                    new[k] = v
        return new

    async def _late_by(self, req: Any, validated_at: int, deadline: float) -> float | None:
        """Seconds the late path waits (a fifth of the TTL), when this lease has less than that left; else None."""
        lease_id, expires_at, ttl_ms = await self.service.backend.command(
            deadline, "HMGET", req.identity.lock_key(), "lease_id", "expires_at", "ttl_ms")
        if lease_id is None or expires_at is None or ttl_ms is None:
            return None
        if (lease_id.decode() if isinstance(lease_id, bytes) else lease_id) != req.lease_id:
            return None  # a retry continuing an old validation after a takeover: the fenced path
        late_ms = int(ttl_ms) / 5
        return late_ms / 1000 if int(expires_at) - validated_at < late_ms else None


_VARIANTS: dict[str, type] = {c.__name__: c for c in (
    LocalClockBackend, RestartDropsLeasesBackend, NonatomicAcquireService, NoIdempotencyCommits,
    RenewWithoutBackendService, IdleHolderRefencedService, LateUnguardedCommits)}


def server_parts(settings: Settings) -> tuple[Settings, type[Backend], type[LeaseService], type[CommitService]]:
    """The mutant's settings and the (backend, service, commits) classes to build its server from."""
    mutant = get_mutant(settings.mutant)
    settings = dataclasses.replace(settings, **mutant.settings).validate() if mutant.settings else settings
    parts: dict[type, type] = {Backend: MutantBackend, LeaseService: LeaseService, CommitService: CommitService}
    for name in mutant.variants:
        cls = _VARIANTS[name]
        for base in parts:
            if issubclass(cls, base):
                parts[base] = cls
    log.warning("PLANTED BUG: mutant %s is active (%s)", mutant.name, mutant.bug)
    return settings, parts[Backend], parts[LeaseService], parts[CommitService]
