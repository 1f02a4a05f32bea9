"""The op record on disk: HistoryWriter, the JSONL readers, pairing and to_frame."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading

import pandas as pd
import pytest

from conftest import wait_until

from lab.history import (
    FRAME_COLUMNS,
    HistoryError,
    HistoryWarning,
    HistoryWriter,
    detect_format,
    iter_jsonl,
    pair_ops,
    read_history,
    read_history_report,
    to_frame,
    validate_op,
    write_jsonl,
)


def _small_history(path, **kw):
    """A short lab history: a write, a nemesis window, a lease acquire that times out, an open read."""
    with HistoryWriter(path, keep=True, **kw) as w:
        a = w.invoke(0, "write", 3)
        w.complete(a, "ok", 3)
        n = w.invoke("nemesis", "start-partition", None)
        w.complete(n, "info", {"isolated": ["n1"]})
        b = w.invoke(1, "acquire", {"request_id": "r1", "ttl_ms": 1000}, key="k3", node="n1")
        w.complete(b, "info", None, error="timeout")
        w.invoke(2, "read", None)
    return w


# -- writer -----------------------------------------------------------------------------------


def test_writer_assigns_dense_indexes_and_monotonic_times(tmp_path):
    w = _small_history(tmp_path / "h.jsonl")
    ops = read_history(tmp_path / "h.jsonl")
    assert [o["index"] for o in ops] == list(range(7))
    assert all(a["time"] <= b["time"] for a, b in zip(ops, ops[1:]))
    assert ops == w.ops  # keep=True keeps exactly what was written


def test_writer_builds_invocations_and_completions(tmp_path):
    _small_history(tmp_path / "h.jsonl")
    ops = read_history(tmp_path / "h.jsonl")
    assert ops[0]["type"] == "invoke" and ops[0]["process"] == 0 and ops[0]["value"] == 3
    assert ops[1]["type"] == "ok" and ops[1]["f"] == "write"
    # The nemesis starts and ends its operations with info (Jepsen's convention).
    assert [ops[2]["type"], ops[3]["type"]] == ["info", "info"] and ops[2]["process"] == "nemesis"
    # key and node are carried from the invocation onto the completion; error is recorded.
    assert ops[5] == {**ops[5], "type": "info", "key": "k3", "node": "n1", "error": "timeout", "value": None}
    assert "error" not in ops[1]


def test_writer_keeps_nothing_in_memory_unless_asked(tmp_path):
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        w.complete(w.invoke(0, "read", None), "ok", 1)
    assert w.ops == [] and w.count == 2


def test_writer_time_is_relative_to_the_given_start(tmp_path):
    import time

    start = time.monotonic_ns() - 5_000_000_000
    with HistoryWriter(tmp_path / "h.jsonl", start_ns=start) as w:
        op = w.invoke(0, "read", None)
    assert op["time"] >= 5_000_000_000
    with HistoryWriter(tmp_path / "future.jsonl", start_ns=time.monotonic_ns() + 10**12) as w:  # a bad start
        with pytest.raises(HistoryError, match="'time' must be an int >= 0"):
            w.invoke(0, "read", None)
        assert w.count == 0


def test_writer_refuses_to_overwrite_a_history(tmp_path):
    (tmp_path / "h.jsonl").write_text("")
    with pytest.raises(HistoryError, match="already exists"):
        HistoryWriter(tmp_path / "h.jsonl")
    with HistoryWriter(tmp_path / "h.jsonl", overwrite=True) as w:
        w.invoke(0, "read", None)
    assert len(read_history(tmp_path / "h.jsonl")) == 1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda w: w.invoke(0, "write", {1, 2}), "not JSON-serializable"),
        (lambda w: w.invoke(-1, "read", None), "'process' must be"),
        (lambda w: w.invoke("n1", "read", None), "'process' must be"),
        (lambda w: w.invoke(0, "", None), "'f' must be"),
        (lambda w: w.invoke(0, "read", None, index=9), "may not set index"),
        (lambda w: w.complete({"process": 0, "f": "read"}, "done", 1), "ok, fail or info"),
        (lambda w: w.invoke(0, "read", float("nan")), "not JSON-serializable"),
    ],
)
def test_writer_rejects_bad_ops_without_consuming_an_index(tmp_path, call, message):
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        with pytest.raises(HistoryError, match=message):
            call(w)
        w.invoke(0, "read", None)
    assert [o["index"] for o in read_history(tmp_path / "h.jsonl")] == [0]


def test_writer_append_assigns_index_and_checks_time_order(tmp_path):
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        first = w.append({"time": 10, "type": "invoke", "process": 0, "f": "read", "value": None, "index": 99})
        assert first["index"] == 0 and first["time"] == 10
        with pytest.raises(HistoryError, match="before the previous op"):
            w.append({"time": 5, "type": "ok", "process": 0, "f": "read", "value": 1})
        assert w.append({"type": "ok", "process": 0, "f": "read", "value": 1})["time"] >= 10


def test_writer_after_close_is_an_error(tmp_path):
    w = HistoryWriter(tmp_path / "h.jsonl")
    w.close()
    w.close()  # idempotent
    with pytest.raises(HistoryError, match="closed"):
        w.invoke(0, "read", None)


@pytest.mark.parametrize("flush", ["each", "batched"])
def test_writer_is_thread_safe(tmp_path, flush):
    path = tmp_path / "h.jsonl"
    per_thread = 2000
    with HistoryWriter(path, flush=flush, flush_interval=0.01) as w:

        def client(p):
            for i in range(per_thread):
                w.complete(w.invoke(p, "write", i), "ok", i)

        threads = [threading.Thread(target=client, args=(p,)) for p in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    ops = read_history(path)  # the reader checks dense indexes and non-decreasing times
    assert len(ops) == 4 * per_thread * 2
    pairs = list(pair_ops(ops))
    assert len(pairs) == 4 * per_thread and all(c is not None and c["value"] == i["value"] for i, c in pairs)


async def test_writer_from_asyncio_workers_and_a_nemesis_thread(tmp_path):
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:

        async def worker(p):
            for i in range(200):
                inv = w.invoke(p, "read", None)
                await asyncio.sleep(0)
                w.complete(inv, "ok", i)

        def nemesis_thread():
            for _ in range(50):
                w.complete(w.invoke("nemesis", "kill", None), "info", "killed")

        t = threading.Thread(target=nemesis_thread)
        t.start()
        await asyncio.gather(*(worker(p) for p in range(3)))
        t.join()
    ops = read_history(path)
    assert len(ops) == 3 * 400 + 100
    assert sum(1 for i, c in pair_ops(ops) if i["process"] == "nemesis") == 50


def test_flushed_lines_are_readable_while_the_writer_is_open(tmp_path):
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path, flush="each") as w:  # every line reaches the OS at once
        w.invoke(0, "read", None)
        assert len(read_history(path)) == 1
        w.flush()
    # batched (the default): flush() hands the batch to the OS at once; without it, the flush thread does
    with HistoryWriter(tmp_path / "b.jsonl", flush_interval=3600) as w:
        w.invoke(0, "read", None)
        w.flush()
        assert len(read_history(tmp_path / "b.jsonl")) == 1
    with HistoryWriter(tmp_path / "t.jsonl", flush_interval=0.05) as w:
        w.complete(w.invoke(0, "read", None), "ok", 1)
        wait_until(lambda: len(read_history(tmp_path / "t.jsonl")) == 2, what="the flush thread to write the batch")


def test_a_big_batch_is_written_without_waiting_for_the_timer(tmp_path):
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path, flush_interval=3600) as w:
        big = "x" * 10_000
        for i in range(120):  # ~1.2 MB: past the 1 MiB batch bound
            w.invoke(i, "write", big)
        wait_until(lambda: path.stat().st_size > 1 << 20, what="the flush thread to write the big batch")
        ops, _problems = read_history_report(path)  # the write may be under way: a torn last line is fine here
        assert len(ops) >= 100


def test_writer_dropped_without_close_still_writes_its_lines(tmp_path):
    import gc

    w = HistoryWriter(tmp_path / "h.jsonl", flush_interval=3600)
    w.complete(w.invoke(0, "read", None), "ok", 1)
    del w
    gc.collect()
    assert [o["type"] for o in read_history(tmp_path / "h.jsonl")] == ["invoke", "ok"]


_MISSING = object()


def test_writer_refuses_exactly_what_validate_op_refuses(tmp_path):
    """The writer's fast type checks accept only ops validate_op accepts, and send the rest to it for its
    message: every combination of valid and invalid caller-chosen fields, invocations and completions."""
    processes = [0, 7, -1, True, "nemesis", "n1", None, 1.0]
    fs = ["read", "", None, 1]
    errors = [None, "timeout", {"code": "x"}, 1, ["x"]]
    keys = [_MISSING, "k3", 3, True, None, 1.5]
    nodes = [_MISSING, None, "n1", 1]
    accepted = refused = 0
    with HistoryWriter(tmp_path / "h.jsonl", flush="each") as w:
        for process, f, error, key, node, completion in itertools.product(processes, fs, errors, keys, nodes,
                                                                          (False, True)):
            extra = {k: v for k, v in (("key", key), ("node", node)) if v is not _MISSING}
            if completion:
                expected = {"type": "ok", "process": process, "f": f, "value": 1, **extra}
                if error is not None:
                    expected["error"] = error
                record = lambda: w.complete({"process": process, "f": f, **extra}, "ok", 1, error)  # noqa: E731
            else:
                expected = {"type": "info" if process == "nemesis" else "invoke", "process": process, "f": f,
                            "value": 1, **extra}
                record = lambda: w.invoke(process, f, 1, **extra)  # noqa: E731
            try:
                validate_op({"index": 0, "time": 0, **expected})
                verdict = None
            except HistoryError as e:
                verdict = str(e).split(": ", 1)[1]
            before = w.count
            if verdict is None:
                op = record()
                assert {k: op[k] for k in expected} == expected and w.count == before + 1
                accepted += 1
            else:
                with pytest.raises(HistoryError) as e:
                    record()
                assert verdict in str(e.value) and w.count == before, (expected, str(e.value))
                refused += 1
    assert accepted and refused
    assert len(read_history(tmp_path / "h.jsonl")) == accepted


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: disk full)")
def test_a_failed_write_is_reported_never_silent():
    w = HistoryWriter("/dev/full", overwrite=True, flush_interval=3600)
    w.invoke(0, "read", None)  # batched: the failure shows at the write
    with pytest.raises(HistoryError, match="writing the history failed.*No space left"):
        w.flush()
    with pytest.raises(HistoryError, match="writing the history failed"):
        w.invoke(1, "read", None)  # nothing more is recorded after a lost write
    assert w.count == 1
    with pytest.raises(HistoryError, match="writing the history failed"):
        w.close()
    w.close()  # idempotent
    w = HistoryWriter("/dev/full", overwrite=True, flush="each")
    with pytest.raises(HistoryError, match="writing op 0 failed.*No space left"):
        w.invoke(0, "read", None)
    with pytest.raises(HistoryError, match="writing the history failed"):
        w.invoke(0, "read", None)
    assert w.count == 0
    with pytest.raises(HistoryError, match="writing the history failed"):
        w.close()


def test_a_forked_child_does_not_write_its_parents_batch(tmp_path):
    """A child forked mid-run (without exec) inherits the unwritten batch; exiting normally it must not write it."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import os, sys\n"
        "from lab.history import HistoryWriter\n"
        "w = HistoryWriter(sys.argv[1], flush_interval=3600)\n"
        "w.complete(w.invoke(0, 'read', None), 'ok', 1)\n"
        "if os.fork() == 0:\n"
        "    sys.exit(0)  # a normal exit: atexit handlers, finalizers run\n"
        "os.wait()\n"
        "w.close()\n"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "h.jsonl")], check=True, cwd=root,
                   env={**os.environ, "PYTHONPATH": str(root)}, timeout=60)
    assert [o["type"] for o in read_history(tmp_path / "h.jsonl")] == ["invoke", "ok"]


