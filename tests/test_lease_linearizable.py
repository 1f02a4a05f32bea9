"""The lease-linearizability checker the lease and fenced-append workloads compose beside the domain checkers.

It is sensitive (a history no order of the `lease` model explains is `false` in the composed result), silent on
linearizable histories (simulated ones, and real runs of the reference server), `unknown` past its budget, and
judges only the model's operations (a workload's other records are left out, not an error).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from checkers.linear import check_history, lease_linearizable
from checkers.linear.testing import HistoryBuilder, mutate_lease, simulate_lease
from lab.history import read_history
from workloads.lease import lease_checker


def lease(lid: str, tok: int, at: int, exp: int, state: str = "active") -> dict:
    """A lease as the server reports it."""
    return {"lease_id": lid, "fencing_token": tok, "acquired_at_ms": at, "renewed_at_ms": at,
            "expires_at_ms": exp, "ttl_ms": exp - at, "state": state}


def acq(b: HistoryBuilder, p: int, rid: str, result: dict) -> HistoryBuilder:
    """An answered acquire by process p."""
    return b.invoke(p, "acquire", {"request_id": rid, "ttl_ms": 1000}, key="k").ok(p, result)


def linear_result(history: list[dict]) -> dict:
    """The composed lease checker's result, and its `linearizable` part."""
    res = lease_checker(None).check({}, history, {})
    return res["results"]["linearizable"]


def test_the_lease_workload_composes_the_lease_model():
    checker = lease_checker(None)
    assert "linearizable" in checker.checkers
    assert checker.checkers["linearizable"].model.name == "lease"


def test_two_live_leases_at_once_are_not_linearizable():
    """L2 is granted at backend time 2000 while L1, with a lower token, is live until 5000: no order explains it."""
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 5000))
    b = acq(b, 1, "r2", lease("L2", 2, 2000, 6000))
    res = lease_checker(None).check({}, b.ops, {})
    assert res["results"]["linearizable"]["valid"] is False
    assert res["results"]["linearizable"]["counterexample"]["key"] == "k"
    assert res["valid"] is False
    ok = acq(acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000)), 1, "r2", lease("L2", 2, 2500, 3500))
    assert linear_result(ok.ops)["valid"] is True  # the successor after L1's reported expiry


def test_a_release_seen_undone_by_a_later_inspect_is_not_linearizable():
    """Real-time order: the inspect is invoked after the release was acknowledged, yet sees the lease active."""
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 9000))
    b.invoke(0, "release", {"request_id": "r2", "lease_id": "L1", "fencing_token": 1}, key="k")
    b.ok(0, lease("L1", 1, 1000, 9000, "released"))
    b.invoke(1, "inspect", None, key="k").ok(1, lease("L1", 1, 1000, 9000))
    assert linear_result(b.ops)["valid"] is False
    c = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 9000))
    c.invoke(0, "release", {"request_id": "r2", "lease_id": "L1", "fencing_token": 1}, key="k")
    c.invoke(1, "inspect", None, key="k").ok(1, lease("L1", 1, 1000, 9000))  # concurrent: before the release
    c.ok(0, lease("L1", 1, 1000, 9000, "released"))
    assert linear_result(c.ops)["valid"] is True


def test_an_unanswered_acquire_may_or_may_not_have_taken_effect():
    """Indeterminate ops are info: a lease only a timed-out acquire could have granted is accepted."""
    b = HistoryBuilder().invoke(0, "acquire", {"request_id": "r1", "ttl_ms": 1000}, key="k").info(0)
    b.invoke(1, "renew", {"request_id": "r2", "lease_id": "L1", "fencing_token": 7}, key="k")
    b.ok(1, {**lease("L1", 7, 1000, 3000), "renewed_at_ms": 2000})
    assert linear_result(b.ops)["valid"] is True


