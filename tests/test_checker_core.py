"""checkers.core: merging, composition and exception safety, pairing, nemesis windows, the registry.

Also home of `LeaseHistory`, the small history builder the other test_checker_* files import.
"""

from __future__ import annotations

import itertools

import pytest

from checkers.core import CHECKERS, DOMAIN_CHECKERS, Checker, compose, get_checker, merge_valid, safe_check
from checkers.pairs import pair_ops
from checkers.windows import nemesis_windows

BASE = 1_700_000_000_000  # backend ms used by the builders
MS = 1_000_000


class LeaseHistory:
    """Builds histories op by op, 1 ms of monotonic time apart; builders return history indices."""

    def __init__(self) -> None:
        self.ops: list[dict] = []
        self.t = 0
        self.rids = itertools.count()

    def add(self, type: str, process, f: str, value=None, key="k", **extra) -> int:
        """Append one op; returns its index."""
        self.t += MS
        op = {"index": len(self.ops), "time": self.t, "type": type, "process": process, "f": f, "value": value}
        if key is not None:
            op["key"] = key
        op.update({k: v for k, v in extra.items() if v is not None})
        self.ops.append(op)
        return op["index"]

    def invoke(self, process, f, value=None, key="k") -> int:
        return self.add("invoke", process, f, value, key)

    def complete(self, type, process, f, value=None, key="k", error=None) -> int:
        return self.add(type, process, f, value, key, error=error)

    def call(self, process, f, value, result=None, key="k", type="ok", error=None) -> tuple[int, int]:
        """An invocation immediately followed by its completion."""
        return self.invoke(process, f, value, key), self.complete(type, process, f, result, key, error)

    def rid(self) -> str:
        return f"r{next(self.rids)}"

    @staticmethod
    def lease(lease_id, token, at, exp=None, ttl=1000, renewed=None, state="active", **extra) -> dict:
        """A lease as an ok acquire/renew/release returns it (backend times relative to BASE)."""
        return {"lease_id": lease_id, "fencing_token": token, "acquired_at_ms": BASE + at,
                "renewed_at_ms": BASE + (at if renewed is None else renewed),
                "expires_at_ms": BASE + (at + ttl if exp is None else exp), "ttl_ms": ttl, "state": state, **extra}

    def acquire(self, process, lease_id, token, at, exp=None, ttl=1000, key="k", rid=None, body=None):
        req = {"request_id": rid or self.rid(), "ttl_ms": ttl}
        if body is not None:
            req["body"] = body
        return self.call(process, "acquire", req, self.lease(lease_id, token, at, exp, ttl), key)

    def renew(self, process, lease_id, token, at, renewed, exp, key="k", rid=None, result_token=None):
        req = {"request_id": rid or self.rid(), "lease_id": lease_id, "fencing_token": token}
        res = self.lease(lease_id, token if result_token is None else result_token, at, exp, renewed=renewed)
        return self.call(process, "renew", req, res, key)

    def release(self, process, lease_id, token, at, key="k", rid=None, type="ok", **extra):
        req = {"request_id": rid or self.rid(), "lease_id": lease_id, "fencing_token": token}
        res = self.lease(lease_id, token, at, state="released", **extra) if type == "ok" else None
        return self.call(process, "release", req, res, key, type=type, error="lease_lost" if type == "fail" else None)

    def commit(self, process, lease_id, token, entry, rev=None, validated=None, doc="d", key="k", type="ok",
               error=None, accepted=None):
        req = {"request_id": self.rid(), "lease_id": lease_id, "fencing_token": token, "doc": doc, "entry": entry}
        res = None
        if type == "ok":
            res = {"doc": doc, "rev": rev, "accepted_token": token if accepted is None else accepted,
                   "validated_at_ms": None if validated is None else BASE + validated}
        return self.call(process, "commit", req, res, key, type=type, error=error)

    def read(self, process, entries, doc="d", key="k"):
        token = max((e[1] for e in entries), default=0)
        return self.call(process, "read", {"doc": doc}, {"doc": doc, "entries": entries, "token": token}, key)

    def nemesis(self, f, value=None) -> int:
        return self.add("info", "nemesis", f, value, key=None)


def run(name: str, ops: list[dict], **kw) -> dict:
    """Run one registered checker on a history."""
    return get_checker(name, **kw).check({}, ops, {})


def kinds(result: dict) -> list[str]:
    """The violation types a result reports, in order."""
    return [v["type"] for v in result["violations"]]


# --------------------------------------------------------------------------- merge and compose


@pytest.mark.parametrize("values, expected", [
    ([], True),
    ([True, True], True),
    ([True, "unknown"], "unknown"),
    (["unknown", True, False], False),
    ([False, "unknown"], False),
    ([True, None], "unknown"),  # anything that is not a bool is not a verdict
])
def test_merge_valid_orders_false_over_unknown_over_true(values, expected):
    assert merge_valid(values) == expected


class Fixed:
    def __init__(self, valid):
        self.valid = valid

    def check(self, test, history, opts):
        return {"valid": self.valid}


class Boom:
    def check(self, test, history, opts):
        raise RuntimeError("boom")


class NotADict:
    def check(self, test, history, opts):
        return ["valid"]


def test_compose_merges_and_keeps_each_result():
    res = compose({"a": Fixed(True), "b": Fixed("unknown")}).check({}, [], {})
    assert res["valid"] == "unknown"
    assert res["results"] == {"a": {"valid": True}, "b": {"valid": "unknown"}}
    assert set(res["elapsed_s"]) == {"a", "b"}
    assert compose({"a": Fixed("unknown"), "b": Fixed(False)}).check({}, [], {})["valid"] is False


