"""Nemesis names, the stack options they need, the nemesis lane, and a full schedule on the real stack.

The schedule test runs every fault the local stack supports through the real
interpreter (`lab.generator.run`) against real Valkey, a lease server,
Toxiproxy and fake clocks, with a client that passes the client-pause gate and
reads its client clock; the history must show a start and an end of every
fault, each with its exact targets and parameters, and nothing may be left
injected afterwards (no toxic, no stopped or dead process, no clock offset).
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings, strategies as st
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted, with a warning each time
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

import lab.generator as gen
from lab.history import HistoryWriter
from lab.stack.faketime import FakeClock
from lab.stack.local import LocalStack, StackOptions
from lab.testmap import Test
from nemesis import registry
from nemesis.process_faults import is_stopped, stack_targets
from nemesis.schedule import MIN_WINDOW_S, Fault, final_heal, fit, lane_timing, nemesis_generator, plan, timing_problem
from lab.stack.toxiproxy_api import ToxiproxyClient

# everything the local stack can run (leader-pause needs a system that names its leader: tests/test_sut_etcd.py)
# client-clock is the client half of clock (the two are exclusive): tests/test_external_runs.py runs it
# server-clock is clock on the lease servers only (exclusive with clock too): tests/test_fault_exposure.py runs it
LOCAL = [n for n in registry.known_names() if n not in ("netns", "leader-pause", "client-clock", "server-clock")]


# -- names ------------------------------------------------------------------------------
def test_validate_names_accepts_the_known_ones_in_either_form():
    assert registry.validate_names("partition,clock,kill") == ["partition", "clock", "kill"]
    assert registry.validate_names(["partition", " latency , pause"]) == ["partition", "latency", "pause"]
    assert set(registry.known_names()) >= {"partition", "latency", "bandwidth", "reset-peer", "slicer", "clock",
                                           "kill", "pause", "client-pause", "valkey-crash", "valkey-restore", "netns"}


@pytest.mark.parametrize("names, message", [
    ("partition,chaos", "--nemesis: unknown nemesis chaos; known: partition, latency, bandwidth, reset-peer"),
    ("kill,,pause", "--nemesis: empty name in 'kill,,pause'; known: partition"),
    ("kill,kill", "--nemesis: kill given more than once"),
    ("netns,partition", "--nemesis: netns and partition are two ways to partition"),
    (42, "--nemesis takes comma-separated names, got 42"),
])
def test_validate_names_messages(names, message):
    with pytest.raises(ValueError) as e:
        registry.validate_names(names)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_server_clock_moves_only_the_lease_servers_and_excludes_the_other_clock_nemeses(tmp_path):
    with pytest.raises(ValueError, match="^--nemesis: clock and server-clock all bump and reset clocks"):
        registry.validate_names("clock,server-clock")
    assert registry.stack_options("server-clock") == {"fake_clocks": True}
    clocks = {n: str(tmp_path / f"{n}.rc") for n in ("valkey", "lease-1", "lease-2")}

    class Stack:  # what build reads of a running LocalStack
        processes = []
        info = {"clocks": clocks}

    test = Test(name="t", time_limit=5, concurrency=2)
    test.live["stack"] = Stack()
    nemesis, _ = registry.build(test, ["server-clock"], interval_s=1, seed=3)
    assert nemesis.fs == {"bump-clock", "strobe-clock", "reset-clock"}
    (member,) = nemesis.nemeses
    assert member.targets == ["lease-1", "lease-2"] and "valkey" not in member.files  # backend time never moves


def test_rounds_draw_every_choice_once_per_round_in_a_seeded_order():
    import random

    from nemesis.core import Rounds

    choices = ["valkey", "store", "lease-1", "lease-2"]
    r = Rounds(random.Random(5))
    draws = [r.pick("target", choices) for _ in range(12)]
    for i in range(0, 12, 4):
        assert sorted(draws[i:i + 4]) == sorted(choices)  # each round covers every target
    again = Rounds(random.Random(5))
    assert [again.pick("target", choices) for _ in range(12)] == draws  # the seed replays the order
    assert len({tuple(draws[i:i + 4]) for i in range(0, 12, 4)}) > 1  # the order is shuffled, not fixed
    with pytest.raises(ValueError, match="no target to choose from"):
        r.pick("target", [])


def test_netns_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ValueError, match=r"^--nemesis netns: netns nemesis needs root .* running as uid 1000$"):
        registry.validate_names("netns")


def test_clock_needs_libfaketime(monkeypatch, tmp_path):
    monkeypatch.setenv("FENCELAB_LIBFAKETIME", str(tmp_path / "missing.so"))
    with pytest.raises(ValueError, match=r"^--nemesis clock: libfaketime is not installed: run `make install`"):
        registry.validate_names("kill,clock")
    assert registry.validate_names("kill") == ["kill"], "only clock needs it"


def test_stack_options_merge_what_the_nemeses_need():
    assert registry.stack_options([]) == {}
    assert registry.stack_options("partition,latency") == {"toxiproxy": True}
    assert registry.stack_options("clock") == {"fake_clocks": True}
    # the nemeses that restart Valkey need the store, where the servers' recovery rule keeps its epoch
    assert registry.stack_options("kill,pause,client-pause") == {"persistence": "always", "recovery_store": True}
    assert registry.stack_options("pause,client-pause") == {}
    assert registry.stack_options("valkey-restore,valkey-crash,slicer") == {"persistence": "everysec",
                                                                            "recovery_store": True,
                                                                            "toxiproxy": True}
    StackOptions(**registry.stack_options(LOCAL)).validate()  # they are StackOptions fields
    with pytest.raises(ValueError, match="unknown nemesis"):
        registry.stack_options("kil")


def test_build_refuses_a_stack_without_what_the_nemesis_needs(tmp_path):
    test = Test(time_limit=5)
    with pytest.raises(ValueError, match=r"needs the running stack in test.live.stack"):
        registry.build(test, "kill", interval_s=1, seed=1)
    test.live["stack"] = LocalStack(name="t", root=tmp_path, info={"clocks": {}})
    with pytest.raises(ValueError, match="started without fake clocks"):
        registry.build(test, "clock", interval_s=1, seed=1)
    with pytest.raises(ValueError, match=r"--nemesis latency: the stack was started without Toxiproxy"):
        registry.build(test, "latency", interval_s=1, seed=1)


# -- the lane ------------------------------------------------------------------------------
FAULTS = [Fault("a", ("start-a",), "stop-a"), Fault("b", ("b1", "b2"), "stop-b"), Fault("c", ("start-c",), "stop-c")]


def test_plan_is_seeded_rounds_of_every_fault_within_the_duration():
    steps = plan(FAULTS, interval_s=1, hold_s=0.5, duration_s=9.6, seed=3)
    assert steps == plan(FAULTS, interval_s=1, hold_s=0.5, duration_s=9.6, seed=3), "a seed replays the plan"
    assert plan(FAULTS, interval_s=1, hold_s=0.5, duration_s=9.6, seed=4) != steps
    times = [t for t, _ in steps]
    assert times == sorted(times) and times[-1] < 9.6e9
    assert [t for t, _ in steps[:4]] == [1_000_000_000, 1_500_000_000, 2_500_000_000, 3_000_000_000]
    starts, stops = [f for _, f in steps[0::2]], [f for _, f in steps[1::2]]
    owner = {"start-a": "stop-a", "b1": "stop-b", "b2": "stop-b", "start-c": "stop-c"}
    assert [owner[s] for s in starts] == stops, "every start is followed by its own stop"
    assert sorted(owner[s] for s in starts[:3]) == ["stop-a", "stop-b", "stop-c"], "each fault once per round"
    assert len(steps) == 12  # 6 windows of 1.5 s fit in 9.6 s
    with pytest.raises(ValueError, match="interval_s must be a number of seconds > 0"):
        plan(FAULTS, interval_s=0, duration_s=1, seed=1)
    with pytest.raises(ValueError, match="faults must have distinct names"):
        plan(FAULTS + FAULTS[:1], interval_s=1, duration_s=1, seed=1)
    with pytest.raises(ValueError, match="starts must be a non-empty tuple"):
        Fault("x", "start-x", "stop-x")


def test_the_lane_runs_on_time_then_stops_every_fault():
    g = nemesis_generator(FAULTS, interval_s=1, hold_s=0.5, duration_s=4, seed=3)
    history = gen.simulate(g, nemesis=True, concurrency=1, latency=100_000_000)
    assert all(o["process"] == "nemesis" and o["type"] == "info" for o in history)
    invokes = history[0::2]  # one op at a time: invocation, completion, invocation, ...
    planned = plan(FAULTS, interval_s=1, hold_s=0.5, duration_s=4, seed=3)
    assert [(o["time"], o["f"]) for o in invokes[:len(planned)]] == list(planned), "each op at its planned time"
    assert [o["f"] for o in invokes[len(planned):]] == ["stop-a", "stop-b", "stop-c"], "then the final heal"
    assert final_heal(FAULTS) == [{"f": "stop-a", "value": None}, {"f": "stop-b", "value": None},
                                  {"f": "stop-c", "value": None}]


def windows_of(steps, faults) -> list[tuple[int, int, str]]:
    """(start, stop, fault name) of each planned window: a start f followed by its fault's stop f."""
    owner = {f: fault for fault in faults for f in fault.starts}
    out = []
    for (t0, f0), (t1, f1) in zip(steps[0::2], steps[1::2]):
        assert f1 == owner[f0].stop, (f0, f1)
        out.append((t0, t1, owner[f0].name))
    assert len(steps) % 2 == 0, "no start is left without its planned stop"
    return out


