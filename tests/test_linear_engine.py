"""The linearizability engine: pairing, info/crash semantics, partitions, budgets, counterexamples."""

from __future__ import annotations

import pytest

from checkers.linear import HistoryError, Linearizable, check_history, pair_history
from checkers.linear.engine import prepare_partition, search
from checkers.linear.testing import HistoryBuilder
from checkers.models import get_model


def verdict(b: HistoryBuilder, model: str = "cas-register") -> object:
    """The verdict for a builder's history."""
    return check_history(b.ops, model)["valid"]


def pathological(n: int = 24, key: object = None) -> HistoryBuilder:
    """n concurrent writes of distinct values and a concurrent read of a value nobody wrote.

    Every order of every subset of the writes must be ruled out before the
    read is known to be impossible: about n * 2**n configurations.
    """
    b = HistoryBuilder()
    for p in range(n):
        b.invoke(p, "write", p, key=key)
    b.invoke(n, "read", key=key).ok(n, -1)
    for p in range(n):
        b.ok(p, p)
    return b


# --------------------------------------------------------------------------- result shape


def test_result_shape_for_a_valid_history():
    b = HistoryBuilder().invoke(0, "write", 1).ok(0).invoke(0, "read").ok(0, 1)
    res = check_history(b.ops, "cas-register")
    assert res["valid"] is True and res["partitions"] == 1 and res["ops"] == 2
    assert isinstance(res["elapsed_s"], float) and "counterexample" not in res


def test_empty_history_is_valid():
    assert check_history([], "register")["valid"] is True


def test_counterexample_names_key_window_prefix_and_states():
    b = HistoryBuilder()
    b.invoke(0, "write", 1, key="x").ok(0)            # 0, 1
    b.invoke(1, "write", 2, key="x").ok(1)            # 2, 3
    b.invoke(0, "read", key="x").ok(0, 1)             # 4, 5: stale
    b.invoke(2, "read", key="y").ok(2, None)          # another key, fine
    res = check_history(b.ops, "cas-register")
    assert res["valid"] is False and res["partitions"] == 2
    ce = res["counterexample"]
    assert ce["key"] == "x"
    assert ce["prefix"] == [0, 2]
    assert ce["window"] == [4]
    assert ce["states"] == ["null", "1", "2"] and ce["final_state"] == "2"
    assert ce["window_ops"][0]["op"] == "read() -> 1"


# --------------------------------------------------------------------------- pairing and op semantics


def test_fail_ops_are_dropped():
    b = HistoryBuilder().invoke(0, "write", 1).fail(0).invoke(1, "read").ok(1, 1)
    assert verdict(b) is False
    b = HistoryBuilder().invoke(0, "write", 1).fail(0).invoke(1, "read").ok(1, None)
    assert verdict(b) is True


def test_info_write_may_take_effect_late_or_never():
    b = HistoryBuilder().invoke(0, "write", 1).info(0)
    b.invoke(1, "read").ok(1, None)  # not yet (or never)
    b.invoke(1, "read").ok(1, 1)     # took effect long after the crash
    assert verdict(b) is True


def test_info_write_cannot_take_effect_before_its_invocation():
    b = HistoryBuilder().invoke(1, "read").ok(1, 1).invoke(0, "write", 1).info(0)
    assert verdict(b) is False


def test_info_write_takes_effect_at_most_once():
    b = HistoryBuilder().invoke(0, "write", 1).info(0)
    b.invoke(1, "read").ok(1, 1).invoke(1, "write", 2).ok(1).invoke(1, "read").ok(1, 1)
    assert verdict(b) is False


def test_invocation_without_completion_is_indeterminate():
    b = HistoryBuilder().invoke(0, "write", 1).invoke(1, "read").ok(1, 1)
    assert verdict(b) is True
    assert pair_history(b.ops)[0].info


