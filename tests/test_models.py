"""Every model accepts its valid histories and rejects a violating one (each model is sensitive)."""

from __future__ import annotations

import dataclasses

import pytest

from checkers.linear import check_history
from checkers.linear.history import pair_history
from checkers.linear.testing import HistoryBuilder
from checkers.models import ILLEGAL, MODELS, Input, Model, ModelError, Output, get_model, prune_register


def valid(b: HistoryBuilder, model: str) -> object:
    """The verdict for a builder's history."""
    return check_history(b.ops, model)["valid"]


# --------------------------------------------------------------------------- registry


def test_registry_names_and_unknown_model_error():
    assert set(MODELS) == {"register", "cas-register", "mutex", "fenced-register", "lease", "kv"}
    assert get_model("kv") is MODELS["kv"]
    with pytest.raises(ValueError, match=r"unknown model 'nope'; known models: register, cas-register"):
        get_model("nope")


def test_model_defaults_are_filled_for_a_minimal_model():
    counter = Model(name="counter", init=lambda: 0,
                    step=lambda s, i, o: (o.type == "info" or o.value == s + 1, s + 1) if i.f == "incr" else (False, s))
    assert counter.equal(1, 1) and counter.hash(3) == hash(3)
    assert counter.describe_state(5) == "5"
    assert counter.describe_operation(Input("incr", None), Output("ok", 1)) == "incr() -> 1"
    b = HistoryBuilder().invoke(0, "incr").invoke(1, "incr").ok(1, 1).ok(0, 2)
    assert valid(b, counter) is True
    b = HistoryBuilder().invoke(0, "incr").ok(0, 1).invoke(1, "incr").ok(1, 1)
    assert valid(b, counter) is False


def test_custom_equal_and_hash_govern_the_cache():
    # States are (value, noise); equality ignores the noise, so the model must still be checked correctly.
    m = Model(name="noisy", init=lambda: (None, 0),
              step=lambda s, i, o: ((True, (i.value, s[1] + 1)) if i.f == "write"
                                    else (o.value == s[0], s)),
              equal=lambda a, b: a[0] == b[0], hash=lambda s: hash(s[0]))
    assert m.native_states is False
    b = HistoryBuilder().invoke(0, "write", 1).invoke(1, "write", 2).ok(0).ok(1).invoke(0, "read").ok(0, 2)
    assert valid(b, m) is True
    b.invoke(1, "read").ok(1, 1)
    assert valid(b, m) is False


def test_partition_callback_replaces_per_key_partitioning():
    b = HistoryBuilder().invoke(0, "write", 1, key="a").ok(0).invoke(1, "write", 2, key="b").ok(1)
    b.invoke(0, "read", key="a").ok(0, 1)
    assert valid(b, "cas-register") is True
    one_register = dataclasses.replace(get_model("cas-register"), name="one", partition=lambda ops: [ops])
    assert one_register.native_states is True
    res = check_history(b.ops, one_register)
    assert res["valid"] is False and res["partitions"] == 1


