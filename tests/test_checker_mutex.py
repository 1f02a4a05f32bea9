"""The mutual-exclusion checker: backend-time overlaps (violations) and client-side unsafe windows (info)."""

from __future__ import annotations

from test_checker_core import BASE, MS, LeaseHistory, kinds, run


def test_release_then_reacquire_before_the_old_expiry_is_valid():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    h.release(0, "L1", 1, at=0)  # no backend release time: real-time order decides
    h.acquire(1, "L2", 2, at=100, ttl=10_000)
    res = run("mutual-exclusion", h.ops)
    assert res["valid"] is True, res["violations"]
    assert res["leases"] == 2


def test_acquired_while_another_lease_is_valid():
    h = LeaseHistory()
    _, a = h.acquire(0, "L1", 1, at=100, ttl=1000)
    b0, b1 = h.acquire(1, "L2", 2, at=500, ttl=1000)
    res = run("mutual-exclusion", h.ops)
    assert kinds(res) == ["overlap"]
    v = res["violations"][0]
    assert v["ops"] == [a, b0, b1] and v["lease"] == "L2" and v["overlapping"] == ["L1"]


def test_validity_is_half_open_at_expiry():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=100, ttl=1000)
    h.acquire(1, "L2", 2, at=1100, ttl=1000)  # exactly at L1's expires_at_ms
    assert run("mutual-exclusion", h.ops)["valid"] is True


def test_a_renewal_extends_validity():
    h = LeaseHistory()
    _, a = h.acquire(0, "L1", 1, at=100, ttl=1000)
    h.renew(0, "L1", 1, at=100, renewed=1000, exp=2000)
    h.acquire(1, "L2", 2, at=1500, ttl=1000)
    res = run("mutual-exclusion", h.ops)
    assert kinds(res) == ["overlap"] and a in res["violations"][0]["ops"]


def test_release_concurrent_with_the_acquisition_gets_the_benefit_of_the_doubt():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    h.invoke(1, "acquire", {"request_id": "b", "ttl_ms": 1000})
    h.invoke(0, "release", {"request_id": "x", "lease_id": "L1", "fencing_token": 1})
    h.complete("ok", 1, "acquire", h.lease("L2", 2, at=50))
    h.complete("info", 0, "release", None, error="timeout")  # may have happened, before the acquire
    assert run("mutual-exclusion", h.ops)["valid"] is True


def test_release_invoked_after_the_successor_was_granted_is_an_overlap():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    h.acquire(1, "L2", 2, at=50)
    h.release(0, "L1", 1, at=0)
    res = run("mutual-exclusion", h.ops)
    assert kinds(res) == ["overlap"] and res["violations"][0]["overlapping"] == ["L1"]


def test_reported_release_time_is_used():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    h.acquire(1, "L2", 2, at=300)
    h.release(0, "L1", 1, at=0, released_at_ms=BASE + 400)  # the server says: released at 400
    assert kinds(run("mutual-exclusion", h.ops)) == ["overlap"]
    h.ops[-1]["value"]["released_at_ms"] = BASE + 200
    assert run("mutual-exclusion", h.ops)["valid"] is True


def test_unsafe_windows_are_counted_but_valid():
    """L1 expired by backend time, but its (paused) holder still acts on it after L2 is granted."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)
    h.acquire(1, "L2", 2, at=150, ttl=100)
    c0, _ = h.commit(0, "L1", 1, [0, 1, 1], type="fail", error="lease_lost")  # fencing covers it
    res = run("mutual-exclusion", h.ops)
    assert res["valid"] is True
    w = res["unsafe_windows"]
    assert w["count"] == 1 and w["max_ms"] > 0
    assert w["commits_by_older_holder"] == {"ok": 0, "fail": 1, "info": 0}
    assert w["windows"][0]["leases"] == ["L1", "L2"] and c0 in w["windows"][0]["ops"]


def test_belief_ends_at_the_release_invocation():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    h.release(0, "L1", 1, at=0)
    h.acquire(1, "L2", 2, at=150)
    assert run("mutual-exclusion", h.ops)["unsafe_windows"]["count"] == 0


def test_an_abandoned_lease_is_believed_until_its_local_expiry():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)  # invoked at 1 ms: believed until 101 ms unless used later
    h.commit(0, "L1", 1, [0, 1, 1], validated=10)  # never released
    h.t = 101 * MS
    h.acquire(1, "L2", 2, at=150, ttl=100)
    assert run("mutual-exclusion", h.ops)["unsafe_windows"]["count"] == 0
    h.commit(0, "L1", 1, [0, 1, 2], type="fail", error="lease_lost")  # ... but it was still acting on it
    w = run("mutual-exclusion", h.ops)["unsafe_windows"]
    assert w["count"] == 1 and w["commits_by_older_holder"]["fail"] == 1