def test_nemesis_ops_are_ignored():
    b = HistoryBuilder().nemesis("start", {"isolated": ["n1"]}).invoke(0, "write", 1)
    b.nemesis("stop").ok(0).nemesis("weird-f", [1, 2]).invoke(0, "read").ok(0, 1)
    res = check_history(b.ops, "cas-register")
    assert res["valid"] is True and res["ops"] == 2
    b.invoke(0, "read").ok(0, 5)
    assert verdict(b) is False


def test_real_time_order_is_line_order():
    # Sequential ops: the read starts after the write returned, so it must see it.
    b = HistoryBuilder().invoke(0, "write", 1).ok(0).invoke(1, "read").ok(1, None)
    assert verdict(b) is False
    # Overlapping: either order.
    b = HistoryBuilder().invoke(0, "write", 1).invoke(1, "read").ok(0).ok(1, None)
    assert verdict(b) is True


@pytest.mark.parametrize(("ops", "message"), [
    ([{"type": "ok", "process": 0, "f": "read", "value": 1}], "no open invocation"),
    ([{"type": "invoke", "process": 0, "f": "read", "value": None}] * 2, "is still open"),
    ([{"type": "start", "process": 0, "f": "read", "value": None}], "has type 'start'"),
    ([{"type": "invoke", "f": "read", "value": None}], "has no 'process' field"),
    ([{"type": "invoke", "process": 0, "f": "read"}, {"type": "ok", "process": 0, "f": "write"}],
     "does not match its invocation"),
    (["not an op"], "is a str, not an object"),
    ([{"type": "invoke", "process": [1], "f": "read"}], "expected an integer"),
])
def test_malformed_histories_get_clear_errors(ops, message):
    with pytest.raises(HistoryError, match=message):
        check_history(ops, "cas-register")


def test_linearizable_checker_turns_errors_into_unknown():
    res = Linearizable("cas-register").check({}, [{"type": "ok", "process": 0, "f": "read"}], {})
    assert res["valid"] == "unknown" and "no open invocation" in res["error"]
    res = Linearizable(get_model("cas-register")).check({}, [{"type": "invoke", "process": 0, "f": "cas",
                                                            "value": 1}], {})
    assert res["valid"] == "unknown" and "cas value must be [old, new]" in res["error"]


def test_linearizable_checker_reports_verdict_and_model():
    b = HistoryBuilder().invoke(0, "write", 1).ok(0).invoke(0, "read").ok(0, 2)
    res = Linearizable("cas-register", time_limit=10).check({}, b.ops, {})
    assert res["valid"] is False and res["model"] == "cas-register"


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="unknown model"):
        check_history([], "no-such-model")
    with pytest.raises(TypeError, match="model must be"):
        check_history([], 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="time_limit"):
        check_history([], "register", time_limit=-1)
    with pytest.raises(ValueError, match="max_cache_entries"):
        check_history([], "register", max_cache_entries=0)


# --------------------------------------------------------------------------- partitions and budgets


def test_partitions_are_independent():
    # Each key alone is linearizable; mixing them into one register would not be.
    b = HistoryBuilder().invoke(0, "write", 1, key="a").ok(0).invoke(1, "write", 2, key="b").ok(1)
    b.invoke(0, "read", key="a").ok(0, 1).invoke(1, "read", key="b").ok(1, 2)
    res = check_history(b.ops, "cas-register")
    assert res["valid"] is True and res["partitions"] == 2


def test_smallest_illegal_partition_is_reported_and_search_stops_there():
    b = pathological(26, key="big")  # would take minutes to exhaust
    b.invoke(100, "write", 1, key="small").ok(100).invoke(100, "read", key="small").ok(100, 2)
    res = check_history(b.ops, "cas-register", time_limit=60)
    assert res["valid"] is False
    assert res["counterexample"]["key"] == "small"


def test_time_budget_gives_unknown():
    res = check_history(pathological(26).ops, "cas-register", time_limit=0.2)
    assert res["valid"] == "unknown" and "time limit" in res["reason"]


def test_cache_budget_gives_unknown():
    res = check_history(pathological(20).ops, "cas-register", max_cache_entries=10_000)
    assert res["valid"] == "unknown" and "cache limit" in res["reason"]


