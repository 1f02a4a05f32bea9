"""The deadlines checker (every completion within its deadline) and availability (rates, latencies, windows)."""

from __future__ import annotations

import pytest

from checkers.deadlines import AvailabilityChecker, DeadlinesChecker
from test_checker_core import MS, LeaseHistory, kinds, run


def timed(h: LeaseHistory, process, f, value, latency_ms, type="ok", result=None, error=None) -> tuple[int, int]:
    """An op that takes latency_ms of monotonic time."""
    i0 = h.invoke(process, f, value)
    h.t += int(latency_ms * MS) - MS  # complete() adds the last millisecond
    return i0, h.complete(type, process, f, result, error=error)


def test_completions_within_deadline_are_valid():
    h = LeaseHistory()
    timed(h, 0, "acquire", {"request_id": "a", "deadline_ms": 50}, 20)
    timed(h, 1, "renew", {"request_id": "b", "deadline_ms": 50}, 50, type="fail", error="lease_lost")
    timed(h, 2, "release", {"request_id": "c"}, 5000)  # no deadline: counted, not judged
    res = run("deadlines", h.ops, slack_ms=0)
    assert res["valid"] is True, res["violations"]
    assert res["checked"] == 2 and res["no_deadline"] == 1


def test_late_completion_names_the_op_and_slack_is_honoured():
    h = LeaseHistory()
    i0, i1 = timed(h, 0, "acquire", {"deadline_ms": 10}, 15, type="info", error="timeout")
    res = run("deadlines", h.ops, slack_ms=0)
    assert kinds(res) == ["deadline-exceeded"]
    assert res["violations"][0]["ops"] == [i0, i1] and res["violations"][0]["overrun_ms"] == pytest.approx(5)
    assert run("deadlines", h.ops, slack_ms=5)["valid"] is True


def test_an_op_that_never_completes_past_its_deadline():
    h = LeaseHistory()
    i0 = h.invoke(0, "acquire", {"deadline_ms": 10})
    for _ in range(20):
        h.call(1, "inspect", {"deadline_ms": 10}, None)
    res = run("deadlines", h.ops, slack_ms=0)
    assert kinds(res) == ["no-completion"] and res["violations"][0]["ops"] == [i0]


def test_absolute_deadlines_need_the_test_start():
    h = LeaseHistory()
    i0, i1 = timed(h, 0, "acquire", {"deadline_at_ms": 1_000_005}, 20)  # invoked at 1 ms, due at 5 ms
    unanchored = run("deadlines", h.ops)
    assert unanchored["valid"] == "unknown" and unanchored["unanchored"] == 1  # nothing it could place
    assert "deadline" in unanchored["reason"]
    res = DeadlinesChecker(slack_ms=0).check({"start_unix_ms": 1_000_000}, h.ops, {})
    assert kinds(res) == ["deadline-exceeded"] and res["violations"][0]["ops"] == [i0, i1]


def test_required_deadlines():
    h = LeaseHistory()
    i0, _ = h.call(0, "acquire", {"request_id": "a"}, None)
    res = run("deadlines", h.ops, require_deadline=True)
    assert kinds(res) == ["missing-deadline"] and res["violations"][0]["ops"] == [i0]
    with pytest.raises(ValueError, match="slack_ms"):
        DeadlinesChecker(slack_ms=-1)


def availability_history() -> LeaseHistory:
    """4 acquires before a partition (3 ok), 2 during it (both info), 1 after it (ok)."""
    h = LeaseHistory()
    for n in range(3):
        timed(h, 0, "acquire", {}, 2 + n)
    timed(h, 0, "acquire", {}, 1, type="fail", error="lease_conflict")
    h.nemesis("start-partition")
    timed(h, 1, "acquire", {}, 100, type="info", error="timeout")
    timed(h, 2, "renew", {}, 100, type="info", error="timeout")
    h.nemesis("stop-partition")
    timed(h, 3, "acquire", {}, 4)
    return h


def test_availability_per_f_and_per_window():
    res = run("availability", availability_history().ops)
    assert res["valid"] is True
    assert res["overall"]["count"] == 7 and res["overall"]["ok"] == 4
    assert res["overall"]["success_rate"] == pytest.approx(4 / 7)
    acq = res["overall"]["by_f"]["acquire"]
    assert acq["count"] == 6 and acq["latency_ms"]["max"] == pytest.approx(100)
    assert acq["latency_ms"]["p50"] == pytest.approx(3.5)
    [w] = res["windows"]
    assert w["fault"] == "partition" and w["count"] == 2 and w["success_rate"] == 0
    assert set(w["by_f"]) == {"acquire", "renew"}
    assert res["outside"]["count"] == 5 and res["outside"]["success_rate"] == pytest.approx(4 / 5)


def test_availability_minimums():
    ops = availability_history().ops
    assert run("availability", ops, min_success_rate=0.5)["valid"] is True
    res = run("availability", ops, min_success_rate={"acquire": 0.9, "renew": 0.0})
    assert kinds(res) == ["availability"] and res["violations"][0]["f"] == "acquire"
    not_ok = [op["index"] - 1 for op in ops if op["f"] == "acquire" and op["type"] in ("fail", "info")]
    assert res["violations"][0]["ops"] == not_ok  # the invocations of the acquires that did not succeed
    with pytest.raises(ValueError, match="within"):
        AvailabilityChecker(min_success_rate=1.5)


def test_an_op_the_lab_paused_is_not_the_systems_lateness():
    """The client-pause nemesis holds a lab client before it sends: its op completes late on a correct server."""
    h = LeaseHistory()
    h.nemesis("start-client-pause", {"fault": "client-pause", "phase": "start", "thread": 0})
    i0, i1 = timed(h, 0, "renew", {"deadline_ms": 5}, 20)
    h.nemesis("stop-client-pause", {"fault": "client-pause", "phase": "end"})
    j0, j1 = timed(h, 1, "renew", {"deadline_ms": 5}, 20)  # after the pause: the system's own lateness
    res = run("deadlines", h.ops, slack_ms=0)
    assert res["client_paused"] == 1 and res["checked"] == 1
    assert kinds(res) == ["deadline-exceeded"] and res["violations"][0]["ops"] == [j0, j1]


def test_a_call_that_never_started_is_not_late_work_of_the_system():
    """concurrent-acquires on a loaded machine: the lab's client gave up 660 ms after a deadline it never sent."""
    h = LeaseHistory()
    timed(h, 0, "acquire", {"deadline_ms": 5}, 700, type="fail", error={"code": "deadline_exceeded",
                                                                        "msg": "nothing was sent: TimeoutError"})
    timed(h, 1, "acquire", {"deadline_ms": 5}, 700, type="fail", error="connect_error")
    i0, i1 = timed(h, 2, "acquire", {"deadline_ms": 5}, 700, type="fail", error="lease_conflict")  # it ran late
    res = run("deadlines", h.ops)
    assert res["not_started"] == 2 and res["checked"] == 1
    assert kinds(res) == ["deadline-exceeded"] and res["violations"][0]["ops"] == [i0, i1]
