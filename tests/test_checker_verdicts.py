"""Verdicts a user can trust (issue 10): nothing judged is "unknown" with a reason, never a vacuous pass;
what the client sent (`value.sent`) is held against what came back; and the false alarms seen on real
runs stay fixed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkers.core import DOMAIN_CHECKERS, applicable_checkers, compose, get_checker
from checkers.linear import Linearizable
from lab.cli import main
from test_checker_core import BASE, LeaseHistory, kinds, run

DATA = Path(__file__).resolve().parent / "data"


def sent(rid: str, lease_id: str | None = None, token: int | None = None) -> dict:
    """A `value.sent` object (docs/history-format.md)."""
    out = {"request_id": rid}
    if lease_id is not None:
        out.update(lease_id=lease_id, fencing_token=token)
    return out


def strip_sent(ops: list[dict]) -> list[dict]:
    """The same history as a run that did not record what was sent."""
    ops = copy.deepcopy(ops)
    for op in ops:
        if isinstance(op.get("value"), dict):
            op["value"].pop("sent", None)
    return ops


def linear(ops: list[dict], model: str = "lease") -> dict:
    return Linearizable(model).check({}, ops, {})


def all_domain(ops: list[dict]) -> dict:
    return compose({n: get_checker(n) for n in DOMAIN_CHECKERS}).check({}, ops, {})


# --------------------------------------------------------------------------- nothing to judge


def test_an_empty_history_is_unknown_for_every_checker_and_overall():
    for name in DOMAIN_CHECKERS:
        res = run(name, [])
        assert res["valid"] == "unknown" and res["reason"], name
    for model in ("lease", "register", "cas-register"):
        res = linear([], model)
        assert res["valid"] == "unknown" and res["reason"] == "no operations"
    res = all_domain([])
    assert res["valid"] == "unknown"
    assert applicable_checkers([]) == ([], "empty history: no client operation")

    class Yes:  # a checker that passes anything: the composition still judged nothing
        def check(self, test, history, opts):
            return {"valid": True}

    res = compose({"yes": Yes()}).check({}, [], {})
    assert res["valid"] == "unknown" and "empty history" in res["reason"]
    nemesis_only = [{"index": 0, "time": 1, "type": "info", "process": "nemesis", "f": "start", "value": None}]
    assert compose({"yes": Yes()}).check({}, nemesis_only, {})["valid"] == "unknown"


def wrong_url_history() -> LeaseHistory:
    """A run against nothing listening: every acquire fails to connect, the session's renews hold nothing."""
    h = LeaseHistory()
    for p in range(3):
        rid = h.rid()
        h.call(p, "acquire", {"request_id": rid, "ttl_ms": 1000}, {"request_id": rid}, type="fail",
               error="connect_error")
        h.call(p, "renew", {"request_id": h.rid()}, {"request_id": "x"}, type="fail", error="not_held")
        h.call(p, "commit", {"request_id": h.rid()}, {"doc": "d"}, type="fail", error="not_held")
    return h


@pytest.mark.parametrize("name, reason", [
    ("fencing", "no successful acquisition"),
    ("mutual-exclusion", "no successful acquisition"),
    ("lease-state", "no successful acquisition"),
    ("stale-commit", "no commit was accepted"),
    ("idempotency", "no request_id was retried"),
    ("deadlines", "no operation carries a deadline"),
    ("availability", "every operation failed"),
])
def test_every_operation_failed_is_unknown_with_the_reason(name, reason):
    res = run(name, wrong_url_history().ops)
    assert res["valid"] == "unknown" and reason in res["reason"], res
    assert res["violation_count"] == 0


def test_every_operation_failed_is_unknown_overall_and_for_linearizability():
    ops = wrong_url_history().ops
    assert all_domain(ops)["valid"] == "unknown"
    res = linear(ops)
    assert res["valid"] == "unknown" and res["reason"] == "every operation failed"
    h = LeaseHistory()
    h.call(0, "acquire", {"request_id": "a", "ttl_ms": 10}, None, type="info", error="timeout")
    res = linear(h.ops)
    assert res["valid"] == "unknown" and res["reason"] == "no operation succeeded"
    assert run("availability", h.ops)["reason"] == "no operation succeeded"


