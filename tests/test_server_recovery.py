"""The recovery rule (C5, section 8's "backup / restore, failover" row) against a real restored Valkey.

Each test owns a Valkey whose state it rolls back for real: `SAVE`, copy
`dump.rdb`, keep working, stop Valkey, put the old file back, start it again
(a new `run_id`, the old counters). Without the rule (`recovery: off`, the
`counter-from-snapshot` planted bug) the restored counter issues token 2 a
second time and the store accepts both holders of token 2; with it, the server
moves to a new epoch whose tokens exceed every earlier one, revokes the
restored leases, and no stale commit is accepted.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid

import pytest
import redis

from lab.couch import CouchClient
from lab.server import backend as keys
from lab.server.identity import normalize_identity
from lab.server.recovery import EPOCH_BITS
from lab.server.store import EPOCH_DOC
from lab.server.testing import identity, in_process_server
from lab.stack.process import free_port
from lab.stack.valkey import ValkeyProcess

from conftest import lease_expired

EPOCH_1 = 1 << EPOCH_BITS


@pytest.fixture
def db_name() -> str:
    """A database of its own in the session store."""
    return "fl" + uuid.uuid4().hex[:12]


@pytest.fixture
def own_valkey(run_dir):
    """A Valkey this test may stop and restore (RDB only: the snapshot is dump.rdb)."""
    v = ValkeyProcess(run_dir, name="valkey-restorable", persistence="none").start()
    try:
        yield v
    finally:
        v.stop()


async def save_snapshot(v: ValkeyProcess, dest) -> None:
    """SAVE, then copy the RDB file out of Valkey's data directory."""
    await asyncio.to_thread(_save, v, dest)


async def restore_snapshot(v: ValkeyProcess, snap) -> None:
    """Stop Valkey, put the snapshot back, start it again (a new run_id, the old data).

    In a thread, so the server's event loop keeps running (and sees its connections close) meanwhile.
    """
    await asyncio.to_thread(_restore, v, snap)


def _save(v: ValkeyProcess, dest) -> None:
    """SAVE and copy dump.rdb to `dest`."""
    c = redis.Redis.from_url(v.url)
    try:
        c.save()
    finally:
        c.close()
    shutil.copy(v.data_dir / "dump.rdb", dest)


def _restore(v: ValkeyProcess, snap) -> None:
    """Stop, put `snap` back as dump.rdb, start."""
    v.stop()
    shutil.copy(snap, v.data_dir / "dump.rdb")
    v.start()


async def read_doc(url: str, db: str, doc: str) -> dict | None:
    """The document as the store holds it (None when absent)."""
    async with CouchClient(url) as c:
        return await c.get(db, doc)


async def acquired(s, principal="lease-a1", **fields) -> dict:
    """Acquire, asserting success; the lease object."""
    r = await s.acquire(principal, **fields)
    assert r.status_code == 200, r.text
    return r.json()["lease"]


async def acquire_after_restart(s, **fields) -> dict:
    """Acquire, accepting only the recovery rule's definite 503 (or Valkey still down) in between."""
    for _ in range(100):
        r = await s.acquire(**fields)
        if r.status_code == 200:
            return r.json()["lease"]
        assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable", r.text
        assert r.json().get("submitted") is False, r.text  # refused before anything was executed
        await asyncio.sleep(0.05)
    raise AssertionError("no acquisition after the restart")


def committed(r) -> dict:
    """The commit result of a commit_accepted envelope."""
    assert r.status_code == 200 and r.json()["code"] == "commit_accepted", r.text
    return r.json()["commit"]


def lost(r) -> None:
    """Assert a 409 lease_lost."""
    assert r.status_code == 409 and r.json()["code"] == "lease_lost", r.text


async def before_restore(s, v: ValkeyProcess, snap) -> tuple[dict, dict]:
    """acquire (1), commit, snapshot, release, acquire (2), commit — the store now holds token 2."""
    one = await acquired(s, ttl_ms=2500)
    assert one["fencing_token"] == 1
    committed(await s.commit(one, "doc-r", {"append": ["one", 1]}))
    await save_snapshot(v, snap)
    assert (await s.release(one)).status_code == 200
    two = await acquired(s, ttl_ms=10_000)
    assert two["fencing_token"] == 2
    committed(await s.commit(two, "doc-r", {"append": ["two", 2]}))
    return one, two


