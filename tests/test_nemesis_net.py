"""The Toxiproxy topology and network nemeses against the real Toxiproxy, Valkey and pouchdb-server.

Each fault is shown taking effect on real traffic (a request through a
partitioned link times out; after the heal it succeeds), and teardown is shown
to leave no toxic and no proxy behind. Timing assertions are lower bounds of
injected delay compared with a baseline measured in the same test.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted, with a warning each time
from redis.backoff import NoBackoff

from conftest import SESSION_PIDS, sigint_default
from lab.paths import REPO_ROOT
from lab.stack.toxiproxy import ToxiproxyProcess
from nemesis.core import Nemesis, NemesisUnavailable, compose, heal_all, running
from nemesis.network import (DIRECTIONS, GRUDGES, SCOPES, bandwidth, grudge_pairs, latency, partition,
                             partition_replay, reset_peer, slicer, toxic_replay)
from lab.stack.topology import Topology, link_name, role, standard_links
from lab.stack.toxiproxy_api import ToxiproxyClient
from nemesis.core import invocation as op

TEST = {"name": "nemesis-net"}  # the nemeses ignore the test value; any value does


@pytest.fixture(scope="module")
def toxiproxy_server(tmp_path_factory):
    """One real Toxiproxy server for this module."""
    p = ToxiproxyProcess(tmp_path_factory.mktemp("toxiproxy-nemesis")).start()
    SESSION_PIDS.add(p.pid)
    yield p
    p.stop()
    SESSION_PIDS.discard(p.pid)


@pytest.fixture
async def tp(toxiproxy_server):
    """A client; `/reset` and no proxies left after each test."""
    client = ToxiproxyClient(toxiproxy_server.url, timeout=5.0)
    yield client
    await client.reset()
    for name in await client.proxies():
        await client.delete_proxy(name)
    await client.aclose()


@pytest.fixture
async def topo(tp, valkey, store):
    """Two client groups, two lease servers, Valkey and the store, one proxy per link."""
    upstreams = {"valkey": f"127.0.0.1:{valkey.port}", "store": f"127.0.0.1:{store.ports['http']}",
                 # the lease servers are not running in these tests; their links forward to Valkey so
                 # client -> server traffic is real traffic too
                 "lease-1": f"127.0.0.1:{valkey.port}", "lease-2": f"127.0.0.1:{valkey.port}"}
    t = await Topology.build(tp, upstreams, standard_links(2, 2))
    yield t
    await t.teardown()


def redis_at(addr: str, timeout: float = 0.5) -> aredis.Redis:
    """A redis client with short timeouts and no retries."""
    host, port = addr.rsplit(":", 1)
    return aredis.Redis(host=host, port=int(port), socket_timeout=timeout, socket_connect_timeout=timeout,
                        retry=Retry(NoBackoff(), 0))


async def ping_ok(addr: str, timeout: float = 0.5) -> bool:
    """Does a fresh connection through `addr` answer PING within `timeout`?"""
    r = redis_at(addr, timeout)
    try:
        return bool(await r.ping())
    except (redis.TimeoutError, redis.ConnectionError):
        return False
    finally:
        await r.aclose()


async def timed(coro) -> float:
    """Seconds the awaitable took."""
    t0 = time.perf_counter()
    await coro
    return time.perf_counter() - t0


async def our_toxics(tp: ToxiproxyClient) -> dict[str, list[str]]:
    """Toxic names per proxy, for proxies that have any."""
    return {n: [t["name"] for t in p["toxics"]] for n, p in (await tp.proxies()).items() if p["toxics"]}


# -- topology ---------------------------------------------------------------------------
async def test_topology_names_one_proxy_per_link_and_routes_to_upstreams(tp, topo, valkey, store):
    assert set(topo.links) == {"c1_lease-1", "c1_lease-2", "c2_lease-1", "c2_lease-2", "lease-1_valkey",
                               "lease-2_valkey", "lease-1_store", "lease-2_store"}
    assert set(await tp.proxies()) == set(topo.links)
    assert topo.clients == ["c1", "c2"] and topo.servers == ["lease-1", "lease-2"]
    listens = {l.listen for l in topo.links.values()}
    assert len(listens) == len(topo.links)  # a port of its own per link
    assert await ping_ok(topo.address("lease-1", "valkey"))
    async with httpx.AsyncClient(timeout=2) as h:
        r = await h.get(f"http://{topo.address('lease-2', 'store')}/")
        assert "version" in r.json()
    with pytest.raises(ValueError, match="no link valkey -> lease-1"):
        topo.address("valkey", "lease-1")
    assert topo.describe()["lease-1_valkey"]["upstream"] == f"127.0.0.1:{valkey.port}"
    await topo.teardown()
    assert await tp.proxies() == {}


@pytest.mark.parametrize("upstreams,links,needle", [
    ({"valkey": "127.0.0.1:1"}, [("lease_1", "valkey")], "no '_'"),
    ({"valkey": "127.0.0.1:1"}, [("c1", "store")], "no upstream address for 'store'"),
    ({"valkey": "127.0.0.1:1"}, [("c1", "valkey"), ("c1", "valkey")], "listed twice"),
    ({"valkey": "127.0.0.1:1"}, [("valkey", "valkey")], "itself"),
    ({"valkey": "nowhere"}, [("c1", "valkey")], "host:port"),
    ({"valkey": "127.0.0.1:1"}, [], "at least one link"),
])
async def test_topology_rejects_bad_input_before_creating_anything(tp, upstreams, links, needle):
    with pytest.raises(ValueError, match=needle):
        await Topology.build(tp, upstreams, links)
    assert await tp.proxies() == {}


async def test_topology_reset_clears_toxics_and_reenables_proxies(tp, topo):
    await partition(topo, rng=0).invoke(TEST, op("start-partition"))
    await tp.disable("c1_lease-1")
    assert await our_toxics(tp)
    await topo.reset()
    assert await our_toxics(tp) == {}
    assert all(p["enabled"] for p in (await tp.proxies()).values())
    assert await ping_ok(topo.address("c1", "lease-1"))


def test_public_names_exist():
    import nemesis.core, nemesis.netns_partition, nemesis.network, lab.stack.topology, lab.stack.toxiproxy_api

    for module in (nemesis.core, nemesis.netns_partition, nemesis.network, lab.stack.topology, lab.stack.toxiproxy_api):
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert missing == [], f"{module.__name__}.__all__ names missing attributes: {missing}"


def test_names_and_roles():
    assert link_name("c1", "lease-2") == "c1_lease-2"
    assert [role(n) for n in ("c3", "lease-10", "valkey", "store", "admin")] == \
        ["client", "server", "valkey", "store", "other"]
    assert standard_links(1, 1, clients_to_store=True) == [("c1", "lease-1"), ("lease-1", "valkey"),
                                                           ("lease-1", "store"), ("c1", "store")]


# -- partition ------------------------------------------------------------------------------
async def test_partition_blackholes_exactly_the_chosen_link_and_heals(tp, topo):
    nem = partition(topo, rng=random.Random(7), grudges=["isolate-valkey"])
    assert isinstance(nem, Nemesis) and nem.fs == {"start-partition", "stop-partition"}
    await nem.setup(TEST)
    a, b = topo.address("lease-1", "valkey"), topo.address("lease-2", "valkey")
    assert await ping_ok(a) and await ping_ok(b)

    done = await nem.invoke(TEST, op("start-partition", {"target": "lease-1"}))
    assert done["type"] == "info" and done["process"] == "nemesis" and done["f"] == "start-partition"
    v = done["value"]
    assert (v["phase"], v["fault"], v["grudge"], v["target"], v["direction"]) == \
        ("start", "partition", "isolate-valkey", "lease-1", "both")
    assert v["links"] == ["lease-1_valkey"] and v["streams"] == ["upstream", "downstream"]
    assert [(t["proxy"], t["type"], t["stream"], t["attributes"]) for t in v["toxics"]] == [
        ("lease-1_valkey", "timeout", "upstream", {"timeout": 0}),
        ("lease-1_valkey", "timeout", "downstream", {"timeout": 0})]
    assert await our_toxics(tp) == {"lease-1_valkey": ["partition-upstream", "partition-downstream"]}

    r = redis_at(a, timeout=0.3)
    with pytest.raises(redis.TimeoutError):
        await r.ping()  # the request through the partitioned link times out
    await r.aclose()
    assert await ping_ok(b)  # the other server's link is untouched

    end = await nem.invoke(TEST, op("stop-partition"))
    assert end["value"]["phase"] == "end" and end["value"]["removed"] == v["toxics"]
    assert await ping_ok(a)  # after the heal it succeeds
    assert await our_toxics(tp) == {}
    await nem.teardown(TEST)


async def test_partition_of_the_store_link_times_out_http(tp, topo):
    nem = partition(topo, rng=1, grudges=["isolate-store"])
    await nem.setup(TEST)
    url = f"http://{topo.address('lease-2', 'store')}/"
    async with httpx.AsyncClient(timeout=0.3) as h:
        assert (await h.get(url)).status_code == 200
        await nem.invoke(TEST, op("start-partition", {"target": "lease-2"}))
    async with httpx.AsyncClient(timeout=0.3) as h:
        with pytest.raises(httpx.TimeoutException):
            await h.get(url)
    await nem.invoke(TEST, op("stop-partition"))
    async with httpx.AsyncClient(timeout=2) as h:
        assert (await h.get(url)).status_code == 200
    await nem.teardown(TEST)


async def test_one_way_partitions_lose_requests_or_responses(tp, topo, valkey):
    """upstream: the SET never reaches Valkey; downstream: it is applied but the reply is lost."""
    nem = partition(topo, rng=3, grudges=["isolate-valkey"], directions=["upstream", "downstream"])
    await nem.setup(TEST)
    addr = topo.address("lease-1", "valkey")
    direct = redis.Redis(port=valkey.port)
    for direction, applied in (("upstream", False), ("downstream", True)):
        key = f"one-way-{direction}"
        r = redis_at(addr, timeout=0.4)
        assert await r.ping()  # connected (and the client's handshake done) before the fault
        done = await nem.invoke(TEST, op("start-partition", {"target": "lease-1", "direction": direction}))
        assert done["value"]["streams"] == [direction]
        assert [t["stream"] for t in done["value"]["toxics"]] == [direction]
        with pytest.raises(redis.TimeoutError):
            await r.set(key, "x")
        await r.aclose()
        assert (direct.get(key) == b"x") is applied
        await nem.invoke(TEST, op("stop-partition"))
        assert await ping_ok(addr)
    direct.close()
    await nem.teardown(TEST)


async def test_isolate_client_cuts_every_link_of_that_client(tp, topo):
    nem = partition(topo, rng=5, grudges=["isolate-client"])
    await nem.setup(TEST)
    v = (await nem.invoke(TEST, op("start-partition", {"target": "c2"})))["value"]
    assert v["links"] == ["c2_lease-1", "c2_lease-2"]
    assert not await ping_ok(topo.address("c2", "lease-1"), 0.3)
    assert await ping_ok(topo.address("c1", "lease-1"))
    await nem.teardown(TEST)  # teardown heals without a stop
    assert await our_toxics(tp) == {}
    assert await ping_ok(topo.address("c2", "lease-1"))


async def test_grudges_pick_the_right_links():
    pairs = standard_links(2, 3)
    rng = random.Random(0)
    assert grudge_pairs("isolate-clients", pairs, rng, target="lease-2")[1] == [("c1", "lease-2"), ("c2", "lease-2")]
    assert set(grudge_pairs("isolate-server", pairs, rng, target="lease-3")[1]) == \
        {("c1", "lease-3"), ("c2", "lease-3"), ("lease-3", "valkey"), ("lease-3", "store")}
    chosen, cut = grudge_pairs("halves", pairs, rng)
    a, b = chosen["sides"]
    assert {"valkey", "store"} <= set(a) and len([e for e in a if role(e) == "server"]) == 2
    assert len([e for e in b if role(e) == "server"]) == 1
    assert cut == [(f, t) for f, t in pairs if (f in a) != (t in a)] and cut
    fixed = grudge_pairs("halves", pairs, rng, sides=[["lease-1"], ["lease-2", "c2"]])
    assert fixed[0]["sides"][1] == ["c2", "lease-2"]
    with pytest.raises(ValueError, match="cannot target 'lease-9'"):
        grudge_pairs("isolate-valkey", pairs, rng, target="lease-9")
    with pytest.raises(ValueError, match="at least 2 lease servers"):
        grudge_pairs("halves", standard_links(2, 1), rng)


async def test_random_targets_are_reproducible_from_the_seed(tp, topo):
    values = []
    for _ in range(2):
        nem = partition(topo, rng=random.Random(42), directions=["both", "upstream", "downstream"])
        run = []
        for _ in range(4):
            run.append((await nem.invoke(TEST, op("start-partition")))["value"])
            await nem.invoke(TEST, op("stop-partition"))
        values.append(run)
        await nem.teardown(TEST)
    assert values[0] == values[1]
    assert len({(v["grudge"], v.get("target"), str(v.get("sides")), v["direction"]) for v in values[0]}) > 1


async def test_halves_partition_splits_clients_from_the_minority(tp, topo):
    nem = partition(topo, rng=11, grudges=["halves"])
    v = (await nem.invoke(TEST, op("start-partition", {"sides": [["lease-1", "c1"], ["lease-2", "c2"]]})))["value"]
    assert v["sides"] == [["c1", "lease-1", "store", "valkey"], ["c2", "lease-2"]]
    assert set(v["links"]) == {"c1_lease-2", "c2_lease-1", "lease-2_valkey", "lease-2_store"}
    assert not await ping_ok(topo.address("lease-2", "valkey"), 0.3)
    assert await ping_ok(topo.address("lease-1", "valkey"))
    assert await ping_ok(topo.address("c2", "lease-2"))
    await nem.teardown(TEST)
    assert await our_toxics(tp) == {}


async def test_start_while_active_and_stop_while_idle_change_nothing(tp, topo):
    nem = partition(topo, rng=2, grudges=["isolate-valkey"])
    idle = await nem.invoke(TEST, op("stop-partition"))
    assert idle["value"] == {"fault": "partition", "phase": "none", "removed": []} and "error" not in idle
    await nem.invoke(TEST, op("start-partition"))
    again = await nem.invoke(TEST, op("start-partition"))
    assert again["value"]["phase"] == "none" and "already active" in again["error"]
    assert sum(len(t) for t in (await our_toxics(tp)).values()) == 2
    await nem.teardown(TEST)


async def test_a_start_given_its_records_replay_value_adds_the_very_same_toxics(tp, topo):
    """A replayed fault schedule (nemesis.fault_schedule) gives each start the value its nemesis's `replay` made
    of the recorded start: every grudge and scope, drawn once, is done again exactly (links, streams, toxics)."""
    nemeses = [(partition(topo, rng=4, directions=DIRECTIONS), partition_replay, 2 * len(GRUDGES)),
               (latency(topo, rng=4, scopes=SCOPES), toxic_replay, 2 * len(SCOPES)),
               (slicer(topo, rng=4), toxic_replay, 2 * len(SCOPES))]
    seen = set()
    for nem, replay, draws in nemeses:
        for _ in range(draws):
            drawn = (await nem.invoke(TEST, op(f"start-{nem.name}")))["value"]
            await nem.invoke(TEST, op(f"stop-{nem.name}"))
            again = (await nem.invoke(TEST, op(f"start-{nem.name}", replay(drawn))))["value"]
            await nem.invoke(TEST, op(f"stop-{nem.name}"))
            assert again == drawn
            seen.add((nem.name, drawn.get("grudge") or drawn.get("scope")))
        await nem.teardown(TEST)
    assert {s for n, s in seen if n == "partition"} == set(GRUDGES), "every grudge was drawn and replayed"
    assert {s for n, s in seen if n == "latency"} == set(SCOPES)
    assert await our_toxics(tp) == {}


# -- latency, bandwidth, reset-peer, slicer -------------------------------------------------------
async def test_latency_measurably_delays_only_while_active(tp, topo):
    nem = latency(topo, rng=0, latency_ms=300, jitter_ms=20)
    assert nem.fs == {"start-latency", "stop-latency"}
    addr = topo.address("lease-1", "valkey")
    r = redis_at(addr, timeout=5)
    await r.ping()
    baseline = await timed(r.ping())
    v = (await nem.invoke(TEST, op("start-latency", {"links": ["lease-1_valkey"]})))["value"]
    assert v["phase"] == "start" and v["params"] == {"latency_ms": 300, "jitter_ms": 20}
    assert v["toxics"][0]["attributes"] == {"latency": 300, "jitter": 20} and v["streams"] == ["downstream"]
    delayed = await timed(r.ping())
    assert delayed >= 0.25 and delayed > baseline
    await nem.invoke(TEST, op("stop-latency"))
    after = await timed(r.ping())
    assert after < delayed
    await r.aclose()
    await nem.teardown(TEST)


async def test_latency_scope_server_covers_every_link_of_the_server(tp, topo):
    nem = latency(topo, rng=0, scopes=["server"], directions=["both"])
    v = (await nem.invoke(TEST, op("start-latency", {"target": "lease-2", "latency_ms": 50})))["value"]
    assert (v["scope"], v["target"]) == ("server", "lease-2") and v["params"]["latency_ms"] == 50
    assert set(v["links"]) == {"c1_lease-2", "c2_lease-2", "lease-2_valkey", "lease-2_store"}
    assert len(v["toxics"]) == 8  # two streams per link
    await nem.teardown(TEST)
    assert await our_toxics(tp) == {}


async def test_bandwidth_slows_a_large_reply(tp, topo, valkey):
    redis.Redis(port=valkey.port).set("big", b"x" * 20_000)
    nem = bandwidth(topo, rng=0, rate_kbps=20)
    r = redis_at(topo.address("lease-1", "valkey"), timeout=10)
    baseline = await timed(r.get("big"))
    await nem.invoke(TEST, op("start-bandwidth", {"links": ["lease-1_valkey"]}))
    t0 = time.perf_counter()
    got = await r.get("big")  # 20 KB at 20 KB/s: about a second
    slow = time.perf_counter() - t0
    assert got == b"x" * 20_000
    assert slow >= 0.5 and slow > baseline
    await nem.invoke(TEST, op("stop-bandwidth"))
    await r.aclose()
    await nem.teardown(TEST)


async def test_reset_peer_resets_connections_until_healed(tp, topo):
    nem = reset_peer(topo, rng=0)
    addr = topo.address("c1", "lease-1")
    r = redis_at(addr, timeout=2)
    assert await r.ping()
    v = (await nem.invoke(TEST, op("start-reset-peer", {"links": ["c1_lease-1"]})))["value"]
    assert v["toxics"][0]["type"] == "reset_peer" and v["toxics"][0]["attributes"] == {"timeout": 0}
    with pytest.raises(redis.ConnectionError):
        await r.ping()
    await r.aclose()
    assert not await ping_ok(addr, 2)  # new connections are reset too
    await nem.invoke(TEST, op("stop-reset-peer"))
    assert await ping_ok(addr, 2)
    await nem.teardown(TEST)


async def test_slicer_cuts_a_reply_into_delayed_pieces_without_corrupting_it(tp, topo, valkey):
    payload = bytes(range(256)) * 2
    redis.Redis(port=valkey.port).set("sliced", payload)
    nem = slicer(topo, rng=0, average_size=32, size_variation=0, delay_us=20_000, directions=["downstream"])
    r = redis_at(topo.address("lease-2", "valkey"), timeout=10)
    baseline = await timed(r.get("sliced"))
    await nem.invoke(TEST, op("start-slicer", {"links": ["lease-2_valkey"]}))
    t0 = time.perf_counter()
    got = await r.get("sliced")
    sliced = time.perf_counter() - t0
    assert got == payload
    assert sliced >= 0.15 and sliced > baseline  # >= 16 pieces, 20 ms apart
    await r.aclose()
    await nem.teardown(TEST)


@pytest.mark.parametrize("make,kwargs,needle", [
    (latency, {"latency_ms": 0}, "latency_ms"),
    (latency, {"jitter_ms": -1}, "jitter_ms"),
    (latency, {"directions": ["sideways"]}, "directions"),
    (latency, {"scopes": []}, "scopes"),
    (latency, {"toxicity": 2}, "toxicity"),
    (bandwidth, {"rate_kbps": "fast"}, "rate_kbps"),
    (reset_peer, {"timeout_ms": 1.5}, "timeout_ms"),
    (slicer, {"average_size": 4, "size_variation": 4}, "size_variation"),
    (partition, {"grudges": ["isolate-moon"]}, "grudges"),
    (partition, {"rng": "seed"}, "rng"),
])
async def test_bad_parameters_are_value_errors_naming_the_parameter(topo, make, kwargs, needle):
    kwargs = {"rng": 1, **kwargs}
    with pytest.raises(ValueError, match=needle):
        make(topo, **kwargs)


async def test_bad_op_values_are_value_errors(tp, topo):
    nem = latency(topo, rng=0)
    with pytest.raises(ValueError, match="unknown links"):
        await nem.invoke(TEST, op("start-latency", {"links": ["c9_lease-1"]}))
    with pytest.raises(ValueError, match="unknown value key"):
        await nem.invoke(TEST, op("start-latency", {"grudge": "halves"}))
    with pytest.raises(ValueError, match="latency_ms"):
        await nem.invoke(TEST, op("start-latency", {"latency_ms": -5}))
    with pytest.raises(ValueError, match="does not handle f 'start-partition'"):
        await nem.invoke(TEST, op("start-partition"))
    assert await our_toxics(tp) == {}


async def test_setup_says_when_the_proxies_are_missing(tp, topo):
    nem = partition(topo, rng=0)
    await tp.delete_proxy("lease-1_valkey")
    with pytest.raises(NemesisUnavailable, match="lacks proxies lease-1_valkey"):
        await nem.setup(TEST)


# -- composition and the heal that always runs ------------------------------------------------------
async def test_compose_routes_by_f_and_refuses_overlaps(tp, topo):
    part, lat = partition(topo, rng=1), latency(topo, rng=1)
    both = compose([part, lat])
    assert isinstance(both, Nemesis)
    assert both.fs == {"start-partition", "stop-partition", "start-latency", "stop-latency"}
    with pytest.raises(ValueError, match="'start-latency' is handled by both latency and latency"):
        compose([lat, latency(topo, rng=2)])
    with pytest.raises(TypeError, match="not a nemesis"):
        compose([part, object()])
    await both.setup(TEST)
    p = await both.invoke(TEST, op("start-partition", {"grudge": "isolate-valkey", "target": "lease-2"}))
    l = await both.invoke(TEST, op("start-latency", {"links": ["lease-2_valkey"], "latency_ms": 10}))
    assert p["value"]["fault"] == "partition" and l["value"]["fault"] == "latency"
    assert sorted((await our_toxics(tp))["lease-2_valkey"]) == [
        "latency-downstream", "partition-downstream", "partition-upstream"]
    with pytest.raises(ValueError, match="no nemesis handles f 'start-clock'"):
        await both.invoke(TEST, op("start-clock"))
    await both.teardown(TEST)
    assert await our_toxics(tp) == {}


async def test_running_heals_on_exception(tp, topo):
    with pytest.raises(RuntimeError, match="boom"):
        async with running(partition(topo, rng=1), TEST) as nem:
            await nem.invoke(TEST, op("start-partition"))
            assert await our_toxics(tp)
            raise RuntimeError("boom")
    assert await our_toxics(tp) == {}


async def test_running_heals_on_cancellation_even_if_cancelled_again(tp, topo):
    started = asyncio.Event()

    async def body():
        async with running(compose([partition(topo, rng=1), latency(topo, rng=1)]), TEST) as nem:
            await nem.invoke(TEST, op("start-partition", {"grudge": "isolate-server", "target": "lease-1"}))
            await nem.invoke(TEST, op("start-latency", {"scope": "all"}))
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await started.wait()
    assert await our_toxics(tp)
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # a second cancellation arrives while healing
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await our_toxics(tp) == {}


async def test_heal_all_waits_for_a_teardown_and_reports_its_failure(tp, topo):
    class Flaky:
        fs = frozenset({"start-flaky"})
        healed = False

        async def setup(self, test):
            pass

        async def invoke(self, test, op):
            return op

        async def teardown(self, test):
            await asyncio.sleep(0.05)
            Flaky.healed = True
            raise OSError("cannot heal")

    with pytest.raises(OSError, match="cannot heal"):
        await heal_all(Flaky(), TEST)
    assert Flaky.healed
    # compose heals every member even when one fails, then raises the failure
    lat = latency(topo, rng=0)
    await lat.invoke(TEST, op("start-latency", {"scope": "all"}))
    with pytest.raises(OSError, match="cannot heal"):
        await compose([lat, Flaky()]).teardown(TEST)
    assert await our_toxics(tp) == {}


def test_ctrl_c_heals_the_partition(toxiproxy_server, valkey, tmp_path):
    """SIGINT to a process running a partition: asyncio cancels it and the heal still removes the toxics."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from nemesis.core import running
        from nemesis.network import partition
        from lab.stack.topology import Topology
        from lab.stack.toxiproxy_api import ToxiproxyClient

        async def main():
            client = ToxiproxyClient({toxiproxy_server.url!r})
            topo = await Topology.build(client, {{"valkey": "127.0.0.1:{valkey.port}"}}, [("lease-1", "valkey")])
            async with running(partition(topo, rng=0), None) as nem:
                await nem.invoke(None, {{"f": "start-partition", "process": "nemesis", "value": None}})
                print("partitioned", flush=True)
                await asyncio.sleep(60)

        asyncio.run(main())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    try:
        assert proc.stdout.readline().strip() == "partitioned", proc.stderr.read()
        client = httpx.Client(base_url=toxiproxy_server.url, timeout=5)
        assert client.get("/proxies/lease-1_valkey/toxics").json()  # the fault is in place
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert "KeyboardInterrupt" in err  # it was interrupted, not finished
        assert client.get("/proxies/lease-1_valkey/toxics").json() == []  # and healed on the way out
        client.delete("/proxies/lease-1_valkey")
        client.close()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
