"""The `lease` workload: many processes acquire, renew, release and inspect leases on a few keys.

Each session is one holder (its own service instance) of one of three kinds,
run by lanes of threads (the default 5 threads: 2 + 2 + 1, see
`workloads.common.exercise`):

- plain (burst lane): acquire a random key of `--keys`, renew twice, release,
  sometimes inspect; an acquire or a renew is sometimes retried with the same
  request_id (it must return the original result). Conflicts are the point:
  one winner per key at a time. Every second the lane's threads all acquire
  one fresh key in the same instant (a burst), then renew and release it;
- stalled (takeover lane): poll the takeover key (`k0`) until held (up to 3 x the TTL), renew
  (and retry that renew: same request_id and body, so every run with a holder
  has a retry after an answer), stall 1.15-1.6 x the TTL, then carry on with the lease it still believes it
  holds (renew and release, in either order) while the other takeover thread,
  which was polling, already holds the key: the server must refuse every
  stale op, and end or delete nothing of the successor's;
- solo (solo lane): the same on a fresh key nobody else uses, with a stall of
  1.05-1.5 x the TTL: renews after the expiry, with no successor in the way.

After an `info` the thread's next process reopens its client and carries the
session on with the lease it still believes it holds (crash-and-carry-on: a
stale holder the lab makes; `--after-info abandon` gives the lease up
instead, docs/plugging-in-a-system.md#client-lifecycle-after-info). The op
after a stall records `mechanism: "stall"`, the first op of a reopened
process `reopened: true`, so a stale-commit or stale-write counterexample
names what made its stale holder.

Every completion keeps what the client sent (`value.sent`: request id, lease
id, token) and what came back (lease id, fencing token, backend times), so
the fencing, mutual-exclusion, lease-state and idempotency checkers can judge
the run, and the lease model's linearizability checker the whole history
(`checkers.linear.lease_linearizable`: backend times as the server reported
them, unanswered ops indeterminate, `unknown` past its budget). `--ttl-ms` scales the stalls; `--keys` the plain sessions' keys.
"""

from __future__ import annotations

import inspect
from typing import Any

from checkers.core import compose, get_checker
from checkers.linear import lease_linearizable
from lab.client import Lease, new_request_id
from lab.sut import WorkloadNeeds
from lab.testmap import Test
from workloads.base import Workload
from workloads.common import (Session, Sessions, acquire_until_held, completion, exercise, identity_for, key_names,
                              lease_client, request_id, sent, session_id, session_start, stall)

DOC = __doc__
NEEDS = WorkloadNeeds("lease")  # the core operations only: any system under test
HOLDER_FS = frozenset({"renew", "release", "commit"})  # requests a worker sends on a lease it believes it holds


def _session_id(op: dict[str, Any]) -> Any:
    """The session an op belongs to (`value.session`), or None: the client's own holder of its key."""
    value = op.get("value") or {}
    return value.get("session") if isinstance(value, dict) else None


