"""The Redis-style lock systems (`valkey-lock`, `valkey-lock-fenced`) against a real valkey-server and pouchdb-server."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from lab.client.results import Identity
from lab.sut.valkey_lock import (
    FENCE_UNKNOWN,
    FencedValkeyLockSystem,
    ValkeyLockSystem,
    fence_name,
    lock_name,
)


def ident(target: str = "t1") -> Identity:
    return Identity("tenant-a", "program-1", "fencelab", target, "actor-1", "lab")


def run(coro):
    return asyncio.run(coro)


async def wait_gone(system, identity, limit_s: float = 10.0) -> None:
    """Poll until Valkey has expired the lock (a condition, not a sleep of a guessed length)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while loop.time() < end:
        r = await system.inspect(identity)
        if r.code == "lease_not_found":
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the lock never expired")


def test_lock_is_exclusive_renews_and_releases_with_its_token(valkey):
    async def go():
        a = ValkeyLockSystem(valkey.url, service_instance_id="a")
        b = ValkeyLockSystem(valkey.url, service_instance_id="b")
        try:
            r = await a.acquire(ident(), ttl_ms=5000)
            assert r.ok and r.code == "lease_acquired"
            lease = r.lease
            assert lease.fencing_token is None  # valkey-lock hands out no token
            assert lease.acquired_at_ms is not None and lease.expires_at_ms is not None
            assert lease.expires_at_ms <= lease.acquired_at_ms + 5000
            import redis

            raw = redis.Redis.from_url(valkey.url)
            assert raw.get(lock_name(ident())).decode() == lease.lease_id  # SET NX stored the lease's token
            assert 0 < raw.pttl(lock_name(ident())) <= 5000
            other = await b.acquire(ident(), ttl_ms=5000)
            assert other.outcome == "fail" and other.code == "lease_conflict"
            ins = await b.inspect(ident())
            assert ins.ok and ins.lease.lease_id == lease.lease_id
            # b cannot release or renew a's lock with a lease whose token is not the stored one
            fake = type(lease)(**{**{f: getattr(lease, f) for f in ("fencing_token", "state", "ttl_ms", "tenant_id",
                               "program_id", "target_namespace", "target_id", "actor_name", "workflow_name",
                               "operation_class")}, "lease_id": uuid.uuid4().hex})
            assert (await b.release(fake)).code == "lease_lost"
            assert raw.get(lock_name(ident())).decode() == lease.lease_id
            ren = await a.renew(lease)
            assert ren.ok and ren.lease.lease_id == lease.lease_id and ren.lease.renewed_at_ms is not None
            rel = await a.release(ren.lease)
            assert rel.ok and rel.lease.state == "released"
            assert raw.get(lock_name(ident())) is None
            again = await a.renew(lease)
            assert again.outcome == "fail" and again.code == "lease_lost"
            raw.close()
        finally:
            await a.aclose()
            await b.aclose()

    run(go())


def test_fenced_variant_counts_a_token_per_acquisition(valkey):
    async def go():
        a = FencedValkeyLockSystem(valkey.url, service_instance_id="a")
        try:
            tokens = []
            for _ in range(3):
                r = await a.acquire(ident(), ttl_ms=2000)
                assert r.ok
                tokens.append(r.lease.fencing_token)
                assert (await a.release(r.lease)).ok
            assert tokens == [1, 2, 3]
        finally:
            await a.aclose()

    run(go())


def test_expired_holder_loses_renew_and_release_to_the_successor(valkey):
    async def go():
        a = FencedValkeyLockSystem(valkey.url, service_instance_id="a")
        b = FencedValkeyLockSystem(valkey.url, service_instance_id="b")
        try:
            old = (await a.acquire(ident(), ttl_ms=100)).lease
            await wait_gone(b, ident())
            new = await b.acquire(ident(), ttl_ms=5000)
            assert new.ok and new.lease.fencing_token > old.fencing_token
            assert (await a.renew(old)).code == "lease_lost"
            assert (await a.release(old)).code == "lease_lost"
            assert (await b.inspect(ident())).lease.lease_id == new.lease.lease_id
        finally:
            await a.aclose()
            await b.aclose()

    run(go())


