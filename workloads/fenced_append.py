"""The `fenced-append` workload: commits through the fenced-write path into a CouchDB-API store.

Each session is a holder with its own service instance that appends entries
`[process, token, n]` to its key's document through the server's fenced
commit (`POST /api/v1/commits`), renewing between commits. Sessions are of
three kinds, run by lanes of threads as in the lease workload
(`workloads.common.exercise`):

- plain: acquire, commit / renew three times, release; a commit is sometimes
  retried with the same request_id (it must return the original result);
- stalled: wait on the takeover key (`k0`) until it is held (a waiting
  acquire, `wait_ms`: the server retries until the holder's lease expires,
  C22; a system without one is polled at the lane's pace), commit the moment
  it is held, send seven commits with deadlines spread over 4-180 ms
  (validated, perhaps never written: their answers are lost), send its last
  commit at 0.90-0.93 x the TTL after its acquire completed (in the lease's
  final tenth: the expiry is at most one TTL after that), stall until
  1.15-1.6 x the TTL after the acquire, then carry on with the lease it still
  believes it holds: a fresh commit, the lost commits retried with their
  request_ids and bodies (the server may finish them under their original
  validation, C29), renew, commit, release. Meanwhile the other takeover
  thread, waiting on the key, has taken it over at the expiry and committed
  at once, so the stale holder's commits arrive on both sides of its
  successor's, its last one perhaps still in flight across the takeover: the
  boundary must refuse the fresh ones and never let a lost or late one land
  over a successor's write (C26, C27);
- solo: the same on a key of its own, stalling until 1.05-1.5 x the TTL.

Every second the burst lane's threads acquire one fresh key in the same
instant (a burst), commit and release. A final phase reads back every
document a commit was sent to (the `--keys` ones, each burst's and each solo
key's). The stale-commit checker then proves that no accepted commit
carries a lower token than one accepted before it, none was validated after
its lease expired, no acknowledged commit is lost and none is applied twice;
the fencing, mutual-exclusion, lease-state and idempotency checkers judge
the leases and retries, and the lease model's linearizability checker the
whole history (`checkers.linear.lease_linearizable`). Every completion keeps what the client sent
(`value.sent`) and what came back.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import lab.generator as gen
from checkers.core import compose, get_checker
from checkers.linear import lease_linearizable
from checkers.stale_write import StaleWriteChecker
from lab.client import new_request_id
from lab.couch import CouchClient, CouchError
from lab.sut import WorkloadNeeds
from lab.sut.probe import lab_owns_store, store_db
from workloads.base import Workload
from workloads.common import (SOLO_STALL, TAKEOVER_STALL, acquire_until_held, completion, exercise, identity_for,
                              key_names, remaining_s, request_id, sent, session_id, session_start, stall_s)
from workloads.lease import LeaseDriver

DOC = __doc__
NEEDS = WorkloadNeeds("fenced-append", capabilities=frozenset({"commit"}), store=True)  # commits through the fenced boundary
DB = "fencelab"


def store_url(test) -> str:
    """The store's URL with its credentials (kept out of test.json: `test.live.store` is the redacted one)."""
    return test.live.store_url or test.live.store


def doc_id(key: str) -> str:
    """The store document a key's holders append to."""
    return f"doc-{key}"


