"""Jepsen's history.edn: import (vector or one map per line), export, and exact round trips."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.history import (
    HistoryError,
    HistoryWarning,
    HistoryWriter,
    read_edn,
    read_edn_report,
    read_history,
    read_history_report,
    write_edn,
    write_jsonl,
)

# What Jepsen writes for an independent (per-key) register test with concurrency 5: ops print as
# maps in Jepsen's key order, values are jepsen.independent [k v] tuples, process 1 crashes
# (:info) and comes back as process 6, the nemesis partitions and heals.
JEPSEN_SAMPLE = """\
{:type :invoke, :f :write, :value [3 1], :process 0, :time 123, :index 0}
{:type :invoke, :f :read, :value [3 nil], :process 1, :time 456, :index 1}
{:type :info, :f :start, :value :start, :process :nemesis, :time 500, :index 2}
{:type :ok, :f :write, :value [3 1], :process 0, :time 789, :index 3}
{:type :info, :f :start, :value [:isolated {"n1" #{"n3" "n2"}, "n2" #{"n1"}}], :process :nemesis, :time 1000, :index 4}
{:type :info, :f :read, :value [3 nil], :process 1, :time 2000, :index 5, :error :timeout}
{:type :invoke, :f :cas, :value [4 [1 2]], :process 6, :time 2100, :index 6}
{:type :fail, :f :cas, :value [4 [1 2]], :process 6, :time 2200, :index 7, :error [:no-client "Connection refused"]}
{:type :info, :f :stop, :value nil, :process :nemesis, :time 3000, :index 8}
{:type :info, :f :stop, :value :network-healed, :process :nemesis, :time 3100, :index 9}
{:type :invoke, :f :read, :value [3 nil], :process 0, :time 3200, :index 10}
{:type :ok, :f :read, :value [3 1], :process 0, :time 3300, :index 11, :debug {:node "n1", :attempts 2}}
"""

EXPECTED = [
    {"index": 0, "time": 123, "type": "invoke", "process": 0, "f": "write", "value": 1, "key": 3},
    {"index": 1, "time": 456, "type": "invoke", "process": 1, "f": "read", "value": None, "key": 3},
    {"index": 2, "time": 500, "type": "info", "process": "nemesis", "f": "start", "value": "start"},
    {"index": 3, "time": 789, "type": "ok", "process": 0, "f": "write", "value": 1, "key": 3},
    {"index": 4, "time": 1000, "type": "info", "process": "nemesis", "f": "start",
     "value": ["isolated", {"n1": ["n2", "n3"], "n2": ["n1"]}]},
    {"index": 5, "time": 2000, "type": "info", "process": 1, "f": "read", "value": None, "key": 3, "error": "timeout"},
    {"index": 6, "time": 2100, "type": "invoke", "process": 6, "f": "cas", "value": [1, 2], "key": 4},
    {"index": 7, "time": 2200, "type": "fail", "process": 6, "f": "cas", "value": [1, 2], "key": 4,
     "error": {"code": "no-client", "details": ["Connection refused"]}},
    {"index": 8, "time": 3000, "type": "info", "process": "nemesis", "f": "stop", "value": None},
    {"index": 9, "time": 3100, "type": "info", "process": "nemesis", "f": "stop", "value": "network-healed"},
    {"index": 10, "time": 3200, "type": "invoke", "process": 0, "f": "read", "value": None, "key": 3},
    {"index": 11, "time": 3300, "type": "ok", "process": 0, "f": "read", "value": 1, "key": 3,
     "debug": {"node": "n1", "attempts": 2}},
]  # fmt: skip


def test_reads_a_jepsen_history_one_map_per_line(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(JEPSEN_SAMPLE)
    ops, problems = read_edn_report(path)
    assert problems == []
    assert ops == EXPECTED
    assert read_history(path) == EXPECTED  # detected by extension


def test_reads_a_jepsen_history_as_one_vector(tmp_path):
    path = tmp_path / "history.txt"
    lines = JEPSEN_SAMPLE.splitlines()
    path.write_text("[" + lines[0] + "\n " + "\n ".join(lines[1:]) + "]\n")
    assert read_history(path) == EXPECTED  # detected by content ("[")


def test_reads_jepsen_op_records_and_assigns_missing_indexes(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(
        "#jepsen.history.Op{:type :invoke, :f :read, :value nil, :process 0, :time 5}\n"
        "#jepsen.history.Op{:type :ok, :f :read, :value #{3 1 2}, :process 0, :time 9}\n"
    )
    ops, problems = read_edn_report(path)
    assert problems == []  # indexes absent everywhere: assigned silently
    assert ops == [
        {"index": 0, "time": 5, "type": "invoke", "process": 0, "f": "read", "value": None},
        {"index": 1, "time": 9, "type": "ok", "process": 0, "f": "read", "value": [1, 2, 3]},
    ]


def test_sparse_indexes_are_reassigned_and_reported(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(
        "{:type :invoke, :f :read, :value nil, :process 0, :time 5, :index 4}\n"
        "{:type :ok, :f :read, :value 1, :process 0, :time 9, :index 9}\n"
    )
    ops, problems = read_edn_report(path)
    assert [o["index"] for o in ops] == [0, 1] and "reassigned" in problems[0]


def test_a_keyless_register_history_is_not_mistaken_for_independent_keys(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(
        "{:type :invoke, :f :cas, :value [1 2], :process 0, :time 1, :index 0}\n"
        "{:type :invoke, :f :read, :value nil, :process 1, :time 2, :index 1}\n"
        "{:type :ok, :f :cas, :value [1 2], :process 0, :time 3, :index 2}\n"
    )
    ops = read_edn(path)
    assert ops[0]["value"] == [1, 2] and "key" not in ops[0]
    forced = read_edn(path, independent=False)
    assert forced == ops
    with pytest.raises(HistoryError, match="independent=True but op 1"):
        read_edn(path, independent=True)


def test_pairs_that_cannot_be_keys_are_not_independent_tuples(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text("{:type :invoke, :f :txn, :value [[:r 1 nil] [:w 2 3]], :process 0, :time 1, :index 0}\n")
    (op,) = read_edn(path)
    assert "key" not in op and op["value"] == [["r", 1, None], ["w", 2, 3]]


def test_independent_can_be_forced_when_detection_cannot_tell(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(
        "{:type :invoke, :f :cas, :value [1 2], :process 0, :time 1, :index 0}\n"
        "{:type :ok, :f :cas, :value [1 2], :process 0, :time 3, :index 1}\n"
    )
    assert read_edn(path)[0]["key"] == 1  # every client value is a pair: looks independent
    assert "key" not in read_edn(path, independent=False)[0]


def test_torn_last_edn_line_is_skipped_and_reported(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(JEPSEN_SAMPLE + "{:type :invoke, :f :read, :val")
    ops, problems = read_edn_report(path)
    assert ops == EXPECTED
    assert len(problems) == 1 and f"{path}:13: torn last line" in problems[0]
    with pytest.warns(HistoryWarning, match="torn last line"):
        read_edn(path)


def test_malformed_middle_edn_line_names_the_line(tmp_path):
    path = tmp_path / "history.edn"
    lines = JEPSEN_SAMPLE.splitlines(keepends=True)
    lines[4] = "{:type :info, :f :start, :value [:isolated\n"
    path.write_text("".join(lines))
    with pytest.raises(HistoryError, match=r"history\.edn:5: malformed EDN line"):
        read_edn(path)


def test_invalid_edn_op_names_its_line(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(JEPSEN_SAMPLE.replace(":type :ok, :f :write", ":type :done, :f :write"))
    with pytest.raises(HistoryError, match=r"history\.edn:4: 'type' must be one of"):
        read_edn(path)


def test_unknown_tags_and_non_map_forms_are_clear_errors(tmp_path):
    tagged = tmp_path / "tagged.edn"
    tagged.write_text("#my.app/Thing{:a 1}\n{:type :invoke, :f :read, :value nil, :process 0, :time 1}\n")
    with pytest.raises(HistoryError, match=r"tagged\.edn:1: malformed EDN line \(unknown EDN tag"):
        read_edn(tagged)
    numbers = tmp_path / "numbers.edn"
    numbers.write_text("[1 2 3]")
    with pytest.raises(HistoryError, match="op 0 is not an EDN map"):
        read_edn(numbers)


# -- export and round trips -------------------------------------------------------------------


def _lab_history(path):
    """A lab history with everything the EDN mapping must preserve."""
    with HistoryWriter(path, keep=True) as w:
        a = w.invoke(0, "acquire", {"request_id": "r-1", "ttl_ms": 1500, "body": "sha256:ab"}, key="k3", node="n1")
        w.complete(
            a,
            "ok",
            {"lease_id": "L1", "fencing_token": 7, "acquired_at_ms": 1_700_000_000_000, "state": "held",
             "nested": {"type": "not-a-keyword", ":colon": [1, 2.5, None, True]}},
        )  # fmt: skip
        n = w.invoke("nemesis", "start-partition", {"groups": [["n1"], ["n2", "n3"]]})
        w.complete(n, "info", "partitioned")
        c = w.invoke(1, "cas", [1, 2])  # a keyless pair value must stay a pair
        w.complete(c, "fail", [1, 2], error={"code": "stale_token", "msg": "token 6 < 7"})
        r = w.invoke(2, "force-release", {"reason": "ünïcødé \"quoted\"\n\ttabs \\ back"}, key=17)
        w.complete(r, "info", None, error="lease_outcome_unknown", attempt=2, **{"weird key": "x"})
        w.invoke(3, "read", None, key="k3")  # never completed
    return w.ops


def test_lab_history_round_trips_through_edn_op_by_op(tmp_path):
    ops = _lab_history(tmp_path / "h.jsonl")
    assert write_edn(ops, tmp_path / "h.edn") == len(ops)
    back, problems = read_history_report(tmp_path / "h.edn")
    assert problems == []
    assert len(back) == len(ops)
    for original, imported in zip(ops, back):
        assert imported == original
    # ...and back to JSONL, and to EDN again, byte for byte.
    write_jsonl(back, tmp_path / "again.jsonl")
    assert read_history(tmp_path / "again.jsonl") == ops
    write_edn(read_history(tmp_path / "again.jsonl"), tmp_path / "again.edn")
    assert (tmp_path / "again.edn").read_text() == (tmp_path / "h.edn").read_text()


def test_export_looks_like_jepsen(tmp_path):
    ops = _lab_history(tmp_path / "h.jsonl")
    write_edn(ops, tmp_path / "h.edn")
    lines = (tmp_path / "h.edn").read_text().splitlines()
    assert lines[0].startswith(";; fencelab history")
    first = lines[1]
    assert first.startswith('{:type :invoke :f :acquire :value ["k3" {"request_id" "r-1"')
    assert ":process 0 :time " in first and ":key \"k3\" :node \"n1\"" in first
    assert ":process :nemesis" in lines[3] and ":f :start-partition" in lines[3]
    assert '"weird key" "x"' in lines[8]  # not a valid keyword: stays a string key


def test_jepsen_import_then_export_then_import_is_stable(tmp_path):
    (tmp_path / "jepsen.edn").write_text(JEPSEN_SAMPLE)
    ops = read_edn(tmp_path / "jepsen.edn")
    write_edn(ops, tmp_path / "ours.edn")
    assert read_edn(tmp_path / "ours.edn") == ops == EXPECTED


def test_write_edn_refuses_to_overwrite_and_validates(tmp_path):
    (tmp_path / "h.edn").write_text("")
    with pytest.raises(HistoryError, match="already exists"):
        write_edn([], tmp_path / "h.edn")
    with pytest.raises(HistoryError, match="op 0: op is missing"):
        write_edn([{"index": 0}], tmp_path / "other.edn")


json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
op_names = st.text(min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    invoke_value=json_values,
    ok_value=json_values,
    f=op_names,
    key=st.none() | st.integers(0, 1000) | st.text(max_size=6),
    extra=st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in {
        "index", "time", "type", "process", "f", "value", "error", "key", "node"}), json_values, max_size=2),
)  # fmt: skip
def test_any_json_op_round_trips_through_edn(invoke_value, ok_value, f, key, extra):
    keyed = {} if key is None else {"key": key}
    ops = [
        {"index": 0, "time": 1, "type": "invoke", "process": 0, "f": f, "value": invoke_value, **keyed, **extra},
        {"index": 1, "time": 2, "type": "ok", "process": 0, "f": f, "value": ok_value, **keyed},
        {"index": 2, "time": 3, "type": "info", "process": "nemesis", "f": f, "value": ok_value, **extra},
    ]
    with tempfile.TemporaryDirectory() as d:
        write_edn(ops, Path(d) / "h.edn")
        assert read_edn(Path(d) / "h.edn") == ops


def test_edn_value_conversions(tmp_path):
    path = tmp_path / "history.edn"
    path.write_text(
        '{:type :invoke, :f :txn, :value [[:r 1 nil] (:w 2 3/4)], :process 0, :time 1, :index 0, '
        ':at #inst "2024-01-02T03:04:05.000-00:00", :id #uuid "f81d4fae-7dec-11d0-a765-00a0c91e6bf6", '
        ':sym some.ns/thing, :ch \\x, :ns-kw :jepsen.nemesis/partition, :dec 1.5M, :meta {:nested {:k #{:b :a}}}}\n'
    )
    (op,) = read_edn(path)
    assert op["value"] == [["r", 1, None], ["w", 2, 0.75]]
    assert op["at"].startswith("2024-01-02T03:04:05") and op["id"] == "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
    assert (op["sym"], op["ch"], op["ns-kw"], op["dec"]) == ("some.ns/thing", "x", "jepsen.nemesis/partition", 1.5)
    assert op["meta"] == {"nested": {"k": ["a", "b"]}}