async def test_without_the_rule_a_restore_issues_a_token_twice(own_valkey, store, run_dir, db_name):
    """The counter-from-snapshot planted bug: the regression is real, and only the store guard limits it."""
    async with in_process_server(run_dir, own_valkey.url, store_url=store.url, store_db=db_name,
                                 recovery="off", allow_mutants=True) as s:
        one, two = await before_restore(s, own_valkey, run_dir / "snap.rdb")
        await restore_snapshot(own_valkey, run_dir / "snap.rdb")
        # the restored lease 1 is active again: Valkey validates its commit, the store's guard refuses it
        r = await s.commit(one, "doc-r", {"append": ["one-again", 1]})
        lost(r)
        assert "document already holds" in r.json()["msg"]
        again = await acquire_after_restart(s, ttl_ms=10_000, wait_ms=4000, service_instance_id="worker-3")
        assert again["fencing_token"] == two["fencing_token"] == 2  # token 2, issued twice
        assert again["lease_id"] != two["lease_id"]
        committed(await s.commit(again, "doc-r", {"append": ["again", 2]}, service_instance_id="worker-3"))
    doc = await read_doc(store.url, db_name, "doc-r")
    # two different leases with the same token were both accepted downstream
    assert doc["entries"] == [["one", 1], ["two", 2], ["again", 2]]


async def test_with_the_rule_no_token_is_reused_and_restored_leases_are_revoked(own_valkey, store, run_dir,
                                                                                 db_name):
    async with in_process_server(run_dir, own_valkey.url, store_url=store.url, store_db=db_name) as s:
        one, two = await before_restore(s, own_valkey, run_dir / "snap.rdb")
        epoch0 = await read_doc(store.url, db_name, EPOCH_DOC)
        assert epoch0["epoch"] == 0
        await restore_snapshot(own_valkey, run_dir / "snap.rdb")
        three = await acquire_after_restart(s, ttl_ms=10_000, service_instance_id="worker-3")
        assert three["fencing_token"] == EPOCH_1 + 1 > two["fencing_token"]
        # no stale commit: the restored lease 1 was revoked by the sweep, lease 2 is gone with the restore
        lost(await s.commit(one, "doc-r", {"append": ["one-again", 1]}))
        lost(await s.commit(two, "doc-r", {"append": ["two-again", 2]}))
        lost(await s.renew(one))
        committed(await s.commit(three, "doc-r", {"append": ["three", three["fencing_token"]]},
                                 service_instance_id="worker-3"))
        inspected = (await s.inspect(one["lease_id"])).json()["lease"]
        assert inspected["state"] == "revoked" and "recovery" in inspected["admin_reason"]
        health = (await s.client.get("/healthz")).json()
        assert health["recovery"]["state"] == "ready" and health["recovery"]["epoch"] == 1
    doc = await read_doc(store.url, db_name, "doc-r")
    assert doc["entries"] == [["one", 1], ["two", 2], ["three", EPOCH_1 + 1]]
    epoch1 = await read_doc(store.url, db_name, EPOCH_DOC)
    assert epoch1["epoch"] == 1 and epoch1["floor"] == EPOCH_1
    assert epoch1["valkey_run_id"] != epoch0["valkey_run_id"] and epoch1["previous"]["epoch"] == 0


async def test_a_restored_valkey_never_serves_an_acquire_before_recovery(own_valkey, store, run_dir, db_name):
    """Detection switched off: the scripts' own run_id check still refuses (the race is closed in Valkey)."""
    async with in_process_server(run_dir, own_valkey.url, store_url=store.url, store_db=db_name,
                                 recovery_check_interval_ms=600_000) as s:
        one = await acquired(s, ttl_ms=200)
        await save_snapshot(own_valkey, run_dir / "snap.rdb")
        s.server.backend.connect_hook = None  # the server will not notice the restart by itself ...
        s.server.gate._wake = lambda: None  # ... nor start recovering when a script refuses
        await restore_snapshot(own_valkey, run_dir / "snap.rdb")
        await lease_expired(s, one)  # the restored lease has expired: only the rule stands in the way
        for _ in range(3):
            r = await s.acquire(ttl_ms=1000)
            assert r.status_code == 503 and r.json()["submitted"] is False, r.text
            assert "recover" in r.json()["msg"]
        c = redis.Redis.from_url(own_valkey.url, decode_responses=True)
        try:
            assert c.get(keys.fence_key(one["lock_key"])) == "1"  # nothing was issued from the old counter
        finally:
            c.close()
        await s.server.recovery.check()
        assert (await acquired(s, ttl_ms=1000))["fencing_token"] == EPOCH_1 + 1


async def test_instances_share_one_epoch_and_a_restart_of_the_server_adopts_it(own_valkey, store, run_dir,
                                                                               db_name):
    ident = {"store_url": store.url, "store_db": db_name}
    async with in_process_server(run_dir / "a", own_valkey.url, instance_id="lease-a", **ident) as a:
        first = await acquired(a, ttl_ms=100)
        assert first["fencing_token"] == 1
        async with in_process_server(run_dir / "b", own_valkey.url, instance_id="lease-b", **ident) as b:
            await lease_expired(a, first)
            second = await acquired(b, ttl_ms=100)
            assert second["fencing_token"] == 2  # adopted epoch 0: no jump
            await save_snapshot(own_valkey, run_dir / "snap.rdb")
            await restore_snapshot(own_valkey, run_dir / "snap.rdb")
            await lease_expired(a, second)  # and so has its restored copy
            third = await acquire_after_restart(a, ttl_ms=100)
            t1 = third["fencing_token"]
            await lease_expired(a, third)
            t2 = (await acquire_after_restart(b, ttl_ms=100))["fencing_token"]
    assert (t1, t2) == (EPOCH_1 + 1, EPOCH_1 + 2)  # both instances recovered into the same single new epoch
    assert (await read_doc(store.url, db_name, EPOCH_DOC))["epoch"] == 1