class FencedAppendDriver(LeaseDriver):
    """The lease workload's driver plus fenced commits and final reads of the store."""

    NEEDS = NEEDS

    def __init__(self, *args: Any, store_db: dict | None = None, counter: Any = None, **kw: Any):
        super().__init__(*args, **kw)
        self.counter = itertools.count(1) if counter is None else counter  # shared: entries are unique
        # shared by every opened client: the database the boundary reports writing (a planted bug may use another)
        self.store_db = {"db": DB} if store_db is None else store_db

    def _shared(self) -> dict[str, Any]:
        return {"store_db": self.store_db, "counter": self.counter}

    async def setup(self, test) -> None:
        """Create the store database and the lab's fence guard, only in a store the lab owns.

        The guard (validate_doc_update) is protection the lab would be supplying: in the system's own store
        (--store-url, not --lab-owns-store) nothing is installed and the database is the server's (--store-db).
        """
        self.store_db["db"] = store_db(test)
        if not lab_owns_store(test):
            return
        async with CouchClient(store_url(test)) as couch:
            await couch.ensure_db(self.store_db["db"])

    async def invoke(self, test, op: dict[str, Any]) -> dict[str, Any]:
        f, key = op["f"], op.get("key")
        if f == "commit":
            await self.before_request(test, op)
            return await self._commit(test, op, key)
        if f == "read":
            return await self._read(test, key)
        return await super().invoke(test, op)

    async def _commit(self, test, op: dict[str, Any], key: str) -> dict[str, Any]:
        value = op.get("value") or {}
        sess = self.session_for(test, op)
        request_id = value.get("request_id") or new_request_id()
        lease = sess.lease
        if lease is None:
            return {"type": "fail", "value": {"request_id": request_id, "doc": doc_id(key)}, "error": "not_held"}
        # a retry sends the same body: the entry is the one its first attempt made
        entry = sess.entries.setdefault(request_id, [op["process"], lease.fencing_token, next(self.counter)])
        attempted = {"request_id": request_id, "doc": doc_id(key), "entry": entry, "lease_id": lease.lease_id,
                     "fencing_token": lease.fencing_token, "sent": sent(request_id, lease)}
        r = await self.api.commit(lease, doc_id(key), {"append": entry}, identity=identity_for(key),
                                  request_id=request_id, deadline_s=self.deadline_for(value))
        if r.ok:
            data = (r.data or {}).get("commit") or r.data or {}
            if data.get("db"):
                self.store_db["db"] = data["db"]
            done = dict(attempted, rev=data.get("rev"), accepted_token=data.get("accepted_token"),
                        validated_at_ms=data.get("validated_at_ms"))
            if data.get("replayed") or (r.data or {}).get("replayed"):
                done["replayed"] = True  # the server answered from an earlier attempt: `rev` is not this write's
            return completion(r, done)
        return completion(r, attempted)  # a lease_lost holder keeps its lease: a stale holder carries on

    async def _read(self, test, key: str) -> dict[str, Any]:
        """Read the key's document straight from the store (a read: an error is a definite `fail`)."""
        try:
            async with CouchClient(store_url(test)) as couch:
                d = await couch.get(self.store_db["db"], doc_id(key))
        except (CouchError, OSError, Exception) as e:  # noqa: BLE001 - a failed read has no effect
            return {"type": "fail", "value": {"doc": doc_id(key)}, "error": f"{type(e).__name__}: {e}"}
        if d is None:
            return {"type": "ok", "value": {"doc": doc_id(key), "entries": [], "token": None}}
        return {"type": "ok", "value": {"doc": doc_id(key), "entries": d.get("entries", []),
                                        "token": d.get("fence_token"), "lease_id": d.get("fence_lease_id")}}


def _op(f: str, key: str, value: Any) -> dict[str, Any]:
    return {"f": f, "key": key, "value": value}


# Commits whose answer is lost: validated perhaps (a `pending` record), written perhaps not. Where a deadline
# strikes (before sending, between the validation and the store write, after the write) depends on the load, so
# one lost commit per slice of a log scale: whatever a commit takes, one or two deadlines fall in its window.
LOST_COMMIT_DEADLINES_MS = ((4, 7), (7, 12), (12, 20), (20, 35), (35, 60), (60, 100), (100, 180))
# x TTL after the acquire completed: a stalled or solo holder's last commit before its stall, sent in its lease's
# final tenth (the expiry is at most one TTL after the acquire's ok; the lane's pacing may add a few ms more)
EDGE_AT = (0.90, 0.93)
DEADLINE_S = 2.0  # each request's deadline unless --deadline-s
STALLS = {"stalled": TAKEOVER_STALL, "solo": SOLO_STALL}
AFTER_S = 1.5  # seconds a stalled or solo holder's ten ops after its stall take at the lanes' pace


def session(keys: list[str], commits: int = 3):
    """One session as a function generator: a plain, stalled or solo holder (see the module docstring)."""

    def make(test, ctx, kind: str | None = None, end_ns: int | None = None):
        if kind in STALLS and remaining_s(test, ctx, end_ns) < int(test.ttl_ms) * STALLS[kind][1] / 1000 + AFTER_S:
            kind = "plain"  # no time for its ten ops after the stall: the run would cut the stale holder short
        k, kind, span, v = session_start(test, ctx, keys, kind, end_ns)
        if kind == "plain":
            ops = [_op("acquire", k, v(ttl_ms=test.ttl_ms))]
            for i in range(commits):
                c = v()
                ops.append(_op("commit", k, c))
                if ctx.rng.random() < 0.2:
                    ops.append(_op("commit", k, c))  # a retry: the same request_id and body
                if i < commits - 1:
                    ops.append(_op("renew", k, v()))
            ops.append(_op("release", k, v()))
            return ops
        lost = []
        for lo, hi in LOST_COMMIT_DEADLINES_MS:
            c = v()
            c["body"] = dict(c)  # what the digest covers: not the first attempt's own deadline
            lost.append(c)
        quick = [_op("commit", k, dict(c, deadline_ms=round(math.exp(ctx.rng.uniform(math.log(lo), math.log(hi))), 1)))
                 for c, (lo, hi) in zip(lost, LOST_COMMIT_DEADLINES_MS)]
        held: dict[str, int] = {}  # when this holder's acquire completed (the generator's clock, ns)
        first = _op("commit", k, v())  # sent the moment it holds the key
        return [acquire_until_held(k, lambda test, ctx: v(ttl_ms=test.ttl_ms, wait_ms=wait_ms(test))),
                gen.bind(lambda test, ctx: marked(held, ctx, first)), *quick,
                until(held, EDGE_AT, end_ns), _op("commit", k, v()),  # its last commit, in the lease's final tenth
                until(held, span, end_ns, stall=True), _op("commit", k, v()), *(_op("commit", k, c) for c in lost),
                _op("renew", k, v()), _op("commit", k, v()), _op("release", k, v())]

    return make


