"""The fault schedule as data (issue 21): what a run's nemesis executed, in its run directory, and
`fencelab test --fault-schedule FILE` replaying it.

Fast tests: the windows derived from a history, the replay value of every nemesis (and the nemeses that take
it doing again what their record says), the file's round trip and every way a file is refused (one line, exit
2, before anything starts), and the lane emitting the recorded ops at their recorded times. One live test on
the local backend: a run with partition and kill, then the same test replaying its schedule; the second run's
executed windows match the first's in kind and targets, each start and end within 50 ms.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

import lab.generator as gen
from lab.cli import main
from lab.exitcodes import EXIT_BAD_INPUT
from lab.runner import RunError, resolve, run_test, validate
from lab.stack.faketime import FakeClock
from lab.testmap import Test
from nemesis import fault_schedule, registry
from nemesis.clock import ClientClocks, clock
from nemesis.core import invocation as op
from nemesis.fault_schedule import FILE, ScheduleError, executed, load
from nemesis.process_faults import ClientPauses, client_pause
from nemesis.schedule import Window, replay_generator

MS = 1_000_000


def _nemesis_pair(index: int, t_ns: int, f: str, value, dt_ns: int = 5 * MS) -> list[dict]:
    """A nemesis operation as the interpreter records it: the invocation (value null), then its completion."""
    return [{"index": index, "time": t_ns, "type": "info", "process": "nemesis", "f": f, "value": None},
            {"index": index + 1, "time": t_ns + dt_ns, "type": "info", "process": "nemesis", "f": f, "value": value}]


def _history(*ops: tuple[int, str, dict]) -> list[dict]:
    out: list[dict] = []
    for t_ms, f, value in ops:
        out += _nemesis_pair(len(out), t_ms * MS, f, value)
    return out


PARTITION = {"fault": "partition", "phase": "start", "grudge": "isolate-server", "target": "lease-1",
             "direction": "both", "links": ["c0_lease-1", "lease-1_valkey"], "streams": ["upstream", "downstream"],
             "params": {}, "toxicity": 1.0, "toxics": []}
KILL = {"fault": "kill", "phase": "start", "targets": ["lease-2"], "signal": "SIGKILL",
        "killed": {"lease-2": {"pid": 42}}, "restart_after_s": None}
STROBE = {"fault": "clock", "phase": "start", "kind": "strobe", "targets": ["lease-1"], "delta_s": -1.5,
          "period_ms": 100, "duration_s": 10.0}


def test_the_executed_windows_are_read_from_the_nemesis_ops_and_their_completions():
    history = _history(
        (700, "start-kill", KILL),
        (1400, "stop-kill", {"fault": "kill", "phase": "end", "restarted": {}}),
        (2100, "start-partition", PARTITION),
        (2200, "start-partition", {"fault": "partition", "phase": "none", "active": []}),  # busy: no window
        (2800, "stop-partition", {"fault": "partition", "phase": "end", "removed": []}),
        (3000, "strobe-clock", STROBE),
        (3500, "reset-clock", {"fault": "clock", "phase": "end", "offsets_before": {}}),
        (4000, "start-kill", KILL),  # never closed (an interrupted run): no window
        (4100, "stop-partition", {"fault": "partition", "phase": "none", "removed": []}),  # the final heal
    )
    windows = executed(history, ["partition", "kill", "server-clock"])
    assert windows == [
        Window("kill", "start-kill", "stop-kill", {"targets": ["lease-2"], "restart_after_s": None}, 0.7, 1.4),
        Window("partition", "start-partition", "stop-partition",
               {"grudge": "isolate-server", "target": "lease-1", "direction": "both"}, 2.1, 2.8),
        Window("server-clock", "strobe-clock", "reset-clock",
               {"targets": ["lease-1"], "delta_s": -1.5, "period_ms": 100, "duration_s": 10.0}, 3.0, 3.5),
    ]
    assert executed(history, []) == [], "no nemesis, no window"


REPLAYS = [
    ("partition", {**PARTITION, "grudge": "links", "direction": "upstream"},
     {"links": ["c0_lease-1", "lease-1_valkey"], "direction": "upstream"}),
    ("partition", {**PARTITION, "grudge": "halves", "target": None, "sides": [["a"], ["b"]]},
     {"grudge": "halves", "target": None, "sides": [["a"], ["b"]], "direction": "both"}),
    ("netns", {"fault": "partition", "backend": "netns", "grudge": "isolate-valkey", "target": "lease-2",
               "direction": "downstream", "links": ["lease-2_valkey"], "rules": []},
     {"grudge": "isolate-valkey", "target": "lease-2", "direction": "downstream"}),
    ("latency", {"fault": "latency", "scope": "server", "target": "lease-1", "direction": "downstream",
                 "links": ["c0_lease-1"], "params": {"latency_ms": 200, "jitter_ms": 50}},
     {"scope": "server", "target": "lease-1", "direction": "downstream", "latency_ms": 200, "jitter_ms": 50}),
    ("slicer", {"fault": "slicer", "scope": "links", "direction": "both", "links": ["c0_lease-1"],
                "params": {"average_size": 8, "size_variation": 4, "delay_us": 1000}},
     {"links": ["c0_lease-1"], "direction": "both", "average_size": 8, "size_variation": 4, "delay_us": 1000}),
    ("clock", {"fault": "clock", "kind": "bump", "targets": ["valkey", "client-0"], "delta_s": 2.5,
               "offsets": {}}, {"targets": ["valkey", "client-0"], "delta_s": 2.5}),
    ("kill", {**KILL, "restart_after_s": 0.5}, {"targets": ["lease-2"], "restart_after_s": 0.5}),
    ("pause", {"fault": "pause", "targets": ["valkey"], "paused": {}}, {"targets": ["valkey"]}),
    ("leader-pause", {"fault": "leader-pause", "targets": ["n2"], "leader": "n2"}, {"targets": ["n2"]}),
    ("client-pause", {"fault": "client-pause", "thread": 2, "target": "client-2", "duration_s": None},
     {"thread": 2, "duration_s": None}),
    ("valkey-crash", {"fault": "valkey-crash", "pid": 9, "restart_after_s": None}, {"restart_after_s": None}),
    ("client-pause", {"fault": "client-pause", "holding": True, "armed": [1], "thread": 1, "duration_s": 0.5},
     {"holding": True, "thread": 1, "duration_s": 0.5}),
    ("valkey-crash", {"fault": "valkey-crash", "pid": 9, "restart_after_s": None}, {"restart_after_s": None}),
    ("valkey-restore", {"fault": "valkey-restore", "snapshot": "/x.rdb"}, None),
    ("server-clock", STROBE, {"targets": ["lease-1"], "delta_s": -1.5, "period_ms": 100, "duration_s": 10.0}),
]


@pytest.mark.parametrize("name, record, value", REPLAYS)
def test_each_nemesis_turns_what_a_start_did_into_the_value_that_does_it_again(name, record, value):
    assert registry.NEMESES[name].replay(record) == value


def _start_f(name: str, record: dict) -> str:
    """The start f a record came from (a clock start is a bump or a strobe)."""
    if record.get("kind") in ("bump", "strobe"):
        return f"{record['kind']}-clock"
    return registry.NEMESES[name].starts[0]


@pytest.mark.parametrize("name, record, value", REPLAYS)
def test_every_value_a_replay_makes_passes_the_check_made_before_the_stack_starts(name, record, value):
    fault_schedule.check_start_value(name, _start_f(name, record), value)


@pytest.mark.parametrize("name, start_f, value, needle", [
    ("client-pause", "start-client-pause", {"holding": "yes"}, "holding must be true or false, got 'yes'"),
    ("client-pause", "start-client-pause", {"thread": "2"}, "thread must be a client thread number"),
    ("client-pause", "start-client-pause", {"holding": True, "wait_s": 0}, "wait_s must be a number of seconds"),
    ("client-pause", "start-client-pause", {"sleep": 1}, "unknown value key 'sleep'"),
    ("kill", "start-kill", {"targets": "lease-1"}, "targets must be a non-empty list of names"),
    ("kill", "start-kill", {"targets": ["lease-1"], "restart_after_s": -1}, "restart_after_s must be a number"),
    ("pause", "start-pause", {"targets": ["valkey"], "restart_after_s": 1}, "unknown value key 'restart_after_s'"),
    ("partition", "start-partition", {"grudge": "moon"}, "grudge must be one of"),
    ("partition", "start-partition", {"grudge": "halves", "sides": [["a"]]}, "sides must be two lists"),
    ("netns", "start-partition", {"direction": "sideways"}, "direction must be one of both, upstream, downstream"),
    ("latency", "start-latency", {"latency_ms": 0}, "latency_ms must be an int >= 1, got 0"),
    ("slicer", "start-slicer", {"delay_us": 1.5}, "delay_us must be an int >= 0, got 1.5"),
    ("bandwidth", "start-bandwidth", {"scope": "planet"}, "scope must be one of link, server, all"),
    ("reset-peer", "start-reset-peer", {"links": []}, "links must be a non-empty list of link names"),
    ("clock", "bump-clock", {"targets": ["valkey"], "delta_s": 0}, "delta_s must be a non-zero number"),
    ("clock", "bump-clock", {"targets": ["valkey"], "period_ms": 100}, "unknown value key 'period_ms'"),
    ("client-clock", "strobe-clock", {"period_ms": 1}, "period_ms must be a number in [10, 3.6e+06]"),
    ("valkey-crash", "start-valkey-crash", {"restart_after_s": "soon"}, "restart_after_s must be a number"),
    ("valkey-restore", "start-valkey-restore", {"keys": 3}, "start-valkey-restore takes no value"),
])
def test_a_start_value_a_nemesis_cannot_take_is_refused_before_the_stack_starts(tmp_path, name, start_f, value,
                                                                                needle):
    spec = registry.NEMESES[name]
    path = _schedule(tmp_path, [{"nemesis": name, "start_f": start_f, "stop_f": spec.stop, "value": value,
                                 "start_s": 1.0, "end_s": 2.0}], nemeses=[name])
    with pytest.raises(ScheduleError) as e:
        load(path)
    msg = str(e.value)
    assert needle in msg and f"window 0 ({name})" in msg and "\n" not in msg, msg


def test_every_nemesis_can_replay_a_recorded_start():
    assert [n for n, spec in registry.NEMESES.items() if spec.replay is None] == []


async def test_the_clock_and_client_pause_nemeses_do_again_what_their_record_says(tmp_path):
    files = {"lease-1": tmp_path / "lease-1.rc", "valkey": tmp_path / "valkey.rc"}
    for p in files.values():
        FakeClock(p).set_offset(0)
    clocks = clock(files, rng=3, client_clocks=ClientClocks(2))
    for f in ("bump-clock", "strobe-clock"):
        drawn = (await clocks.invoke(None, op(f)))["value"]
        await clocks.invoke(None, op("reset-clock"))
        again = (await clocks.invoke(None, op(f, registry.NEMESES["clock"].replay(drawn))))["value"]
        await clocks.invoke(None, op("reset-clock"))
        assert again == drawn, f"{f}: a replayed start does what the drawn one did"
    await clocks.teardown(None)
    pauses = client_pause(ClientPauses(4), rng=8)
    drawn = (await pauses.invoke(None, op("start-client-pause")))["value"]
    await pauses.invoke(None, op("stop-client-pause"))
    again = (await pauses.invoke(None, op("start-client-pause", registry.NEMESES["client-pause"].replay(drawn))))
    await pauses.teardown(None)
    assert again["value"] == drawn


# -- the file ---------------------------------------------------------------------------------------------------
WINDOWS = [Window("kill", "start-kill", "stop-kill", {"targets": ["lease-2"], "restart_after_s": None}, 0.7, 1.4),
           Window("partition", "start-partition", "stop-partition", {"grudge": "isolate-server",
                                                                     "target": "lease-1", "direction": "both"},
                  2.1, 2.8)]


def test_a_schedule_round_trips_through_its_file(tmp_path):
    path = fault_schedule.write(tmp_path / FILE, ["partition", "kill"], WINDOWS)
    d = json.loads(path.read_text())
    assert d["format"] == 1 and d["time_origin"] == "history" and d["nemeses"] == ["partition", "kill"]
    assert d["windows"][0] == {"nemesis": "kill", "start_f": "start-kill", "stop_f": "stop-kill",
                               "value": {"targets": ["lease-2"], "restart_after_s": None}, "start_s": 0.7,
                               "end_s": 1.4}
    assert load(path, time_limit=3.0) == (["partition", "kill"], WINDOWS)
    empty = fault_schedule.write(tmp_path / "empty.json", [], [])
    assert load(empty) == ([], [])


def test_a_stored_run_directory_gets_its_schedule_from_its_own_files(tmp_path):
    history = _history((700, "start-kill", KILL), (1400, "stop-kill", {"fault": "kill", "phase": "end"}))
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(o) + "\n" for o in history))
    (tmp_path / "test.json").write_text(json.dumps({"nemesis": ["kill"]}))
    assert load(fault_schedule.write_for_run(tmp_path)) == (["kill"], WINDOWS[:1])
    (tmp_path / "test.json").write_text(json.dumps({"workload": "lease"}))  # a run without a nemesis
    assert json.loads(fault_schedule.write_for_run(tmp_path).read_text()) == {
        "format": 1, "time_origin": "history", "nemeses": [], "windows": []}


def _schedule(tmp_path, windows=None, nemeses=("partition", "kill"), **top) -> Path:
    path = tmp_path / "schedule.json"
    d = fault_schedule.to_json(list(nemeses), WINDOWS)
    if windows is not None:
        d["windows"] = windows
    d.update(top)
    path.write_text(json.dumps(d))
    return path


def _raw(tmp_path, text: str) -> Path:
    path = tmp_path / "schedule.json"
    path.write_text(text)
    return path


def _w(**changes) -> dict:
    return {"nemesis": "kill", "start_f": "start-kill", "stop_f": "stop-kill", "value": {"targets": ["lease-1"]},
            "start_s": 1.0, "end_s": 2.0, **changes}


@pytest.mark.parametrize("make, needle", [
    (lambda p: _raw(p, "{not json"), "not JSON"),
    (lambda p: _raw(p, "[]"), "not a fault schedule"),
    (lambda p: _schedule(p, nemeses=["partition", "quake"]), "unknown nemesis quake"),
    (lambda p: _schedule(p, [_w(nemesis="quake")]), "window 0: unknown nemesis 'quake'"),
    (lambda p: _schedule(p, [_w(nemesis="pause", start_f="start-pause", stop_f="stop-pause")]),
     "window 0: nemesis pause is not one of the schedule's nemeses (partition, kill)"),
    (lambda p: _schedule(p, [_w(start_s=2.0, end_s=1.5)]), "window 0: ends at 1.5 s, not after it starts (2 s)"),
    (lambda p: _schedule(p, [_w(start_s=-0.5)]), "window 0: start_s must be a number of seconds >= 0, not -0.5"),
    (lambda p: _schedule(p, [_w(end_s=math.nan)]), "window 0: end_s must be a number of seconds >= 0, not nan"),
    (lambda p: _schedule(p, [_w(start_s=4.0, end_s=4.5)]), "window 0 (kill, 4-4.5 s) is past --time-limit 3"),
    (lambda p: _schedule(p, [_w(end_s=5.5)]), "window 0 (kill, 1-5.5 s) is past --time-limit 3"),
    (lambda p: _schedule(p, [_w(start_f="start-partition")]), "kill opens with start-kill and closes with stop-kill"),
    (lambda p: _schedule(p, [_w(value=["lease-1"])]), "value must be an object or null"),
    (lambda p: _schedule(p, [_w(targets=["lease-1"])]), "window 0 has unknown key 'targets'"),
    (lambda p: _schedule(p, [{"nemesis": "kill"}]), "window 0 lacks start_f, stop_f, value, start_s, end_s"),
    (lambda p: _schedule(p, [_w(), _w(start_s=1.5, end_s=2.5)]),
     "window 1 (kill) starts at 1.5 s, before its nemesis's previous window ends (2 s)"),
    (lambda p: _schedule(p, seed=3), "unknown key 'seed'"),
    (lambda p: _schedule(p, format=2), "format 2 with time origin 'history' is not this lab's"),
])
def test_a_schedule_that_cannot_be_replayed_is_one_line_naming_the_file_and_the_entry(tmp_path, make, needle):
    path = make(tmp_path)
    with pytest.raises(ScheduleError) as e:
        load(path, time_limit=3.0)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and msg.startswith(f"--fault-schedule {path}"), msg


def test_a_fault_without_a_replay_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.NEMESES, "kill", registry.NEMESES["kill"].__class__(
        **{**registry.NEMESES["kill"].__dict__, "replay": None}))
    with pytest.raises(ScheduleError, match="kill cannot replay a recorded start"):
        load(_schedule(tmp_path))


# -- the command line -------------------------------------------------------------------------------------------
def _fencelab_test(tmp_path, *args: str):
    store = tmp_path / "store"
    res = CliRunner().invoke(main, ["test", "--store-dir", str(store), *args])
    return res, store


def test_fencelab_test_refuses_a_start_value_the_nemesis_cannot_take_before_anything_starts(tmp_path):
    path = _schedule(tmp_path, [{"nemesis": "client-pause", "start_f": "start-client-pause",
                                 "stop_f": "stop-client-pause", "value": {"holding": "yes"}, "start_s": 1.0,
                                 "end_s": 2.0}], nemeses=["client-pause"])
    res, store = _fencelab_test(tmp_path, "--fault-schedule", str(path), "--time-limit", "3")
    assert res.exit_code == EXIT_BAD_INPUT, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "holding must be true or false, got 'yes'" in lines[0], res.output
    assert not store.exists(), "nothing started"


@pytest.mark.parametrize("args, needle", [
    (["--time-limit", "2"], "is past --time-limit 2"),
    (["--nemesis", "partition"], "--nemesis partition is not what --fault-schedule"),
    (["--scenario", "concurrent-acquires"], "a --scenario scripts its own"),
])
def test_fencelab_test_refuses_a_schedule_it_cannot_replay_in_one_line_before_anything_starts(tmp_path, args,
                                                                                              needle):
    path = _schedule(tmp_path)
    res, store = _fencelab_test(tmp_path, "--fault-schedule", str(path), *args)
    assert res.exit_code == EXIT_BAD_INPUT, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencelab: error: ") and needle in lines[0], res.output
    assert not store.exists(), "nothing started"


def test_a_malformed_file_is_exit_2_and_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("nope")
    res, store = _fencelab_test(tmp_path, "--fault-schedule", str(bad))
    assert res.exit_code == EXIT_BAD_INPUT and res.output.count("\n") == 1 and "not JSON" in res.output, res.output
    assert "Traceback" not in res.output and not store.exists()


def test_a_schedule_naming_a_fault_the_placement_cannot_take_gets_the_targets_reason(tmp_path):
    path = _schedule(tmp_path, [], nemeses=["leader-pause"])
    with pytest.raises(RunError) as given:
        validate(Test(nemesis=["leader-pause"]))
    with pytest.raises(RunError) as replayed:
        validate(Test(fault_schedule=str(path)))
    assert str(replayed.value) == str(given.value)


def test_the_schedules_nemeses_are_the_runs(tmp_path):
    path = _schedule(tmp_path)
    spec, _ = resolve(Test(fault_schedule=str(path), time_limit=3.0))
    assert spec.nemesis == ["partition", "kill"] and spec.fault_schedule == str(path)
    assert resolve(Test(fault_schedule=str(path), nemesis=["kill", "partition"], time_limit=3.0))[0].nemesis == [
        "partition", "kill"], "the same nemeses in another order agree with the file"


# -- the lane ---------------------------------------------------------------------------------------------------
def test_the_lane_emits_the_recorded_ops_at_their_recorded_times_then_heals():
    faults = [registry.NEMESES[n].fault for n in ("partition", "kill")]
    overlapping = [*WINDOWS, Window("kill", "start-kill", "stop-kill", None, 2.5, 3.0)]
    history = gen.simulate(replay_generator(overlapping, faults), nemesis=True, concurrency=1, latency=MS)
    invokes = history[0::2]
    assert [(o["time"], o["f"], o["value"]) for o in invokes] == [
        (700 * MS, "start-kill", {"targets": ["lease-2"], "restart_after_s": None}),
        (1400 * MS, "stop-kill", None),
        (2100 * MS, "start-partition", {"grudge": "isolate-server", "target": "lease-1", "direction": "both"}),
        (2500 * MS, "start-kill", None),  # windows of two nemeses may overlap: ops in time order
        (2800 * MS, "stop-partition", None),
        (3000 * MS, "stop-kill", None),
        (3001 * MS, "stop-partition", None), (3002 * MS, "stop-kill", None),  # the final heal
    ]


def test_a_late_op_is_made_at_once_and_the_rest_keep_their_times():
    faults = [registry.NEMESES["kill"].fault]
    windows = [Window("kill", "start-kill", "stop-kill", None, 0.1, 0.2),
               Window("kill", "start-kill", "stop-kill", None, 2.0, 2.5)]
    history = gen.simulate(replay_generator(windows, faults), nemesis=True, concurrency=1,
                           latency=lambda o: 500 * MS if o["f"] == "start-kill" and o["time"] < MS * 1000 else MS)
    assert [(o["time"], o["f"]) for o in history[0::2]][:4] == [
        (100 * MS, "start-kill"), (600 * MS, "stop-kill"), (2000 * MS, "start-kill"), (2500 * MS, "stop-kill")]


# -- live: the local backend ------------------------------------------------------------------------------------
def _windows(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / FILE).read_text())["windows"]


def test_a_replayed_schedule_reproduces_the_runs_fault_windows_on_the_local_backend(tmp_path):
    # seed 1 draws partition first and kill last: a restart takes as long as it takes (1.5-2.2 s on a loaded
    # machine), so a window right after one may come late in one run and not in the other
    base = dict(workload="fenced-append", time_limit=4.0, concurrency=3, rate=20.0, keys=2, seed=1)
    first = run_test(Test(name="drawn", nemesis=["partition", "kill"], nemesis_interval=1.0, **base), tmp_path)
    drawn_dir = (tmp_path / "drawn" / "latest").resolve()
    drawn = _windows(drawn_dir)
    assert {w["nemesis"] for w in drawn} == {"partition", "kill"}, drawn
    assert first["valid"] is True, first
    replay = run_test(Test(name="replayed", fault_schedule=str(drawn_dir / FILE), **base), tmp_path)
    replay_dir = (tmp_path / "replayed" / "latest").resolve()
    again = _windows(replay_dir)
    assert [(w["nemesis"], w["start_f"], w["value"]) for w in again] == [
        (w["nemesis"], w["start_f"], w["value"]) for w in drawn], "the same faults on the same targets"
    late = [(w["nemesis"], round(v["start_s"] - w["start_s"], 3), round(v["end_s"] - w["end_s"], 3))
            for w, v in zip(drawn, again)]
    assert all(abs(ds) <= 0.05 and abs(de) <= 0.05 for _, ds, de in late), late
    recorded = json.loads((replay_dir / "test.json").read_text())
    assert recorded["fault_schedule"] == str(drawn_dir / FILE) and recorded["nemesis"] == ["partition", "kill"]
    assert f"--fault-schedule {drawn_dir / FILE}" in replay["replay"], replay["replay"]
    assert f'href="{FILE}"' in (replay_dir / "report.html").read_text(), "the report links the schedule"
    assert replay["valid"] is True, replay