async def test_first_start_over_existing_counters_moves_above_them(valkey, store, run_dir, db_name):
    c = redis.Redis.from_url(valkey.url, decode_responses=True)
    try:
        c.set(keys.fence_key(normalize_identity(identity()).lock_key()), "7")  # tokens from an unknown past
    finally:
        c.close()
    async with in_process_server(run_dir, valkey.url, store_url=store.url, store_db=db_name) as s:
        assert (await acquired(s, ttl_ms=1000))["fencing_token"] == EPOCH_1 + 1
        other = await acquired(s, ttl_ms=1000, target_id="fresh.example")
        assert other["fencing_token"] == EPOCH_1 + 1  # the floor applies to identities without a counter too


async def test_without_a_reachable_store_mutations_stay_refused(valkey, run_dir, db_name):
    dead_store = f"http://127.0.0.1:{free_port()}"
    async with in_process_server(run_dir, valkey.url, store_url=dead_store, store_db=db_name,
                                 max_backend_timeout_ms=300) as s:
        r = await s.acquire(ttl_ms=1000)
        assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable"
        assert r.json()["retryable"] is True and r.json()["submitted"] is False
        health = await s.client.get("/healthz")
        assert health.status_code == 503 and "recovering" in health.json()["msg"]
    assert s.server.gate.state != "ready" and s.server.gate.last_error


async def test_without_a_store_a_valkey_restart_fails_closed(own_valkey, run_dir):
    """No store, no durable epoch: the first Valkey is trusted; after a restart (which may have rolled the
    counters back) every mutation is refused, definitely, and no token is issued again."""
    async with in_process_server(run_dir, own_valkey.url, recovery_check_interval_ms=100) as s:
        one = await acquired(s, ttl_ms=1000)
        assert one["fencing_token"] == 1
        assert (await s.client.get("/healthz")).json()["recovery"]["state"] == "ready"
        await save_snapshot(own_valkey, run_dir / "snap.rdb")
        two = await acquired(s, ttl_ms=1000, target_id="other.example")
        await restore_snapshot(own_valkey, run_dir / "snap.rdb")  # lease `two` and its counter are gone
        for _ in range(40):  # well past detection: never a grant, always a definite refusal
            r = await s.acquire(ttl_ms=1000, target_id="other.example", service_instance_id="worker-2")
            assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable", r.text
            assert r.json().get("submitted") is False, r.text
            await asyncio.sleep(0.025)
        assert s.server.gate.state == "failed_closed" and "without a store" in s.server.gate.last_error
        assert (await s.renew(one)).status_code == 503
        health = await s.client.get("/healthz")
        assert health.status_code == 503
    assert two["fencing_token"] == 1


async def test_a_commit_retried_after_a_restore_gets_its_original_result(own_valkey, store, run_dir, db_name):
    """The restore took the commit's idempotency record (and revoked its lease); the store's applied list still
    has the write: the retry gets the original result, replayed (C17), and nothing is written twice."""
    async with in_process_server(run_dir, own_valkey.url, store_url=store.url, store_db=db_name) as s:
        one = await acquired(s, ttl_ms=10_000)
        committed(await s.commit(one, "doc-r", {"append": ["one", 1]}))
        await save_snapshot(own_valkey, run_dir / "snap.rdb")
        rid = uuid.uuid4().hex
        first = committed(await s.commit(one, "doc-r", {"append": ["after", 1]}, request_id=rid))
        committed(await s.commit(one, "doc-r", {"append": ["later", 1]}))  # the document moves on
        await restore_snapshot(own_valkey, run_dir / "snap.rdb")
        await acquire_after_restart(s, ttl_ms=1000, target_id="other.example")  # recovered: one is revoked
        again = await s.commit(one, "doc-r", {"append": ["after", 1]}, request_id=rid)
        assert again.status_code == 200 and again.json().get("replayed") is True, again.text
        assert again.json()["commit"]["rev"] == first["rev"]  # the revision its own write produced
        lost(await s.commit(one, "doc-r", {"append": ["new", 1]}))  # a new commit of the revoked lease: refused
    doc = await read_doc(store.url, db_name, "doc-r")
    assert doc["entries"] == [["one", 1], ["after", 1], ["later", 1]]