def test_won_lock_with_unanswered_counter_is_info_not_fail(valkey):
    """SET NX won but INCR failed: the lock is held, its token unknown: `info`, never `fail`."""
    import redis

    raw = redis.Redis.from_url(valkey.url)
    raw.set(fence_name(ident()), "not-a-number")
    raw.close()

    async def go():
        a = FencedValkeyLockSystem(valkey.url)
        try:
            r = await a.acquire(ident(), ttl_ms=2000)
            assert r.outcome == "info" and r.code == FENCE_UNKNOWN
            assert (await a.inspect(ident())).ok  # the lock really was taken
        finally:
            await a.aclose()

    run(go())


def test_unreachable_valkey_is_a_definite_failure(tmp_path):
    from lab.stack.process import free_port

    async def go():
        a = ValkeyLockSystem(f"redis://127.0.0.1:{free_port()}/0", timeout_s=1.0)
        try:
            r = await a.acquire(ident(), ttl_ms=1000)
            assert r.outcome == "fail" and r.code == "connect_error"
        finally:
            await a.aclose()

    run(go())


def test_errors_after_sending_are_indefinite():
    """The mapping itself: a read timeout or dropped connection after sending may have run the command."""
    from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

    s = ValkeyLockSystem("redis://127.0.0.1:1/0")
    try:
        assert s._error(TimeoutError("Timeout reading from 127.0.0.1:1"), sent=True, op="x").outcome == "info"
        assert s._error(asyncio.TimeoutError(), sent=True, op="x").outcome == "info"
        assert s._error(ConnectionError("Connection closed by server."), sent=True, op="x").outcome == "info"
        assert s._error(ConnectionError("Error 111 connecting to 127.0.0.1:1. refused."), sent=True,
                        op="x").outcome == "fail"
        assert s._error(TimeoutError("Timeout connecting to server"), sent=True, op="x").outcome == "fail"
        assert s._error(BusyLoadingError("LOADING"), sent=True, op="x").outcome == "fail"
        assert s._error(asyncio.TimeoutError(), sent=False, op="x").outcome == "fail"
    finally:
        run(s.aclose())


def test_retries_are_off():
    """redis-py's default would re-send a timed-out command: the systems' clients never retry."""
    s = ValkeyLockSystem("redis://127.0.0.1:1/0")
    try:
        retry = s.redis.connection_pool.connection_kwargs.get("retry") or s.redis.get_retry()
        assert retry is not None and retry.get_retries() == 0
        assert not s.redis.connection_pool.connection_kwargs.get("retry_on_timeout")
        from redis.asyncio.retry import Retry as AsyncRetry  # a sync Retry works too, converted with a warning

        assert isinstance(retry, AsyncRetry)
    finally:
        run(s.aclose())


def test_valkey_lock_refuses_fenced_commits():
    with pytest.raises(ValueError, match="no fencing token"):
        ValkeyLockSystem("redis://127.0.0.1:1/0", commit_mode="fenced")


def kleppmann(valkey, store, system_cls, mode: str, db_suffix: str):
    """A holds the lock, stalls past its TTL; B acquires and writes; A wakes and writes on belief."""
    async def go():
        a = system_cls(valkey.url, store.url, service_instance_id="a", commit_mode=mode)
        b = system_cls(valkey.url, store.url, service_instance_id="b", commit_mode=mode)
        doc = f"doc-{db_suffix}-{uuid.uuid4().hex[:8]}"
        try:
            old = (await a.acquire(ident(doc), ttl_ms=100)).lease
            first = await a.commit(old, doc, {"append": ["a", old.fencing_token, 1]})
            assert first.ok
            await wait_gone(b, ident(doc))  # A's "GC pause": its lock runs out
            new = (await b.acquire(ident(doc), ttl_ms=5000)).lease
            assert (await b.commit(new, doc, {"append": ["b", new.fencing_token, 1]})).ok
            stale = await a.commit(old, doc, {"append": ["a", old.fencing_token, 2]})
            db = first.data["commit"]["db"]
            from lab.couch import CouchClient

            async with CouchClient(store.url) as couch:
                d = await couch.get(db, doc)
            return stale, d["entries"]
        finally:
            await a.aclose()
            await b.aclose()

    return run(go())


