"""The recovery rule: after Valkey restarts or is restored, no fencing token is ever issued twice (C5).

A Valkey that restarts from its files (or from an older snapshot, or a replica
that takes over) may have rolled every fencing counter back: the races table's
"backup / restore, failover" row asks that the counter never goes below a token
accepted downstream, "otherwise a higher epoch and all restored leases invalid".
This server takes the epoch branch, because proving the counters is not enough:
a token issued after the snapshot and never committed (or validated, its
high-water mark lost with the snapshot, and still on its way to the store) is
known to nobody, yet a second holder with the same token would pass the
store's `<` guard.

- Tokens live in epochs: epoch `e` issues tokens in `(e << 32, (e+1) << 32)`.
  The acquire script takes the floor `e << 32` and the ceiling
  `(e+1) << 32 - 1` as arguments: `token = max(counter, floor) + 1`.
- The epoch is durable in the document store, not in Valkey: the local document
  `_local/lease-epoch` of `store_db`, `{epoch, floor, valkey_run_id, ...}`,
  changed only with `_rev` compare-and-set.
- Detection: Valkey's `run_id` changes on every restart. The server compares it
  on every new connection (the backend's `connect_hook`, before any command is
  written on it), every `recovery_check_interval_ms`, and whenever a call is
  refused. Enforcement does not depend on detection being quick: every
  connection is stamped with the `run_id` of the Valkey it reaches (`INFO
  server`, once, before anything else is written on it: backend.py), and every
  mutation is written only on a connection stamped with the run_id the server
  has recovered for; on any other it is refused (`recovering`) unsent. A TCP
  connection reaches one Valkey process for its whole life, so a restored
  Valkey can never serve an acquire, renew, release, admin ending or commit
  validation before this server has recovered for that very incarnation.
  (Until issue 13 each script compared `INFO server` itself, in every call:
  the same check, at about 13 us of Valkey CPU per operation.)
- Recovery for run_id R: read the epoch document. If it was established for R
  (another instance, or this one before a restart, already recovered this
  incarnation) adopt its epoch. Otherwise the new epoch is the old one + 1, and
  at least `ceil(highest / 2^32)` where `highest` is the largest token seen
  anywhere: Valkey's counters and high-water marks, the store documents'
  `fence_token`s, the old floor; write it with `_rev` CAS (on a conflict,
  start over: another instance won and is adopted). Then sweep: every restored
  active record whose token is below the floor is ended as `revoked`
  (`ended_by = lease-server:recovery`), so its holder's renew, release and
  commit fail closed with `lease_lost`. Only then does the server accept
  mutations again (until then: 503 `lease_backend_unavailable`, retryable,
  `submitted: false`).
- A fresh store and an empty Valkey start at epoch 0 (tokens 1, 2, ...).

The epoch needs a store (`store_url`). Without one there is no durable place
for a new epoch, so the rule **fails closed**: the first Valkey incarnation the
server sees is trusted (epoch 0, as a fresh start over a store would be), and
after any restart or restore (a new `run_id`) every mutation stays refused
(503, `submitted: false`, `/healthz` 503 `failed_closed`) until an operator
restarts the server, because the restarted Valkey may have lost or rolled back
counters and re-issuing a token is what C5 forbids (a Valkey without durable
persistence loses every counter in a crash). `recovery: off` (the
`counter-from-snapshot` planted bug, `--allow-mutants` only) trusts whatever
counters Valkey comes back with.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Callable

import orjson
from redis.asyncio.connection import Connection

from lab.server.backend import ACTIVE_INDEX, RECOVERY_KEY, Backend, BackendError, history_key
from lab.server.identity import KEY_PREFIX
from lab.server.settings import Settings
from lab.server.store import EPOCH_DOC, DocumentStore, StoreError
from lab.server.wire import now_ms

log = logging.getLogger("lab.server.recovery")

EPOCH_BITS = 32
UNVERIFIED = "unverified"  # never a run_id (those are hex), so every gated script refuses
_LOCK_KEY_RE = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]{43}\Z")
_COUNTER_SUFFIXES = (":fence", ":hwm")
SCAN_COUNT = 1000
CAS_ATTEMPTS = 8
RETRY_DELAY_S = 0.1


class RecoveryFailed(Exception):
    """Recovery cannot complete (the store refused, or no epoch is left under fence_max)."""


class RecoveryGate:
    """What the mutation scripts are told about the Valkey incarnation, and the token range of this epoch."""

    def __init__(self, active: bool):
        self.active = active
        self.run_id: str | None = None  # the Valkey incarnation recovered for
        self.epoch = 0
        self.floor = 0
        self.state = "unverified" if active else "inactive"
        self.recoveries = 0
        self.first_run_id: str | None = None  # without a store: the only incarnation mutations are allowed on
        self.last_error: str | None = None
        self._wake: Callable[[], None] = lambda: None

    @property
    def ready(self) -> bool:
        return not self.active or self.state == "ready"

    def expected_run_id(self) -> str:
        """The scripts' argument: '' (no gate), the recovered run_id, or a value no Valkey has."""
        if not self.active:
            return ""
        return self.run_id or UNVERIFIED

    def ceiling(self, fence_max: int) -> int:
        """The largest token this epoch may issue."""
        if not self.active:
            return fence_max
        return min(fence_max, ((self.epoch + 1) << EPOCH_BITS) - 1)

    def lost(self) -> None:
        """The Valkey incarnation changed (or is unknown): refuse mutations and recover."""
        if self.active:
            self.run_id = None
            if self.state != "failed_closed":
                self.state = "recovering"
            self._wake()

    def refused(self, expected: str) -> None:
        """A script refused: if it was given the run_id we believed in, that Valkey is gone."""
        if self.active and expected and expected == self.run_id:
            self.lost()
        else:
            self._wake()

    def established(self, run_id: str, epoch: int, floor: int) -> None:
        self.run_id, self.epoch, self.floor, self.state = run_id, epoch, floor, "ready"
        self.last_error = None

    def describe(self) -> dict[str, Any]:
        """For /healthz."""
        out: dict[str, Any] = {"state": self.state}
        if self.active:
            out.update(epoch=self.epoch, floor=self.floor)
            if self.last_error:
                out["last_error"] = self.last_error
        return out


