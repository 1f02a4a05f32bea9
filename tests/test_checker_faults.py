"""Faults asked for and never injected (checkers.faults): no plain "valid" under a fault that never fired."""

from __future__ import annotations

from checkers.core import compose, get_checker
from checkers.faults import FaultCoverage, fault_windows, with_fault_coverage
from nemesis.registry import start_fs
from test_checker_core import LeaseHistory
from test_checker_stale_commit import holder_history


def with_partition(h: LeaseHistory, phase: str = "start") -> LeaseHistory:
    """A partition window as the lane records it: invocation (value null), completion (value with the phase)."""
    h.nemesis("start-partition")
    h.nemesis("start-partition", {"fault": "partition", "phase": phase, "grudge": "isolate-valkey"})
    h.nemesis("stop-partition")
    h.nemesis("stop-partition", {"fault": "partition", "phase": "end" if phase == "start" else "none"})
    return h


def judge(ops: list[dict], test: dict) -> dict:
    """The stale-commit checker of a run, composed and covered as `lab.runner.analyze` does."""
    return with_fault_coverage(compose({"stale-commit": get_checker("stale-commit")}), start_fs()).check(test, ops, {})


def test_a_run_asked_for_a_partition_that_never_happened_is_unknown_with_the_reason():
    res = judge(holder_history().ops, {"nemesis": ["partition"]})
    assert res["valid"] == "unknown" and res["unexercised_faults"] == ["partition"]
    assert res["results"]["faults"]["windows"] == {"partition": 0}
    assert "no partition window happened" in res["reason"] and "nothing is claimed under partition" in res["reason"]
    assert res["results"]["stale-commit"]["valid"] is True, "the other checkers judged as before"


def test_the_same_history_with_a_partition_window_stays_as_before():
    res = judge(with_partition(holder_history()).ops, {"nemesis": ["partition"]})
    assert res["valid"] is True and "unexercised_faults" not in res and "reason" not in res
    assert res["results"]["faults"] == {"valid": True, "asked": ["partition"], "windows": {"partition": 1},
                                        "unexercised": []}
    plain = judge(holder_history().ops, {"nemesis": []})
    assert plain["valid"] is True and set(plain) == {"valid", "results", "elapsed_s"} and set(plain["results"]) == {
        "stale-commit"}, "no nemesis asked: nothing added"


def test_an_invalid_run_stays_invalid():
    h = holder_history()
    h.commit(0, "L1", 1, [0, 1, 3], rev=4, validated=2500)  # after its successor's commit: a stale commit
    res = judge(h.ops, {"nemesis": ["partition"]})
    assert res["valid"] is False and res["unexercised_faults"] == ["partition"]


def test_a_start_that_changed_nothing_or_only_an_invocation_is_no_window():
    res = judge(with_partition(holder_history(), phase="none").ops, {"nemesis": ["partition"]})
    assert res["valid"] == "unknown" and res["results"]["faults"]["windows"] == {"partition": 0}
    h = holder_history()
    h.nemesis("start-partition")  # the lane was cut off before the completion
    assert judge(h.ops, {"nemesis": ["partition"]})["valid"] == "unknown"


def test_each_name_counts_its_own_start_fs():
    h = holder_history()
    h.nemesis("bump-clock", {"fault": "clock", "phase": "start", "targets": ["lease-1"]})
    h.nemesis("start-kill", {"fault": "kill", "phase": "start", "targets": ["valkey"]})
    res = judge(h.ops, {"nemesis": "partition,server-clock,kill"})  # an older test.json's string form
    assert res["results"]["faults"]["windows"] == {"partition": 0, "server-clock": 1, "kill": 1}
    assert res["unexercised_faults"] == ["partition"]
    # netns opens its window with start-partition; a name the caller gave no start fs for: start-<name> or its fault
    assert fault_windows(with_partition(LeaseHistory()).ops, ["netns"], start_fs()) == {"netns": 1}
    assert fault_windows(h.ops, ["kill"]) == {"kill": 1}


def test_a_scenario_run_is_not_judged_twice():
    res = judge(holder_history().ops, {"nemesis": ["partition"], "scenario": "stale-commit-after-pause"})
    assert res["valid"] is True and "faults" not in res["results"]


def test_the_schedule_the_run_used_is_shown():
    sched = {"faults": 1, "asked_interval_s": 5.0, "interval_s": 2.5, "hold_s": 2.5, "scaled": True}
    res = FaultCoverage(start_fs()).check({"nemesis": ["partition"], "extra": {"nemesis_schedule": sched}},
                                          with_partition(LeaseHistory()).ops, {})
    assert res["valid"] is True and res["schedule"] == sched