def test_model_requires_callables():
    with pytest.raises(ModelError, match="needs callable init and step"):
        Model(name="bad", init=None, step=None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- register / cas-register


def test_register_valid_concurrent_write_and_read():
    b = HistoryBuilder().invoke(0, "write", 1).invoke(1, "read").ok(1, 1).ok(0)
    assert valid(b, "register") is True


def test_register_read_of_unset_is_null_and_stale_read_is_caught():
    b = HistoryBuilder().invoke(0, "read").ok(0, None).invoke(0, "write", 1).ok(0)
    assert valid(b, "register") is True
    b.invoke(1, "read").ok(1, None)  # after the write returned: stale
    assert valid(b, "register") is False


def test_register_rejects_cas():
    with pytest.raises(ModelError, match="register: unknown f"):
        check_history(HistoryBuilder().invoke(0, "cas", [1, 2]).ok(0).ops, "register")


def test_cas_register_ok_cas_must_match():
    b = HistoryBuilder().invoke(0, "write", 1).ok(0).invoke(0, "cas", [1, 2]).ok(0, [1, 2])
    b.invoke(1, "read").ok(1, 2)
    assert valid(b, "cas-register") is True
    bad = HistoryBuilder().invoke(0, "write", 1).ok(0).invoke(0, "cas", [3, 2]).ok(0, [3, 2])
    assert valid(bad, "cas-register") is False


def test_cas_register_failed_cas_is_dropped_and_info_cas_may_apply():
    b = HistoryBuilder().invoke(0, "cas", [5, 6]).fail(0).invoke(0, "read").ok(0, None)
    assert valid(b, "cas-register") is True
    b = HistoryBuilder().invoke(0, "write", 1).ok(0).invoke(1, "cas", [1, 2]).info(1)
    assert valid(HistoryBuilder().invoke(0, "read").ok(0, 2), "cas-register") is False
    assert valid(b.invoke(2, "read").ok(2, 2), "cas-register") is True


def test_cas_register_bad_cas_value_is_a_clear_error():
    with pytest.raises(ModelError, match=r"cas value must be \[old, new\].*at index 0"):
        check_history(HistoryBuilder().invoke(0, "cas", 3).ok(0).ops, "cas-register")


def test_prune_register_drops_only_unobservable_info_writes():
    b = HistoryBuilder()
    b.invoke(0, "write", 7).info(0)  # 7 is never read: droppable
    b.invoke(1, "write", 8).info(1)  # 8 is read later: kept
    b.invoke(2, "read").ok(2, 8)
    b.invoke(3, "read").ok(3, 9)  # 9 is read, but before the info write of 9 was invoked
    b.invoke(4, "write", 9).info(4)
    ops = pair_history(b.ops)
    kept = prune_register(ops)
    assert [o.input.value for o in kept if o.input.f == "write"] == [8]


def test_prune_register_shortcut_agrees_with_the_exact_pass():
    # prune_register stops reading once every crashed op has a witness; the exact pass reads every op
    import random

    from checkers.models import _prune_register_exact

    rng = random.Random(7)
    dropping = 0
    for _ in range(400):
        b = HistoryBuilder()
        procs = list(range(rng.randrange(1, 6)))
        active: dict[int, bool] = {}
        for _ in range(rng.randrange(1, 30)):
            p = rng.choice(procs)
            if p in active:
                r = rng.random()
                if r < 0.25:
                    b.info(p)
                    procs[procs.index(p)] = max(procs) + 1
                else:
                    b.ok(p, rng.randrange(3) if active[p] else None)
                del active[p]
            else:
                f = rng.choice(["read", "write", "cas"])
                b.invoke(p, f, None if f == "read" else rng.randrange(3) if f == "write" else
                         [rng.randrange(3), rng.randrange(3)])
                active[p] = f == "read"
        ops = pair_history(b.ops)
        if rng.random() < 0.3:
            rng.shuffle(ops)  # any order: the shortcut's early stop is only faster on a call-ordered list
        crashed = [o for o in ops if o.ret is None and o.input.f != "read"]
        exact = _prune_register_exact(ops, crashed) if crashed else ops
        assert prune_register(ops) == exact
        dropping += len(exact) < len(ops)
    assert dropping > 10  # both outcomes covered

# --------------------------------------------------------------------------- mutex


def test_mutex_valid_and_double_acquire():
    b = HistoryBuilder().invoke(0, "acquire").ok(0).invoke(0, "release").ok(0).invoke(1, "acquire").ok(1)
    assert valid(b, "mutex") is True
    bad = HistoryBuilder().invoke(0, "acquire").ok(0).invoke(1, "acquire").ok(1)
    assert valid(bad, "mutex") is False


def test_mutex_info_release_may_have_freed_it():
    b = HistoryBuilder().invoke(0, "acquire").ok(0).invoke(0, "release").info(0).invoke(1, "acquire").ok(1)
    assert valid(b, "mutex") is True
    assert valid(HistoryBuilder().invoke(0, "release").ok(0), "mutex") is False


# --------------------------------------------------------------------------- fenced-register


def fw(b: HistoryBuilder, p: int, v: object, t: int, accepted: object = True) -> HistoryBuilder:
    """A fenced write of v with token t, completed ok with `accepted`."""
    return b.invoke(p, "write", {"value": v, "token": t}).ok(p, accepted)


def test_fenced_register_accepts_equal_or_higher_tokens():
    b = fw(fw(fw(HistoryBuilder(), 0, "a", 1), 1, "b", 3), 0, "c", 3)
    b.invoke(2, "read").ok(2, {"value": "c", "token": 3})
    assert valid(b, "fenced-register") is True


def test_fenced_register_lower_token_accepted_is_a_violation():
    b = fw(fw(HistoryBuilder(), 0, "a", 5), 1, "b", 4)
    assert valid(b, "fenced-register") is False


def test_fenced_register_rejection_must_be_justified():
    ok = fw(fw(HistoryBuilder(), 0, "a", 5), 1, "b", 4, {"accepted": False})
    assert valid(ok, "fenced-register") is True
    bad = fw(fw(HistoryBuilder(), 0, "a", 5), 1, "b", 6, False)  # a higher token rejected
    assert valid(bad, "fenced-register") is False


def test_fenced_register_read_checks_value_and_token():
    b = fw(HistoryBuilder(), 0, "a", 2).invoke(1, "read").ok(1, {"value": "a", "token": 1})
    assert valid(b, "fenced-register") is False
    b = fw(HistoryBuilder(), 0, "a", 2).invoke(1, "read").ok(1, "a")
    assert valid(b, "fenced-register") is True


def test_fenced_register_bad_write_value():
    with pytest.raises(ModelError, match="token"):
        check_history(HistoryBuilder().invoke(0, "write", 3).ok(0).ops, "fenced-register")


# --------------------------------------------------------------------------- kv


def test_kv_put_append_get_per_key():
    b = HistoryBuilder().invoke(0, "put", "x", key="a").ok(0).invoke(1, "append", "y", key="a").ok(1)
    b.invoke(2, "get", key="a").ok(2, "xy").invoke(2, "get", key="b").ok(2, None)
    assert valid(b, "kv") is True
    b.invoke(0, "get", key="a").ok(0, "x")
    assert valid(b, "kv") is False


def test_kv_concurrent_appends_in_either_order():
    b = HistoryBuilder().invoke(0, "append", "x", key=1).invoke(1, "append", "y", key=1).ok(0).ok(1)
    assert valid(HistoryBuilder(), "kv") is True
    assert valid(b.invoke(2, "get", key=1).ok(2, "yx"), "kv") is True


# --------------------------------------------------------------------------- lease


def lease(lid: str, tok: int, at: int, exp: int, state: str = "active") -> dict:
    """A lease as the server reports it."""
    return {"lease_id": lid, "fencing_token": tok, "acquired_at_ms": at, "renewed_at_ms": at,
            "expires_at_ms": exp, "ttl_ms": exp - at, "state": state}


def acq(b: HistoryBuilder, p: int, rid: str, result: dict | None, *, info: bool = False) -> HistoryBuilder:
    """An acquire by process p with request id rid: ok with `result`, or info."""
    b.invoke(p, "acquire", {"request_id": rid, "ttl_ms": 1000}, key="k")
    return b.info(p) if info else b.ok(p, result)


def ref(lid: str, tok: int, rid: str = "r") -> dict:
    """A renew/release/commit invoke value."""
    return {"request_id": rid, "lease_id": lid, "fencing_token": tok}


def test_lease_lifecycle_is_valid():
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
    b.invoke(0, "renew", ref("L1", 1, "r2"), key="k").ok(0, {**lease("L1", 1, 1000, 2500), "renewed_at_ms": 1500})
    b.invoke(0, "commit", ref("L1", 1, "r3"), key="k").ok(0, {"doc": "d", "rev": 1, "accepted_token": 1,
                                                                "validated_at_ms": 1600})
    b.invoke(0, "release", ref("L1", 1, "r4"), key="k").ok(0, lease("L1", 1, 1000, 2500, "released"))
    acq(b, 1, "r5", lease("L2", 2, 1700, 2700))
    b.invoke(1, "inspect", {}, key="k").ok(1, lease("L2", 2, 1700, 2700))
    assert valid(b, "lease") is True


def test_lease_acquire_while_live_is_a_violation_but_after_expiry_is_fine():
    b = acq(acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000)), 1, "r2", lease("L2", 2, 1999, 3000))
    assert valid(b, "lease") is False
    b = acq(acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000)), 1, "r2", lease("L2", 2, 2000, 3000))
    assert valid(b, "lease") is True