def test_writer_serializes_like_json(tmp_path):
    """orjson on the hot path, json for what orjson refuses or would change: the file reads back the same."""
    values = [
        {"a": [1, 2.5, None, True, "é ✓"], "b": {"c": -0.0}},
        {1: "int key", None: "null key"},  # json's string keys; orjson refuses non-string keys
        2**70,  # beyond orjson's 64 bits
        [1e16, 1.5e-7, -3],
        None,
    ]
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        for v in values:
            w.invoke(0, "write", v, key="k")
    got = [o["value"] for o in read_history(tmp_path / "h.jsonl")]
    assert got == [json.loads(json.dumps(v)) for v in values]
    for bad in (float("inf"), {"x": [float("-inf")]}, (float("nan"),), "\ud800"):
        with HistoryWriter(tmp_path / "bad.jsonl", overwrite=True) as w:
            with pytest.raises(HistoryError, match="not JSON-serializable"):
                w.invoke(0, "write", bad)
            assert w.count == 0



@pytest.mark.parametrize("validate", [True, False])
def test_writer_refuses_nan_and_infinity_wherever_they_are(tmp_path, validate):
    """orjson writes NaN and Infinity as null; the writer refuses them in every field a caller fills (the value,
    an extra, the error, a key or node carried over from the invocation; with validate=False also the process
    and f), whether the value beside them is a scalar or not, and records nothing for them."""
    nan, inf = float("nan"), float("-inf")
    cases = [
        lambda w: w.invoke(0, "write", nan),
        lambda w: w.invoke(0, "write", [1, inf]),
        lambda w: w.invoke(0, "write", 1, key="k", extra=nan),
        lambda w: w.invoke(0, "write", None, key=inf),
        lambda w: w.invoke("nemesis", "kill", {"at": inf}),
        lambda w: w.complete({"process": 0, "f": "read"}, "ok", nan),
        lambda w: w.complete({"process": 0, "f": "read"}, "ok", 1, {"code": "x", "after": inf}),
        lambda w: w.complete({"process": 0, "f": "read", "key": nan}, "ok", 1),
        lambda w: w.complete({"process": 0, "f": "read", "node": inf}, "fail", "s"),
        lambda w: w.complete({"process": 0, "f": "read"}, "info", None, None, extra={"x": [nan]}),
    ]
    if not validate:  # unchecked ops may carry a float anywhere
        cases += [lambda w: w.invoke(nan, "write", 1), lambda w: w.complete({"process": 0, "f": inf}, "ok", 1)]
    with HistoryWriter(tmp_path / "h.jsonl", validate=validate) as w:
        for record in cases:  # refused as not JSON, or (a key or node) by the op format's own rule
            with pytest.raises(HistoryError, match="not JSON-serializable|'(key|node)' must be a string"):
                record(w)
        assert w.count == 0
        ok = [w.invoke(0, "write", 1.5), w.invoke(1, "write", None, key="k"), w.invoke(2, "write", "null")]
        assert w.count == 3
    assert [o["value"] for o in read_history(tmp_path / "h.jsonl")] == [o["value"] for o in ok] == [1.5, None, "null"]

