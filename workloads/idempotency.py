"""The `idempotency` workload: retries with the same request_id, and reuse of a request_id with a changed body.

A plain session on a random key: an acquire whose first attempt has a tiny
deadline (its response is often lost: an `info`), retried with the same
request_id and body (must return the same lease and token, C17), then with
the same request_id and a changed body (must be `idempotency_conflict`,
mutating nothing); a renew and a release, each retried with the same
request_id (the retry returns the original result). Stalled sessions poll
the takeover key (`k0`) until held, and solo sessions take a fresh key; both
renew (and retry), stall past the lease's expiry (stalled: 1.15-1.6 x the
TTL; solo: 1.05-1.5 x), then renew and release with retries, a successor
already holding the takeover key. Every second the burst lane's
threads acquire one fresh key in the same instant, each retrying its acquire
and release. Lanes as in the lease workload (`workloads.common.exercise`).
The idempotency checker judges the groups of ops by request_id; fencing,
lease-state and mutual exclusion judge the rest.
"""

from __future__ import annotations

from typing import Any

from checkers.core import compose, get_checker
from lab.sut import WorkloadNeeds
from workloads.base import Workload
from workloads.common import (SOLO_STALL, TAKEOVER_STALL, acquire_until_held, exercise, key_names, pick_kind,
                              seeded_request_id, session_key, stall, time_for, unstalled)
from workloads.lease import LeaseDriver

DOC = __doc__
NEEDS = WorkloadNeeds("idempotency")  # the core operations only: any system under test


class IdempotencyDriver(LeaseDriver):
    """The lease workload's driver: it honours each op's request_id, ttl, deadline and session.

    A retry after an `info` runs in the thread's next process: the session (its lease, and its service instance,
    which is part of the owner and so of the idempotency digest) is shared by every opened client.
    """

    NEEDS = NEEDS


def _body(value: dict[str, Any]) -> dict[str, Any]:
    """What the server's digest covers (deadlines are not part of it)."""
    return {k: v for k, v in value.items() if k not in ("deadline_ms", "session", "body")}


def _with_body(value: dict[str, Any]) -> dict[str, Any]:
    """The invoke value, with `body` naming what the idempotency digest covers (the checker compares it)."""
    return dict(value, body=_body(value))


def session(keys: list[str]):
    """One retry session as a function generator: plain, stalled or solo (see the module docstring)."""

    def make(test, ctx, kind: str | None = None, end_ns: int | None = None):
        kind = unstalled(test, kind or pick_kind(test, ctx))
        span = TAKEOVER_STALL if kind == "stalled" else SOLO_STALL
        if kind != "plain" and not time_for(test, ctx, span, end_ns):
            kind = "plain"  # no time left to act after a stall
        k = session_key(test, ctx, kind, keys)
        sid = seeded_request_id(test, ctx)  # the session's request ids and service instance: this run's own
        acq = {"request_id": f"{sid}-a", "ttl_ms": test.ttl_ms, "session": sid}
        ren = {"request_id": f"{sid}-r", "session": sid}
        rel = {"request_id": f"{sid}-x", "session": sid}
        changed = dict(acq, ttl_ms=test.ttl_ms + 1)
        if kind == "stalled":
            def attempt(test, ctx):
                return _with_body({"request_id": seeded_request_id(test, ctx), "ttl_ms": test.ttl_ms,
                                   "session": sid})

            # poll for the contended key until held; after the stall a successor holds it
            ops = [acquire_until_held(k, attempt)]
        else:
            ops = [
                {"f": "acquire", "key": k, "value": _with_body(dict(acq, deadline_ms=5))},  # response often lost
                {"f": "acquire", "key": k, "value": _with_body(acq)},  # same request_id, same body: same lease
                {"f": "acquire", "key": k, "value": _with_body(changed)},  # changed body: idempotency_conflict
            ]
        ops += [{"f": "renew", "key": k, "value": _with_body(ren)},
                {"f": "renew", "key": k, "value": _with_body(ren)}]
        if kind != "plain":
            # the holder stalls past (stalled) or around (solo) its lease's expiry and carries on, retrying too
            late = {"request_id": f"{sid}-l", "session": sid}
            ops += [stall(span, end_ns), {"f": "renew", "key": k, "value": _with_body(late)},
                    {"f": "renew", "key": k, "value": _with_body(late)}]
        return ops + [{"f": "release", "key": k, "value": _with_body(rel)},
                      {"f": "release", "key": k, "value": _with_body(rel)}]

    return make


def burst(test, ctx, key: str) -> list[dict[str, Any]]:
    """One thread's part of a burst on a free key: acquire it (every thread now) and retry, release and retry."""
    sid = seeded_request_id(test, ctx)
    acq = _with_body({"request_id": f"{sid}-a", "ttl_ms": test.ttl_ms, "session": sid})
    rel = _with_body({"request_id": f"{sid}-x", "session": sid})
    return [{"f": f, "key": key, "value": v} for f, v in (("acquire", acq), ("acquire", acq), ("release", rel),
                                                           ("release", rel))]


def workload(test):
    """Retry sessions (plain, stalled, solo) on `test.keys` keys, with a burst every second."""
    keys = key_names(test.keys)
    return Workload(
        name="idempotency",
        client=IdempotencyDriver(ttl_ms=test.ttl_ms, deadline_s=float(test.deadline_s or 2.0)),
        generator=exercise(test, session(keys), burst),
        checker=compose({name: get_checker(name) for name in ("idempotency", "fencing", "lease-state",
                                                                "mutual-exclusion")}),
        doc=DOC,
    )