def test_fencing_and_exclusion_need_a_key_acquired_twice():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, key="k1")
    h.acquire(1, "M1", 1, at=0, key="k2")
    for name in ("fencing", "mutual-exclusion"):
        res = run(name, h.ops)
        assert res["valid"] == "unknown" and "acquired twice" in res["reason"] or "two leases" in res["reason"]
    h.acquire(2, "L2", 2, at=5000, key="k1")
    for name in ("fencing", "mutual-exclusion"):
        assert run(name, h.ops)["valid"] is True


def test_lease_state_needs_an_op_on_an_acquired_lease():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    h.release(0, "L1", 1, at=0, type="fail")  # refused: nothing succeeded on the lease
    res = run("lease-state", h.ops)
    assert res["valid"] == "unknown" and "no renew, release" in res["reason"]
    h.renew(0, "L1", 1, at=0, renewed=10, exp=1010)
    assert run("lease-state", h.ops)["valid"] is True


def test_stale_commit_without_commits_or_with_none_accepted():
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    assert run("stale-commit", h.ops)["reason"] == "no commit"
    h.commit(0, "L1", 1, [0, 1, 1], type="fail", error="lease_lost")
    res = run("stale-commit", h.ops)
    assert res["valid"] == "unknown" and "no commit was accepted" in res["reason"]
    h.read(9, [[0, 1, 1]])  # ... but a refused commit in the store is still a violation: false beats unknown
    assert kinds(run("stale-commit", h.ops)) == ["failed-commit-visible"]


def test_idempotency_needs_a_retry_of_an_answered_request():
    h = LeaseHistory()
    h.call(0, "acquire", {"request_id": "a", "ttl_ms": 1000}, None, type="info", error="timeout")
    h.call(1, "acquire", {"request_id": "a", "ttl_ms": 1000}, h.lease("L1", 1, at=0))
    res = run("idempotency", h.ops)  # the retry's answer has no earlier answer to match
    assert res["valid"] == "unknown" and res["retried"] == 1 and res["judged"] == 0
    h.call(2, "acquire", {"request_id": "a", "ttl_ms": 1000}, h.lease("L1", 1, at=0))
    res = run("idempotency", h.ops)
    assert res["valid"] is True and res["judged"] == 1


def test_deadlines_judge_ops_that_carry_one():
    h = LeaseHistory()
    h.call(0, "acquire", {"request_id": "a", "ttl_ms": 1000, "deadline_ms": 500}, h.lease("L1", 1, at=0))
    assert run("deadlines", h.ops)["valid"] is True


def test_false_beats_unknown_in_a_composition():
    h = LeaseHistory()
    h.acquire(0, "L1", 7, at=0)
    h.acquire(1, "L2", 7, at=2000)  # a duplicate token; nothing else to judge
    res = all_domain(h.ops)
    assert res["valid"] is False
    assert res["results"]["fencing"]["valid"] is False and res["results"]["stale-commit"]["valid"] == "unknown"


# --------------------------------------------------------------------------- false alarms seen on real runs