README_FAULTS = [registry.NEMESES[n].fault for n in ("partition", "clock", "kill")]


def test_a_short_run_gets_a_window_of_every_named_fault():
    """The README's line at --time-limit 5: the default 5 s interval used to leave no window at all."""
    steps = plan(README_FAULTS, interval_s=5, duration_s=5, seed=1)
    wins = windows_of(steps, README_FAULTS)
    assert sorted(name for _, _, name in wins) == ["clock", "kill", "partition"]
    assert fit(3, interval_s=5, duration_s=5) == (0.714285714, 0.714285714)  # min(5, 5 / (2 x 3 + 1))
    assert all(t1 - t0 == 714_285_714 for t0, t1, _ in wins) and wins[-1][1] <= 5e9 - 714_285_714, "slack at the end"
    # a 12 s run at 3 s: every fault a 1.7 s window, the last one healed 1.7 s after it started (not 20 ms)
    wins = windows_of(plan(README_FAULTS, interval_s=3, duration_s=12, seed=1), README_FAULTS)
    assert sorted(n for _, _, n in wins) == ["clock", "kill", "partition"] and {t1 - t0 for t0, t1, _ in wins} == {
        1_714_285_714}
    assert lane_timing(3, interval_s=5, time_limit=5) == {
        "faults": 3, "asked_interval_s": 5.0, "interval_s": 0.714286, "hold_s": 0.714286, "scaled": True}
    assert lane_timing(1, interval_s=5, time_limit=60)["scaled"] is False