def test_pathological_history_is_decided_without_budget_when_small():
    assert check_history(pathological(8).ops, "cas-register")["valid"] is False


# --------------------------------------------------------------------------- pruning rules


def test_read_only_ops_are_forced_without_branching():
    # 12 concurrent reads of the current value and one write: R1 linearizes each legal read at once.
    # One cache entry: the write's configuration. A forced read is its parent's only child and gets no
    # entry (R0); a read that branched like other ops would be cached, and with R1 gone none would be
    # linearized at all outside an info op's R6 window (the search would fail).
    b = HistoryBuilder()
    for p in range(12):
        b.invoke(p, "read")
    b.invoke(99, "write", 1)
    for p in range(12):
        b.ok(p, None)
    b.ok(99)
    si = prepare_partition(pair_history(b.ops), get_model("cas-register"))
    res = search(si)
    assert res.valid is True and res.cache_entries == 1
    # reads of 1 after the write: forced too, once the write is in
    c = HistoryBuilder()
    c.invoke(99, "write", 1)
    for p in range(12):
        c.invoke(p, "read")
    c.ok(99)
    for p in range(12):
        c.ok(p, 1)
    res = search(prepare_partition(pair_history(c.ops), get_model("cas-register")))
    assert res.valid is True and res.cache_entries == 1


def test_identical_info_ops_are_tried_once():
    # 30 crashed writes of the same value: R4 tries one of them, not 30 (nor their subsets).
    b = HistoryBuilder()
    for p in range(30):
        b.invoke(p, "write", 1).info(p)
    b.invoke(50, "read").ok(50, 1).invoke(50, "write", 2).ok(50).invoke(50, "read").ok(50, 3)
    si = prepare_partition(pair_history(b.ops), get_model("cas-register"))
    res = search(si)
    assert res.valid is False and res.cache_entries <= 4


def test_unobserved_info_writes_are_pruned_before_the_search():
    b = HistoryBuilder()
    for p in range(40):
        b.invoke(p, "write", 100 + p).info(p)  # nobody ever reads these values
    b.invoke(50, "read").ok(50, None)
    si = prepare_partition(pair_history(b.ops), get_model("cas-register"))
    assert si.dropped == 40 and not si.iops


def test_info_ops_are_only_taken_when_the_next_op_needs_them():
    # 12 crashed writes of distinct values, then reads that see each value once, in order, and a bad read.
    # R6 only inserts a crashed write right before the read it enables: the search stays linear.
    b = HistoryBuilder()
    for v in range(12):
        b.invoke(v, "write", v).info(v)
    for v in range(12):
        b.invoke(50, "read").ok(50, v)
    b.invoke(50, "read").ok(50, 0)  # 0 again: its write was used up
    si = prepare_partition(pair_history(b.ops), get_model("cas-register"))
    res = search(si)
    assert res.valid is False and res.cache_entries < 100


def test_identical_determinate_ops_are_tried_earliest_deadline_first():
    # 14 overlapping writes of the same value and a read that needs a different one: R5 tries one write per
    # state instead of every subset of the 14.
    b = HistoryBuilder()
    for p in range(14):
        b.invoke(p, "write", 1)
    b.invoke(20, "read").ok(20, 2)
    for p in range(14):
        b.ok(p, 1)
    si = prepare_partition(pair_history(b.ops), get_model("cas-register"))
    res = search(si)
    assert res.valid is False and res.cache_entries < 30


# --------------------------------------------------------------------------- sequential partitions


def _sequential(values_read: list) -> HistoryBuilder:
    """write 1, read, write 2, read, ... one after the other (no overlap); reads return `values_read`."""
    b = HistoryBuilder()
    for i, v in enumerate(values_read):
        b.invoke(0, "write", i + 1).ok(0, i + 1)
        b.invoke(1, "read").ok(1, v)
    return b


