"""Every violation kind every domain checker can report is proven sensitive: a violating history gives
`valid: false` with that kind. The catalog is checked against the checkers' source, so a new kind
without a violating history here fails this file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checkers.core import SUBJECT_FS
from test_checker_core import BASE, LeaseHistory, run

CHECKERS_DIR = Path(__file__).resolve().parents[1] / "checkers"
MODULES = {"fencing": "fencing", "mutual-exclusion": "mutex", "lease-state": "lease_state",
           "stale-commit": "stale_commit", "idempotency": "idempotency", "deadlines": "deadlines",
           "availability": "deadlines", "stale-write": "stale_write"}
REQ = {"request_id": "a", "ttl_ms": 1000}


def ref(lid: str, tok: int, rid: str) -> dict:
    return {"request_id": rid, "lease_id": lid, "fencing_token": tok}


# --------------------------------------------------------------------------- one violating history per kind


def duplicate_token(h):
    h.acquire(0, "L1", 7, at=0)
    h.acquire(1, "L2", 7, at=2000)


def token_order_realtime(h):
    h.acquire(0, "L1", 5, at=100)
    h.acquire(1, "L2", 4, at=100)


def token_order_backend(h):
    h.invoke(0, "acquire", {"request_id": "a", "ttl_ms": 100})
    h.invoke(1, "acquire", {"request_id": "b", "ttl_ms": 100})
    h.complete("ok", 0, "acquire", h.lease("L1", 3, at=10))
    h.complete("ok", 1, "acquire", h.lease("L2", 2, at=20))


def overlap(h):
    h.acquire(0, "L1", 1, at=0, ttl=1000)
    h.acquire(1, "L2", 2, at=500)


def revived(h):
    h.acquire(0, "L1", 1, at=0)
    h.release(0, "L1", 1, at=0)
    h.renew(0, "L1", 1, at=0, renewed=100, exp=1100)


def renew_after_expiry(h):
    h.acquire(0, "L1", 1, at=0, ttl=100)
    h.renew(0, "L1", 1, at=0, renewed=100, exp=200)


def renew_after_end(h):
    h.acquire(0, "L1", 1, at=0, ttl=1000)
    h.invoke(0, "renew", ref("L1", 1, "r"))
    h.release(1, "L1", 1, at=0, released_at_ms=BASE + 50)
    h.complete("ok", 0, "renew", h.lease("L1", 1, at=0, renewed=60, exp=1060))


def token_changed(h):
    h.acquire(0, "L1", 1, at=0)
    h.renew(0, "L1", 1, at=0, renewed=10, exp=1010, result_token=2)


def lease_mismatch_renew(h):
    h.acquire(0, "L1", 1, at=0)
    h.acquire(1, "L2", 2, at=2000)
    h.call(0, "renew", {"request_id": "r"}, {**h.lease("L2", 2, at=2000, renewed=2100, exp=3100),
                                             "sent": ref("L1", 1, "r")})


def wrong_token_accepted(h):
    h.acquire(0, "L1", 2, at=0)
    h.call(0, "release", {"request_id": "r"}, {**h.lease("L1", 2, at=0, state="released"),
                                               "sent": ref("L1", 1, "r")})


def stale_op_succeeded(h):
    h.acquire(0, "L1", 1, at=0, ttl=100)
    h.acquire(1, "L2", 2, at=200)
    h.release(0, "L1", 1, at=0)


def token_regression(h):
    h.commit(0, "L2", 2, [0, 2, 1])
    h.commit(1, "L1", 1, [1, 1, 1])


def validated_after_expiry(h):
    h.acquire(0, "L1", 1, at=0, ttl=1000)
    h.commit(0, "L1", 1, [0, 1, 1], validated=1000)


def validated_after_end(h):
    h.acquire(0, "L1", 1, at=0, ttl=1000)
    h.invoke(1, "commit", {"lease_id": "L1", "fencing_token": 1, "doc": "d", "entry": [1, 1, 1]})
    h.release(0, "L1", 1, at=0, released_at_ms=BASE + 400)
    h.complete("ok", 1, "commit", {"doc": "d", "rev": 1, "accepted_token": 1, "validated_at_ms": BASE + 500})


def commit_after_release(h):
    h.acquire(0, "L1", 1, at=0)
    h.release(0, "L1", 1, at=0)
    h.commit(1, "L1", 1, [1, 1, 1], validated=100)


def commit_after_successor(h):
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    h.acquire(1, "L2", 2, at=200)
    h.commit(0, "L1", 1, [0, 1, 1], validated=250)


def token_mismatch(h):
    h.acquire(0, "L1", 1, at=0)
    h.commit(0, "L1", 1, [0, 1, 1], validated=5, accepted=3)


def lease_mismatch_commit(h):
    h.acquire(0, "L1", 1, at=0)
    h.call(0, "commit", {"request_id": "c", "doc": "d", "entry": [0, 1, 1]},
           {"doc": "d", "rev": 1, "accepted_token": 1, "validated_at_ms": BASE + 5, "lease_id": "L9",
            "sent": ref("L1", 1, "c")})


def lost_commit(h):
    h.acquire(0, "L1", 1, at=0)
    h.commit(0, "L1", 1, [0, 1, 1], rev=1, validated=5)
    h.read(9, [])


def duplicate_entry(h):
    h.acquire(0, "L1", 1, at=0)
    h.commit(0, "L1", 1, [0, 1, 1], rev=1, validated=5)
    h.read(9, [[0, 1, 1], [0, 1, 1]])


def stale_write(h):
    h.acquire(0, "L1", 1, at=0)
    h.acquire(1, "L2", 2, at=10)
    h.commit(1, "L2", 2, [1, 2, 1], rev=1, validated=11)
    h.commit(0, "L1", 1, [0, 1, 1], rev=2, validated=12)  # the earlier holder's write lands after the successor's
    h.read(9, [[1, 2, 1], [0, 1, 1]])


def failed_commit_visible(h):
    h.acquire(0, "L1", 1, at=0)
    h.commit(0, "L1", 1, [0, 1, 1], type="fail", error="stale_token")
    h.read(9, [[0, 1, 1]])


def replay_different_result(h):
    h.call(0, "acquire", REQ, h.lease("L1", 1, at=0))
    h.call(1, "acquire", REQ, h.lease("L2", 2, at=10))


def changed_body_accepted(h):
    h.call(0, "acquire", REQ, h.lease("L1", 1, at=0))
    h.call(1, "acquire", {**REQ, "ttl_ms": 5}, h.lease("L1", 1, at=0))


def replay_not_idempotent(h):
    h.call(0, "acquire", REQ, h.lease("L1", 1, at=0))
    h.call(1, "acquire", REQ, None, type="fail", error="lease_conflict")


def changed_body_not_conflict(h):
    h.call(0, "acquire", REQ, h.lease("L1", 1, at=0))
    h.call(1, "acquire", {**REQ, "ttl_ms": 5}, None, type="fail", error="lease_conflict")


def false_conflict(h):
    h.call(0, "acquire", REQ, None, type="fail", error="idempotency_conflict")


def deadline_exceeded(h):
    h.invoke(0, "acquire", {"request_id": "a", "deadline_ms": 1})
    h.t += 200 * 1_000_000
    h.complete("ok", 0, "acquire", h.lease("L1", 1, at=0))


def no_completion(h):
    h.invoke(0, "acquire", {"request_id": "a", "deadline_ms": 1})
    for _ in range(200):
        h.call(1, "inspect", {"deadline_ms": 1_000}, None)


def missing_deadline(h):
    h.call(0, "acquire", {"request_id": "a"}, h.lease("L1", 1, at=0))


def availability(h):
    h.call(0, "acquire", REQ, None, type="fail", error="lease_conflict")
    h.call(0, "acquire", {"request_id": "b", "ttl_ms": 1000}, h.lease("L1", 1, at=0))


CATALOG = {  # (checker, kind) -> (violating history builder, checker options)
    ("fencing", "duplicate-token"): (duplicate_token, {}),
    ("fencing", "token-order-realtime"): (token_order_realtime, {}),
    ("fencing", "token-order-backend"): (token_order_backend, {}),
    ("mutual-exclusion", "overlap"): (overlap, {}),
    ("lease-state", "revived"): (revived, {}),
    ("lease-state", "renew-after-expiry"): (renew_after_expiry, {}),
    ("lease-state", "renew-after-end"): (renew_after_end, {}),
    ("lease-state", "token-changed"): (token_changed, {}),
    ("lease-state", "lease-mismatch"): (lease_mismatch_renew, {}),
    ("lease-state", "stale-op-succeeded"): (stale_op_succeeded, {}),
    ("lease-state", "wrong-token-accepted"): (wrong_token_accepted, {}),
    ("stale-commit", "token-regression"): (token_regression, {}),
    ("stale-commit", "validated-after-expiry"): (validated_after_expiry, {}),
    ("stale-commit", "validated-after-end"): (validated_after_end, {}),
    ("stale-commit", "commit-after-release"): (commit_after_release, {}),
    ("stale-commit", "commit-after-successor"): (commit_after_successor, {}),
    ("stale-commit", "token-mismatch"): (token_mismatch, {}),
    ("stale-commit", "lease-mismatch"): (lease_mismatch_commit, {}),
    ("stale-commit", "lost-commit"): (lost_commit, {}),
    ("stale-commit", "duplicate-entry"): (duplicate_entry, {}),
    ("stale-commit", "failed-commit-visible"): (failed_commit_visible, {}),
    ("stale-write", "stale-write"): (stale_write, {}),
    ("idempotency", "replay-different-result"): (replay_different_result, {}),
    ("idempotency", "changed-body-accepted"): (changed_body_accepted, {}),
    ("idempotency", "replay-not-idempotent"): (replay_not_idempotent, {}),
    ("idempotency", "changed-body-not-conflict"): (changed_body_not_conflict, {}),
    ("idempotency", "false-conflict"): (false_conflict, {}),
    ("deadlines", "deadline-exceeded"): (deadline_exceeded, {}),
    ("deadlines", "no-completion"): (no_completion, {}),
    ("deadlines", "missing-deadline"): (missing_deadline, {"require_deadline": True}),
    ("availability", "availability"): (availability, {"min_success_rate": 0.9}),
}


@pytest.mark.parametrize("checker, kind", sorted(CATALOG))
def test_each_violation_kind_is_caught(checker, kind):
    build, opts = CATALOG[(checker, kind)]
    h = LeaseHistory()
    build(h)
    res = run(checker, h.ops, **opts)
    assert res["valid"] is False and kind in res["violation_counts"], res.get("violations")
    assert all(v["ops"] for v in res["violations"]), "every violation names its ops"


def test_the_catalog_covers_every_kind_the_checkers_can_report():
    emitted = {}
    for checker, module in MODULES.items():
        source = (CHECKERS_DIR / f"{module}.py").read_text()
        emitted[module] = set(re.findall(r'\.add\(\s*"([a-z-]+)"', source))
    covered: dict[str, set] = {}
    for checker, kind in CATALOG:
        covered.setdefault(MODULES[checker], set()).add(kind)
    assert covered == emitted
    assert set(SUBJECT_FS) <= {c for c, _ in CATALOG}