def test_a_run_too_short_for_a_window_per_nemesis_is_refused_in_one_line():
    assert timing_problem(3, interval_s=5, time_limit=5) is None
    problem = timing_problem(3, interval_s=5, time_limit=0.5)
    assert problem == ("--time-limit 0.5 is too short for 3 nemeses: each needs a quiet interval and a window of at "
                       f"least {MIN_WINDOW_S:g} s, and one more quiet interval ends the round (0.7 s in all); give a "
                       "longer --time-limit or fewer nemeses")
    # an interval asked shorter than the floor on purpose is the user's: it still fits, so it is kept
    assert timing_problem(1, interval_s=0.05, time_limit=1) is None
    assert "finite" in timing_problem(1, interval_s=5, time_limit=float("inf"))


def test_a_long_runs_schedule_is_unchanged():
    """Pinned from the schedule before short runs were scaled (seed 42, 60 s, 5 s): the same faults at the same
    times; only the last window, which the final heal used to close at once, now gets its stop at 60 s."""
    before = ((5000000000, "start-kill"), (10000000000, "stop-kill"), (15000000000, "start-partition"),
              (20000000000, "stop-partition"), (25000000000, "bump-clock"), (30000000000, "reset-clock"),
              (35000000000, "start-partition"), (40000000000, "stop-partition"), (45000000000, "start-kill"),
              (50000000000, "stop-kill"), (55000000000, "strobe-clock"))
    assert plan(README_FAULTS, interval_s=5, duration_s=60, seed=42) == before + ((60000000000, "reset-clock"),)


