"""The fencing checker: unique tokens per key, increasing in real-time and backend order."""

from __future__ import annotations

from test_checker_core import LeaseHistory, kinds, run


def test_sequential_leases_and_a_replay_are_valid():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, rid="a")
    h.call(1, "acquire", {"request_id": "a", "ttl_ms": 1000}, h.lease("L1", 1, 0))  # replay: same lease
    h.acquire(2, "L2", 2, at=2000)
    h.acquire(3, "M1", 1, at=2100, key="other")  # tokens are per key
    res = run("fencing", h.ops)
    assert res["valid"] is True, res["violations"]
    assert res["leases"] == 3 and res["keys"] == 2


def test_duplicate_token_names_both_acquisitions():
    h = LeaseHistory()
    _, a = h.acquire(0, "L1", 7, at=0)
    _, b = h.acquire(1, "L2", 7, at=2000)
    res = run("fencing", h.ops)
    assert res["valid"] is False
    dup = [v for v in res["violations"] if v["type"] == "duplicate-token"]
    assert len(dup) == 1 and dup[0]["ops"] == [a, b] and dup[0]["leases"] == ["L1", "L2"]


def test_lower_token_after_a_completed_acquisition_violates_realtime_order():
    h = LeaseHistory()
    _, a = h.acquire(0, "L1", 5, at=100)
    b0, b1 = h.acquire(1, "L2", 4, at=100)  # same backend ms: only real time orders them
    res = run("fencing", h.ops)
    assert kinds(res) == ["token-order-realtime"]
    assert res["violations"][0]["ops"] == [a, b0, b1]


def test_concurrent_acquisitions_may_complete_in_any_order():
    h = LeaseHistory()
    a0 = h.invoke(0, "acquire", {"request_id": "a", "ttl_ms": 100})
    h.call(1, "acquire", {"request_id": "b", "ttl_ms": 100}, h.lease("L1", 1, at=10, ttl=100))
    h.complete("ok", 0, "acquire", h.lease("L2", 2, at=200, ttl=100))
    assert a0 == 0
    assert run("fencing", h.ops)["valid"] is True


def test_backend_order_of_acquired_at_ms():
    h = LeaseHistory()
    h.invoke(0, "acquire", {"request_id": "a", "ttl_ms": 100})
    h.invoke(1, "acquire", {"request_id": "b", "ttl_ms": 100})
    a = h.complete("ok", 0, "acquire", h.lease("L1", 3, at=10))
    b = h.complete("ok", 1, "acquire", h.lease("L2", 2, at=20))  # acquired later, lower token
    res = run("fencing", h.ops)
    assert kinds(res) == ["token-order-backend"]
    assert res["violations"][0]["ops"] == [a, b]


def test_a_replay_is_timed_from_its_first_attempt():
    """The original attempt timed out; its lease was created then, before L2, so its lower token is right."""
    h = LeaseHistory()
    h.call(0, "acquire", {"request_id": "a", "ttl_ms": 100}, None, type="info", error="timeout")
    h.acquire(1, "L2", 2, at=50)
    h.call(2, "acquire", {"request_id": "a", "ttl_ms": 100}, h.lease("L1", 1, at=5))  # replay of "a"
    assert run("fencing", h.ops)["valid"] is True
    # without the earlier attempt, the same replay would break real-time order
    fresh = [op for op in h.ops if op["index"] >= 2]
    assert kinds(run("fencing", fresh)) == ["token-order-realtime"]
