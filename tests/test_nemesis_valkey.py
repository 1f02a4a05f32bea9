"""Valkey durability faults: crash-and-recover and restore-from-snapshot, on real Valkey and lease servers.

Both faults can roll every fencing counter back, which contract rule C5 and
the restore row of the races table forbid. These tests show the lab produces
that regression for real: through the reference lease server (which has no
recovery rule today), the same fencing token is issued twice.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis

from lab.client import LeaseClient, new_request_id
from lab.stack.valkey import ValkeyProcess
from nemesis.valkey import valkey_crash, valkey_restore
from workloads.common import identity_for, pick_credential
from nemesis.core import invocation as op


def holder_client(stack, instance):
    cred = pick_credential(json.loads(stack.credentials_file.read_text()))
    return LeaseClient(stack.process("lease-1").url, cred["api_key"], service_instance_id=instance)


async def acquire_when_free(api, ident, ttl_ms, timeout_s=10.0):
    """Acquire, retrying while the key is held (a restored lease runs out) or Valkey is coming back.

    An indeterminate answer is re-sent with the same request_id (it may have
    happened); a definite one gets a fresh request next time.
    """
    deadline = time.monotonic() + timeout_s
    request_id = new_request_id()
    while True:
        r = await api.acquire(ident, ttl_ms=ttl_ms, request_id=request_id)
        if r.outcome == "ok" or time.monotonic() > deadline:
            return r
        if r.outcome == "fail":
            request_id = new_request_id()
        await asyncio.sleep(0.05)


async def restore_scenario(stack) -> dict:
    """acquire (token A) -> snapshot -> release, acquire (token B) -> restore -> acquire (token C)."""
    nem = valkey_restore(stack.process("valkey"), stack.dir / "snapshots")
    await nem.setup(None)
    ident = identity_for("k-restore")
    async with holder_client(stack, "w-1") as w1, holder_client(stack, "w-2") as w2, \
            holder_client(stack, "w-3") as w3:
        a = await w1.acquire(ident, ttl_ms=1000)
        assert a.outcome == "ok", a
        snap = await nem.invoke(None, op("start-valkey-restore"))
        released = await w1.release(a.lease)
        assert released.outcome == "ok", released
        b = await w2.acquire(ident, ttl_ms=1000)
        assert b.outcome == "ok", b
        restored = await nem.invoke(None, op("stop-valkey-restore"))
        c = await acquire_when_free(w3, ident, ttl_ms=1000)
        assert c.outcome == "ok", c
    await nem.teardown(None)
    return {"snapshot": snap, "restored": restored,
            "tokens": [a.lease.fencing_token, b.lease.fencing_token, c.lease.fencing_token]}


# The recovery rule (C5, section 8's restore row: after a restore every token exceeds any token issued
# before it) keeps its epoch in the store, so it is on exactly when the servers have a store.
@pytest.mark.parametrize("recovery_rule", [False, True])
async def test_restore_from_an_older_snapshot_reissues_a_fencing_token(make_stack, recovery_rule):
    stack = make_stack(servers=1, store=recovery_rule, persistence="always")
    out = await restore_scenario(stack)
    snap, restored = out["snapshot"]["value"], out["restored"]["value"]
    assert snap["phase"] == "start" and snap["fault"] == "valkey-restore" and snap["keys"] >= 1
    assert restored["phase"] == "end" and restored["restored"] and restored["restarted"]["ready"]
    assert restored["installed"] == ["appendonlydir/appendonly.aof.1.base.rdb",
                                     "appendonlydir/appendonly.aof.manifest"]
    a, b, c = out["tokens"]
    assert b > a, "before the restore, a new acquisition gets a greater token"
    if recovery_rule:
        assert c > b, "after a restore the server must never go below a token it already issued"
    else:
        assert c == b, f"without a recovery rule the restored counter issues token {b} a second time: {out['tokens']}"


async def test_valkey_crash_without_persistence_resets_the_fencing_counter(make_stack):
    stack = make_stack(servers=1, store=False, persistence="none")
    nem = valkey_crash(stack.process("valkey"))
    await nem.setup(None)
    ident = identity_for("k-crash")
    async with holder_client(stack, "w-1") as w1, holder_client(stack, "w-2") as w2:
        a = await w1.acquire(ident, ttl_ms=1000)
        assert a.outcome == "ok", a
        crashed = await nem.invoke(None, op("start-valkey-crash"))
        assert crashed["value"]["phase"] == "start" and crashed["value"]["persistence"] == "none"
        assert crashed["value"]["keys_before"] >= 1
        back = await nem.invoke(None, op("stop-valkey-crash"))
        assert back["value"]["phase"] == "end" and back["value"]["keys_after"] == 0
        b = await acquire_when_free(w2, ident, ttl_ms=1000)
        assert b.outcome == "ok", b
        assert b.lease.fencing_token == a.lease.fencing_token, "the counter restarted: one token issued twice"
    await nem.teardown(None)


@pytest.mark.parametrize("persistence", ["none", "always"])
async def test_restore_puts_back_exactly_the_snapshot(tmp_path, persistence):
    v = ValkeyProcess(tmp_path, persistence=persistence).start()
    try:
        nem = valkey_restore(v, tmp_path / "snapshots")
        await nem.setup(None)
        c = redis.Redis.from_url(v.url, decode_responses=True)
        c.set("a", "1")
        c.incr("ctr")
        started = await nem.invoke(None, op("start-valkey-restore"))
        assert started["value"]["keys"] == 2 and started["value"]["bytes"] > 0
        assert not (v.data_dir / "dump.rdb").exists(), "the snapshot is moved out of the data directory"
        c.set("a", "2")
        c.incr("ctr")
        c.set("b", "new")
        busy = await nem.invoke(None, op("start-valkey-restore"))
        assert busy["value"]["phase"] == "none" and "already holds a snapshot" in busy["error"]
        c.close()
        restored = await nem.invoke(None, op("stop-valkey-restore"))
        v2 = restored["value"]
        assert (v2["keys_before"], v2["keys_snapshot"], v2["keys_after"]) == (3, 2, 2)
        c = redis.Redis.from_url(v.url, decode_responses=True)
        assert (c.get("a"), c.get("ctr"), c.get("b")) == ("1", "1", None)
        c.incr("ctr")  # and it keeps working from there, durably
        c.close()
        await nem.teardown(None)
        assert v.alive() and v.healthy()
    finally:
        v.stop()


async def test_discarded_snapshot_changes_nothing_and_crash_keeps_aof_data(tmp_path):
    v = ValkeyProcess(tmp_path, persistence="everysec").start()
    try:
        restore = valkey_restore(v, tmp_path / "snapshots")
        crash = valkey_crash(v)
        await restore.setup(None)
        await crash.setup(None)
        c = redis.Redis.from_url(v.url, decode_responses=True)
        c.set("k", "before")
        await restore.invoke(None, op("start-valkey-restore"))
        c.set("k", "after")
        kept = await restore.invoke(None, op("stop-valkey-restore", {"discard": True}))
        assert kept["value"]["phase"] == "end" and kept["value"]["restored"] is False
        assert c.get("k") == "after"
        deadline = time.monotonic() + 5
        while c.info("persistence")["aof_buffer_length"] and time.monotonic() < deadline:
            time.sleep(0.01)
        c.close()
        crashed = await crash.invoke(None, op("start-valkey-crash"))
        assert crashed["value"]["signal"] == "SIGKILL" and not v.alive()
        back = await crash.invoke(None, op("stop-valkey-crash"))
        assert back["value"]["keys_after"] == back["value"]["keys_before"] == 1
        assert "appendonlydir/appendonly.aof.manifest" in back["value"]["files"]
        c = redis.Redis.from_url(v.url, decode_responses=True)
        assert c.get("k") == "after", "everysec keeps what Valkey had written when it was SIGKILLed"
        c.close()
        none = await crash.invoke(None, op("stop-valkey-crash"))
        assert none["value"]["phase"] == "none"
        with pytest.raises(ValueError, match="stop-valkey-restore value must be null or"):
            await restore.invoke(None, op("stop-valkey-restore", {"discard": "yes"}))
        await crash.invoke(None, op("start-valkey-crash"))
        await crash.teardown(None)  # the heal restarts it without a stop op
        assert v.alive() and v.healthy()
    finally:
        v.stop()
