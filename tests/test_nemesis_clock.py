"""The clock nemesis: bump / strobe / reset of libfaketime clocks on the real stack, and client clocks.

On the real stack (Valkey and a lease server under libfaketime): Valkey's
clock is backend time, so a +20 s jump expires a 10 s lease early, and the
next holder gets a strictly greater token; the lease server's own clock, 30 s
ahead or behind, changes nothing a lease depends on (C20). Every skew is first
shown to have taken effect (Valkey's TIME, the server's Date header), so
"nothing changed" is never vacuous.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import time

import httpx
import pytest
import redis

from lab.client import LeaseClient
from lab.stack.faketime import FakeClock
from lab.stack.local import LocalStack, StackOptions
from lab.testmap import Test
from nemesis.clock import BUMP_S, ClientClocks, clock, lease_skews
from nemesis.core import NemesisUnavailable
from workloads.common import identity_for, pick_credential
from nemesis.core import invocation as op

from conftest import until


async def wait_for(pred, timeout=5.0):
    """Poll `pred` until it holds or `timeout` passes (libfaketime notices an offset file a few ms late)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.01)
    return pred()


@pytest.fixture
def stack(tmp_path):
    """One lease server over Valkey, both under libfaketime; always downed."""
    s = LocalStack(name="t", root=tmp_path / "stack")
    try:
        s.up(StackOptions(servers=1, store=False, fake_clocks=True))
        yield s
    finally:
        s.down()


def api_key(stack):
    return pick_credential(json.loads(stack.credentials_file.read_text()))["api_key"]


def valkey_skew_s(conn) -> float:
    """Valkey's clock minus ours, in seconds."""
    secs, micros = conn.time()
    return secs + micros / 1e6 - time.time()


def server_skew_s(url) -> float:
    """The lease server's clock minus ours, from its Date header (1 s resolution, refreshed every second)."""
    date = httpx.get(url + "/healthz", timeout=2.0).headers["date"]
    return email.utils.parsedate_to_datetime(date).timestamp() - time.time()


def valkey_ms(conn) -> int:
    """Backend time: Valkey's TIME in Unix ms."""
    secs, micros = conn.time()
    return secs * 1000 + micros // 1000


async def test_valkey_clock_jump_expires_a_lease_early(stack):
    url = stack.process("lease-1").url
    nem = clock(stack.info["clocks"], rng=1)
    assert set(nem.targets) == {"valkey", "lease-1"}
    await nem.setup(None)
    conn = redis.Redis.from_url(stack.info["valkey"])
    ident = identity_for("k1")
    async with LeaseClient(url, api_key(stack), service_instance_id="holder") as holder, \
            LeaseClient(url, api_key(stack), service_instance_id="rival") as rival:
        first = await holder.acquire(ident, ttl_ms=10_000)
        assert first.outcome == "ok", first
        blocked = await rival.acquire(ident, ttl_ms=10_000)
        assert blocked.code == "lease_conflict", "before the jump the lease is held"
        bumped = await nem.invoke(None, op("bump-clock", {"targets": ["valkey"], "delta_s": 20}))
        assert bumped["value"] == {"fault": "clock", "phase": "start", "kind": "bump", "targets": ["valkey"],
                                   "delta_s": 20.0, "offsets": {"valkey": 20.0}}
        assert await wait_for(lambda: abs(valkey_skew_s(conn) - 20) < 2), "Valkey's TIME follows the bump"
        lost = await holder.renew(first.lease)
        assert (lost.outcome, lost.code) == ("fail", "lease_lost"), "backend time passed the lease's expiry"
        second = await rival.acquire(ident, ttl_ms=10_000)
        assert second.outcome == "ok", second
        assert second.lease.fencing_token > first.lease.fencing_token
        assert second.lease.lease_id != first.lease.lease_id
        reset = await nem.invoke(None, op("reset-clock"))
        assert reset["value"] == {"fault": "clock", "phase": "end", "offsets_before": {"valkey": 20.0}}
        assert await wait_for(lambda: abs(valkey_skew_s(conn)) < 2)
        assert (await nem.invoke(None, op("reset-clock")))["value"]["phase"] == "none"

        # strobe: Valkey's clock is seen both ways while it runs, and is back at 0 when it ends
        strobe = await nem.invoke(None, op("strobe-clock", {"targets": ["valkey"], "delta_s": -20, "period_ms": 50,
                                                            "duration_s": 1.0}))
        assert strobe["value"] == {"fault": "clock", "phase": "start", "kind": "strobe", "targets": ["valkey"],
                                   "delta_s": -20.0, "period_ms": 50, "duration_s": 1.0}
        changes = [0]  # Valkey's skew in units of 20 s, each time it changes
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and len(changes) < 4:
            skew = round(valkey_skew_s(conn) / 20)
            if skew != changes[-1]:
                changes.append(skew)
            await asyncio.sleep(0.005)
        assert changes == [0, -1, 0, -1], f"Valkey's clock flips between 0 and -20 s and back, saw {changes}"
        reset = await nem.invoke(None, op("reset-clock"))
        assert reset["value"]["phase"] == "end" and reset["value"]["strobe_flips"] >= 3
    assert await wait_for(lambda: abs(valkey_skew_s(conn)) < 2)
    conn.close()
    await nem.teardown(None)


