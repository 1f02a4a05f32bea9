"""The stale-commit checker: accepted commits against leases and tokens, and the final state."""

from __future__ import annotations

from test_checker_core import BASE, LeaseHistory, kinds, run


def holder_history() -> LeaseHistory:
    """Two holders in turn on key k, each committing, then the final read: valid."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=1000)
    h.commit(0, "L1", 1, [0, 1, 1], rev=1, validated=10)
    h.renew(0, "L1", 1, at=0, renewed=900, exp=1900)
    h.commit(0, "L1", 1, [0, 1, 2], rev=2, validated=1500)  # valid thanks to the renewal
    h.release(0, "L1", 1, at=0)
    h.acquire(1, "L2", 2, at=2000)
    h.commit(1, "L2", 2, [1, 2, 1], rev=3, validated=2010)
    h.commit(1, "L2", 2, [1, 2, 2], type="fail", error="lease_lost")
    h.read(9, [[0, 1, 1], [0, 1, 2], [1, 2, 1]])
    return h


def test_a_correct_run_is_valid():
    res = run("stale-commit", holder_history().ops)
    assert res["valid"] is True, res["violations"]
    assert res["commits"] == {"ok": 3, "fail": 1, "info": 0} and res["docs_read"] == 1


def test_lower_token_accepted_after_a_higher_one_in_real_time():
    h = LeaseHistory()
    _, a = h.commit(0, "L2", 2, [0, 2, 1])
    b0, b1 = h.commit(1, "L1", 1, [1, 1, 1])
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["token-regression"]
    assert res["violations"][0]["ops"] == [a, b0, b1] and res["violations"][0]["order"] == "realtime"
    assert res["unknown_lease"] == 2  # no acquire reported these leases


def test_lower_token_later_in_revision_order():
    h = LeaseHistory()
    h.invoke(0, "commit", {"lease_id": "L2", "fencing_token": 2, "doc": "d", "entry": [0, 2, 1]})
    h.invoke(1, "commit", {"lease_id": "L1", "fencing_token": 1, "doc": "d", "entry": [1, 1, 1]})
    a = h.complete("ok", 0, "commit", {"doc": "d", "rev": 1, "accepted_token": 2})
    b = h.complete("ok", 1, "commit", {"doc": "d", "rev": "2-abc", "accepted_token": 1})  # CouchDB rev
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["token-regression"]
    assert res["violations"][0]["order"] == "rev" and res["violations"][0]["ops"] == [a, b]


def test_final_read_order_and_duplicates():
    h = LeaseHistory()
    _, r = h.read(9, [[0, 2, 1], [1, 1, 1], [0, 2, 1]])
    res = run("stale-commit", h.ops)
    assert sorted(kinds(res)) == ["duplicate-entry", "token-regression"]
    assert all(v["ops"] == [r] for v in res["violations"])
    dup = next(v for v in res["violations"] if v["type"] == "duplicate-entry")
    assert dup["position"] == 2


def test_commit_validated_at_expiry():
    h = LeaseHistory()
    _, grant = h.acquire(0, "L1", 1, at=0, ttl=1000)
    c0, c1 = h.commit(0, "L1", 1, [0, 1, 1], validated=1000)  # at expires_at_ms: already expired
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["validated-after-expiry"]
    assert res["violations"][0]["ops"] == [grant, c0, c1]


def test_commit_validated_after_a_reported_release_time():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=1000)
    c = h.invoke(1, "commit", {"lease_id": "L1", "fencing_token": 1, "doc": "d", "entry": [1, 1, 1]})
    _, rel = h.release(0, "L1", 1, at=0, released_at_ms=BASE + 400)
    h.complete("ok", 1, "commit", {"doc": "d", "rev": 1, "accepted_token": 1, "validated_at_ms": BASE + 500})
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["validated-after-end"]
    assert res["violations"][0]["ops"] == sorted([rel, c, c + 3])
    h.ops[-1]["value"]["validated_at_ms"] = BASE + 399  # validated just before the release: fine
    assert run("stale-commit", h.ops)["valid"] is True


def test_commit_after_its_release_completed():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    _, rel = h.release(0, "L1", 1, at=0)
    c0, c1 = h.commit(1, "L1", 1, [1, 1, 1], validated=100)
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["commit-after-release"]
    assert res["violations"][0]["ops"] == [rel, c0, c1]


def test_commit_after_a_successor_was_acquired():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    _, succ = h.acquire(1, "L2", 2, at=200)
    c0, c1 = h.commit(0, "L1", 1, [0, 1, 1], validated=250)
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["commit-after-successor"]
    assert res["violations"][0]["ops"] == [succ, c0, c1] and res["violations"][0]["successor"] == "L2"


def test_commit_validated_before_the_successor_may_land_after_it():
    """C29: validated before expiry (and before the successor), acknowledged later: fine."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)
    c = h.invoke(0, "commit", {"request_id": "c", "lease_id": "L1", "fencing_token": 1, "doc": "d",
                               "entry": [0, 1, 1]})
    h.acquire(1, "L2", 2, at=200)
    h.complete("ok", 0, "commit", {"doc": "d", "rev": 1, "accepted_token": 1, "validated_at_ms": BASE + 50})
    assert c == 2
    assert run("stale-commit", h.ops)["valid"] is True