def test_lease_tokens_must_increase():
    b = acq(acq(HistoryBuilder(), 0, "r1", lease("L1", 5, 1000, 2000)), 1, "r2", lease("L2", 5, 3000, 4000))
    assert valid(b, "lease") is False


def test_lease_renew_after_expiry_is_a_violation():
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
    b.invoke(0, "renew", ref("L1", 1, "r2"), key="k").ok(0, {**lease("L1", 1, 1000, 3000), "renewed_at_ms": 2000})
    assert valid(b, "lease") is False


def test_lease_stale_release_after_reacquire_is_a_violation():
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
    acq(b, 1, "r2", lease("L2", 2, 2500, 3500))
    b.invoke(0, "release", ref("L1", 1, "r3"), key="k").ok(0, lease("L1", 1, 1000, 2000, "released"))
    assert valid(b, "lease") is False


def test_lease_commit_checks_expiry_and_high_water():
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
    b.invoke(0, "commit", ref("L1", 1), key="k").ok(0, {"accepted_token": 1, "validated_at_ms": 2000})
    assert valid(b, "lease") is False  # validated at expiry
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
    acq(b, 1, "r2", lease("L2", 2, 2000, 3000))
    b.invoke(1, "commit", ref("L2", 2, "c1"), key="k").ok(1, {"accepted_token": 2, "validated_at_ms": 2100})
    b.invoke(0, "commit", ref("L1", 1, "c2"), key="k").ok(0, {"accepted_token": 1, "validated_at_ms": 1500})
    assert valid(b, "lease") is False  # the older holder committed after a newer acquisition