async def test_lease_server_clock_skew_changes_nothing_a_lease_depends_on(stack):
    url = stack.process("lease-1").url
    clients = ClientClocks(concurrency=2)
    nem = clock(stack.info["clocks"], rng=1, client_clocks=clients)
    await nem.setup(None)
    conn = redis.Redis.from_url(stack.info["valkey"])
    ident = identity_for("k2")
    async with LeaseClient(url, api_key(stack), service_instance_id="holder") as holder:
        got = await holder.acquire(ident, ttl_ms=10_000)
        assert got.outcome == "ok", got
        lease = got.lease
        for delta in (30, -30):
            await nem.invoke(None, op("bump-clock", {"targets": ["lease-1"], "delta_s": delta}))
            assert await wait_for(lambda: abs(server_skew_s(url) - delta) < 3), f"the server's clock is {delta:+} s off"
            t0 = valkey_ms(conn)
            # a deadline far enough out that the server's skewed clock still sees it in the future
            renewed = await holder.renew(lease, deadline_s=120)
            t1 = valkey_ms(conn)
            assert renewed.outcome == "ok", renewed
            assert renewed.lease.fencing_token == lease.fencing_token
            assert t0 <= renewed.lease.expires_at_ms - 10_000 <= t1, "expiry = backend time + ttl, skew or not"
            assert renewed.lease.renewed_at_ms is not None and t0 <= renewed.lease.renewed_at_ms <= t1
            if delta > 0:
                # the one thing the server's clock decides: deadlines. A server ahead by more than the
                # caller's budget refuses the call before doing anything (fail closed, nothing renewed).
                late = await holder.renew(lease, deadline_s=5)
                assert (late.outcome, late.code) == ("fail", "deadline_exceeded")
            assert (await nem.invoke(None, op("reset-clock")))["value"]["offsets_before"] == {"lease-1": float(delta)}
            assert await wait_for(lambda: abs(server_skew_s(url)) < 3)
            lease = renewed.lease

        # a client clock 30 s behind: its deadline_at lies in the server's past; the call is refused,
        # and nothing the client's clock says extends the lease (C20)
        await nem.invoke(None, op("bump-clock", {"targets": ["client-1"], "delta_s": -30}))
        assert abs(clients.now_ms(3) - time.time() * 1000 + 30_000) < 1000, "process 3 runs on thread 1"
        async with LeaseClient(url, api_key(stack), service_instance_id="holder",
                               clock_ms=clients.clock_for(3)) as behind:
            refused = await behind.renew(lease)
            assert (refused.outcome, refused.code) == ("fail", "deadline_exceeded")
        still = await holder.inspect(ident)
        assert still.outcome == "ok" and still.lease.expires_at_ms == lease.expires_at_ms
    await nem.teardown(None)
    assert clients.offsets() == {}
    conn.close()


def test_client_clocks():
    clocks = ClientClocks(concurrency=3)
    assert clocks.names == ["client-0", "client-1", "client-2"]
    clocks.set_offset("client-2", 1.5)
    assert clocks.offset("client-2") == 1.5 and clocks.offsets() == {"client-2": 1.5}
    now = time.time_ns() // 1_000_000
    assert 1400 <= clocks.now_ms(5) - now <= 1600, "process 5 runs on thread 5 mod 3 = 2"
    assert abs(clocks.now_ms(0) - now) < 100
    read = clocks.clock_for(2)
    clocks.set_offset("client-2", -1)
    assert -1100 <= read() - time.time_ns() // 1_000_000 <= -900, "clock_for follows later offsets"
    clocks.set_offset("client-2", 0)
    assert clocks.offsets() == {}
    with pytest.raises(ValueError, match="unknown client clock 'client-3'"):
        clocks.set_offset("client-3", 1)
    with pytest.raises(ValueError, match="offset must be a number"):
        clocks.set_offset("client-0", float("nan"))
    with pytest.raises(ValueError, match="client process is an int >= 0"):
        clocks.now_ms("nemesis")