# -- readers ----------------------------------------------------------------------------------


def _lines(*ops):
    return "".join(json.dumps(o) + "\n" for o in ops)


def _op(i, type_="invoke", process=0, f="read", value=None, t=None, **extra):
    time = i * 10 if t is None else t
    return {"index": i, "time": time, "type": type_, "process": process, "f": f, "value": value, **extra}


def test_torn_last_line_is_skipped_and_reported(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text(_lines(_op(0), _op(1, "ok", value=5)) + '{"index":2,"time":30,"type":"inv')
    ops, problems = read_history_report(path)
    assert [o["index"] for o in ops] == [0, 1]
    assert len(problems) == 1 and f"{path}:3" in problems[0] and "torn last line" in problems[0]
    with pytest.warns(HistoryWarning, match="torn last line"):
        assert read_history(path) == ops
    with pytest.warns(HistoryWarning):
        assert list(iter_jsonl(path)) == ops


def test_a_lone_bad_line_is_torn_for_the_lab_and_malformed_when_an_op_is_needed(tmp_path):
    """The lab reads its own history while it is written (one torn line is no error there); `fencelab check`
    passes need_an_op=True, so one line of garbage is refused, not judged as an empty history."""
    path = tmp_path / "h.jsonl"
    path.write_text('{"index":0,"time":0,"type":"inv')
    ops, problems = read_history_report(path)
    assert ops == [] and f"{path}:1: torn last line" in problems[0]
    with pytest.raises(HistoryError, match=r"h\.jsonl:1: malformed line \(not JSON"):
        read_history_report(path, need_an_op=True)
    path.write_text(_lines(_op(0)) + '{"index":1,"ti')
    assert len(read_history_report(path, need_an_op=True)[0]) == 1  # a whole op before it: torn


def test_torn_last_line_inside_a_multibyte_character(tmp_path):
    path = tmp_path / "h.jsonl"
    full = json.dumps(_op(1, "ok", value="lease é"), ensure_ascii=False).encode()
    path.write_bytes(_lines(_op(0)).encode() + full[: full.index("é".encode()) + 1])
    ops, problems = read_history_report(path)
    assert len(ops) == 1 and "torn last line" in problems[0]


def test_malformed_middle_line_names_the_line(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text(_lines(_op(0)) + "{not json\n" + _lines(_op(1)))
    with pytest.raises(HistoryError, match=r"h\.jsonl:2: malformed line"):
        read_history(path)


def test_invalid_op_names_the_line_and_the_problem(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text(_lines(_op(0), {**_op(1), "type": "done"}, _op(2)))
    with pytest.raises(HistoryError, match=r"h\.jsonl:2: 'type' must be one of"):
        read_history(path)


def test_a_complete_but_invalid_last_line_is_an_error_not_a_torn_write(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text(_lines(_op(0), {"index": 1}))
    with pytest.raises(HistoryError, match=r"h\.jsonl:2: op is missing required field"):
        read_history(path)


def test_indexes_must_be_dense_and_times_must_not_decrease(tmp_path):
    gap = tmp_path / "gap.jsonl"
    gap.write_text(_lines(_op(0), _op(2)))
    with pytest.raises(HistoryError, match=r"gap\.jsonl:2: index 2 but 1 was expected"):
        read_history(gap)
    back = tmp_path / "back.jsonl"
    back.write_text(_lines(_op(0, t=50), _op(1, "ok", t=40)))
    with pytest.raises(HistoryError, match=r"back\.jsonl:2: time 40 is before"):
        read_history(back)


def test_blank_lines_are_ignored_and_empty_files_are_empty_histories(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text("\n" + _lines(_op(0)) + "\n\n" + _lines(_op(1, "ok")))
    assert len(read_history(path)) == 2
    (tmp_path / "empty.jsonl").write_text("")
    assert read_history_report(tmp_path / "empty.jsonl") == ([], [])


def test_missing_file_and_bad_format_are_clear_errors(tmp_path):
    with pytest.raises(HistoryError, match="no such history file"):
        read_history(tmp_path / "nope.jsonl")
    (tmp_path / "h.jsonl").write_text(_lines(_op(0)))
    with pytest.raises(HistoryError, match="format must be one of"):
        read_history(tmp_path / "h.jsonl", format="csv")


def test_detect_format_by_extension_then_content(tmp_path):
    cases = {
        "a.jsonl": "{:type :invoke}",  # the extension wins
        "b.edn": '{"type": 1}',
        "c.txt": '  {"index": 0}',
        "d.log": "{:type :invoke}",
        "e.log": "[{:type :invoke}]",
        "f.log": ";; comment\n{:a 1}",
    }
    expected = {"a.jsonl": "jsonl", "b.edn": "edn", "c.txt": "jsonl", "d.log": "edn", "e.log": "edn", "f.log": "edn"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert detect_format(tmp_path / name) == expected[name], name
    (tmp_path / "g.log").write_text("hello")
    with pytest.raises(HistoryError, match="cannot tell"):
        detect_format(tmp_path / "g.log")


def test_read_history_reads_jsonl_without_the_extension(tmp_path):
    _small_history(tmp_path / "h.jsonl")
    (tmp_path / "history.txt").write_bytes((tmp_path / "h.jsonl").read_bytes())
    assert read_history(tmp_path / "history.txt") == read_history(tmp_path / "h.jsonl")


def test_write_jsonl_round_trips(tmp_path):
    w = _small_history(tmp_path / "h.jsonl")
    assert write_jsonl(w.ops, tmp_path / "copy.jsonl") == 7
    assert read_history(tmp_path / "copy.jsonl") == w.ops
    with pytest.raises(HistoryError, match="already exists"):
        write_jsonl(w.ops, tmp_path / "copy.jsonl")


# -- validation and pairing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, problem",
    [
        ([], "must be a JSON object"),
        ({"index": 0}, "missing required field"),
        (_op(0, t=-1), "'time' must be an int >= 0"),
        ({**_op(0), "index": True}, "'index' must be an int"),
        ({**_op(0), "process": True}, "'process' must be"),
        ({**_op(0), "error": 5}, "'error' must be a string code or an object"),
        ({**_op(0), "key": [1]}, "'key' must be a string or an int"),
        ({**_op(0), "node": 3}, "'node' must be a string"),
    ],
)
def test_validate_op_names_where_and_what(op, problem):
    with pytest.raises(HistoryError) as e:
        validate_op(op, "run.jsonl:7")
    assert str(e.value).startswith("run.jsonl:7: ") and problem in str(e.value)


def test_validate_op_accepts_the_documented_shapes():
    for op in [
        _op(0),
        _op(1, "ok", process="nemesis", value={"a": [1]}, error={"code": "lease_lost", "msg": "x"}, key=3, node="n1"),
        _op(2, "fail", key="k1", error="lease_conflict"),
    ]:
        assert validate_op(op) is op


def test_pair_ops_matches_by_process_and_reports_open_invocations():
    ops = [
        _op(0, process=0, f="write", value=1),
        _op(1, process=1, f="read"),
        _op(2, "info", process="nemesis", f="kill"),
        _op(3, "ok", process=1, f="read", value=1),
        _op(4, "info", process="nemesis", f="kill", value="done"),
        _op(5, process=2, f="read"),
        _op(6, "fail", process=2, f="read"),
    ]
    pairs = [(i["index"], c and c["index"]) for i, c in pair_ops(ops)]
    assert pairs == [(1, 3), (2, 4), (5, 6), (0, None)]


@pytest.mark.parametrize(
    "ops, message",
    [
        ([_op(0), _op(1)], "process 0 invoked while its operation at index 0 is still open"),
        ([_op(0, "ok")], "ok completion for process 0 with no open invocation"),
        ([_op(0), _op(1, "info"), _op(2)], "process 0 invoked again after its info completion at index 1"),
        ([_op(0, f="read"), _op(1, "ok", f="write")], "does not match its invocation"),
        ([_op(0, "ok", process="nemesis")], "nemesis ok with no nemesis operation open"),
    ],
)
def test_pair_ops_rejects_impossible_histories(ops, message):
    with pytest.raises(HistoryError, match=message):
        list(pair_ops(ops))


def test_to_frame_one_row_per_operation(tmp_path):
    _small_history(tmp_path / "h.jsonl")
    ops = read_history(tmp_path / "h.jsonl")
    frame = to_frame(ops)
    assert list(frame.columns) == FRAME_COLUMNS
    assert list(frame["invoke_index"]) == [0, 2, 4, 6]
    write, nem, acquire, read = (frame.iloc[i] for i in range(4))
    assert write["type"] == "ok" and write["complete_index"] == 1 and write["value_out"] == 3
    assert write["latency_ns"] == ops[1]["time"] - ops[0]["time"]
    assert nem["process"] == "nemesis" and nem["type"] == "info" and nem["value_out"] == {"isolated": ["n1"]}
    assert acquire["key"] == "k3" and acquire["node"] == "n1" and acquire["error"] == "timeout"
    assert acquire["value_in"] == {"request_id": "r1", "ttl_ms": 1000}
    # The read never completed: info, with missing completion columns.
    assert read["type"] == "info"
    assert pd.isna(read["complete_index"]) and pd.isna(read["complete_time"]) and pd.isna(read["latency_ns"])
    assert str(frame["complete_index"].dtype) == "Int64"


def test_to_frame_of_an_empty_history():
    frame = to_frame([])
    assert list(frame.columns) == FRAME_COLUMNS and len(frame) == 0


def test_pair_ops_over_a_big_interleaved_history():
    n = 50_000
    ops = []
    for i in range(n):
        ops.append(_op(2 * i, process=i % 7, t=2 * i))
        ops.append(_op(2 * i + 1, "ok", process=i % 7, t=2 * i + 1))
    pairs = list(pair_ops(ops))
    assert len(pairs) == n and all(c["index"] == i["index"] + 1 for i, c in pairs)