def test_a_recorded_lease_run_is_valid_under_the_lease_model():
    """`fencelab test --workload lease --time-limit 5` (our server, seed 0): its inspects return released
    leases, which the lease model called a violation (`fencelab check ... --model lease` said invalid)."""
    path = DATA / "lease-run-history.jsonl"
    history = [json.loads(line) for line in path.read_text().splitlines()]
    released = [op for op in history if op["f"] == "inspect" and op["type"] == "ok"
                and (op["value"] or {}).get("state") == "released"]
    assert released, "the recorded run has inspects that returned a released lease"
    res = CliRunner().invoke(main, ["check", str(path), "--model", "lease", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["valid"] is True


def test_a_retry_that_sent_nothing_is_not_a_replay():
    """`--workload idempotency --nemesis kill`, seed 1: a retry refused a connection (nothing sent, a definite
    `fail`) was counted as a replay that changed its answer."""
    h = LeaseHistory()
    req = {"request_id": "a", "ttl_ms": 1000}
    h.call(0, "acquire", req, h.lease("L1", 1, at=0))
    h.call(1, "acquire", req, {"request_id": "a"}, type="fail", error="connect_error")
    res = run("idempotency", h.ops)
    assert res["violation_count"] == 0 and res["valid"] == "unknown"
    # a retry the server did answer with a refusal is still a violation
    h.call(2, "acquire", req, {"request_id": "a"}, type="fail", error="lease_conflict")
    assert kinds(run("idempotency", h.ops)) == ["replay-not-idempotent"]


def test_in_a_history_that_records_sent_a_failure_without_it_sent_nothing():
    h = LeaseHistory()
    req = {"request_id": "a", "lease_id": "L1", "fencing_token": 1}
    h.acquire(0, "L1", 1, at=0)
    h.call(0, "renew", req, {**h.lease("L1", 1, at=0, renewed=5, exp=1005), "sent": req})
    h.call(1, "renew", req, {"request_id": "a"}, type="fail", error="some_client_code")  # never on the wire
    assert run("idempotency", h.ops)["violation_count"] == 0
    h.ops[-1]["value"]["sent"] = req  # it was sent, and refused: not idempotent
    assert kinds(run("idempotency", h.ops)) == ["replay-not-idempotent"]


# --------------------------------------------------------------------------- what the client sent


def stale_holder(f: str, reply: str) -> tuple[LeaseHistory, int]:
    """L1 expires, L2 is acquired; L1's holder then sends `f` naming L1, and the server says ok.

    reply "successor": the reply is L2's record (the server acted on the current lease of the key);
    "empty": the reply names no lease at all. The invocation names no lease (the workloads record it
    before the client picks its lease): only `value.sent` says which lease the op was about.
    """
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)
    h.acquire(1, "L2", 2, at=200, ttl=1000)
    state = "released" if f == "release" else "active"
    value = (h.lease("L2", 2, at=200, renewed=300, exp=1300, state=state) if reply == "successor"
             else {"request_id": "s"})
    value = {**value, "sent": sent("s", "L1", 1)}
    _, done = h.call(0, f, {"request_id": "s"}, value)
    return h, done


@pytest.mark.parametrize("f", ["renew", "release"])
def test_a_stale_holder_acting_on_the_successor_is_caught_with_sent(f):
    """C12, C13, races table "stale release after reacquire": the successor must stay untouched."""
    h, done = stale_holder(f, "successor")
    res = run("lease-state", h.ops)
    assert res["valid"] is False
    assert {"lease-mismatch", "stale-op-succeeded"} <= set(res["violation_counts"])
    mismatch = next(v for v in res["violations"] if v["type"] == "lease-mismatch")
    assert mismatch["lease"] == "L1" and mismatch["returned_lease"] == "L2" and done in mismatch["ops"]
    assert linear(h.ops)["valid"] is False
    # without `sent` the same history looks like a legitimate op of L2's holder: what the checkers missed
    old = strip_sent(h.ops)
    assert run("lease-state", old)["valid"] is True
    assert linear(old)["valid"] is True


@pytest.mark.parametrize("f", ["renew", "release"])
def test_a_stale_op_whose_reply_names_no_lease_is_caught_with_sent(f):
    h, _ = stale_holder(f, "empty")
    res = run("lease-state", h.ops)
    assert "stale-op-succeeded" in res["violation_counts"]
    assert res["violations"][0]["lease"] == "L1" and res["violations"][0]["successor"] == "L2"
    assert run("lease-state", strip_sent(h.ops))["valid"] != False  # noqa: E712 - unknown or true: missed


def stale_commit(accepted: int, returned_lease: str | None = None) -> LeaseHistory:
    """L1's holder commits after L2 was acquired; only `sent` names the lease and token it carried."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)
    h.acquire(1, "L2", 2, at=200, ttl=1000)
    value = {"doc": "d", "rev": 1, "accepted_token": accepted, "validated_at_ms": BASE + 250,
             "sent": sent("c", "L1", 1)}
    if returned_lease:
        value["lease_id"] = returned_lease
    h.call(0, "commit", {"request_id": "c", "doc": "d", "entry": [0, 1, 1]}, value)
    return h


def test_a_commit_after_a_newer_acquisition_is_caught_with_sent():
    """C29: a lower token after a newer acquisition is rejected."""
    h = stale_commit(accepted=1)
    res = run("stale-commit", h.ops)
    assert "commit-after-successor" in res["violation_counts"] and res["unknown_lease"] == 0
    assert linear(h.ops)["valid"] is False
    old = run("stale-commit", strip_sent(h.ops))
    assert old["valid"] is True and old["unknown_lease"] == 1  # missed: the lease was unknown


def test_a_commit_accepted_under_another_lease_or_token_is_caught_with_sent():
    h = stale_commit(accepted=2)  # the boundary validated the key's current lease, not the one sent
    assert "token-mismatch" in run("stale-commit", h.ops)["violation_counts"]
    assert linear(h.ops)["valid"] is False
    assert run("stale-commit", strip_sent(h.ops))["valid"] is True
    h = stale_commit(accepted=1, returned_lease="L2")
    assert "lease-mismatch" in run("stale-commit", h.ops)["violation_counts"]


def test_histories_without_sent_check_as_before():
    """An older run names the lease in the invocation (or the completion's value): same verdicts."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=100)
    h.acquire(1, "L2", 2, at=200)
    h.release(0, "L1", 1, at=0)  # the invocation names L1
    assert kinds(run("lease-state", h.ops)) == ["stale-op-succeeded"]
    assert linear(h.ops)["valid"] is False


def test_an_info_op_takes_its_lease_from_what_was_sent():
    """The lease model reads an unanswered renew's lease from `sent` (the invocation names none)."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=1000)
    h.call(0, "renew", {"request_id": "r"}, {"request_id": "r", "sent": sent("r", "L1", 1)}, type="info",
           error="timeout")
    h.release(1, "L1", 1, at=0)
    res = linear(h.ops)
    assert res["valid"] is True, res


def test_a_retry_with_its_own_deadline_is_the_same_request():
    """A retry always carries a later deadline: no digest can cover it, so it is no changed body."""
    h = LeaseHistory()
    h.call(0, "acquire", {"request_id": "a", "ttl_ms": 1000, "deadline_ms": 5}, h.lease("L1", 1, at=0))
    h.call(1, "acquire", {"request_id": "a", "ttl_ms": 1000, "deadline_ms": 2000}, h.lease("L1", 1, at=0))
    res = run("idempotency", h.ops)
    assert res["valid"] is True and res["judged"] == 1
    h.call(2, "acquire", {"request_id": "a", "ttl_ms": 999}, h.lease("L1", 1, at=0))  # really changed
    assert kinds(run("idempotency", h.ops)) == ["changed-body-accepted"]


def test_a_same_request_id_sent_for_another_lease_is_a_changed_body():
    """The renew's invocation names no lease; what was sent does: a conflict there is no false conflict."""
    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0)
    h.call(0, "renew", {"request_id": "r"}, {**h.lease("L1", 1, at=0, renewed=5, exp=1005),
                                             "sent": sent("r", "L1", 1)})
    h.call(1, "renew", {"request_id": "r"}, {"request_id": "r", "sent": sent("r", "L9", 4)}, type="fail",
           error="idempotency_conflict")
    res = run("idempotency", h.ops)
    assert res["valid"] is True and res["judged"] == 1
    h.ops[-1]["value"]["sent"] = sent("r", "L1", 1)  # the same lease sent again: nothing to conflict with
    assert kinds(run("idempotency", h.ops)) == ["false-conflict"]