def test_lease_retry_by_request_id_is_one_operation():
    # The first attempt timed out; the retry (same request_id) returned the lease granted then.
    b = acq(HistoryBuilder(), 0, "r1", None, info=True)
    acq(b, 1, "r9", None, info=True)
    acq(b, 2, "r1", lease("L1", 1, 1000, 2000))
    res = check_history(b.ops, "lease")
    assert res["valid"] is True and res["ops"] == 3


def test_lease_unseen_grant_is_explained_by_an_info_acquire():
    # The acquire's answer was lost, but an inspect shows the lease it granted.
    b = acq(HistoryBuilder(), 0, "r1", None, info=True)
    b.invoke(1, "inspect", {}, key="k").ok(1, lease("L1", 1, 1000, 2000))
    assert valid(b, "lease") is True
    # Without any acquire that could have granted it, the same inspect is a violation.
    b = HistoryBuilder().invoke(1, "inspect", {}, key="k").ok(1, lease("L1", 1, 1000, 2000))
    assert valid(b, "lease") is False


def test_lease_bad_values_are_clear_errors():
    with pytest.raises(ModelError, match="lease: value needs 'fencing_token'"):
        check_history(acq(HistoryBuilder(), 0, "r1", {"lease_id": "L1"}).ops, "lease")
    with pytest.raises(ModelError, match="lease: unknown f"):
        check_history(HistoryBuilder().invoke(0, "steal", {}).ok(0).ops, "lease")


def test_every_model_step_is_consistent_with_compile():
    m = get_model("cas-register")
    assert m.step(1, Input("cas", (1, 2)), Output("ok", (1, 2))) == (True, 2)
    assert m.step(3, Input("cas", (1, 2)), Output("ok", (1, 2)))[0] is False
    assert m.compile(Input("read", None), Output("ok", 4))(4) == 4
    assert m.compile(Input("read", None), Output("ok", 4))(5) is ILLEGAL


def test_lease_inspect_may_return_the_terminal_record():
    """Contract section 3 keeps a lease's terminal record; inspect returns it with its state (issue 10: the
    model called a valid run invalid because an inspect returned a released lease)."""

    def released() -> HistoryBuilder:
        b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
        return b.invoke(0, "release", ref("L1", 1, "r2"), key="k").ok(0, lease("L1", 1, 1000, 2000, "released"))

    b = released().invoke(1, "inspect", None, key="k").ok(1, lease("L1", 1, 1000, 2000, "released"))
    assert valid(b, "lease") is True
    b = released().invoke(1, "inspect", None, key="k").ok(1, lease("L1", 1, 1000, 2000, "active"))
    assert valid(b, "lease") is False  # active after its release
    b = released().invoke(1, "inspect", None, key="k").ok(1, lease("L1", 1, 1000, 2000, "revoked"))
    assert valid(b, "lease") is False  # ended another way than it was


def test_lease_inspect_of_a_superseded_lease_only_by_its_id():
    def superseded() -> HistoryBuilder:
        b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
        return acq(b, 1, "r2", lease("L2", 2, 2500, 3500))

    b = superseded().invoke(2, "inspect", {"lease_id": "L1"}, key="k").ok(2, lease("L1", 1, 1000, 2000, "expired"))
    assert valid(b, "lease") is True  # its own record, terminal
    b = superseded().invoke(2, "inspect", {"lease_id": "L1"}, key="k").ok(2, lease("L1", 1, 1000, 2000))
    assert valid(b, "lease") is False  # a superseded lease is never active
    b = superseded().invoke(2, "inspect", None, key="k").ok(2, lease("L1", 1, 1000, 2000, "expired"))
    assert valid(b, "lease") is False  # the identity's record is the successor's