async def test_bump_strobe_reset_on_offset_files_and_client_clocks(tmp_path):
    files = {"lease-1": tmp_path / "lease-1.rc", "valkey": tmp_path / "valkey.rc"}
    clients = ClientClocks(concurrency=2)
    nem = clock(files, rng=42, client_clocks=clients, bump_s=(5, 10))
    with pytest.raises(NemesisUnavailable, match="cannot use lease-1's offset file"):
        await nem.setup(None)  # no offset file: no process reads one (the stack has no fake clocks)
    for p in files.values():
        FakeClock(p).set_offset(7)
    await nem.setup(None)
    assert FakeClock(files["valkey"]).offset() == 0
    drawn = await nem.invoke(None, op("bump-clock"))
    v = drawn["value"]
    assert v["phase"] == "start" and 5 <= abs(v["delta_s"]) <= 10 and v["targets"]
    for t in v["targets"]:
        got = FakeClock(files[t]).offset() if t in files else clients.offset(t)
        assert got == v["delta_s"], f"{t} moved by exactly the recorded step"
    busy = await nem.invoke(None, op("bump-clock"))
    assert busy["value"]["phase"] == "none" and "already active" in busy["error"]
    reset = await nem.invoke(None, op("reset-clock"))
    assert reset["value"]["offsets_before"] == {t: v["delta_s"] for t in v["targets"]}
    assert all(FakeClock(p).offset() == 0 for p in files.values()) and clients.offsets() == {}

    strobe = await nem.invoke(None, op("strobe-clock", {"targets": ["lease-1", "client-0"], "delta_s": 3,
                                                        "period_ms": 20, "duration_s": 30}))
    assert strobe["value"]["phase"] == "start"
    seen = set()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(seen) < 2:
        seen.add((FakeClock(files["lease-1"]).offset(), clients.offset("client-0")))
        await asyncio.sleep(0.003)
    assert seen == {(3.0, 3.0), (0.0, 0.0)}, seen
    await nem.teardown(None)  # stops the 30 s strobe at once
    assert nem._strobe is None
    assert FakeClock(files["lease-1"]).offset() == 0 and clients.offsets() == {}

    # a strobe that ran out by itself leaves every clock at 0; the window stays open until reset
    await nem.invoke(None, op("strobe-clock", {"targets": ["valkey"], "delta_s": 2, "period_ms": 10,
                                               "duration_s": 0.05}))
    await until(lambda: nem._strobe.done(), what="the 50 ms strobe to run out")
    assert FakeClock(files["valkey"]).offset() == 0
    assert (await nem.invoke(None, op("reset-clock")))["value"]["phase"] == "end"


def test_clock_nemesis_validates(tmp_path):
    f = {"valkey": tmp_path / "v.rc"}
    with pytest.raises(ValueError, match="no clocks to move: start the stack with fake_clocks=True"):
        clock({}, rng=1)
    with pytest.raises(ValueError, match=r"clock targets \['lease-1'\] are unknown; known: valkey"):
        clock(f, rng=1, targets=["lease-1"])
    with pytest.raises(ValueError, match=r"bump_s max must be a number in \[5"):
        clock(f, rng=1, bump_s=(5, 1))
    with pytest.raises(ValueError, match="strobe_period_ms must be a number in"):
        clock(f, rng=1, strobe_period_ms=1)
    nem = clock(f, rng=1)
    with pytest.raises(ValueError, match="delta_s must be a non-zero number of seconds"):
        asyncio.run(nem.invoke(None, op("bump-clock", {"delta_s": 0})))
    with pytest.raises(ValueError, match=r"bump-clock value must be null or an object with keys"):
        asyncio.run(nem.invoke(None, op("bump-clock", {"offset": 3})))
    with pytest.raises(ValueError, match="not configured"):
        asyncio.run(nem.invoke(None, op("bump-clock", {"targets": ["lease-1"]})))
    with pytest.raises(ValueError, match="does not handle f 'start-clock'"):
        asyncio.run(nem.invoke(None, op("start-clock")))