def test_unfenced_write_of_an_expired_holder_lands_after_the_successors(valkey, store):
    stale, entries = kleppmann(valkey, store, ValkeyLockSystem, "unfenced", "u")
    assert stale.ok  # nothing stops it: the store accepts the stale holder's write
    assert [e[0] for e in entries] == ["a", "b", "a"]


def test_fenced_write_of_an_expired_holder_is_refused_by_the_store(valkey, store):
    stale, entries = kleppmann(valkey, store, FencedValkeyLockSystem, "fenced", "f")
    assert stale.outcome == "fail" and stale.code == "stale_token"
    assert [e[0] for e in entries] == ["a", "b"]


def test_fenced_lock_can_also_write_unfenced(valkey, store):
    stale, entries = kleppmann(valkey, store, FencedValkeyLockSystem, "unfenced", "fu")
    assert stale.ok and [e[0] for e in entries] == ["a", "b", "a"]
    assert entries[-1][1] < entries[-2][1]  # the stale write carries the lower token, the store did not check


def test_a_holder_stalled_between_set_nx_and_incr_outranks_its_successor(valkey, store):
    """The INCR is not atomic with SET NX: stop A at its pause gate between them (the client-pause nemesis does
    this to a worker) past its TTL, let B win and count first, and A's token is the larger one. The guard then
    takes the expired holder's writes and refuses the rightful one's. (docs/third-party.md, "the INCR window".)
    The time A spends at the gate does not count against its deadline."""

    async def go():
        gate, requests = asyncio.Event(), []

        async def pause_gate():  # A's requests: TIME, SET NX, then INCR: hold it before the INCR
            requests.append(len(requests))
            if len(requests) == 3:
                await gate.wait()

        a = FencedValkeyLockSystem(valkey.url, store.url, service_instance_id="a")
        a.pause_gate = pause_gate
        b = FencedValkeyLockSystem(valkey.url, store.url, service_instance_id="b")
        doc = f"doc-incr-{uuid.uuid4().hex[:8]}"
        try:
            a_acq = asyncio.create_task(a.acquire(ident(doc), ttl_ms=100, deadline_s=0.5))
            await wait_held(b, ident(doc))  # A's SET NX has won
            await wait_gone(b, ident(doc))  # ... and expired while A stands at its gate
            new = await b.acquire(ident(doc), ttl_ms=5000)
            assert new.ok
            await asyncio.sleep(0.5)  # past A's deadline in wall time: the paused time does not count
            gate.set()
            old = await a_acq
            assert old.ok and old.lease.fencing_token > new.lease.fencing_token  # the expired holder outranks
            assert (await b.inspect(ident(doc))).lease.lease_id == new.lease.lease_id  # B holds it in Valkey
            a.pause_gate = None
            assert (await a.commit(old.lease, doc, {"append": ["a", old.lease.fencing_token, 1]})).ok
            refused = await b.commit(new.lease, doc, {"append": ["b", new.lease.fencing_token, 1]})
            assert refused.outcome == "fail" and refused.code == "stale_token"
        finally:
            await a.aclose()
            await b.aclose()

    run(go())