def test_an_exception_becomes_unknown_with_the_error():
    res = compose({"ok": Fixed(True), "boom": Boom()}).check({}, [], {})
    assert res["valid"] == "unknown"
    assert res["results"]["boom"] == {"valid": "unknown", "error": "RuntimeError: boom"}
    assert res["results"]["ok"] == {"valid": True}
    assert compose({"boom": Boom(), "bad": Fixed(False)}).check({}, [], {})["valid"] is False
    assert safe_check(NotADict(), {}, [], {})["valid"] == "unknown"


def test_compose_validates_its_checkers():
    with pytest.raises(TypeError, match="'x' has no check"):
        compose({"x": object()})
    with pytest.raises(ValueError):
        compose({})
    assert isinstance(Boom(), Checker)


def test_domain_checkers_survive_garbage_inside_compose():
    history = [{"index": 0, "time": 1, "type": "invoke", "process": 0, "f": "commit", "value": {"fencing_token": "x"}},
               {"index": 1, "time": 2, "type": "ok", "process": 0, "f": "commit", "value": {"accepted_token": 3}},
               {"index": 2, "time": 3, "type": "invoke", "process": 0, "f": "commit", "value": {"fencing_token": 1}},
               {"index": 3, "time": 4, "type": "ok", "process": 0, "f": "commit", "value": {"accepted_token": "y"}}]
    res = compose({n: get_checker(n) for n in DOMAIN_CHECKERS}).check({}, history, {})
    assert res["valid"] == "unknown"  # comparing "y" with 3 fails inside stale-commit; the others run
    assert res["results"]["stale-commit"]["valid"] == "unknown"
    assert res["results"]["stale-commit"]["error"].startswith("TypeError")
    others = {n: r for n, r in res["results"].items() if n != "stale-commit"}
    assert not any("error" in r for r in others.values())  # no crash: they had nothing to judge
    assert others.pop("availability")["valid"] is True  # both commits succeeded
    assert all(r["valid"] == "unknown" and r["reason"] for r in others.values())


# --------------------------------------------------------------------------- pairing and windows


def test_pair_ops_by_process_skipping_nemesis_with_open_invocations_as_info():
    h = LeaseHistory()
    a = h.invoke(0, "acquire", {})
    b = h.invoke(1, "acquire", {})
    h.nemesis("partition", {"phase": "start"})
    c = h.complete("fail", 1, "acquire", error="lease_conflict")
    d = h.complete("ok", 0, "acquire", {"lease_id": "L"})
    e = h.invoke(2, "renew", {})
    pairs = pair_ops(h.ops)
    assert [(p.i0, p.i1, p.type) for p in pairs] == [(a, d, "ok"), (b, c, "fail"), (e, None, "info")]
    assert pairs[2].t1 is None and pairs[2].comp is None
    assert pairs[0].result == {"lease_id": "L"}


def test_nemesis_windows_in_both_conventions():
    h = LeaseHistory()
    s1 = h.nemesis("partition", {"phase": "start"})
    e1 = h.nemesis("partition", {"phase": "end"})
    s2 = h.add("invoke", "nemesis", "start-kill", None, key=None)  # Jepsen: invoke + info per nemesis op
    h.add("info", "nemesis", "start-kill", None, key=None)
    h.add("invoke", "nemesis", "stop-kill", None, key=None)
    e2 = h.add("info", "nemesis", "stop-kill", None, key=None)
    s3 = h.nemesis("clock-start")
    h.call(0, "acquire", {}, {})
    ws = nemesis_windows(h.ops)
    assert [(w["fault"], w["start_index"], w["end_index"], w["open"]) for w in ws] == [
        ("partition", s1, e1, False), ("kill", s2, e2, False), ("clock", s3, None, True)]
    assert ws[2]["end"] == h.ops[-1]["time"]


# --------------------------------------------------------------------------- registry


def test_registry_names_and_errors():
    assert set(CHECKERS) == {"linearizable", "fencing", "stale-commit", "stale-write", "mutual-exclusion",
                             "idempotency", "lease-state", "deadlines", "availability"}
    for name in DOMAIN_CHECKERS:
        assert isinstance(get_checker(name), Checker)
    with pytest.raises(ValueError, match="unknown checker 'nope'; known checkers: linearizable, fencing"):
        get_checker("nope")
    with pytest.raises(ValueError, match="needs a model"):
        get_checker("linearizable")


def test_linearizable_comes_from_the_registry_with_a_model():
    h = LeaseHistory()
    h.call(0, "write", 1, None, key=None)
    h.call(0, "read", None, 2, key=None)  # reads a value never written
    res = get_checker("linearizable", model="register").check({}, h.ops, {})
    assert res["valid"] is False
    assert set(res["counterexample"]["window"]) & {2, 3}


def test_public_names_exist():
    import importlib

    for mod in ("core", "pairs", "windows", "view", "commits", "fencing", "stale_commit", "stale_write", "mutex",
                "idempotency", "lease_state", "deadlines", "render", "cli"):
        m = importlib.import_module(f"checkers.{mod}")
        missing = [n for n in m.__all__ if not hasattr(m, n)]
        assert not missing, f"checkers.{mod}.__all__ names missing attributes: {missing}"