def test_a_sequential_partition_is_replayed_without_a_search():
    si = prepare_partition(pair_history(_sequential([1, 2, 3, 4]).ops), get_model("cas-register"))
    res = search(si)
    assert res.valid is True and res.cache_entries == 0  # replayed in call order: no configuration cached


def test_an_illegal_sequential_partition_gets_the_searchs_counterexample():
    b = _sequential([1, 2, 2, 4])  # the third read returns the value written before the write that preceded it
    si = prepare_partition(pair_history(b.ops), get_model("cas-register"))
    res = search(si)
    assert res.valid is False and res.cache_entries > 0
    assert [op.index for op in res.prefix] == [0, 2, 4, 6, 8]  # write 1, read 1, write 2, read 2, write 3
    assert [op.index for op in res.window] == [10]  # the read of 2 after write 3
    ce = check_history(b.ops, "cas-register")["counterexample"]
    assert ce["window"] == [10] and ce["final_state"] == "3"


def test_overlap_or_an_info_op_leaves_the_replay_to_the_search():
    b = _sequential([1, 2])
    b.invoke(0, "write", 9).invoke(1, "read").ok(1, 9).ok(0, 9)  # overlapping write and read
    res = search(prepare_partition(pair_history(b.ops), get_model("cas-register")))
    assert res.valid is True and res.cache_entries > 0
    c = _sequential([1, 2])
    c.invoke(2, "write", 7).info(2)  # an unanswered write, that a later read observes
    c.invoke(1, "read").ok(1, 7)
    res = search(prepare_partition(pair_history(c.ops), get_model("cas-register")))
    assert res.valid is True and res.cache_entries > 0
    assert verdict(_sequential([1, 2, 3])) is True and verdict(_sequential([1, 1, 3])) is False


# --------------------------------------------------------------------------- records and R5 inputs


def test_shared_inputs_and_outputs_keep_each_values_type():
    # pair_history shares the Input/Output of int, null and two-int values within a history; a value that
    # equals one of them in Python (True == 1, 1.0 == 1, [True, 2] == [1, 2]) must still get its own.
    values = [1, True, 1.0, None, [1, 2], [True, 2], [1.0, 2], "1", 1, [1, 2]]
    b = HistoryBuilder()
    for v in values:
        b.invoke(0, "cas", v).ok(0, v)
    ops = pair_history(b.ops)
    assert len(ops) == len(values)
    for op, v in zip(ops, values):
        want = tuple(v) if isinstance(v, list) else v
        for got in (op.input.value, op.output.value):
            assert got == want and type(got) is type(want)
            if isinstance(want, tuple):
                assert [type(x) for x in got] == [type(x) for x in want]
    # equal int and two-int values are one object; an equal value of another type is not
    assert ops[0].output is ops[8].output and ops[4].input is ops[9].input
    assert ops[1].output is not ops[0].output and ops[5].input is not ops[4].input
    assert ops[1].output.value is True and ops[5].input.value[0] is True


def test_twins_are_the_identical_ops_returning_inside_each_ops_window():
    # R5's twins against their definition: same class, mutating, returning after x is invoked and
    # before x returns (ties on the return position ordered by id), on random intervals with ties.
    import random

    from checkers.linear.engine import SearchInput, _twins

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(1, 12)
        iv = sorted((c, c + rng.randrange(1, 6)) for c in (rng.randrange(0, 10) for _ in range(n)))
        si = SearchInput()
        si.calls = [c for c, _ in iv]
        si.rets = [r for _, r in iv]
        si.ops = list(range(n))
        si.ro = [rng.random() < 0.2 for _ in range(n)]
        classes = [rng.choice([-1, 0, 1]) for _ in range(n)]
        got = _twins(si, classes)
        for x in range(n):
            if classes[x] < 0 or si.ro[x]:
                assert got[x] == ()
                continue
            want = sorted((si.rets[y], y) for y in range(n)
                          if classes[y] == classes[x] and not si.ro[y] and si.rets[y] > si.calls[x]
                          and (si.rets[y], y) < (si.rets[x], x))
            assert got[x] == tuple(y for _r, y in want)
