"""The server's Valkey connections (lab/server/backend.py, issue 13): pipelined and shared, the recovery gate's
run_id stamped once per connection, and the submission boundary exact through both."""

from __future__ import annotations

import asyncio

import pytest
import redis

from lab.server import backend as keys
from lab.server.backend import Backend, pack_command, stamped
from lab.server.settings import Settings
from lab.server.testing import in_process_server
from lab.stack.valkey import ValkeyProcess

from conftest import lease_expired
# a Valkey of the test's own (its command counters see this test's calls only); an identity's fencing counter
from test_server_failures import counter_value as counter, own_valkey  # noqa: F401 (own_valkey: a fixture)


def stats(v: ValkeyProcess) -> dict[str, int]:
    """How many times Valkey has run each command (one INFO commandstats: itself one more INFO call)."""
    c = redis.Redis.from_url(v.url)
    try:
        return {name[len("cmdstat_"):]: s["calls"] for name, s in c.info("commandstats").items()}
    finally:
        c.close()


def calls(v: ValkeyProcess, command: str) -> int:
    return stats(v).get(command, 0)


async def test_mutations_under_the_recovery_rule_do_not_ask_valkey_for_its_run_id_each_time(own_valkey, run_dir):
    async with in_process_server(run_dir, own_valkey.url, recovery_check_interval_ms=600_000) as s:
        assert s.server.gate.active and s.server.backend.stamp_incarnation
        first = await s.acquire(target_id="warm")
        assert first.status_code == 200, first.text
        before = stats(own_valkey)
        for i in range(20):
            lease = (await s.acquire(target_id=f"t{i}.example")).json()["lease"]
            assert (await s.release(lease)).status_code == 200
        after = stats(own_valkey)
        assert after["evalsha"] - before["evalsha"] == 40
        # the run_id was read when the connection opened, not by each of the 40 mutations (one INFO is the
        # `before` snapshot's own; at most one more if a connection opened meanwhile)
        assert after["info"] - before["info"] <= 2


async def test_a_connection_to_another_valkey_incarnation_carries_no_mutation(own_valkey, run_dir):
    """Detection switched off: the connection's stamp alone refuses, and nothing reaches Valkey."""
    async with in_process_server(run_dir, own_valkey.url, recovery_check_interval_ms=600_000) as s:
        lease = (await s.acquire(target_id="held.example")).json()["lease"]
        s.server.backend.connect_hook = None
        s.server.gate._wake = lambda: None
        for conn in s.server.backend._idle:
            conn.valkey_run_id = "0" * 40  # as if this connection reached a restarted Valkey
        evalsha_before = calls(own_valkey, "evalsha")
        r = await s.acquire(target_id="other.example")
        assert r.status_code == 503 and r.json()["submitted"] is False and "recover" in r.json()["msg"], r.text
        assert s.server.gate.state == "recovering"  # the refusal told the gate: it now refuses every mutation
        for refused in (await s.acquire(target_id="third.example"), await s.renew(lease), await s.release(lease)):
            assert refused.status_code == 503 and refused.json()["submitted"] is False, refused.text
        assert calls(own_valkey, "evalsha") == evalsha_before
        assert counter(own_valkey, target_id="other.example") is None
        assert counter(own_valkey, target_id="held.example") == "1"


async def test_a_reconnected_connection_is_stamped_again(own_valkey):
    b = Backend(Settings(valkey_url=own_valkey.url))
    conn = b._template.make_connection()
    conn.valkey_run_id = "stale"
    await conn.connect()
    try:
        assert conn.valkey_run_id is None  # redis-py's _connect (every reconnect) clears it
        run_id = await b.stamp(conn)
        assert run_id == redis.Redis.from_url(own_valkey.url).info("server")["run_id"]
        assert conn.valkey_run_id == run_id
    finally:
        await conn.disconnect()
    assert stamped(type(conn)) is type(conn)  # stamping a stamped class twice changes nothing