def test_lease_inspect_reporting_expiry_ends_the_lease():
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 2000))
    b.invoke(1, "inspect", None, key="k").ok(1, lease("L1", 1, 1000, 2000, "expired"))
    ok = HistoryBuilder()
    ok.ops = [dict(op) for op in b.ops]
    acq(ok, 2, "r3", lease("L2", 2, 2000, 3000))
    assert valid(ok, "lease") is True  # a successor after the reported expiry
    b.invoke(0, "renew", ref("L1", 1, "r2"), key="k").ok(0, {**lease("L1", 1, 1000, 2500), "renewed_at_ms": 1500})
    assert valid(b, "lease") is False  # C10: an expired lease is never revived
    b = HistoryBuilder().invoke(0, "inspect", None, key="k").ok(0, lease("L1", 1, 1000, 2000, "zombie"))
    with pytest.raises(ModelError, match="inspect state must be one of"):
        check_history(b.ops, "lease")


def test_lease_a_backend_failure_may_end_the_current_lease_once():
    """Races table, backup / restore and failover: a higher epoch and all restored leases invalid. After a
    fault that may lose the backend's records the service may end the current lease without a client op."""

    def crash(b: HistoryBuilder) -> HistoryBuilder:
        b.nemesis("start-valkey-crash", None)
        return b.nemesis("start-valkey-crash", {"fault": "valkey-crash", "phase": "start"})

    def over_live(with_crash: bool) -> HistoryBuilder:
        b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 5000))
        if with_crash:
            crash(b)
        return acq(b, 1, "r2", lease("L2", 2 ** 32 + 1, 2000, 6000))  # L1 still live by its expiry

    assert valid(over_live(True), "lease") is True
    assert valid(over_live(False), "lease") is False  # no fault: an acquisition over a live lease
    b = over_live(True)
    b.invoke(0, "renew", ref("L1", 1, "r3"), key="k").ok(0, {**lease("L1", 1, 1000, 7000), "renewed_at_ms": 2500})
    assert valid(b, "lease") is False  # the ended lease renewed: never revived
    b = acq(over_live(True), 2, "r4", lease("L3", 2 ** 32 + 2, 2500, 7000))
    assert valid(b, "lease") is False  # one crash ends the lease of the moment, not every later one
    b = acq(HistoryBuilder(), 0, "r1", lease("L1", 1, 1000, 5000))
    b.nemesis("start-kill", {"fault": "kill", "phase": "start", "targets": ["lease-1"]})  # Valkey's data survives
    assert valid(acq(b, 1, "r2", lease("L2", 2, 2000, 6000)), "lease") is False


# -- a model judges only what it models ---------------------------------------------------------------------------


def test_every_registered_model_says_which_fs_it_models():
    from checkers.models import LEASE_FS, models_taking

    assert {n: sorted(m.fs) for n, m in MODELS.items() if n != "lease"} == {
        "register": ["read", "write"], "cas-register": ["cas", "read", "write"], "mutex": ["acquire", "release"],
        "fenced-register": ["read", "write"], "kv": ["append", "get", "put"]}
    assert MODELS["lease"].fs == LEASE_FS
    assert models_taking({"read", "write"}) == ["register", "cas-register", "fenced-register"]
    assert models_taking({"acquire", "commit", "read"}) == ["lease"]


def test_the_linearizable_checker_never_convicts_on_an_op_its_model_does_not_model():
    """A store `read` beside lease ops: once `valid: false` under cas-register (the read's partition came first)."""
    from checkers.linear import Linearizable

    ops = [{"index": 0, "time": 1, "type": "invoke", "process": 0, "f": "acquire", "key": "k", "value": None},
           {"index": 1, "time": 2, "type": "ok", "process": 0, "f": "acquire", "key": "k", "value": {"token": 1}},
           {"index": 2, "time": 3, "type": "invoke", "process": 1, "f": "read", "key": "doc", "value": None},
           {"index": 3, "time": 4, "type": "ok", "process": 1, "f": "read", "key": "doc", "value": ["e1"]}]
    res = Linearizable("cas-register").check(None, ops, None)
    assert res["valid"] == "unknown" and res["error"] == "model 'cas-register' does not model acquire"
    stale = [{**op, "f": "write" if op["f"] == "acquire" else "read", "value": 7 if op["f"] == "acquire" else 8,
              "key": "k"} for op in ops]
    assert Linearizable("cas-register").check(None, stale, None)["valid"] is False