def test_token_mismatch():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    c0, c1 = h.commit(0, "L1", 1, [0, 1, 1], validated=5, accepted=3)
    res = run("stale-commit", h.ops)
    assert "token-mismatch" in kinds(res)
    assert next(v for v in res["violations"] if v["type"] == "token-mismatch")["ops"] == [c0, c1]


def test_lost_acknowledged_commit():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    c0, c1 = h.commit(0, "L1", 1, [0, 1, 1], rev=1, validated=5)
    _, r = h.read(9, [])
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["lost-commit"]
    assert res["violations"][0]["ops"] == [c0, c1, r]


def test_a_commit_still_running_at_the_read_is_not_lost():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    h.invoke(0, "commit", {"lease_id": "L1", "fencing_token": 1, "doc": "d", "entry": [0, 1, 1]})
    h.read(9, [])
    h.complete("ok", 0, "commit", {"doc": "d", "rev": 1, "accepted_token": 1, "validated_at_ms": BASE + 5})
    assert run("stale-commit", h.ops)["valid"] is True


def test_failed_commit_visible_in_the_final_read():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    c0, c1 = h.commit(0, "L1", 1, [0, 1, 1], type="fail", error="stale_token")
    _, r = h.read(9, [[0, 1, 1]])
    res = run("stale-commit", h.ops)
    assert kinds(res) == ["failed-commit-visible"]
    assert res["violations"][0]["ops"] == [c0, c1, r]


# -- the lost-commit rule needs the final read (issue 18, item 6) ------------------------------------------------
def without_final_read() -> LeaseHistory:
    """holder_history cut short before its final phase (an interrupted run: docs_read 0)."""
    h = holder_history()
    h.ops = [o for o in h.ops if o["f"] != "read"]
    return h


def test_a_run_whose_final_read_never_happened_is_unknown_with_the_reason_when_the_workload_reads_back():
    res = run("stale-commit", without_final_read().ops, final_read=True)
    assert res["valid"] == "unknown" and res["docs_read"] == 0 and res["unread_docs"] == ["d"]
    assert "final read did not happen for 1 document(s)" in res["reason"] and "lost-commit" in res["reason"]
    # a checker not told the history has a final phase judges what it has, as before (`fencelab check`, scenarios)
    assert run("stale-commit", without_final_read().ops)["valid"] is True


def test_with_the_final_read_the_rule_judges_as_before_and_a_violation_stays_a_violation():
    assert run("stale-commit", holder_history().ops, final_read=True)["valid"] is True
    h = without_final_read()
    h.commit(0, "L1", 1, [0, 1, 3], rev=4, validated=2500)  # after its successor's commit (token 2): stale
    res = run("stale-commit", h.ops, final_read=True)
    assert res["valid"] is False and "reason" not in res and res["unread_docs"] == ["d"]
    # a read of another document does not judge this one's commits
    h = without_final_read()
    h.read(9, [], doc="other")
    res = run("stale-commit", h.ops, final_read=True)
    assert res["valid"] == "unknown" and res["docs_read"] == 1 and res["unread_docs"] == ["d"]