def test_late_ops_never_cut_a_window_short_and_a_start_that_cannot_fit_is_not_made():
    """Each nemesis op takes 1 s (a slow restart): later windows start late, keep their whole hold, and the one
    that could no longer last its hold before the end is dropped (the final heal follows)."""
    g = nemesis_generator(FAULTS, interval_s=0.5, hold_s=0.5, duration_s=4, seed=3)
    history = gen.simulate(g, nemesis=True, concurrency=1, latency=1_000_000_000)
    invokes = history[0::2]
    heal = len(invokes) - len(FAULTS)
    lane_ops, final = invokes[:heal], invokes[heal:]
    assert [o["f"] for o in final] == ["stop-a", "stop-b", "stop-c"]
    assert len(lane_ops) == 4, "two windows; the third would have started at 4.5 s, after the 4 s lane"
    owner = {"start-a": "stop-a", "b1": "stop-b", "b2": "stop-b", "start-c": "stop-c"}
    for start, stop in zip(lane_ops[0::2], lane_ops[1::2]):
        assert owner[start["f"]] == stop["f"] and stop["time"] - start["time"] >= 500_000_000
        assert start["time"] + 500_000_000 <= 4_000_000_000, "the lane starts at 0 here: every window fits in it"
    assert [o["time"] for o in lane_ops] == [500_000_000, 1_500_000_000, 2_500_000_000, 3_500_000_000]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 2**32), duration=st.floats(0.01, 120),
       interval=st.floats(0.05, 10), hold=st.one_of(st.none(), st.floats(0.05, 10)))
def test_no_window_is_ever_cut_short_and_one_round_always_fits(n, seed, duration, interval, hold):
    faults = FAULTS[:n] + [Fault(f"f{i}", (f"start-f{i}",), f"stop-f{i}") for i in range(n - len(FAULTS))]
    steps = plan(faults, interval_s=interval, hold_s=hold, duration_s=duration, seed=seed)
    wins = windows_of(steps, faults)
    i_ns, h_ns = (round(x * 1e9) for x in fit(n, interval_s=interval, hold_s=hold, duration_s=duration))
    assert all(t1 - t0 == h_ns for t0, t1, _ in wins), "every window lasts its whole hold"
    assert all(t1 <= round(duration * 1e9) for _, t1, _ in wins), "and is over by the time limit"
    if h_ns > 0 and i_ns > 0:
        assert sorted(name for _, _, name in wins[:n]) == sorted(f.name for f in faults), "one window of each"
    asked_h = hold if hold is not None else interval
    i0, h0 = round(interval * 1e9), round(asked_h * 1e9)
    if n * (i0 + h0) + i0 <= round(duration * 1e9):  # one round and a quiet interval fit as asked
        assert (i_ns, h_ns) == (i0, h0)


# -- a full schedule on the real stack ---------------------------------------------------
class CounterClient:
    """A trivial client: waits at its client-pause gate, reads its client clock, INCRs a Valkey counter."""

    def __init__(self, conn=None):
        self.conn = conn

    async def open(self, test, node):
        return CounterClient(aioredis.Redis.from_url(test.valkey, socket_timeout=0.5, socket_connect_timeout=0.5,
                                                     retry=Retry(NoBackoff(), 0)))

    async def invoke(self, test, op):
        await test.live["client_pauses"].wait(op["process"])
        clock_ms = test.live["client_clocks"].now_ms(op["process"])
        try:
            return {"type": "ok", "value": {"n": await self.conn.incr("ctr"), "clock_ms": clock_ms}}
        except (RedisError, OSError) as e:
            return {"type": "info", "error": f"{type(e).__name__}: {e}"}

    async def close(self, test):
        await self.conn.aclose()


# what each start completion must say about its target and parameters
START_KEYS = {
    "partition": {"grudge", "direction", "links", "toxics"},
    "latency": {"scope", "links", "params", "toxics"},
    "bandwidth": {"scope", "links", "params", "toxics"},
    "reset-peer": {"scope", "links", "params", "toxics"},
    "slicer": {"scope", "links", "params", "toxics"},
    "clock": {"kind", "targets", "delta_s"},
    "kill": {"targets", "killed", "signal"},
    "pause": {"targets", "paused", "signal"},
    "client-pause": {"target", "thread"},
    "valkey-crash": {"target", "pid", "persistence"},
    "valkey-restore": {"target", "snapshot", "keys"},
}


async def leftovers(stack, clocks, test) -> list[str]:
    """Anything a fault left behind: toxics or disabled proxies, stopped or dead processes, clock offsets, gates."""
    found = []
    async with ToxiproxyClient(stack.info["toxiproxy"]) as tp:
        for name, proxy in (await tp.proxies()).items():
            if proxy.get("toxics") or not proxy.get("enabled", True):
                found.append(f"proxy {name}: {proxy.get('toxics')} enabled={proxy.get('enabled')}")
    for name, proc in stack_targets(stack).items():
        if not proc.alive() or is_stopped(proc):
            found.append(f"process {name} alive={proc.alive()} stopped={is_stopped(proc)}")
    found += [f"clock {n} at {FakeClock(p).offset()}" for n, p in clocks.items() if FakeClock(p).offset() != 0]
    if test.live["client_clocks"].offsets():
        found.append(f"client clocks {test.live['client_clocks'].offsets()}")
    if test.live["client_pauses"].paused:
        found.append(f"client pauses {test.live['client_pauses'].paused}")
    return found