class LeaseDriver:
    """A worker's driver of the lease workload (over a lab.sut system); a session's lease and service instance are
    shared by every opened driver."""

    NEEDS = NEEDS  # what it asks of the system (a subclass for another workload declares its own)

    def __init__(self, ttl_ms: int = 2000, deadline_s: float = 2.0, node: str | None = None, api=None,
                 sessions: Sessions | None = None):
        self.ttl_ms = ttl_ms
        self.deadline_s = deadline_s
        self.node = node
        self.api = api
        # shared by every opened client: after an `info` the thread's next process continues the session
        self.sessions = Sessions() if sessions is None else sessions
        self.own: dict[str, Session] = {}  # ops without a session: this client's own holder per key
        # a system that refused a waiting acquire as invalid (its maximum wait is lower, or it has none: C22 leaves
        # both open) is polled from then on, by this client, instead of losing every waiting acquire
        self.wait_refused = False

    async def open(self, test, node: str) -> "LeaseDriver":
        """A fresh driver bound to lease server `node` (ops without a session use its own service instance)."""
        return type(self)(self.ttl_ms, self.deadline_s, node, lease_client(test, node, needs=self.NEEDS),
                          sessions=self.sessions, **self._shared())

    def _shared(self) -> dict[str, Any]:
        """Keyword arguments a subclass's opened clients share with their prototype."""
        return {}

    async def setup(self, test) -> None:
        return None

    async def teardown(self, test) -> None:
        return None

    async def close(self, test) -> None:
        if self.api is not None:
            await self.api.aclose()

    async def before_request(self, test, op: dict[str, Any]) -> None:
        """Honour the client nemeses: a paused process waits here; a skewed one reads its own clock."""
        clocks = test.live.client_clocks
        if clocks is not None and self.api is not None:
            self.api.clock_ms = clocks.clock_for(op["process"])
        pauses = test.live.client_pauses
        if pauses is not None:
            if self.api is not None and hasattr(self.api, "pause_gate"):  # a system that stops mid-op too (etcd)
                process = op["process"]
                self.api.pause_gate = lambda: pauses.wait(process)
            # naming its system lets the pause freeze it whole (its own background activity too); `holding`: this
            # request acts on a lease the worker holds, where a pause armed for a holder closes
            await pauses.wait(op["process"], *([self.api] if self.api is not None else []),
                              holding=self.holds(op))

    def holds(self, op: dict[str, Any]) -> bool:
        """Is `op` a request on a lease its session believes it holds (a commit, renew or release with a lease in
        hand; not one its session sends after a refused acquire)? Read only: no session is made here."""
        if op.get("f") not in HOLDER_FS:
            return False
        sid = _session_id(op)
        sess = self.sessions.get(sid) if sid is not None else self.own.get(op.get("key"))
        return sess is not None and sess.lease is not None

    def session_for(self, test: Test | None, op: dict[str, Any]) -> Session:
        """The op's session (its `value.session`), acting as that session's service instance."""
        sid = _session_id(op)
        if sid is None:
            key = op.get("key")
            if key not in self.own:
                self.own[key] = Session(getattr(self.api, "service_instance_id", None))
            return self.own[key]
        sess = self.sessions.get_session(test, sid)
        if op.get("reopened") and sess.lease is not None and isinstance(test, Test) and test.after_info == "abandon":
            # its process crashed and the client was reopened (closing a client may end its session, and so its
            # lock): with --after-info abandon the session gives its lease up instead of carrying on with it
            sess.lease = None
        if sess.instance and getattr(self.api, "service_instance_id", None) not in (None, sess.instance):
            # the owner is principal + service instance: a session is one holder whichever process acts for it
            self.api.service_instance_id = sess.instance
        return sess

    def wait_option(self, value: Any) -> dict[str, int]:
        """`{"wait_ms": n}` when the op asks for a waiting acquire (`value.wait_ms`) and the system's acquire has
        one (the contract's bounded server wait, C22); else nothing: the generator's retries are the poll."""
        wait = value.get("wait_ms") if isinstance(value, dict) else None
        if not wait or self.wait_refused or "wait_ms" not in inspect.signature(self.api.acquire).parameters:
            return {}
        return {"wait_ms": int(wait)}

    def deadline_for(self, value: Any) -> float:
        """The op's own deadline (`deadline_ms`: a retry's first attempt may have a tiny one), else the client's."""
        if isinstance(value, dict) and value.get("deadline_ms") is not None:
            return float(value["deadline_ms"]) / 1000
        return self.deadline_s

    async def invoke(self, test, op: dict[str, Any]) -> dict[str, Any]:
        """Run one lease op; `fail` only when it definitely did not happen."""
        await self.before_request(test, op)
        f, key = op["f"], op.get("key")
        value = op.get("value") or {}
        if f == "inspect":
            r = await self.api.inspect(identity_for(key), deadline_s=self.deadline_s)
            if r.ok:
                return completion(r, r.lease.history_value() if r.lease else None)
            if r.code == "lease_not_found":
                return {"type": "ok", "value": None}
            return completion(r, None)
        sess = self.session_for(test, op)
        rid = value.get("request_id") or new_request_id()
        identity = identity_for(key)
        deadline_s = self.deadline_for(value)
        if f == "acquire":
            wait = self.wait_option(value)
            r = await self.api.acquire(identity, ttl_ms=value.get("ttl_ms", self.ttl_ms), request_id=rid,
                                       deadline_s=deadline_s, **wait)
            on_wire = dict(sent(rid), **wait)
            if wait and r.outcome == "fail" and r.code == "invalid_lease_request":
                self.wait_refused = True
            if r.ok:
                sess.lease = r.lease
                return completion(r, dict(r.lease.history_value(), request_id=rid, sent=on_wire))
            return completion(r, {"request_id": rid, "sent": on_wire})
        if f in ("renew", "release"):
            lease: Lease | None = sess.lease
            if lease is None:
                return {"type": "fail", "value": {"request_id": rid}, "error": "not_held"}
            call = self.api.renew if f == "renew" else self.api.release
            r = await call(lease, identity=identity, request_id=rid, deadline_s=deadline_s)
            on_wire = sent(rid, lease)
            if r.ok:
                if f == "renew" and r.lease.lease_id == lease.lease_id:
                    sess.lease = r.lease
                return completion(r, dict(r.lease.history_value(), request_id=rid, sent=on_wire))
            # a lease_lost holder keeps its lease: a stale holder carries on, and the server must refuse it
            attempted = {"request_id": rid, "lease_id": lease.lease_id, "fencing_token": lease.fencing_token,
                         "sent": on_wire}
            return completion(r, attempted, late=True) if r.late else completion(r, attempted)
        raise ValueError(f"lease workload: unknown f {f!r}")


