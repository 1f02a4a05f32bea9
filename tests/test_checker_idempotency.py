"""The idempotency checker: same request_id and body, same result; changed body, idempotency_conflict."""

from __future__ import annotations

from test_checker_core import LeaseHistory, kinds, run

REQ = {"request_id": "a", "ttl_ms": 1000}


def test_retries_and_a_rejected_changed_body_are_valid():
    h = LeaseHistory()
    h.call(0, "acquire", REQ, None, type="info", error="lease_outcome_unknown")
    h.call(1, "acquire", REQ, h.lease("L1", 1, at=0))
    h.call(1, "acquire", REQ, h.lease("L1", 1, at=0, state="released"))  # replay after the end (C18)
    h.call(1, "acquire", {**REQ, "ttl_ms": 5}, None, type="fail", error={"code": "idempotency_conflict", "msg": "x"})
    h.call(1, "acquire", REQ, None, type="fail", error="lease_backend_unavailable")  # says nothing
    res = run("idempotency", h.ops)
    assert res["valid"] is True, res["violations"]
    assert res["retried"] == 1


def test_replay_with_a_different_result():
    h = LeaseHistory()
    _, a = h.call(0, "acquire", REQ, h.lease("L1", 1, at=0))
    b0, b1 = h.call(1, "acquire", REQ, h.lease("L2", 2, at=10))
    res = run("idempotency", h.ops)
    assert kinds(res) == ["replay-different-result"]
    assert res["violations"][0]["ops"] == [a, b0, b1]
    assert res["violations"][0]["original"] == ["L1", 1] and res["violations"][0]["replay"] == ["L2", 2]


def test_commit_replay_must_repeat_rev_and_token():
    h = LeaseHistory()
    req = {"request_id": "c", "lease_id": "L1", "fencing_token": 1, "doc": "d", "entry": [0, 1, 1]}
    h.call(0, "commit", req, {"doc": "d", "rev": 1, "accepted_token": 1})
    h.call(1, "commit", req, {"doc": "d", "rev": 2, "accepted_token": 1})  # applied twice
    assert kinds(run("idempotency", h.ops)) == ["replay-different-result"]


def test_changed_body_accepted():
    h = LeaseHistory()
    a0, a1 = h.call(0, "acquire", {**REQ, "body": "digest-1"}, h.lease("L1", 1, at=0))
    b0, b1 = h.call(1, "acquire", {**REQ, "body": "digest-2"}, h.lease("L1", 1, at=0))
    res = run("idempotency", h.ops)
    assert kinds(res) == ["changed-body-accepted"]
    assert res["violations"][0]["ops"] == [a0, a1, b0, b1]


def test_changed_body_must_get_idempotency_conflict():
    h = LeaseHistory()
    _, a = h.call(0, "acquire", REQ, h.lease("L1", 1, at=0))
    b0, b1 = h.call(1, "acquire", {**REQ, "ttl_ms": 5}, None, type="fail", error="lease_conflict")
    res = run("idempotency", h.ops)
    assert kinds(res) == ["changed-body-not-conflict"]
    assert res["violations"][0]["ops"] == [a, b0, b1] and res["violations"][0]["code"] == "lease_conflict"


def test_replay_that_fails_instead_of_returning_the_original():
    h = LeaseHistory()
    _, a = h.call(0, "acquire", REQ, h.lease("L1", 1, at=0))
    b0, b1 = h.call(1, "acquire", REQ, None, type="fail", error="lease_conflict")
    res = run("idempotency", h.ops)
    assert kinds(res) == ["replay-not-idempotent"]
    assert res["violations"][0]["ops"] == [a, b0, b1]


def test_conflict_with_nothing_to_conflict_with():
    h = LeaseHistory()
    a0, a1 = h.call(0, "release", {"request_id": "z", "lease_id": "L1", "fencing_token": 1}, None, type="fail",
                    error="idempotency_conflict")
    res = run("idempotency", h.ops)
    assert kinds(res) == ["false-conflict"] and res["violations"][0]["ops"] == [a0, a1]
    h.call(1, "release", {"request_id": "z", "lease_id": "L1", "fencing_token": 1}, None, type="fail",
           error="idempotency_conflict")  # two same-body requests: still nothing to conflict with
    assert kinds(run("idempotency", h.ops)) == ["false-conflict", "false-conflict"]


def test_request_ids_are_scoped_by_operation_and_key():
    h = LeaseHistory()
    h.call(0, "acquire", REQ, h.lease("L1", 1, at=0), key="k1")
    h.call(1, "acquire", REQ, h.lease("L9", 1, at=0), key="k2")
    h.call(1, "renew", {"request_id": "a", "lease_id": "L9", "fencing_token": 1}, h.lease("L9", 1, at=0), key="k2")
    res = run("idempotency", h.ops)
    assert res["violation_count"] == 0 and res["request_ids"] == 3 and res["retried"] == 0
    assert res["valid"] == "unknown"  # three different idempotency keys: no retry to judge