def test_drawn_steps_cover_every_scale_log_uniformly():
    """Steps below a call's 2 s deadline budget (the only ones a skewed server's lease logic ever sees: above it
    every call is refused as deadline_exceeded) are drawn as often as the large ones, at both signs."""
    nem = clock(None, rng=7, client_clocks=ClientClocks(concurrency=1))
    steps = [nem._choose({})[1] for _ in range(2000)]
    sizes = sorted(abs(d) for d in steps)
    lo, hi = BUMP_S
    assert lo <= sizes[0] and sizes[-1] <= hi
    below_budget = sum(lo <= s < 2.0 for s in sizes) / len(sizes)
    expected = math.log(2.0 / lo) / math.log(hi / lo)  # 0.58 for (0.05, 30): uniform would give 0.07
    assert abs(below_budget - expected) < 0.05, below_budget
    assert 0.45 < sum(d > 0 for d in steps) / len(steps) < 0.55
    deciles = [sizes[len(sizes) * k // 10] for k in range(1, 10)]
    ratios = [b / a for a, b in zip(deciles, deciles[1:])]
    assert max(ratios) / min(ratios) < 1.6, deciles  # log-uniform: equal ratios between deciles


def server_clock(tmp_path, servers: int, **options):
    """The `server-clock` nemesis as `fencelab test` builds it over `servers` lease servers' offset files."""
    from nemesis import registry  # only these tests build through the registry

    clocks = {n: str(tmp_path / f"{n}.rc") for n in ("valkey", *(f"lease-{i}" for i in range(1, servers + 1)))}

    class Stack:  # what build reads of a running LocalStack
        processes = []
        info = {"clocks": clocks}

    test = Test(name="t", time_limit=10, concurrency=5, **options)
    test.live["stack"] = Stack()
    nemesis, _ = registry.build(test, ["server-clock"], interval_s=1, seed=0)
    (member,) = nemesis.nemeses
    return member


@pytest.mark.parametrize("servers", [2, 3])
def test_server_clock_moves_a_strict_subset_of_the_servers_by_steps_sized_against_the_ttl(tmp_path, servers):
    """Every window leaves at least one server on the real clock, so two servers that stamp one lease disagree
    while it lasts (moving every server by one step leaves nothing for a server-clock bug to disagree about),
    by a step its leases feel: 0.5-2 x the TTL back, or up to 3/4 of the request deadline ahead (from half that)
    (a server further ahead refuses every call as deadline_exceeded: nothing left to decide wrongly)."""
    nem = server_clock(tmp_path, servers)  # defaults: TTL 2000 ms, the workloads' 2 s deadline
    draws = [nem._choose({}) for _ in range(600)]
    subsets = {tuple(targets) for targets, _ in draws}
    assert all(0 < len(s) < servers for s in subsets), subsets
    assert {t for s in subsets for t in s} == set(nem.targets)  # every server is skewed some time
    steps = [d for _, d in draws]
    assert all(-4.0 <= d <= -1.0 or 0.75 <= d <= 1.5 for d in steps), (min(steps), max(steps))
    assert 0.4 < sum(d > 0 for d in steps) / len(steps) < 0.6  # both directions, about as often

    short = server_clock(tmp_path, servers, ttl_ms=500, deadline_s=1.0)
    steps = [short._choose({})[1] for _ in range(300)]
    assert all(-1.0 <= d <= -0.25 or 0.25 <= d <= 0.75 for d in steps), (min(steps), max(steps))
    given = short._choose({"targets": short.targets, "delta_s": 30})  # an explicit op value is taken as given
    assert given == (short.targets, 30.0)


def test_lease_skews_follow_the_ttl_and_stay_below_the_deadline():
    assert lease_skews(2000, 2.0) == ((1.0, 4.0), (0.75, 1.5))
    assert lease_skews(60_000, 2.0) == ((30.0, 120.0), (0.75, 1.5))  # a long TTL: forward steps still decide
    assert lease_skews(100, 5.0) == ((0.05, 0.2), (0.05, 0.2))
    with pytest.raises(ValueError, match="ttl_ms must be a number"):
        lease_skews(0, 2.0)
    with pytest.raises(ValueError, match="deadline_s must be a number"):
        lease_skews(2000, float("inf"))
    with pytest.raises(ValueError, match="forward_s must be"):
        clock(None, rng=1, client_clocks=ClientClocks(concurrency=1), forward_s=5)
    with pytest.raises(ValueError, match="strict_subset must be True or False"):
        clock(None, rng=1, client_clocks=ClientClocks(concurrency=1), strict_subset="yes")
    # the general clock nemesis still draws any non-empty subset, every clock at once included
    every = clock(None, rng=3, client_clocks=ClientClocks(concurrency=2))
    assert any(len(every._choose({})[0]) == 2 for _ in range(50))