async def test_concurrent_calls_share_connections_and_each_gets_its_own_answer(own_valkey, run_dir):
    async with in_process_server(run_dir, own_valkey.url) as s:
        rs = await asyncio.gather(*(s.acquire(target_id=f"c{i}.example") for i in range(60)))
        assert [r.json()["lease"]["target_id"] for r in rs] == [f"c{i}.example" for i in range(60)]
        assert all(r.json()["lease"]["fencing_token"] == 1 for r in rs)
        assert 1 <= len(s.server.backend._idle) < 60  # pipelined: far fewer connections than calls in flight


async def test_a_call_abandoned_before_its_write_is_never_written(own_valkey):
    b = Backend(Settings(valkey_url=own_valkey.url))
    loop = asyncio.get_running_loop()
    try:
        pipe = await b._pipe()
        dropped = pipe.submit(pack_command(("INCR", "abandoned")), 1)
        kept = pipe.submit(pack_command(("INCR", "kept")), 1)
        dropped.futures[0].cancel()  # its caller gave up in the same event-loop turn, before the write
        assert await kept.futures[0] == 1 and kept.sent and not dropped.sent
        assert await b.command(loop.time() + 1, "MGET", "abandoned", "kept") == [None, "1"]
    finally:
        await b.close()


async def test_a_late_reply_is_dropped_and_the_connection_goes_on(own_valkey):
    b = Backend(Settings(valkey_url=own_valkey.url))
    loop = asyncio.get_running_loop()
    try:
        await b.command(loop.time() + 1, "SET", "k", "before")
        own_valkey.pause()
        try:
            with pytest.raises(keys.OutcomeUnknown):  # written, no reply in time: it may have executed
                await b.command(loop.time() + 0.2, "SET", "k", "late")
        finally:
            own_valkey.resume()
        (conn,) = b._idle
        assert await b.command(loop.time() + 2, "GET", "k") == "late"  # the late SET's reply went nowhere
        assert b._idle == [conn]
    finally:
        await b.close()


async def test_a_broken_connection_fails_written_calls_as_unknown_and_new_ones_as_unavailable(own_valkey):
    b = Backend(Settings(valkey_url=own_valkey.url, valkey_connect_timeout_ms=300))
    loop = asyncio.get_running_loop()
    try:
        await b.command(loop.time() + 1, "PING")
        own_valkey.pause()
        pending = asyncio.create_task(b.command(loop.time() + 5, "INCR", "n"))
        await asyncio.sleep(0.05)  # written, waiting for its reply
        own_valkey.kill()  # a crash: the connection breaks under it, the INCR never ran
        with pytest.raises(keys.OutcomeUnknown):
            await pending
        with pytest.raises(keys.BackendUnavailable):  # nothing to connect to: definitely not executed
            await b.command(loop.time() + 1, "INCR", "n")
    finally:
        await b.close()


async def test_the_quota_index_keeps_one_entry_per_identity_without_a_pruning_pass(own_valkey, run_dir):
    """acquire.lua no longer prunes expired entries: they are overwritten by the identity's next acquire."""
    quota = keys.quota_key("lease-a1")
    c = redis.Redis.from_url(own_valkey.url, decode_responses=True)
    try:
        async with in_process_server(run_dir, own_valkey.url, active_lease_quota=5, min_ttl_ms=50) as s:
            first = (await s.acquire(target_id="q1", ttl_ms=100)).json()["lease"]
            await lease_expired(s, first)  # expired, never released: its entry stays, but counts no more
            for _ in range(3):
                lease = (await s.acquire(target_id="q1", ttl_ms=100)).json()["lease"]
                assert c.zcard(quota) == 1  # the same member (the lock key), its score moved to the new expiry
                assert int(c.zscore(quota, lease["lock_key"])) == lease["expires_at_ms"]
                await lease_expired(s, lease)
            held = [(await s.acquire(target_id=f"q{i}")).json()["lease"] for i in range(2, 7)]
            assert c.zcard(quota) == 6 and (await s.acquire(target_id="q7")).status_code == 429  # 5 unexpired
            for lease in held:
                assert (await s.release(lease)).status_code == 200
            assert c.zrange(quota, 0, -1) == [first["lock_key"]]  # only the expired q1 entry is left
    finally:
        c.close()