def test_an_open_op_naming_no_lease_may_act_on_the_current_lease_or_none():
    """The workloads record the lease a release names only in its completion (`value.sent`), so an op that
    never completed (a run killed mid-flight, a crashed client) names none: the history is judged (not
    `unknown` with a model error), with the op acting on the current lease or on none, never a false alarm."""
    def history(release_value: dict, seen: str, release_first: bool = True) -> list[dict]:
        b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 9000))
        if release_first:
            b.invoke(1, "release", release_value, key="k")  # never completes: the run was killed
        b.invoke(2, "inspect", None, key="k").ok(2, lease("L1", 1, 1000, 9000, seen))
        if not release_first:
            b.invoke(1, "release", release_value, key="k")
        return b.ops

    nameless = {"request_id": "r2", "session": "s"}
    assert linear_result(history(nameless, "active"))["valid"] is True  # it need not have taken effect
    assert linear_result(history(nameless, "released"))["valid"] is True  # it may have released L1
    # a release invoked only after the inspect answered cannot explain it; nor can a release explain a revoke
    assert linear_result(history(nameless, "released", release_first=False))["valid"] is False
    assert linear_result(history(nameless, "revoked"))["valid"] is False
    named = {"request_id": "r2", "lease_id": "L1", "fencing_token": 1}
    assert linear_result(history(named, "released"))["valid"] is True
    # the release went out and took effect, its completion was lost, and a successor acquired after it
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 9000))
    b.invoke(0, "release", nameless, key="k")
    b = acq(b, 1, "r3", lease("L2", 2, 2000, 5000))
    assert linear_result(b.ops)["valid"] is True
    c = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 9000))
    c.invoke(0, "release", nameless, key="k").info(0)  # the interpreter's crash completion: no value
    c = acq(c, 1, "r3", lease("L2", 2, 2000, 5000))
    assert linear_result(c.ops)["valid"] is True
    d = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 9000))  # no release at all: two live leases
    d = acq(d, 1, "r3", lease("L2", 2, 2000, 5000))
    assert linear_result(d.ops)["valid"] is False


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_the_engine_on_simulated_and_mutated_lease_histories(seed):
    """Composed or alone, one verdict: valid on linearizable-by-construction histories, and on mutated ones
    the composed checker says exactly what the search says (at least one seed in four is invalid)."""
    rng = random.Random(seed)
    h = simulate_lease(rng, 40, 4)
    assert linear_result(h)["valid"] is True
    m = mutate_lease(h, rng)
    assert linear_result(m)["valid"] == check_history(m, "lease")["valid"]


def test_mutations_are_caught():
    """Sensitivity over many histories: a good share of one-field perturbations is not linearizable."""
    rng = random.Random(7)
    verdicts = [linear_result(mutate_lease(simulate_lease(rng, 40, 4), rng))["valid"] for _ in range(60)]
    assert verdicts.count(False) >= 10
    assert "unknown" not in verdicts


def test_past_its_budget_the_verdict_is_unknown_not_valid():
    b = acq(acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000)), 1, "r2", lease("L2", 2, 2500, 3500))
    res = lease_linearizable(time_limit=0).check({}, b.ops, {})
    assert res["valid"] == "unknown" and "time limit" in res["reason"]
    assert lease_linearizable().check({}, b.ops, {})["valid"] is True


def test_other_records_are_left_out_not_an_error():
    """A workload's observation (an f the model does not know) is no lease operation: judged without it."""
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 5000))
    b.invoke(2, "observe-backend", {}, key="k").ok(2, {"anything": 1})
    with_obs = acq(b, 1, "r2", lease("L2", 2, 2000, 6000))
    res = linear_result(with_obs.ops)
    assert res["valid"] is False and "error" not in res
    with pytest.raises(ValueError, match="unknown f"):  # the model alone still refuses an f it does not know
        check_history(with_obs.ops, "lease")


def test_nothing_answered_is_unknown():
    b = HistoryBuilder().invoke(0, "acquire", {"request_id": "r1", "ttl_ms": 1000}, key="k").fail(0)
    assert linear_result(b.ops)["valid"] == "unknown"


# --------------------------------------------------------------------------- real runs of the reference server


def _run(tmp_path, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "lab", "test", "--store-dir", str(tmp_path), "--time-limit", "4",
                        *args], capture_output=True, text=True, timeout=300)
    workload = args[args.index("--workload") + 1]
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr
    return json.loads((tmp_path / workload / "latest" / "results.json").read_text())


@pytest.mark.parametrize("args", [("--workload", "lease", "--nemesis", "partition", "--nemesis-interval", "1.5"),
                                  ("--workload", "fenced-append", "--keys", "2")])
def test_no_false_alarm_on_a_real_run(tmp_path, args):
    results = _run(tmp_path, *args)
    lin = results["results"]["linearizable"]
    assert lin["model"] == "lease"
    assert lin["valid"] is True, lin
    assert lin["ops"] > 0
    hist = read_history(next((tmp_path / args[1]).glob("*/history.jsonl")))
    assert check_history(hist, "lease")["valid"] is True
    # Sensitive on the same run: a later grant that repeats an earlier grant's token (C5: tokens only grow).
    bad = _token_reused(hist)
    assert bad is not None, "the run has no two ordered grants on one key"
    assert linear_result(bad)["valid"] is False