def marked(held: dict[str, int], ctx: Any, op: dict[str, Any]) -> dict[str, Any]:
    """`op`, the holder's first after its acquire completed, noting in `held` when that was."""
    held.setdefault("at", ctx.time)
    return op


def wait_ms(test) -> int:
    """A successor's waiting acquire (the server retries until the holder's lease expires, C22): at most half
    the request deadline, so the server answers a conflict well before the client gives up; at most the TTL."""
    return max(1, min(int(test.ttl_ms), int(500 * float(test.deadline_s or DEADLINE_S))))


def until(held: dict[str, int], span: tuple[float, float], end_ns: int | None, stall: bool = False) -> Any:
    """Idle until `span` x the TTL (drawn from the seeded rng when reached) after the holder's acquire completed
    (`held["at"]`): the lease's expiry is at most one TTL after that, whatever the server's clock says. Cut to
    the main phase's time left, so the run ends on time; nothing when that moment has passed. A `stall` (the
    idling past the TTL) marks the thread's next invocation `mechanism: "stall"` with `stall_ms`, as
    workloads.common.stall does, so the stale holder it makes says where it came from."""
    def pause(test, ctx):
        s = (held.get("at", ctx.time) - ctx.time) / 1e9 + stall_s(test, ctx, span)
        s = min(s, remaining_s(test, ctx, end_ns) - 0.2)
        if s <= 0:
            return None
        return dict(gen.sleep(s), mark={"mechanism": "stall", "stall_ms": round(s * 1000)}) if stall else gen.sleep(s)

    return gen.bind(pause)


def burst(test, ctx, key: str) -> list[dict[str, Any]]:
    """One thread's part of a burst: acquire `key` (free, and every thread acquires it now), commit, release."""
    sid = session_id(test, ctx)
    return [_op(f, key, dict({"request_id": request_id(test, ctx), "session": sid},
                             **({"ttl_ms": test.ttl_ms} if f == "acquire" else {})))
            for f in ("acquire", "commit", "release")]


def recording_commits(make: Any, written: set[str]) -> Any:
    """`make` (a session or burst maker), noting in `written` the key of every commit op it generates."""

    def wrapped(test, ctx, *args: Any, **kw: Any) -> Any:
        ops = make(test, ctx, *args, **kw)
        written.update(op["key"] for op in ops if isinstance(op, dict) and op.get("f") == "commit")
        return ops

    return wrapped


class CommitsExercised:
    """`unknown` when no commit was accepted: the fence was never tested, so `valid` would claim too much."""

    def check(self, test, history, opts) -> dict:
        oks = sum(1 for op in history if op.get("f") == "commit" and op.get("type") == "ok")
        attempts = sum(1 for op in history if op.get("f") == "commit" and op.get("type") == "invoke")
        return {"valid": True if oks else "unknown", "accepted_commits": oks, "attempted_commits": attempts}


def workload(test):
    """Fenced appends (plain, stalled, solo sessions, bursts), then a final read of every document committed to."""
    keys = key_names(test.keys)
    written: set[str] = set()  # every key the generator sent a commit for (burst and solo keys too)
    return Workload(
        name="fenced-append",
        client=FencedAppendDriver(ttl_ms=test.ttl_ms, deadline_s=float(test.deadline_s or DEADLINE_S)),
        generator=exercise(test, recording_commits(session(keys), written), recording_commits(burst, written)),
        # read back every document a commit was sent to: no acknowledged commit may be missing from any of them
        final_generator=gen.bind(lambda test, ctx: [{"f": "read", "key": k, "value": {"doc": doc_id(k)}}
                                                    for k in sorted(set(keys) | written)]),
        checker=compose({"commits-exercised": CommitsExercised(),
                         # the final phase reads every document: a commit's doc without that read is not judged
                         "stale-commit": get_checker("stale-commit", final_read=True),
                         **{name: get_checker(name) for name in
                            ("fencing", "mutual-exclusion", "lease-state", "idempotency", "availability")},
                         "stale-write": StaleWriteChecker(),  # needs no token: judges token-less locks too
                         "linearizable": lease_linearizable()}),  # the lease model: acquire ... commit, final read
        needs_store=NEEDS.store,
        doc=DOC,
    )
