"""The asyncio interpreter with small in-process fake clients and a fake nemesis."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

import lab.generator as gen
from lab.generator import GeneratorError
from lab.history import HistoryWriter, pair_ops, read_history
from lab.testmap import RunContext, Test


class FakeClient:
    """A client whose behaviour is a function of the op; counts its lifecycle calls."""

    def __init__(self, behaviour=None, *, log=None, latency=0.0, rng_seed=0):
        self.behaviour = behaviour or (lambda op: {"type": "ok", "value": op["value"]})
        self.log = log if log is not None else []
        self.latency = latency
        self.rng = random.Random(rng_seed)
        self.node = None

    async def open(self, test, node):
        c = FakeClient(self.behaviour, log=self.log, latency=self.latency, rng_seed=self.rng.random())
        c.node = node
        self.log.append(("open", node))
        return c

    async def setup(self, test):
        self.log.append(("setup", self.node))

    async def invoke(self, test, op):
        if self.latency:
            await asyncio.sleep(self.rng.uniform(0, self.latency))
        else:
            await asyncio.sleep(0)
        return self.behaviour(op)

    async def teardown(self, test):
        self.log.append(("teardown", self.node))

    async def close(self, test):
        self.log.append(("close", self.node))


class FakeNemesis:
    fs = frozenset({"start", "stop"})

    def __init__(self):
        self.calls = []

    async def setup(self, test):
        self.calls.append("setup")

    async def invoke(self, test, op):
        self.calls.append(op["f"])
        await asyncio.sleep(0.001)
        return {"type": "ok", "value": f"{op['f']}ed"}  # the interpreter records nemesis completions as info

    async def teardown(self, test):
        self.calls.append("teardown")


TEST = Test(name="fake", live=RunContext(nodes=["n1", "n2", "n3"]))


async def run(tmp_path, g, client=None, *, name="h.jsonl", **kw):
    kw.setdefault("concurrency", 3)
    path = tmp_path / name
    with HistoryWriter(path) as w:
        await gen.run(TEST, g, client or FakeClient(), history_writer=w, **kw)
    return read_history(path)


def max_outstanding(history):
    open_, most = set(), 0
    for o in history:
        if o["process"] == "nemesis":
            continue
        if o["type"] == "invoke":
            open_.add(o["process"])
            most = max(most, len(open_))
        else:
            open_.discard(o["process"])
    return most


async def test_records_every_invocation_and_completion(tmp_path):
    h = await run(tmp_path, gen.limit(30, gen.repeat({"f": "write", "value": 1, "key": "k1"})))
    pairs = list(pair_ops(h))
    assert len(h) == 60 and len(pairs) == 30
    assert all(c["type"] == "ok" and c["key"] == "k1" and i["value"] == 1 for i, c in pairs)


async def test_never_more_than_concurrency_client_ops_in_flight(tmp_path):
    client = FakeClient(latency=0.003)
    g = gen.clients(gen.limit(200, gen.mix([gen.repeat({"f": "read"}), gen.repeat({"f": "write", "value": 2})])))
    h = await run(tmp_path, g, client, concurrency=4, seed=3)
    assert len(h) == 400
    assert max_outstanding(h) == 4  # reached, never exceeded


async def test_a_crash_becomes_info_and_the_thread_gets_a_fresh_process(tmp_path):
    log = []

    def behaviour(op):
        if op["value"] == 3:
            raise ConnectionError("server went away")
        return {"type": "ok"}

    g = gen.seq({"f": "write", "value": v} for v in range(8))
    h = await run(tmp_path, g, FakeClient(behaviour, log=log), concurrency=2)
    crash = next(o for o in h if o["type"] == "info")
    assert crash["error"] == {"code": "crash", "msg": "ConnectionError: server went away"}
    p = crash["process"]
    assert not [o for o in h if o["process"] == p and o["index"] > crash["index"]]
    assert any(o["process"] == p + 2 for o in h)  # process + concurrency
    # One client per process: 3 setup clients for 3 nodes, 2 workers, 1 reopened after the crash.
    assert sum(1 for e in log if e[0] == "open") == 3 + 2 + 1
    assert sum(1 for e in log if e[0] == "close") == 3 + 2 + 1  # every client is closed


async def test_an_info_completion_retires_the_process(tmp_path):
    h = await run(
        tmp_path,
        gen.limit(6, gen.repeat({"f": "acquire"})),
        FakeClient(lambda op: {"type": "info", "error": "timeout"}),
        concurrency=1,
    )
    assert [o["process"] for o in h if o["type"] == "invoke"] == [0, 1, 2, 3, 4, 5]
    assert all(o["error"] == "timeout" for o in h if o["type"] == "info")


@pytest.mark.parametrize(
    "completion, why",
    [
        ("ok", "not a completion dict"),
        ({"type": "done"}, "completion type must be ok, fail or info"),
        ({"type": "ok", "process": 7}, "does not match the invocation"),
        ({"type": "ok", "value": {1, 2}}, "could not be recorded"),
    ],
)
async def test_invalid_completions_are_recorded_as_info(tmp_path, completion, why):
    h = await run(tmp_path, {"f": "read"}, FakeClient(lambda op: completion), concurrency=1)
    assert h[1]["type"] == "info" and h[1]["error"]["code"] == "invalid_completion" and why in h[1]["error"]["msg"]


async def test_completion_fields_are_recorded(tmp_path):
    h = await run(tmp_path, {"f": "read"}, FakeClient(lambda op: {"type": "fail", "error": "lease_lost", "node": "n2"}))
    assert h[1]["type"] == "fail" and h[1]["error"] == "lease_lost" and h[1]["node"] == "n2" and h[1]["value"] is None


async def test_a_client_that_cannot_open_fails_the_op_definitely(tmp_path):
    class Flaky(FakeClient):
        opened = 0

        async def open(self, test, node):
            Flaky.opened += 1
            if Flaky.opened in (4, 5):  # after the 3 setup clients, the workers' first opens fail
                raise OSError("connection refused")
            return await super().open(test, node)

    h = await run(tmp_path, gen.limit(4, gen.repeat({"f": "read"})), Flaky(), concurrency=2)
    fails = [o for o in h if o["type"] == "fail"]
    assert len(fails) == 2 and all(o["error"]["code"] == "no_client" for o in fails)
    assert sum(1 for o in h if o["type"] == "ok") == 2


async def test_nemesis_lane_ops_are_recorded_as_nemesis_info_ops(tmp_path):
    nem = FakeNemesis()
    g = gen.clients(
        gen.limit(20, gen.repeat({"f": "read"})),
        [{"f": "start"}, {"f": "stop"}],
    )
    h = await run(tmp_path, g, nemesis=nem, concurrency=2)
    nemesis_ops = [o for o in h if o["process"] == "nemesis"]
    assert [(o["type"], o["f"]) for o in nemesis_ops] == [
        ("info", "start"), ("info", "start"), ("info", "stop"), ("info", "stop"),
    ]  # fmt: skip
    assert nemesis_ops[1]["value"] == "started" and nem.calls == ["setup", "start", "stop", "teardown"]
    assert all(o["process"] != "nemesis" for o in h if o["f"] == "read")


async def test_nemesis_ops_without_a_nemesis_or_outside_its_fs_are_errors(tmp_path):
    with pytest.raises(GeneratorError, match="run\\(\\) was given no nemesis"):
        await run(tmp_path, gen.nemesis({"f": "start", "process": "nemesis"}), name="a.jsonl")
    with pytest.raises(GeneratorError, match="the nemesis handles f in \\['start', 'stop'\\], not 'kill'"):
        await run(tmp_path, gen.nemesis({"f": "kill"}), nemesis=FakeNemesis(), name="b.jsonl")


async def test_same_seed_same_choices(tmp_path):
    def workload():
        return gen.clients(
            gen.limit(
                150,
                gen.mix(
                    [
                        lambda test, ctx: {"f": "write", "value": ctx.rng.randrange(100)},
                        gen.repeat({"f": "read"}),
                        lambda test, ctx: {"f": "cas", "value": [ctx.rng.randrange(5), ctx.rng.randrange(5)]},
                    ]
                ),
            )
        )

    def choices(h):
        return [(o["f"], o["value"]) for o in h if o["type"] == "invoke"]

    # Real, random latencies: completions arrive in a different order each run, choices do not change.
    a = await run(tmp_path, workload(), FakeClient(latency=0.002, rng_seed=1), concurrency=3, seed=42, name="a.jsonl")
    b = await run(tmp_path, workload(), FakeClient(latency=0.002, rng_seed=2), concurrency=3, seed=42, name="b.jsonl")
    c = await run(tmp_path, workload(), FakeClient(latency=0.002, rng_seed=1), concurrency=3, seed=43, name="c.jsonl")
    assert choices(a) == choices(b) and choices(a) != choices(c)
    assert [o["process"] for o in a] != [o["process"] for o in b]  # the interleavings did differ


async def test_time_limit_ends_an_infinite_generator(tmp_path):
    h = await run(tmp_path, gen.time_limit(0.2, gen.clients(gen.repeat({"f": "read"}))), FakeClient(latency=0.005))
    assert len(h) > 10 and all(c is not None for _, c in pair_ops(h))


async def test_scheduled_times_are_honoured(tmp_path):
    dt = 0.02
    h = await run(tmp_path, gen.limit(5, gen.delay(dt, gen.repeat({"f": "read"}))), concurrency=2)
    times = [o["time"] for o in h if o["type"] == "invoke"]
    # Op k is scheduled dt*k after op 0's scheduled time (>= 0): it cannot be invoked earlier.
    assert all(t >= k * dt * 1e9 for k, t in enumerate(times))
    late = await run(tmp_path, {"f": "read", "time": 50_000_000}, name="late.jsonl")
    assert late[0]["time"] >= 50_000_000


async def test_phases_wait_for_completions(tmp_path):
    g = gen.phases(gen.limit(9, gen.repeat({"f": "write"})), gen.clients(gen.each_thread({"f": "read"})))
    h = await run(tmp_path, g, FakeClient(latency=0.004), concurrency=3)
    last_write_done = max(o["index"] for o in h if o["f"] == "write" and o["type"] == "ok")
    first_read = min(o["index"] for o in h if o["f"] == "read")
    assert first_read > last_write_done and sum(1 for o in h if o["f"] == "read" and o["type"] == "invoke") == 3


async def test_sleep_and_log_are_performed_but_not_recorded(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lab.generator")
    h = await run(tmp_path, [{"f": "a"}, gen.log("halfway there"), gen.sleep(0.05), {"f": "b"}], concurrency=1)
    assert [o["f"] for o in h] == ["a", "a", "b", "b"]
    assert h[2]["time"] - h[1]["time"] >= 50_000_000
    assert "halfway there" in caplog.text


async def test_lifecycle_setup_and_teardown_per_node_even_when_the_generator_fails(tmp_path):
    log = []

    def broken(test, ctx):
        raise KeyError("no such key")

    nem = FakeNemesis()
    with pytest.raises(GeneratorError, match="generator raised KeyError"):
        await run(tmp_path, [{"f": "read"}, broken], FakeClient(log=log), nemesis=nem)
    assert [e for e in log if e[0] == "setup"] == [("setup", "n1"), ("setup", "n2"), ("setup", "n3")]
    assert [e for e in log if e[0] == "teardown"] == [("teardown", "n1"), ("teardown", "n2"), ("teardown", "n3")]
    assert sum(1 for e in log if e[0] == "open") == sum(1 for e in log if e[0] == "close")
    assert nem.calls[-1] == "teardown"


async def test_invalid_generated_ops_are_explained(tmp_path):
    with pytest.raises(GeneratorError, match="time must be an int"):
        await run(tmp_path, {"f": "read", "time": 1.5}, name="a.jsonl")
    with pytest.raises(GeneratorError, match="client ops are invoked with type invoke"):
        await run(tmp_path, {"f": "read", "type": "info"}, name="b.jsonl")
    with pytest.raises(GeneratorError, match=r"process 9 is not running \(thread 1 runs process 1\)"):
        await run(tmp_path, {"f": "read", "process": 9}, name="c.jsonl", concurrency=2)
    with pytest.raises(GeneratorError, match="process 'n1' belongs to no thread"):
        await run(tmp_path, {"f": "read", "process": "n1"}, name="d.jsonl", concurrency=2)


async def test_synchronous_clients_work_too(tmp_path):
    class SyncClient:
        def open(self, test, node):
            return self

        def invoke(self, test, op):
            return {"type": "ok", "value": 1}

    h = await run(tmp_path, gen.limit(4, gen.repeat({"f": "read"})), SyncClient())
    assert [o["value"] for o in h if o["type"] == "ok"] == [1, 1, 1, 1]


async def test_bad_arguments_are_refused_before_anything_starts(tmp_path):
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        with pytest.raises(TypeError, match="lacks open"):
            await gen.run(TEST, {"f": "r"}, object(), history_writer=w, concurrency=1)
        with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
            await gen.run(TEST, {"f": "r"}, FakeClient(), history_writer=w, concurrency=0)
        with pytest.raises(TypeError, match="history_writer must be"):
            await gen.run(TEST, {"f": "r"}, FakeClient(), history_writer=None, concurrency=1)
    assert read_history(tmp_path / "h.jsonl") == []



class _CancelsTheRun:
    """A client whose `at`-th invoke cancels the run `delay` loop steps later, as Ctrl-C does under asyncio.run."""

    def __init__(self, at, delay):
        self.at, self.delay, self.n, self.run = at, delay, 0, None

    async def open(self, test, node):
        return self

    async def invoke(self, test, op):
        self.n += 1
        if self.n == self.at:
            async def later():
                for _ in range(self.delay):
                    await asyncio.sleep(0)
                self.run.cancel()
            asyncio.ensure_future(later())
        await asyncio.sleep(0)
        return {"type": "ok", "value": None}


async def test_a_cancellation_stops_the_run_even_as_a_completion_wakes_it(tmp_path):
    # Python 3.11's wait_for swallowed a cancellation that landed in the step where a completion woke the
    # interpreter (CI saw a run ignore Ctrl-C and go on to its time limit; this grid swallowed 54 of 120 then).
    swallowed = []
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        for at in range(5, 25):
            for delay in range(6):
                client = _CancelsTheRun(at, delay)
                g = gen.clients(gen.stagger(0.0001, gen.repeat({"f": "read", "value": None})))
                client.run = run_ = asyncio.create_task(gen.run(TEST, g, client, history_writer=w, concurrency=3))
                await asyncio.wait({run_}, timeout=10)  # an endless generator: only the cancel ends it
                if not run_.cancelled():
                    swallowed.append((at, delay))
                while not run_.done():  # stop a run that swallowed its cancel before the next one starts
                    run_.cancel()
                    await asyncio.wait({run_}, timeout=1)
    assert not swallowed, f"the run went on after a cancel (op, steps later): {swallowed}"


class _SwallowsACancel:
    """A client whose invoke takes a cancellation for a timeout and returns (client libraries have done so): its
    worker then goes back to its inbox, where the first cancellation no longer reaches it."""

    def __init__(self):
        self.swallowed = 0

    async def open(self, test, node):
        return self

    async def invoke(self, test, op):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.swallowed += 1
            return {"type": "info", "value": None, "error": "timed out"}
        return {"type": "ok", "value": None}


async def _ended_after_its_cancellation(run_: asyncio.Task) -> None:
    """Assert that a cancelled run ends within 20 s (the old interpreter hung: it is then stopped the hard way,
    so the test fails cleanly)."""
    done, _ = await asyncio.wait({run_}, timeout=20)
    if not done:
        run_.cancel()
        await asyncio.wait({run_}, timeout=5)
    assert run_ in done and run_.cancelled(), "the run did not end after its cancellation"


async def test_a_client_that_swallows_a_cancellation_does_not_hang_the_run(tmp_path):
    # Ctrl-C of `fencelab test` hung in 4 of 25 runs under load (tests/test_cli_safety.py, 2026-12-05): a worker
    # was left waiting on its inbox with its cancellation spent. The interpreter cancels such a worker again.
    client = _SwallowsACancel()
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        g = gen.clients(gen.repeat({"f": "read", "value": None}))
        run_ = asyncio.create_task(gen.run(TEST, g, client, history_writer=w, concurrency=2))
        while w.count < 2:  # both workers are inside invoke
            await asyncio.sleep(0.01)
        run_.cancel()
        await _ended_after_its_cancellation(run_)
    assert client.swallowed == 2


async def test_a_real_redis_client_that_swallows_the_runs_cancellation_does_not_hang_it(tmp_path, valkey):
    # The cause of that hang, with the real parts: redis-py (8.2) sends a command inside asyncio.wait_for when
    # socket_timeout is set, and Python 3.11's wait_for returns the result when a cancellation lands while the
    # send is in flight (cpython gh-86296, fixed in 3.12). Here the run is cancelled from inside a register
    # client's send: that worker's cancellation is swallowed, and its op completes ok.
    from workloads.register import RegisterDriver

    test = Test(name="swallow", live=RunContext(nodes=["n1"], valkey=valkey.url))
    state = {"sends": 0, "cancelled_at": None}

    class Driver(RegisterDriver):
        async def open(self, test, node):
            driver = await super().open(test, node)
            await driver.conn.ping()
            conn = await driver.conn.connection_pool.get_connection()
            await driver.conn.connection_pool.release(conn)
            send = conn._send_packed_command  # noqa: SLF001  (the step inside redis-py's wait_for)

            async def cancel_the_run_mid_send(command):
                await send(command)
                state["sends"] += 1
                if state["sends"] == 20:
                    state["cancelled_at"] = w.count
                    state["run"].cancel()

            conn._send_packed_command = cancel_the_run_mid_send  # noqa: SLF001
            return driver

    with HistoryWriter(tmp_path / "h.jsonl") as w:
        g = gen.clients(gen.stagger(0.001, gen.repeat({"f": "write", "key": "k", "value": 1})))
        state["run"] = run_ = asyncio.create_task(gen.run(test, g, Driver(timeout_s=2.0), history_writer=w,
                                                          concurrency=1))
        await _ended_after_its_cancellation(run_)
    history = read_history(tmp_path / "h.jsonl")
    # the cancellation was swallowed: the op whose send it landed in completed ok after it
    assert state["cancelled_at"] is not None
    assert any(o["type"] == "ok" for o in history[state["cancelled_at"]:]), history[-4:]