def _token_reused(hist: list[dict]) -> list[dict] | None:
    """The history with the first grant invoked after another grant on its key completed given that grant's token."""
    done: dict = {}  # key -> token of a grant completed so far
    invoked: dict = {}  # process -> (position, tokens completed on its key when it was invoked)
    for pos, op in enumerate(hist):
        if op.get("f") != "acquire" or op.get("process") == "nemesis":
            continue
        if op["type"] == "invoke":
            invoked[op["process"]] = done.get(op.get("key"))
        elif op["type"] == "ok":
            prior = invoked.pop(op["process"], None)
            if prior is not None and prior != op["value"]["fencing_token"]:
                out = [dict(o) for o in hist]
                out[pos]["value"] = {**op["value"], "fencing_token": prior}
                return out
            done[op.get("key")] = op["value"]["fencing_token"]
        else:
            invoked.pop(op["process"], None)
    return None


@pytest.mark.parametrize("sut", ["valkey-lock", "valkey-lock-fenced", "etcd"])
def test_systems_without_request_ids_or_backend_times_do_not_claim_it(sut):
    """The lease model's premises (retries by request id, backend wall-clock lease times, tokens) are the contract's;
    a third-party lock that lacks them is not judged by it (not run, listed under not_claimed with the reason)."""
    from types import SimpleNamespace

    from lab.sut.registry import claimed_checker, get_sut
    from workloads.lease import lease_checker as checker_of

    assert "linearizable" in get_sut(sut).not_claimed
    kept = claimed_checker(SimpleNamespace(sut=sut, extra={}), checker_of(None))
    assert "linearizable" not in kept.checker.checkers and "lease-state" in kept.checker.checkers
    ref = claimed_checker(SimpleNamespace(sut="reference", extra={}), checker_of(None))
    assert "linearizable" in ref.checkers  # the reference server claims the whole contract


def test_after_a_restore_inspect_may_report_an_older_terminal_record():
    """A real run (valkey-restore on the reference server): the restore brought back the snapshot's record of an
    earlier lease, and inspect reported it, expired. Section 8 allows it (restored leases are invalid); the same
    inspect without a fault, or reporting that older lease active, is not linearizable."""

    def history(fault: bool, state: str) -> list[dict]:
        b = acq(HistoryBuilder(), 0, "r1", lease("L2", 2, 1000, 3000))
        b = acq(b, 1, "r2", lease("L3", 3, 3100, 5100))  # after L2 expired
        if fault:
            b.nemesis("start-valkey-restore", {"fault": "valkey-restore", "phase": "start"})
        b.invoke(2, "inspect", None, key="k").ok(2, lease("L2", 2, 1000, 3000, state))
        return b.ops

    assert linear_result(history(True, "expired"))["valid"] is True
    assert linear_result(history(False, "expired"))["valid"] is False  # no rollback: the record is L3's
    assert linear_result(history(True, "active"))["valid"] is False  # a restored lease is never active
    b = acq(HistoryBuilder(), 0, "r1", lease("L2", 2, 1000, 3000))
    b.nemesis("start-valkey-restore", {"fault": "valkey-restore", "phase": "start"})
    b.invoke(2, "inspect", None, key="k").ok(2, lease("L9", 9, 1000, 3000, "expired"))
    assert linear_result(b.ops)["valid"] is False  # a token never allocated
    after = acq(HistoryBuilder(), 0, "r1", lease("L2", 2, 1000, 9000))
    after.nemesis("start-valkey-restore", {"fault": "valkey-restore", "phase": "start"})
    after.invoke(0, "renew", {"request_id": "r3", "lease_id": "L2", "fencing_token": 2}, key="k")
    after.ok(0, {**lease("L2", 2, 1000, 9500), "renewed_at_ms": 2000})
    after.invoke(2, "inspect", None, key="k").ok(2, lease("L2", 2, 1000, 9500, "revoked"))
    assert linear_result(after.ops)["valid"] is True  # renewed before the recovery ended it
    after.invoke(0, "renew", {"request_id": "r4", "lease_id": "L2", "fencing_token": 2}, key="k")
    after.ok(0, {**lease("L2", 2, 1000, 9800), "renewed_at_ms": 2500})
    assert linear_result(after.ops)["valid"] is False  # renewed after it was seen ended: never revived
