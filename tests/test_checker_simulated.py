"""Domain checkers on simulated concurrent lease histories (bench/checker_domain.py's simulator):
a correct server's history passes every checker; planted server bugs are caught by the right one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from checkers.core import DOMAIN_CHECKERS, compose, get_checker

_spec = importlib.util.spec_from_file_location(
    "bench_checker_domain", Path(__file__).resolve().parents[1] / "bench" / "checker_domain.py")
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)


def check_all(history: list[dict]) -> dict:
    return compose({n: get_checker(n) for n in DOMAIN_CHECKERS}).check({}, history, {})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_correct_server_passes_every_checker(seed):
    history = sim.generate_history(20_000, n_keys=8, n_workers=12, seed=seed)
    res = check_all(history)
    bad = {n: r.get("violations", r.get("error"))[:3] for n, r in res["results"].items() if r["valid"] is not True}
    assert res["valid"] is True, bad
    # the history exercises what the checkers look at
    fs = {op["f"] for op in history}
    assert {"acquire", "renew", "release", "commit", "read", "partition"} <= fs
    assert any(op.get("error") == "timeout" for op in history)
    assert res["results"]["idempotency"]["retried"] > 0
    assert res["results"]["availability"]["windows"]


class IgnoresConflicts(sim.Server):
    """Grants an acquire over a live lease now and then (a mutual-exclusion bug)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def _acquire(self, key, value, now_ms):
        self.calls += 1
        cur = self.current.get(key)
        if self.calls % 50 == 0 and cur is not None:
            real, cur["state"] = cur["state"], "expired"  # pretend it ended, grant, keep the old one valid
            try:
                return super()._acquire(key, value, now_ms)
            finally:
                cur["state"] = real
        return super()._acquire(key, value, now_ms)


class ReusesTokens(sim.Server):
    """Forgets to advance the fencing counter now and then (a fencing bug)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def _acquire(self, key, value, now_ms):
        self.calls += 1
        if self.calls % 40 == 0 and self.counter.get(key):
            self.counter[key] -= 1
        return super()._acquire(key, value, now_ms)


class UnfencedCommits(sim.Server):
    """Accepts commits from any lease that ever existed, ignoring expiry and successors (no fencing)."""

    def _commit(self, key, value, now_ms):
        doc = self.docs.setdefault(value["doc"], {"entries": [], "rev": 0, "token": 0})
        if value.get("lease_id") not in self.leases:
            return ("fail", None, "lease_lost")
        doc["entries"].append(value["entry"])
        doc["rev"] += 1
        doc["token"] = max(doc["token"], value["fencing_token"])
        return ("ok", {"doc": value["doc"], "rev": doc["rev"], "accepted_token": value["fencing_token"],
                       "validated_at_ms": now_ms}, None)


def test_planted_bugs_are_caught():
    overlap = check_all(sim.generate_history(20_000, n_keys=8, n_workers=12, seed=4, server=IgnoresConflicts()))
    assert overlap["results"]["mutual-exclusion"]["valid"] is False
    assert overlap["results"]["mutual-exclusion"]["violation_counts"]["overlap"] > 0
    reuse = check_all(sim.generate_history(20_000, n_keys=8, n_workers=12, seed=4, server=ReusesTokens()))
    assert reuse["results"]["fencing"]["valid"] is False
    assert reuse["results"]["fencing"]["violation_counts"]["duplicate-token"] > 0
    unfenced = check_all(sim.generate_history(20_000, n_keys=8, n_workers=12, seed=4, server=UnfencedCommits()))
    stale = unfenced["results"]["stale-commit"]
    assert stale["valid"] is False
    assert {"commit-after-release", "commit-after-successor"} & set(stale["violation_counts"])
