"""The one pairing (lab.history.pair) and what every checker does with a malformed history.

A history that breaks docs/history-format.md's pairing rules is judged by no checker: every domain checker,
the linearizability checker, a scenario checker and `compose` say "unknown" and name the same problem (the
strict pairing's HistoryError), while the same history repaired is judged (no error). The lenient pairing
lists every problem and pairs by fixed rules.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

from checkers.core import DOMAIN_CHECKERS, compose, get_checker
from checkers.pairs import pair_ops
from checkers.linear import Linearizable, pair_history
from checkers.linear.history import pair_partitions, partition_ops
from lab.history import NEMESIS, HistoryError, HistoryWarning, pair
from lab.history import pair_ops as history_pair_ops
from lab.scenarios import SCENARIOS
from lab.scenarios.scenario import ScenarioChecker

_spec = importlib.util.spec_from_file_location(
    "bench_checker_domain", Path(__file__).resolve().parents[1] / "bench" / "checker_domain.py")
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)


@pytest.fixture(scope="module")
def history() -> list[dict]:
    return sim.generate_history(3_000, n_keys=4, n_workers=8, seed=5)


def _client_positions(h: list[dict], typ: str) -> list[int]:
    return [i for i, op in enumerate(h) if op["process"] != NEMESIS and op["type"] == typ]


def _reindex(h: list[dict]) -> list[dict]:
    return [{**op, "index": i} for i, op in enumerate(h)]


def double_invoke(h: list[dict]) -> tuple[list[dict], str]:
    """A process invokes again while its operation is open (its completion removed)."""
    h = [dict(op) for op in h]
    inv = next(i for i in _client_positions(h, "invoke") if i > len(h) // 2)
    proc = h[inv]["process"]
    comp = next(j for j in range(inv + 1, len(h)) if h[j]["process"] == proc)
    del h[comp]
    return _reindex(h), "is still open"


def reuse_after_info(h: list[dict]) -> tuple[list[dict], str]:
    """A process retired by an info invokes again (its successor's ops renamed to it)."""
    h = [dict(op) for op in h]
    info = next(i for i in _client_positions(h, "info") if i > len(h) // 3)
    old = h[info]["process"]
    new = next(op["process"] for op in h[info + 1:] if op["type"] == "invoke" and op["process"] != NEMESIS
               and not any(o["process"] == op["process"] for o in h[:info]))
    for op in h[info + 1:]:
        if op["process"] == new:
            op["process"] = old
    return h, "invoked again after its info completion"


def orphan_completion(h: list[dict]) -> tuple[list[dict], str]:
    """A completion whose invocation is missing."""
    h = [dict(op) for op in h]
    comp = next(i for i in _client_positions(h, "ok") if i > len(h) // 2)
    proc = h[comp]["process"]
    inv = max(j for j in range(comp) if h[j]["process"] == proc)
    del h[inv]
    return _reindex(h), "with no open invocation"


def f_mismatch(h: list[dict]) -> tuple[list[dict], str]:
    h = [dict(op) for op in h]
    comp = next(i for i in _client_positions(h, "ok") if i > len(h) // 2)
    h[comp]["f"] = "something-else"
    return h, "does not match its invocation"


def bad_type(h: list[dict]) -> tuple[list[dict], str]:
    h = [dict(op) for op in h]
    h[_client_positions(h, "ok")[5]]["type"] = "done"
    return h, "has type 'done'"


def bad_process(h: list[dict]) -> tuple[list[dict], str]:
    h = [dict(op) for op in h]
    h[_client_positions(h, "invoke")[5]]["process"] = [1]
    return h, "expected an integer"


MALFORMATIONS = [double_invoke, reuse_after_info, orphan_completion, f_mismatch, bad_type, bad_process]


def every_checker() -> dict:
    checkers = {name: get_checker(name) for name in DOMAIN_CHECKERS}
    checkers["linearizable"] = Linearizable("lease")
    checkers["scenario"] = ScenarioChecker(SCENARIOS[sorted(SCENARIOS)[0]])
    return checkers


def test_the_generated_history_is_well_formed_and_judged(history):
    assert not pair(history, strict=False).problems
    res = compose({name: get_checker(name) for name in DOMAIN_CHECKERS}).check({}, history, {})
    assert res["valid"] is True and not any("error" in r for r in res["results"].values())
    lin = Linearizable("lease").check({}, history, {})
    assert "error" not in lin or "HistoryError" not in lin["error"]


@pytest.mark.parametrize("malform", MALFORMATIONS, ids=lambda m: m.__name__)
def test_every_checker_treats_a_malformed_history_alike(history, malform):
    bad, phrase = malform(history)
    with pytest.raises(HistoryError, match=phrase) as e:
        pair(bad, strict=True)
    problem = str(e.value)
    results = {name: c.check({}, bad, {}) for name, c in every_checker().items()}
    for name, res in results.items():
        assert res["valid"] == "unknown", (name, res)
        assert res.get("error") == f"HistoryError: {problem}", (name, res)
    composed = compose(every_checker()).check({}, bad, {})
    assert composed["valid"] == "unknown" and composed["reason"] == f"malformed history: {problem}"
    assert all(r["error"] == f"HistoryError: {problem}" for r in composed["results"].values())
    # the lenient pairing finds the same first problem and goes on
    pairs, problems, _ = pair(bad, strict=False)
    assert problems and problems[0] == problem and pairs


def test_strict_pairing_readers_agree_with_the_one_pairing(history):
    pairs = pair(history, strict=True).pairs
    client = [p for p in pairs if p[0]["process"] != NEMESIS]
    assert [(p.i0, p.i1) for p in pair_ops(history)] == [
        (inv["index"], comp["index"] if comp is not None else None) for inv, comp, _, _ in client]
    assert [op.index for op in pair_history(history)] == [
        inv["index"] for inv, comp, _, _ in client if comp is None or comp["type"] != "fail"]
    with_nemesis = pair(history, strict=True, nemesis=True).pairs
    assert len(with_nemesis) > len(pairs) and sum(1 for _ in history_pair_ops(history)) == len(with_nemesis)


def _op(i, typ, process=0, f="read", **kw):
    return {"index": i, "time": i, "type": typ, "process": process, "f": f, "value": None, **kw}


def test_lenient_pairing_rules():
    ops = [
        _op(0, "invoke"),  # left open by the next invoke
        _op(1, "invoke"),
        _op(2, "info"),  # retires process 0
        _op(3, "ok", process=1),  # nothing open: dropped
        _op(4, "invoke"),  # after the info: paired as usual
        _op(5, "ok", f="write"),  # f differs: still completes it
        "not an op",
        {"index": 7, "type": "invoke", "f": "read"},  # no process: dropped
        _op(8, "invoke", process=2),
    ]
    pairs, problems, nemesis_at = pair(ops, strict=False)
    assert nemesis_at == []
    assert [(a["index"], b and b["index"]) for a, b, _, _ in pairs] == [(0, None), (1, 2), (4, 5), (8, None)]
    assert [p[2:] for p in pairs] == [(0, None), (1, 2), (4, 5), (8, None)]
    expected = ["is still open", "with no open invocation", "invoked again after its info completion",
                "does not match its invocation", "is a str, not an object", "has no 'process' field"]
    assert len(problems) == len(expected)
    for problem, phrase in zip(problems, expected):
        assert phrase in problem
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(history_pair_ops(ops, strict=False))) == 4
    assert [str(w.message) for w in caught if w.category is HistoryWarning] == problems
    # strict: the first of them is the error
    with pytest.raises(HistoryError, match="is still open"):
        pair(ops, strict=True)
    # the checkers' lenient reader (pages) follows the same rules
    assert [(p.i0, p.i1, p.type) for p in pair_ops(ops, strict=False)] == [
        (0, None, "info"), (1, 2, "info"), (4, 5, "ok"), (8, None, "info")]


def test_nemesis_pairing_only_when_asked():
    ops = [_op(0, "info", NEMESIS, "start"), _op(1, "ok", NEMESIS, "x"), _op(2, "invoke")]
    assert [p[2:] for p in pair(ops, strict=True).pairs] == [(2, None)]  # nemesis ops skipped
    with pytest.raises(HistoryError, match="nemesis invoke while|nemesis ok"):
        pair([_op(0, "ok", NEMESIS, "x")], strict=True, nemesis=True)
    assert pair(ops, strict=True).nemesis == [0, 1]
    pairs, problems, _ = pair([_op(0, "info", NEMESIS, "a"), _op(1, "invoke", NEMESIS, "b"),
                            _op(2, "info", NEMESIS, "b")], strict=False, nemesis=True)
    assert [p[2:] for p in pairs] == [(0, None), (1, 2)] and "still open" in problems[0]


def _fields(parts):
    from checkers.linear.history import Op

    # every slot, read by getattr: the fast pass builds its Ops slot by slot, and one left unset would raise here
    return [(k, [tuple(getattr(o, s) for s in Op.__slots__) for o in p]) for k, p in parts]


def _one_pairing(h, model):
    ops = pair_history(h)
    return len(ops), partition_ops(ops, model)


def test_the_fused_pairing_gives_what_the_one_pairing_gives(history):
    """checkers.linear's one-pass pairing + partitioning (`pair_partitions`) builds the same ops, in the same
    partitions and order, as `pair_history` + `partition_ops`, and a broken history raises the one pairing's
    error."""
    import random

    from checkers.linear.testing import mutate, mutate_lease, simulate, simulate_lease
    from checkers.models import get_model

    rng = random.Random(13)
    cases = []
    for i in range(60):
        name = ["register", "cas-register", "mutex", "kv", "fenced-register"][i % 5]
        h = simulate(name, rng, 60, 5, keys=1 + i % 4)
        cases.append((name, h))
        cases.append((name, mutate(h, rng)))  # a fail made ok, or an ok made fail (fails are dropped)
        # some invocations name no key, their completions do; a few ops fail
        k = [dict(op) for op in h]
        for op in k:
            if op["type"] == "invoke" and "key" in op and rng.random() < 0.3:
                del op["key"]
            elif op["type"] == "ok" and rng.random() < 0.1:
                op["type"] = "fail"
        cases.append((name, k))
        cases.append(("lease", simulate_lease(rng, 50, 4)))
        cases.append(("lease", mutate_lease(cases[-1][1], rng)))
    cases.append(("lease", history))
    nemesis = [{"index": 0, "time": 0, "type": "info", "process": NEMESIS, "f": "start", "value": None}]
    cases.append(("cas-register", nemesis + [{**op, "index": op["index"] + 1} for op in cases[1][1]]))
    # an unhashable (list) key, frozen by partition_ops, and an op with bool / float / dict values
    cases.append(("cas-register", [_op(0, "invoke", key=[1, 2]), _op(1, "ok", key=[1, 2]),
                                   {**_op(2, "invoke", f="write"), "value": True, "key": "a"},
                                   {**_op(3, "ok", f="write"), "value": True, "key": "a"},
                                   {**_op(4, "invoke", process=1, f="write"), "value": 1.5, "key": "a"}]))
    # records without an index or a value (the fast walk reads fields by subscript: these go the general path)
    cases.append(("cas-register", [{k: v for k, v in op.items() if k not in ("index", "value")}
                                   for op in cases[1][1]]))
    n_parts = 0
    for name, h in cases:
        model = get_model(name)
        n, parts = pair_partitions(h, model)
        n1, parts1 = _one_pairing(h, model)
        assert n == n1 and _fields(parts) == _fields(parts1), name
        n_parts += len(parts) > 1
    assert n_parts > 20  # multi-key histories were among them
    # an iterator is read once: a broken one still gets the one pairing's error, a good one its ops
    bad, phrase = MALFORMATIONS[0](history)
    with pytest.raises(HistoryError, match=phrase):
        pair_partitions(iter(bad), get_model("cas-register"))
    h = cases[1][1]
    n, parts = pair_partitions(iter(h), get_model("cas-register"))
    assert (n, _fields(parts)) == (lambda r: (r[0], _fields(r[1])))(_one_pairing(h, get_model("cas-register")))
    for malform in MALFORMATIONS:
        bad, phrase = malform(history)
        for name in ("cas-register", "lease"):
            with pytest.raises(HistoryError, match=phrase) as e:
                pair_partitions(bad, get_model(name))
            with pytest.raises(HistoryError) as e1:
                pair_history(bad)
            assert str(e.value) == str(e1.value)