async def wait_held(system, identity, limit_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while loop.time() < end:
        if (await system.inspect(identity)).ok:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the lock was never taken")


def test_valkey_persistence_is_the_nemeses_unless_the_test_says(tmp_path):
    from lab.sut.processes import Placement
    from lab.sut.protocol import SutError
    from lab.sut.valkey_lock import valkey_processes
    from lab.testmap import Test

    def persistence(extra, asked):
        decl = valkey_processes(Test(workload="fenced-append", extra={"sut": "valkey-lock", **extra}))
        placement = Placement(decl, tmp_path, 1, False, persistence=asked)
        return decl.processes[0].make(placement).persistence

    assert persistence({}, "always") == "always"  # what the kill nemesis asks
    assert persistence({"valkey_persistence": "none"}, "always") == "none"  # a Valkey that forgets on a kill
    with pytest.raises(SutError, match="valkey_persistence"):
        persistence({"valkey_persistence": "sometimes"}, "none")


def test_each_nemesis_takes_effect_on_the_lab_owned_valkey(tmp_path):
    """On the stack the lab runs for `valkey-lock` (its Valkey, the store, a proxy per client link): kill: the pid
    is gone and comes back, the held lock survives (appendfsync always); pause: SIGSTOPped, a request sent to it
    times out as `info`; partition: requests through the cut links time out, and answer again after the heal."""
    import os

    from lab.stack.local import StackOptions
    from lab.sut.processes import SutStack
    from lab.sut.valkey_lock import valkey_processes
    from lab.testmap import Test
    from nemesis import network, process_faults
    from nemesis.core import invocation
    from lab.stack.topology import Topology
    from lab.stack.toxiproxy_api import ToxiproxyClient
    from tests.conftest import until

    stack = SutStack(valkey_processes(Test(workload="fenced-append", extra={"sut": "valkey-lock-fenced"})),
                     root=tmp_path / "stack", die_with_parent=True)
    stack.up(StackOptions(store=True, toxiproxy=True, persistence="always"))
    valkey = stack.process("valkey")
    assert valkey.persistence == "always"

    def via(group: int) -> FencedValkeyLockSystem:
        node = f"redis://{stack.info['topology'][f'c{group}_valkey']['listen']}/0"
        return FencedValkeyLockSystem(node, stack.store_url_for(node), service_instance_id=f"w{group}", timeout_s=1.0)

    async def answers(c) -> bool:
        return (await c.inspect(ident("n"), deadline_s=1.0)).code in ("lease_inspected", "lease_not_found")

    async def scenario():
        c1, c2 = via(1), via(2)
        try:
            held = await c1.acquire(ident("n"), ttl_ms=60_000)
            assert held.ok
            targets = process_faults.stack_targets(stack)
            assert {"valkey", "store"} <= set(targets)
            kill = process_faults.kill(targets, rng=1)
            await kill.setup(None)
            old = valkey.pid
            done = await kill.invoke(None, invocation("start-kill", {"targets": ["valkey"]}))
            assert done["value"]["killed"]["valkey"]["pid"] == old and not valkey.alive()
            with pytest.raises(ProcessLookupError):
                os.kill(old, 0)
            assert not await answers(c1)
            done = await kill.invoke(None, invocation("stop-kill"))
            assert done["value"]["restarted"]["valkey"]["ready"] and valkey.alive() and valkey.pid != old
            await until(lambda: answers(c1), timeout=30, what="the restarted Valkey to serve")
            after = await c2.inspect(ident("n"), deadline_s=1.0)
            assert after.ok and after.lease.lease_id == held.lease.lease_id  # the lock survived the kill

            pause = process_faults.pause(targets, rng=1)
            await pause.invoke(None, invocation("start-pause", {"targets": ["valkey"]}))
            assert process_faults.is_stopped(valkey)
            maybe = await c1.release(held.lease, deadline_s=0.5)
            assert maybe.outcome == "info" and maybe.code == "timeout"  # sent: it may yet run
            await pause.invoke(None, invocation("stop-pause"))
            await until(lambda: answers(c2), timeout=30, what="the resumed Valkey to serve")

            topo = Topology.from_description(ToxiproxyClient(stack.info["toxiproxy"]), stack.info["topology"])
            part = network.partition(topo, rng=1)
            await part.setup(None)
            done = await part.invoke(None, invocation("start-partition", {"grudge": "isolate-valkey"}))
            links = set(done["value"]["links"])
            assert links and links <= {"c1_valkey", "c2_valkey"}
            cut_side, other = (c1, c2) if "c1_valkey" in links else (c2, c1)
            cut = await cut_side.acquire(ident("m"), ttl_ms=2000, deadline_s=0.5)
            assert cut.outcome in ("fail", "info") and cut.code in ("deadline_exceeded", "timeout",
                                                                     "connection_lost"), cut
            if len(links) == 1:
                assert await answers(other)  # the other client group's link still serves
            await part.invoke(None, invocation("stop-partition"))
            await until(lambda: answers(cut_side), timeout=30, what="the healed link to serve")
            await part.teardown(None)
            await topo.client.aclose()
        finally:
            await c1.aclose()
            await c2.aclose()

    try:
        run(scenario())
    finally:
        stack.down()