def test_full_schedule_on_the_real_stack(tmp_path):
    """Sync on purpose: like the runner, the stack comes up (it builds its Toxiproxy topology with its own
    asyncio.run) before the run's event loop starts."""
    names = registry.validate_names(LOCAL)
    interval, hold = 0.25, 0.25
    # two rounds' time: ops run one at a time and a restart (kill, valkey-crash, valkey-restore) takes a second or
    # two, so later windows come late; one that no longer fits before the time limit is not started, and the second
    # round's time is the slack that lets every fault of the first one fit
    test = Test(name="nemesis-schedule", time_limit=2 * len(names) * (interval + hold) + interval, concurrency=2,
                seed=11)
    stack = LocalStack(name="t", root=tmp_path / "stack")
    try:
        stack.up(StackOptions(servers=1, store=False, client_groups=1, **registry.stack_options(names)))
        test.live["stack"] = stack
        test.live.valkey = stack.info["valkey"]
        nemesis, nemesis_gen = registry.build(test, names, interval_s=interval, hold_s=hold, seed=test.seed)
        assert nemesis.fs >= {"start-partition", "bump-clock", "strobe-clock", "reset-clock", "start-kill",
                              "stop-valkey-restore", "start-client-pause"}
        clients = gen.time_limit(test.time_limit, gen.clients(gen.stagger(0.02, gen.repeat({"f": "incr"}))))

        async def run():
            await asyncio.wait_for(gen.run(test, gen.any_of(clients, nemesis_gen), CounterClient(),
                                           nemesis=nemesis, history_writer=writer, concurrency=2, seed=test.seed),
                                   timeout=120)
            return await leftovers(stack, stack.info["clocks"], test)

        with HistoryWriter(tmp_path / "history.jsonl", keep=True) as writer:
            left = asyncio.run(run())
            history = writer.ops
        done = [o for o in history if o["process"] == "nemesis" and o["type"] == "info" and isinstance(o["value"], dict)]
        by_fault = {}
        for o in done:
            by_fault.setdefault(o["value"]["fault"], []).append(o)
        problems = []
        for name in names:
            ops = by_fault.get(name, [])
            phases = [o["value"]["phase"] for o in ops]
            starts = [o for o in ops if o["value"]["phase"] == "start"]
            if not starts:
                problems.append(f"{name}: no start in {phases} ({[o.get('error') for o in ops]})")
                continue
            missing = START_KEYS[name] - set(starts[0]["value"])
            if missing:
                problems.append(f"{name}: start value lacks {missing}: {starts[0]['value']}")
            if "end" not in phases[phases.index("start"):]:
                problems.append(f"{name}: window never closed: {phases}")
            if [p for p in phases if p != "none"][-1] != "end":
                problems.append(f"{name}: last window left open: {phases}")
        assert not problems, "\n".join(problems)
        assert by_fault["clock"][0]["value"]["targets"], "the exact clock targets are recorded"
        client_ops = [o for o in history if o["process"] != "nemesis"]
        assert sum(o["type"] == "ok" for o in client_ops) > 20, "clients did work meanwhile"
        # the paused client thread: an op it was invoked with during the window completed only after the stop
        paused = next(o for o in by_fault["client-pause"] if o["value"]["phase"] == "start")
        resumed = next(o for o in by_fault["client-pause"] if o["value"]["phase"] == "end")
        thread = paused["value"]["thread"]
        open_at, held = {}, []  # process -> index of its open invocation; ops invoked in the window, done after
        for o in client_ops:
            if o["type"] == "invoke":
                open_at[o["process"]] = o["index"]
                continue
            invoked = open_at.pop(o["process"])
            # invoked in the window, or before it but still short of its gate (under load the task can be
            # switched out between recording the invoke and reaching the gate): either way it waited there
            if (o["process"] % test.concurrency == thread and invoked < resumed["index"]
                    and o["index"] > resumed["index"]):
                held.append(o)
        assert held, "a client op of the paused thread waited at its gate until the stop"
        assert left == []
        json.dumps(history)  # the whole record is plain JSON
    finally:
        stack.down()
