"""Generators: the plain-value generators and every combinator, run in simulated time."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

import lab.generator as gen
from lab.generator import PENDING, Context, GeneratorError, simulate


def invokes(history):
    """The invocations of a history; a nemesis operation starts with its first info op."""
    out, nemesis_open = [], False
    for o in history:
        if o["process"] == "nemesis":
            if not nemesis_open:
                out.append(o)
            nemesis_open = not nemesis_open
        elif o["type"] == "invoke":
            out.append(o)
    return out


def fs(history):
    return [o["f"] for o in invokes(history)]


def max_outstanding(history, processes=lambda p: p != "nemesis"):
    """Most operations ever open at once among the selected processes."""
    open_, most = set(), 0
    for o in history:
        if not processes(o["process"]):
            continue
        if o["type"] == "invoke":
            open_.add(o["process"])
            most = max(most, len(open_))
        else:
            open_.discard(o["process"])
    return most


CTX = Context.initial(3, nemesis=True, seed=1)


# -- plain values -------------------------------------------------------------------------------


def test_a_dict_is_one_op_with_fields_filled_in():
    h = simulate({"f": "write", "value": 3, "key": "k1"}, concurrency=2, latency=7)
    assert h == [
        {"index": 0, "time": 0, "type": "invoke", "process": 0, "f": "write", "value": 3, "key": "k1"},
        {"index": 1, "time": 7, "type": "ok", "process": 0, "f": "write", "value": 3, "key": "k1"},
    ]


def test_op_answers_pending_when_no_process_is_free():
    busy = CTX.busy(0, 0).busy(0, 1).busy(0, 2).busy(0, "nemesis")
    assert gen.op({"f": "read"}, None, busy) is PENDING
    assert gen.op(None, None, CTX) is None


def test_a_list_is_a_sequence_and_None_ends_nothing():
    h = simulate([{"f": "a"}, None, [{"f": "b"}, {"f": "c"}], ({"f": "d"},)], concurrency=1)
    assert fs(h) == ["a", "b", "c", "d"]


def test_a_function_is_called_again_after_each_generator_it_returns():
    # (It may also be called for answers the interpreter then discards, so ops are built from ctx.)
    h = simulate(gen.limit(5, lambda test, ctx: {"f": "write", "value": ctx.time}), concurrency=1, latency=10)
    assert [o["value"] for o in h if o["type"] == "invoke"] == [0, 10, 20, 30, 40]


def test_a_function_of_test_and_ctx_sees_the_context():
    seen = []

    def f(test, ctx):
        seen.append((test, ctx.time))
        return {"f": "read"} if len(seen) < 3 else None

    h = simulate(f, concurrency=1, latency=10, test="the-test")
    assert fs(h) == ["read", "read"] and seen == [("the-test", 0), ("the-test", 10), ("the-test", 20)]


def test_a_function_returning_a_sequence_runs_it_then_is_called_again():
    h = simulate(gen.limit(5, lambda: [{"f": "w"}, {"f": "r"}]), concurrency=1)
    assert fs(h) == ["w", "r", "w", "r", "w"]


def test_seq_makes_an_iterator_a_pure_lazy_sequence():
    g = gen.seq({"f": "write", "value": i} for i in itertools.count())
    first = gen.op(g, None, CTX)
    again = gen.op(g, None, CTX)  # asking twice must not consume the iterator twice
    assert first[0]["value"] == again[0]["value"] == 0
    assert gen.op(first[1], None, CTX)[0]["value"] == 1
    assert [o["value"] for o in simulate(gen.limit(4, g)) if o["type"] == "invoke"] == [0, 1, 2, 3]


def test_combinators_accept_iterators_directly():
    h = simulate(gen.limit(3, ({"f": "w", "value": i} for i in range(10))), concurrency=1)
    assert [o["value"] for o in invokes(h)] == [0, 1, 2]


@pytest.mark.parametrize(
    "bad, message",
    [
        ("read", "a string is not a generator"),
        (42, "is not a generator"),
        ({1, 2}, "is not a generator"),
        ([iter([{"f": "a"}])], "wrap it with lab.generator.seq"),
        ({"value": 1}, "has no 'f'"),
        (lambda a: {"f": "x"}, r"takes \(\) or \(test, ctx\)"),
    ],
)
def test_bad_generators_are_clear_errors(bad, message):
    with pytest.raises(GeneratorError, match=message):
        gen.op(bad, None, CTX)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: gen.stagger(0, {"f": "a"}), "duration in seconds > 0"),
        (lambda: gen.time_limit(-1, {"f": "a"}), "duration in seconds > 0"),
        (lambda: gen.rate("fast", {"f": "a"}), "ops per second"),
        (lambda: gen.limit(-1, {"f": "a"}), "int >= 0"),
        (lambda: gen.concurrency_limit(0, {"f": "a"}), "int >= 1"),
        (lambda: gen.sleep(-1), "seconds >= 0"),
        (lambda: gen.mix({"f": "a"}), "mix takes a list"),
        (lambda: gen.reserve(1, {"f": "a"}), "followed by a default"),
        (lambda: gen.map_ops(lambda a, b: a, {"f": "a"}), r"f\(op\) or f\(op, test, ctx\)"),
    ],
)
def test_bad_combinator_arguments_fail_at_construction(make, message):
    with pytest.raises(GeneratorError, match=message):
        make()


# -- purity -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "g",
    [
        gen.limit(3, gen.repeat({"f": "r"})),
        gen.cycle([{"f": "a"}, {"f": "b"}]),
        gen.stagger(0.1, gen.repeat({"f": "r"})),
        gen.mix([gen.repeat({"f": "a"}), gen.repeat({"f": "b"})]),
        gen.each_thread([{"f": "a"}, {"f": "b"}]),
        gen.phases({"f": "a"}, {"f": "b"}),
        gen.any_of(gen.repeat({"f": "a"}), gen.repeat({"f": "b"})),
        gen.reserve(1, gen.repeat({"f": "w"}), gen.repeat({"f": "r"})),
    ],
)
def test_asking_twice_gives_the_same_op(g):
    a = gen.op(g, None, Context.initial(3, seed=5))
    b = gen.op(g, None, Context.initial(3, seed=5))
    assert a[0] == b[0]


# -- choosing -----------------------------------------------------------------------------------


def test_mix_picks_randomly_and_deterministically_by_seed():
    g = gen.limit(400, gen.mix([gen.repeat({"f": "a"}), gen.repeat({"f": "b"}), gen.repeat({"f": "c"})]))
    one, same, other = (fs(simulate(g, seed=s)) for s in (1, 1, 2))
    assert one == same and one != other
    counts = Counter(one)
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 80  # roughly uniform (fixed seed)


def test_mix_drops_exhausted_generators_and_ends_with_the_last():
    h = simulate(gen.mix([[{"f": "a"}] * 3, [{"f": "b"}] * 5]), seed=3)
    assert Counter(fs(h)) == {"a": 3, "b": 5}


def test_any_of_takes_the_soonest_op_and_ends_when_all_end():
    h = simulate(gen.any_of([{"f": "a", "time": 30}], [{"f": "b", "time": 10}, {"f": "c", "time": 20}]), concurrency=3)
    assert fs(h) == ["b", "c", "a"]


def test_shortest_any_ends_with_the_first_exhausted_generator():
    h = simulate(gen.shortest_any(gen.repeat({"f": "a"}), gen.limit(3, gen.repeat({"f": "b"}))), concurrency=2, seed=1)
    assert Counter(fs(h))["b"] <= 3 and len(invokes(h)) < 20


def test_flip_flop_alternates():
    h = simulate(gen.flip_flop(gen.repeat({"f": "a"}), [{"f": "b"}, {"f": "c"}]), concurrency=1)
    assert fs(h) == ["a", "b", "a", "c", "a"]


# -- counting -----------------------------------------------------------------------------------


def test_limit_once_repeat_and_cycle():
    assert fs(simulate(gen.limit(3, gen.repeat({"f": "r"})))) == ["r"] * 3
    assert fs(simulate(gen.once([{"f": "a"}, {"f": "b"}]))) == ["a"]
    assert fs(simulate(gen.repeat([{"f": "a"}, {"f": "b"}], times=3))) == ["a"] * 3  # repeat re-asks the same gen
    assert fs(simulate(gen.cycle([{"f": "a"}, {"f": "b"}], times=2), concurrency=1)) == ["a", "b", "a", "b"]
    assert gen.limit(3, None) is None and gen.repeat(None) is None


def test_repeat_of_a_function_makes_fresh_ops():
    h = simulate(gen.repeat(lambda test, ctx: {"f": "w", "value": ctx.rng.random()}, times=3))
    values = [o["value"] for o in invokes(h)]
    assert len(values) == 3 and len(set(values)) == 3


# -- time ---------------------------------------------------------------------------------------


def test_stagger_spaces_ops_randomly_about_dt_apart():
    dt = 0.01
    h = simulate(gen.limit(2000, gen.stagger(dt, gen.repeat({"f": "r"}))), concurrency=4, seed=9)
    times = [o["time"] for o in invokes(h)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(0 <= g < 2 * dt * 1e9 for g in gaps)
    assert 0.9 * dt * 1e9 < sum(gaps) / len(gaps) < 1.1 * dt * 1e9  # simulated time, fixed seed


def test_rate_is_ops_per_second_overall():
    h = simulate(gen.time_limit(10, gen.rate(50, gen.repeat({"f": "r"}))), concurrency=8, seed=2)
    assert 450 < len(invokes(h)) < 550


def test_delay_spaces_ops_exactly():
    h = simulate(gen.limit(5, gen.delay(0.5, gen.repeat({"f": "r"}))), concurrency=2)
    assert [o["time"] for o in invokes(h)] == [i * 500_000_000 for i in range(5)]


def test_time_limit_stops_emitting_after_the_limit():
    h = simulate(gen.time_limit(1, gen.repeat({"f": "r"})), concurrency=2, latency=30_000_000)
    times = [o["time"] for o in invokes(h)]
    assert times and max(times) < 1_000_000_000 and len(times) == 2 * 34  # 0, 30 ms, ..., 990 ms on 2 threads


def test_time_limit_counts_from_the_first_op():
    late = gen.time_limit(1, gen.repeat({"f": "r"}))
    h = simulate([{"f": "setup", "time": 0}, gen.sleep(5), late], concurrency=1, latency=100_000_000)
    times = [o["time"] for o in invokes(h) if o["f"] == "r"]
    assert min(times) >= 5_000_000_000 and max(times) < min(times) + 1_000_000_000 and len(times) == 10


def test_ops_scheduled_in_the_future_wait_for_their_time():
    h = simulate([{"f": "a", "time": 100}, {"f": "b", "time": 50}], concurrency=2)
    assert [(o["f"], o["time"]) for o in invokes(h)] == [("a", 100), ("b", 100)]


def test_sleep_takes_a_thread_for_that_long_and_is_not_recorded():
    h = simulate([{"f": "a"}, gen.sleep(2), {"f": "b"}], concurrency=1, latency=10)
    assert fs(h) == ["a", "b"] and invokes(h)[1]["time"] == 10 + 2_000_000_000
    assert all(o["type"] not in ("sleep", "log") for o in h)


# -- synchronization ----------------------------------------------------------------------------


def test_phases_wait_for_every_op_of_the_previous_phase():
    latencies = itertools.cycle([5, 50, 500])
    h = simulate(
        gen.phases(gen.limit(7, gen.repeat({"f": "w"})), gen.limit(4, gen.repeat({"f": "r"})), {"f": "final"}),
        concurrency=3,
        latency=lambda _op: next(latencies),
    )
    last_w_done = max(o["time"] for o in h if o["f"] == "w" and o["type"] == "ok")
    first_r = min(o["time"] for o in invokes(h) if o["f"] == "r")
    last_r_done = max(o["time"] for o in h if o["f"] == "r" and o["type"] == "ok")
    assert first_r >= last_w_done and invokes(h)[-1]["f"] == "final" and invokes(h)[-1]["time"] >= last_r_done
    assert Counter(fs(h)) == {"w": 7, "r": 4, "final": 1}
    # Without phases the reads would start while writes are still running:
    loose = simulate(
        [gen.limit(7, gen.repeat({"f": "w"})), gen.limit(4, gen.repeat({"f": "r"}))],
        concurrency=3,
        latency=lambda _op: next(latencies),
    )
    assert min(o["time"] for o in invokes(loose) if o["f"] == "r") < max(o["time"] for o in loose if o["f"] == "w")


def test_then_runs_the_second_argument_first():
    h = simulate(gen.then({"f": "final"}, gen.limit(3, gen.repeat({"f": "w"}))), concurrency=2, latency=10)
    assert fs(h)[-1] == "final" and invokes(h)[-1]["time"] >= 20


def test_concurrency_limit_bounds_ops_in_flight():
    h = simulate(gen.concurrency_limit(2, gen.limit(20, gen.repeat({"f": "r"}))), concurrency=5, latency=10)
    assert len(invokes(h)) == 20 and max_outstanding(h) == 2


def test_until_ok_retries_until_success():
    results = iter(["fail", "info", "fail", "ok", "ok"])
    h = simulate(
        gen.until_ok(gen.repeat({"f": "read"})),
        concurrency=1,
        complete=lambda o: {"type": next(results), "value": 1},
    )
    assert [o["type"] for o in h if o["type"] != "invoke"] == ["fail", "info", "fail", "ok"]


# -- threads ------------------------------------------------------------------------------------


def test_each_thread_runs_a_copy_per_thread():
    h = simulate(gen.each_thread([{"f": "a"}, {"f": "b"}]), concurrency=3)
    per_process = {}
    for o in invokes(h):
        per_process.setdefault(o["process"], []).append(o["f"])
    assert per_process == {0: ["a", "b"], 1: ["a", "b"], 2: ["a", "b"]}


def test_each_thread_keeps_its_copy_across_a_crash_but_each_process_starts_over():
    crash_first = lambda o: {"type": "info" if o["process"] == 0 and o["f"] == "a" else "ok"}  # noqa: E731
    by_thread = simulate(gen.each_thread([{"f": "a"}, {"f": "b"}]), concurrency=2, complete=crash_first)
    assert sorted((o["process"], o["f"]) for o in invokes(by_thread)) == [(0, "a"), (1, "a"), (1, "b"), (2, "b")]
    by_process = simulate(gen.each_process([{"f": "a"}, {"f": "b"}]), concurrency=2, complete=crash_first)
    assert sorted((o["process"], o["f"]) for o in invokes(by_process)) == [
        (0, "a"), (1, "a"), (1, "b"), (2, "a"), (2, "b"),
    ]  # fmt: skip


def test_a_crashed_process_is_replaced_by_a_fresh_id():
    outcome = itertools.cycle(["ok", "info", "ok", "ok"])
    h = simulate(gen.limit(24, gen.repeat({"f": "w"})), concurrency=3, complete=lambda o: {"type": next(outcome)})
    current = {0: 0, 1: 1, 2: 2}  # thread -> the process it must be running
    for o in h:
        thread = o["process"] % 3
        assert o["process"] == current[thread], f"op {o['index']} ran on a retired process"
        if o["type"] == "info":
            current[thread] += 3
    assert sum(1 for o in h if o["type"] == "info") == 6 and max(current.values()) > 3


def test_reserve_dedicates_threads():
    g = gen.reserve(2, gen.repeat({"f": "w"}), 1, gen.repeat({"f": "cas"}), gen.repeat({"f": "r"}))
    h = simulate(gen.limit(60, g), concurrency=5, latency=10, seed=4)
    threads = {}
    for o in invokes(h):
        threads.setdefault(o["f"], set()).add(o["process"] % 5)
    assert threads == {"w": {0, 1}, "cas": {2}, "r": {3, 4}}


def test_reserve_needs_enough_threads():
    with pytest.raises(GeneratorError, match="only 3 threads"):
        simulate(gen.reserve(2, {"f": "w"}, 1, {"f": "c"}, {"f": "r"}), concurrency=3)


def test_clients_and_nemesis_lanes():
    g = gen.clients(
        gen.limit(10, gen.repeat({"f": "w"})),
        gen.limit(4, gen.cycle([{"f": "start"}, {"f": "stop"}])),
    )
    h = simulate(g, concurrency=2, nemesis=True, latency=10)
    nemesis_ops = [o for o in h if o["process"] == "nemesis"]
    assert [o["f"] for o in nemesis_ops] == ["start", "start", "stop", "stop", "start", "start", "stop", "stop"]
    assert all(o["type"] == "info" for o in nemesis_ops)
    assert all(o["process"] != "nemesis" for o in h if o["f"] == "w") and Counter(fs(h))["w"] == 10


def test_a_plain_generator_may_run_on_the_nemesis_thread_so_wrap_it_in_clients():
    loose = simulate(gen.limit(6, gen.repeat({"f": "w"})), concurrency=1, nemesis=True, latency=10)
    assert any(o["process"] == "nemesis" for o in loose)
    tight = simulate(gen.clients(gen.limit(6, gen.repeat({"f": "w"}))), concurrency=1, nemesis=True, latency=10)
    assert all(o["process"] == 0 for o in tight)


def test_on_threads_with_a_collection():
    h = simulate(gen.on_threads({1}, gen.limit(3, gen.repeat({"f": "w"}))), concurrency=3)
    assert {o["process"] for o in h} == {1}


# -- transforming -------------------------------------------------------------------------------


def test_map_filter_and_f_map():
    base = gen.limit(6, gen.seq({"f": "w", "value": i} for i in itertools.count()))
    doubled = simulate(gen.map_ops(lambda o: {**o, "value": o["value"] * 2}, base))
    assert [o["value"] for o in invokes(doubled)] == [0, 2, 4, 6, 8, 10]
    evens = simulate(gen.filter_ops(lambda o: o["value"] % 2 == 0, base))
    assert [o["value"] for o in invokes(evens)] == [0, 2, 4]
    renamed = simulate(gen.f_map({"w": "write"}, base))
    assert set(fs(renamed)) == {"write"}


def test_on_update_sees_every_event():
    events = []

    def track(this, test, ctx, event):
        events.append(event["type"])
        return gen.on_update(track, this.gen)

    simulate(gen.on_update(track, gen.limit(2, gen.repeat({"f": "w"}))), concurrency=1)
    assert events == ["invoke", "ok", "invoke", "ok"]


def test_a_pending_generator_with_nothing_in_flight_is_reported():
    class Stuck(gen.Generator):
        __slots__ = ()

        def op(self, test, ctx):
            return PENDING

    with pytest.raises(GeneratorError, match="PENDING with no operation in flight"):
        simulate(Stuck())


def test_simulate_refuses_unbounded_generators():
    with pytest.raises(GeneratorError, match="more than 50 ops"):
        simulate(gen.repeat({"f": "r"}), max_ops=50)


def test_generator_repr_is_readable():
    text = repr(gen.clients(gen.limit(3, gen.repeat({"f": "read"}))))
    assert "OnThreads" in text and "client threads" in text and "Limit" in text