def _op(f: str, key: str, value: Any) -> dict[str, Any]:
    return {"f": f, "key": key, "value": value}


def session(keys: list[str], renews: int = 2):
    """One worker session as a function generator: a plain, stalled or solo holder (see the module docstring)."""

    def make(test, ctx, kind: str | None = None, end_ns: int | None = None):
        k, kind, span, v = session_start(test, ctx, keys, kind, end_ns)
        if kind == "plain":
            # the op dicts written out (not _op): every free thread at a session's start makes one per op asked
            rand = ctx.rng.random
            acq = v(ttl_ms=test.ttl_ms)
            ops = [{"f": "acquire", "key": k, "value": acq}]
            if rand() < 0.3:
                ops.append({"f": "acquire", "key": k, "value": acq})  # a retry: the same request_id and body
            for _ in range(renews):
                ren = v()
                ops.append({"f": "renew", "key": k, "value": ren})
                if rand() < 0.2:
                    ops.append({"f": "renew", "key": k, "value": ren})
            ops.append({"f": "release", "key": k, "value": v()})
            if rand() < 0.2:
                ops.append({"f": "inspect", "key": k, "value": None})
            return ops
        # a holder that stalls: it polls for the key until it holds it, then works, stalls, and carries on
        ren = v()
        # its first renew is always retried (same request_id and body): every run that has a holder has a
        # retry after an answer for the idempotency rules, not only the plain sessions that happen to draw one
        ops = [acquire_until_held(k, lambda test, ctx: v(ttl_ms=test.ttl_ms)), _op("renew", k, ren),
               _op("renew", k, ren), stall(span, end_ns)]
        after = [_op("renew", k, v()), _op("release", k, v())]
        if kind == "stalled" and ctx.rng.random() < 0.5:
            after.reverse()  # the stale holder's release first: it must not end (or delete) its successor's lease
        if kind == "solo":
            after.insert(0, _op("renew", k, v()))
        return ops + after

    return make


def burst(test, ctx, key: str) -> list[dict[str, Any]]:
    """One thread's part of a burst: acquire `key` (free, and every thread acquires it now), renew, release."""
    sid = session_id(test, ctx)
    return [_op(f, key, dict({"request_id": request_id(test, ctx), "session": sid},
                             **({"ttl_ms": test.ttl_ms} if f == "acquire" else {})))
            for f in ("acquire", "renew", "release")]


def lease_checker(test):
    """The lease workload's checkers: fencing, mutual exclusion, lease state, idempotency, availability, and
    lease linearizability (the `lease` model over the whole history, `checkers.linear.lease_linearizable`)."""
    return compose({**{name: get_checker(name) for name in
                       ("fencing", "mutual-exclusion", "lease-state", "idempotency", "availability")},
                    "linearizable": lease_linearizable()})


def workload(test):
    """Sessions (plain, stalled, solo) on `test.keys` keys at `test.rate` ops/s in total, a burst every second."""
    keys = key_names(test.keys)
    ttl_ms = int(test.ttl_ms)
    return Workload(
        name="lease",
        client=LeaseDriver(ttl_ms=ttl_ms, deadline_s=float(test.deadline_s or 2.0)),
        generator=exercise(test, session(keys), burst),
        checker=lease_checker(test),
        doc=DOC,
    )