class Recovery:
    """Detects a new Valkey incarnation and re-establishes the fencing floor before mutations resume."""

    def __init__(self, settings: Settings, backend: Backend, store: DocumentStore | None, gate: RecoveryGate,
                 on_revoked: Callable[[list[str], int], None] | None = None):
        self.settings = settings
        self.backend = backend
        self.store = store
        self.gate = gate
        self.on_revoked = on_revoked or (lambda flat, now: None)
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Recover once now (when the backends answer) and keep watching the run_id."""
        if not self.gate.active:
            return
        if self.store is None:
            log.warning("recovery rule without a store (no --store-url): no durable epoch, so after a Valkey restart "
                        "or restore mutations stay refused (fail closed) until this server is restarted")
        self.gate._wake = self._wake.set
        self.backend.stamp_incarnation = True
        self.backend.connect_hook = self._on_connect
        await self._check_logged()
        self._task = asyncio.create_task(self._watch(), name="recovery-watch")

    async def close(self) -> None:
        """Stop the watcher (re-cancelling: Python 3.11's timeout blocks can swallow one cancellation)."""
        self._closed = True
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task], timeout=0.5)

    # -- detection ------------------------------------------------------------
    async def _on_connect(self, conn: Connection) -> None:
        """Every new Valkey connection: a different run_id means a restart; refuse until recovered."""
        if await self.backend.stamp(conn) != self.gate.run_id:
            self.gate.lost()

    async def _watch(self) -> None:
        """Compare the run_id periodically and whenever woken; retry a failed recovery soon."""
        interval = self.settings.recovery_check_interval_ms / 1000
        delay = interval
        while not self._closed:
            try:  # asyncio.timeout: 3.11's wait_for can swallow the cancellation that stops this watcher
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            delay = interval if await self._check_logged() else min(interval, RETRY_DELAY_S)

    async def _check_logged(self) -> bool:
        """One check (and recovery when needed); False when it could not complete."""
        try:
            await self.check()
            return True
        except (BackendError, StoreError, RecoveryFailed) as e:
            error = f"{type(e).__name__}: {e}"
            # retried every RETRY_DELAY_S while it lasts: log each new problem once, not every retry
            log.log(logging.DEBUG if error == self.gate.last_error else logging.WARNING,
                    "recovery check failed: %s", error)
            self.gate.last_error = error
            return False
        except Exception as e:  # noqa: BLE001 - the watcher must survive anything; mutations stay refused
            self.gate.last_error = type(e).__name__
            log.exception("recovery check crashed")
            return False

    async def check(self) -> None:
        """Recover when the Valkey answering now is not the incarnation the floor was established for."""
        run_id = await self.backend.run_id(self._deadline())
        if run_id == self.gate.run_id and self.gate.state == "ready":
            return
        self.gate.lost()
        self._wake.clear()  # this call is the recovery the wake-up asked for
        await self.recover(run_id)

    # -- recovery ---------------------------------------------------------------
    async def recover(self, run_id: str) -> None:
        """Establish (or adopt) the epoch for Valkey incarnation `run_id`, sweep restored leases, then accept."""
        async with self._lock:
            if self.store is None:
                self._without_store(run_id)
                return
            await self.store.prepare(self._deadline())
            epoch, adopted = await self._establish(run_id)
            floor = epoch << EPOCH_BITS
            revoked = await self._sweep(run_id, epoch, floor)
            await self.backend.command(self._deadline(), "SET", RECOVERY_KEY, orjson.dumps(
                {"epoch": epoch, "floor": floor, "run_id": run_id, "at_ms": now_ms()}))
            self.gate.established(run_id, epoch, floor)
            self.gate.recoveries += 1
            log.warning("recovery: Valkey run_id %s, epoch %d (%s), floor %d, %d restored leases revoked",
                        run_id, epoch, "adopted" if adopted else "new", floor, revoked)

    def _without_store(self, run_id: str) -> None:
        """No store: trust the first incarnation this server sees; any later one fails closed."""
        if self.gate.first_run_id is None:
            self.gate.first_run_id = run_id
        if run_id != self.gate.first_run_id:
            self.gate.state = "failed_closed"
            raise RecoveryFailed(f"Valkey restarted or was restored (run_id {self.gate.first_run_id} -> {run_id}); "
                                 "without a store (--store-url) there is no durable epoch above the tokens already "
                                 "issued, so mutations stay refused until an operator restarts this server")
        self.gate.established(run_id, 0, 0)
        self.gate.recoveries += 1
        log.warning("recovery: Valkey run_id %s trusted (no store: epoch 0; a restart of it fails closed)", run_id)

    async def _establish(self, run_id: str) -> tuple[int, bool]:
        """The epoch for `run_id`: adopted from the epoch document, or a new one written with _rev CAS."""
        assert self.store is not None
        for _ in range(CAS_ATTEMPTS):
            doc = await self.store.get(self.store.db, EPOCH_DOC, self._deadline())
            if doc is not None and doc.get("valkey_run_id") == run_id:
                return _int(doc.get("epoch"), "epoch"), True
            highest = max(await self._valkey_highest(), await self._store_highest(),
                          _int(doc.get("floor", 0), "floor") if doc else 0)
            epoch = _int(doc.get("epoch"), "epoch") + 1 if doc else 0
            epoch = max(epoch, -(-highest >> EPOCH_BITS))  # floor = epoch << 32 >= every token seen
            if (epoch << EPOCH_BITS) + 1 > self.settings.fence_max:
                raise RecoveryFailed(f"epoch {epoch} would start above fence_max; acquisitions stay refused")
            new = {"_id": EPOCH_DOC, "epoch": epoch, "floor": epoch << EPOCH_BITS, "valkey_run_id": run_id,
                   "highest_seen": highest, "established_at_ms": now_ms(),
                   "established_by": self.settings.instance_id,
                   "previous": {"epoch": doc.get("epoch"), "valkey_run_id": doc.get("valkey_run_id")} if doc else None}
            if doc is not None:
                new["_rev"] = doc["_rev"]
            res = await self.store.put(self.store.db, EPOCH_DOC, new, self._deadline())
            if res.ok:
                return epoch, False
            if not res.conflict:
                raise RecoveryFailed(f"the store refused the epoch document: {res.status} {res.error}")
        raise RecoveryFailed("the epoch document kept changing")

    async def _scan(self) -> tuple[list[str], list[str]]:
        """(lock keys, counter and high-water-mark keys) present in Valkey."""
        records: list[str] = []
        counters: list[str] = []
        cursor = "0"
        while True:
            reply = await self.backend.command(self._deadline(), "SCAN", cursor, "MATCH", KEY_PREFIX + "*",
                                               "COUNT", SCAN_COUNT)
            cursor, names = str(reply[0]), reply[1]
            for name in names:
                if name.endswith(_COUNTER_SUFFIXES):
                    counters.append(name)
                elif _LOCK_KEY_RE.match(name):
                    records.append(name)
            if cursor == "0":
                return records, counters

    async def _valkey_highest(self) -> int:
        """The largest fencing counter or high-water mark in Valkey."""
        _, counters = await self._scan()
        highest = 0
        for i in range(0, len(counters), 500):
            for v in await self.backend.command(self._deadline(), "MGET", *counters[i:i + 500]):
                if v is not None and str(v).isdigit():
                    highest = max(highest, int(v))
        return highest

    async def _store_highest(self) -> int:
        """The largest fence_token the store has accepted (both databases in the unfenced mode)."""
        assert self.store is not None
        highest = 0
        for db in {self.store.db, self.store.commit_db}:
            for doc in await self.store.all_docs(db, self._deadline()):
                token = doc.get("fence_token")
                if isinstance(token, int) and not isinstance(token, bool):
                    highest = max(highest, token)
        return highest

    async def _sweep(self, run_id: str, epoch: int, floor: int) -> int:
        """End every restored unexpired record below the floor as revoked; the count."""
        s = self.settings
        records, _ = await self._scan()
        revoked = 0
        reason = f"recovery: Valkey restarted or restored; epoch {epoch}, tokens below {floor} invalid"
        for key in records:
            res = await self.backend.run("recover", [key, history_key(key), ACTIVE_INDEX],
                                         [floor, s.history_max_entries, s.history_retention_ms,
                                          s.idempotency_ttl_ms, reason], self._deadline(), incarnation=run_id)
            if res[0] == "recovering":
                raise RecoveryFailed("Valkey changed again during recovery")
            if res[0] == "revoked":
                revoked += 1
                self.on_revoked(res[2], int(res[1]))
        return revoked

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.settings.max_backend_timeout_ms / 1000


def _int(value: Any, name: str) -> int:
    """A non-negative integer from the epoch document, or RecoveryFailed (fail closed on a damaged document)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RecoveryFailed(f"the epoch document's {name} is not a non-negative integer")
    return value
