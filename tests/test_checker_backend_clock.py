"""A nemesis that moves Valkey's clock makes backend times incomparable: checkers must not convict a correct server.

The recorded history (tests/data/lease-valkey-clock-history.jsonl) is a real `fencelab test -w lease --nemesis
clock --seed 2` run against the unmodified server, in which Valkey's clock was stepped back: before the fix the
fencing and lease-state checkers reported dozens of backend-order "violations" in it.
"""

from __future__ import annotations

import copy
from pathlib import Path

from checkers.core import backend_clock_moves, compose, get_checker
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
    for name in CHECKERS:
        assert res["results"][name]["backend_time_rules"].startswith("skipped")


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
