"""A nemesis that moves Valkey's clock makes backend times incomparable: checkers must not convict a correct server.

The recorded history (tests/data/lease-valkey-clock-history.jsonl) is a real `fencelab test -w lease --nemesis
clock --seed 2` run against the unmodified server, in which Valkey's clock was stepped back: before the fix the
fencing and lease-state checkers reported dozens of backend-order "violations" in it.
"""

from __future__ import annotations

import copy
from pathlib import Path

from checkers.core import compose, get_checker
from checkers.windows import backend_clock_moves
from lab.history import read_history

DATA = Path(__file__).resolve().parent / "data" / "lease-valkey-clock-history.jsonl"
CHECKERS = ("fencing", "mutual-exclusion", "lease-state")


def check(history):
    return compose({n: get_checker(n) for n in CHECKERS}).check({}, history, {})


def test_a_moved_backend_clock_is_detected_and_backend_rules_are_skipped():
    history = read_history(DATA)
    assert backend_clock_moves(history), "the recorded run moved Valkey's clock"
    res = check(history)
    assert res["valid"] is True, {n: r.get("violations", [])[:1] for n, r in res["results"].items()}
    for name in ("fencing", "lease-state"):
        assert res["results"][name]["backend_time_rules"].startswith("skipped")
    mutex = res["results"]["mutual-exclusion"]
    assert mutex["backend_time_rules"].startswith("per stretch between clock moves")
    assert mutex["keys_compared"] > 0, "exclusion is still judged between the clock moves"


def test_an_overlap_between_two_clock_moves_is_still_caught():
    history = copy.deepcopy(read_history(DATA))
    move = next(op["time"] for op in history if op["process"] == "nemesis")
    oks = [op for op in history if op["type"] == "ok" and op["f"] == "acquire" and op["key"] == "k1"
           and op["time"] < move]
    first, later = oks[0], oks[1]  # consecutive leases of k1
    assert first is not later
    # the first lease's release reports (backend time) that it ended after the later lease was acquired,
    # and everything happened before any clock move
    lid = first["value"]["lease_id"]
    release = next(op for op in history if op["type"] == "ok" and op["f"] == "release"
                   and op["value"]["lease_id"] == lid)
    assert release["time"] < move
    release["value"]["released_at_ms"] = later["value"]["acquired_at_ms"] + 5
    res = check(history)
    assert res["results"]["mutual-exclusion"]["valid"] is False
    assert "overlap" in res["results"]["mutual-exclusion"]["violation_counts"]


def test_real_time_rules_still_catch_a_reused_token_in_such_a_history():
    history = copy.deepcopy(read_history(DATA))
    oks = [op for op in history if op["type"] == "ok" and op["f"] == "acquire" and op["key"] == "k1"]
    first, later = oks[0], oks[-1]
    later["value"]["fencing_token"] = first["value"]["fencing_token"]  # a later acquisition reuses a token
    res = check(history)
    assert res["results"]["fencing"]["valid"] is False


def test_without_a_clock_fault_backend_rules_apply():
    history = [op for op in read_history(DATA) if op["process"] != "nemesis"]
    assert not backend_clock_moves(history)
    res = check(history)
    assert res["results"]["fencing"]["backend_time_rules"] == "applied"
    assert res["results"]["fencing"]["valid"] is False, "the same backend disorder, unexplained, is a violation"
