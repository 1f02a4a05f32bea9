"""The lease-history view: built once per composition, handed to each checker, and nothing shared besides it.

`checkers.view.lease_view` pairs a history and indexes it; `Compose` builds one view when any of its checkers
takes one (`ViewChecker`) and passes that view to each; a checker run alone builds its own. Nothing else
carries what was derived from a history from one call to another (the old ContextVar cache keyed on the
history's identity is gone): these tests count the pairings and compare the objects each checker receives.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import checkers.pairs
import checkers.view
from checkers.core import DOMAIN_CHECKERS, ViewCheck, ViewChecker, compose, get_checker
from checkers.pairs import pair_ops
from checkers.view import LeaseView, lease_view
from test_checker_core import Fixed, LeaseHistory

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pairings(monkeypatch) -> list[int]:
    """Counts every pairing of a history by the checkers (`lab.history.pair`, wherever checkers call it)."""
    seen: list[int] = []
    for module in (checkers.view, checkers.pairs):
        real = module.pair

        def counting(history, *a, _real=real, **kw):
            seen.append(id(history))
            return _real(history, *a, **kw)

        monkeypatch.setattr(module, "pair", counting)
    return seen


class Spy(ViewCheck):
    """A view checker that keeps the view it was given, and what a fresh pairing of its history gives."""

    def __init__(self) -> None:
        self.views: list[LeaseView] = []
        self.fresh: list[list] = []

    def check_view(self, test, view, opts):
        self.views.append(view)
        self.fresh.append(pair_ops(view.history))  # outside the view: no ambient cache may answer this
        return {"valid": True}


def lease_history() -> list[dict]:
    """Two leases on one key, a renew, a release, a commit and its final read, and a partition window."""
    h = LeaseHistory()
    h.nemesis("partition", {"phase": "start"})
    h.acquire(0, "L1", 1, at=0)
    h.renew(0, "L1", 1, at=0, renewed=5, exp=1005)
    h.commit(0, "L1", 1, [0, 1, 0], rev=1, validated=6)
    h.release(0, "L1", 1, at=0)
    h.nemesis("partition", {"phase": "end"})
    h.acquire(1, "L2", 2, at=2000)
    h.read(1, [[0, 1, 0]])
    return h.ops


def test_every_domain_checker_takes_the_view_and_the_linearizability_checker_does_not():
    assert all(isinstance(get_checker(n), ViewChecker) for n in DOMAIN_CHECKERS)
    assert not isinstance(get_checker("linearizable", model="register"), ViewChecker)


def test_compose_pairs_the_history_once_and_hands_every_checker_the_same_view(pairings):
    history = lease_history()
    first, last = Spy(), Spy()
    res = compose({"first": first, **{n: get_checker(n) for n in DOMAIN_CHECKERS}, "last": last}).check(
        {}, history, {})
    assert not any("error" in r for r in res["results"].values()), res["results"]
    assert res["results"]["fencing"]["valid"] is True and res["results"]["stale-commit"]["valid"] is True
    assert len(first.views) == len(last.views) == 1 and first.views[0] is last.views[0]
    assert first.views[0].history is history
    # one pairing for the view of eight checkers, plus the two the spies asked for themselves
    assert pairings == [id(history)] * 3


def test_nothing_derived_from_a_history_is_shared_outside_the_view(pairings):
    history = lease_history()
    spy = Spy()
    compose({"fencing": get_checker("fencing"), "spy": spy}).check({}, history, {})
    view, fresh = spy.views[0], spy.fresh[0]
    # inside a composition, pairing the same history again gives new pairs: no cache keyed on the history
    # answers it (the view is the only thing shared, and only to whom it is handed)
    assert fresh is not view.pairs and [p.i0 for p in fresh] == [p.i0 for p in view.pairs]
    assert lease_view(history) is not view
    # the next composition of the same history builds a view of its own
    compose({"spy": spy}).check({}, history, {})
    assert spy.views[1] is not view


def test_a_checker_run_alone_builds_its_own_view_each_time(pairings):
    history = lease_history()
    checker = get_checker("mutual-exclusion")
    assert checker.check({}, history, {}) == checker.check({}, history, {})
    assert pairings == [id(history)] * 2


def test_a_composition_without_view_checkers_builds_no_view(pairings):
    res = compose({"a": Fixed(True), "linearizable": get_checker("linearizable", model="register")}).check(
        {}, lease_history(), {})
    assert "error" not in res["results"]["a"] and pairings == []


def test_a_history_the_view_cannot_read_is_unknown_for_each_view_checker_and_the_others_still_run(pairings):
    history = lease_history()
    history.insert(1, dict(history[1], index=99))  # a second invoke by process 0 while its first is open
    res = compose({"fencing": get_checker("fencing"), "mutual-exclusion": get_checker("mutual-exclusion"),
                   "fixed": Fixed(True)}).check({}, history, {})
    for name in ("fencing", "mutual-exclusion"):
        assert res["results"][name]["valid"] == "unknown"
        assert res["results"][name]["error"].startswith("HistoryError: ")
    assert res["results"]["fixed"] == {"valid": True}
    assert res["reason"].startswith("malformed history: ")
    assert len(pairings) == 1  # tried once, not once per checker
    # alone, a view checker says the same
    assert get_checker("fencing").check({}, history, {}) == res["results"]["fencing"]


def test_the_view_is_frozen_and_derives_each_index_once():
    view = lease_view(lease_history())
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.pairs = []  # type: ignore[misc]
    assert view.leases is view.leases and set(view.leases) == {"L1", "L2"}
    assert view.first_invocations is view.first_invocations
    assert view.successors is view.successors
    assert view.commits is view.commits and len(view.commits) == 1
    assert [w["fault"] for w in view.faults.windows] == ["partition"]
    assert view.of("renew") == [p for p in view.pairs if p.f == "renew"] and view.of("nope") == []


def test_no_checker_module_imports_another_modules_private_names():
    """The shared parts live in the view modules (pairs, windows, commits, view), not in a checker."""
    offenders = []
    for path in sorted((ROOT / "checkers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("checkers."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private:
                    offenders.append(f"{path.relative_to(ROOT)}: from {node.module} import {', '.join(private)}")
    assert not offenders
