"""Valkey durability faults: crash-and-recover and restore-from-snapshot, on real Valkey and lease servers.

Both faults can roll every fencing counter back, which contract rule C5 and
the restore row of the races table forbid. These tests show the lab produces
that regression for real: through the reference lease server with its recovery
rule switched off (the `counter-from-snapshot` planted bug) the same fencing
token is issued twice; with the rule and a store the next token is above every
earlier one; with the rule and no store (no durable epoch) the server fails
closed after the restart instead of re-issuing a token.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
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
# before it) keeps its epoch in the store; `recovery: off` (the counter-from-snapshot mutant) trusts the
# restored counters.
@pytest.mark.parametrize("recovery_rule", [False, True])
async def test_restore_from_an_older_snapshot_reissues_a_fencing_token(make_stack, recovery_rule):
    stack = make_stack(servers=1, store=True, persistence="always",
                       mutant="" if recovery_rule else "counter-from-snapshot")
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


async def test_valkey_crash_without_persistence_and_store_fails_closed(make_stack):
    """No persistence: the crash loses every counter. Without a store there is no durable epoch to move
    to, so the server must refuse (a definite 503) rather than issue token 1 again."""
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
        b = await acquire_when_free(w2, ident, ttl_ms=1000, timeout_s=3.0)
        assert b.outcome == "fail" and b.code == "lease_backend_unavailable", b  # refused, never token 1 again
        async with httpx.AsyncClient() as http:
            health = await http.get(stack.process("lease-1").url + "/healthz")
        assert health.status_code == 503 and "recovering" in health.json()["msg"], health.text
        assert "mutations stay refused until an operator restarts" in stack.process("lease-1").log_path.read_text()
    await nem.teardown(None)


async def test_valkey_crash_without_persistence_reissues_a_token_without_the_recovery_rule(make_stack):
    stack = make_stack(servers=1, store=False, persistence="none", mutant="counter-from-snapshot")
    nem = valkey_crash(stack.process("valkey"))
    await nem.setup(None)
    ident = identity_for("k-crash")
    async with holder_client(stack, "w-1") as w1, holder_client(stack, "w-2") as w2:
        a = await w1.acquire(ident, ttl_ms=1000)
        assert a.outcome == "ok", a
        await nem.invoke(None, op("start-valkey-crash"))
        back = await nem.invoke(None, op("stop-valkey-crash"))
        assert back["value"]["keys_after"] == 0
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


# -- what mutual-exclusion makes of a Valkey loss (the contract's restore row: "a higher epoch and all
# restored leases invalid"): synthetic histories, each rule proven both ways ----------------------------
def _loss_history(loss: dict | None, *, new_token: int = 2 << 32, old_success_after: bool = False):
    from test_checker_core import LeaseHistory

    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)  # valid until 10 s of backend time
    if loss is not None:
        h.nemesis(loss["f"], None)
        h.nemesis(loss["f"], loss["value"])
    if old_success_after:
        h.renew(0, "L1", 1, at=0, renewed=200, exp=10_200)
    h.acquire(1, "L2", new_token, at=300, ttl=1000)
    return h.ops


CRASH = {"f": "start-valkey-crash", "value": {"fault": "valkey-crash", "phase": "start", "target": "valkey"}}
RESTORE = {"f": "stop-valkey-restore", "value": {"fault": "valkey-restore", "phase": "end", "restored": True}}
KILL_VALKEY = {"f": "start-kill", "value": {"fault": "kill", "phase": "start", "targets": ["valkey"]}}


@pytest.mark.parametrize("loss", [CRASH, RESTORE, KILL_VALKEY], ids=["crash", "restore", "kill-valkey"])
def test_a_lease_invalidated_by_a_valkey_loss_is_no_overlap(loss):
    from test_checker_core import run

    res = run("mutual-exclusion", _loss_history(loss))
    assert res["valid"] is True, res["violations"]
    assert res["valkey_losses"] == 1 and res["overlaps_after_valkey_loss"] == 1


@pytest.mark.parametrize("case", ["no-loss", "server-killed", "restore-discarded", "old-lease-used-after",
                                  "token-not-higher"])
def test_an_overlap_the_loss_does_not_explain_is_still_a_violation(case):
    from test_checker_core import kinds, run

    loss = {"no-loss": None,
            "server-killed": {"f": "start-kill", "value": {"fault": "kill", "phase": "start", "targets": ["lease-1"]}},
            "restore-discarded": {"f": "stop-valkey-restore",
                                  "value": {"fault": "valkey-restore", "phase": "end", "restored": False}},
            }.get(case, CRASH)
    ops = _loss_history(loss, old_success_after=case == "old-lease-used-after",
                        new_token=1 if case == "token-not-higher" else 2 << 32)
    res = run("mutual-exclusion", ops)
    assert kinds(res) == ["overlap"], res


def test_an_acquisition_that_completes_while_the_restore_op_finishes_is_after_the_loss():
    """The restarted Valkey serves before the nemesis op returns: an acquire invoked during the restore op and
    completed after it began runs on the new incarnation (here, a token of the next epoch)."""
    from test_checker_core import LeaseHistory, run

    h = LeaseHistory()
    h.acquire(0, "L1", 1, at=0, ttl=10_000)
    h.nemesis(RESTORE["f"], None)  # the restore begins
    h.invoke(1, "acquire", {"request_id": h.rid(), "ttl_ms": 1000})
    h.complete("ok", 1, "acquire", h.lease("L2", 2 << 32, at=300))
    h.nemesis(RESTORE["f"], RESTORE["value"])  # ... and completes after the acquisition did
    res = run("mutual-exclusion", h.ops)
    assert res["valid"] is True and res["overlaps_after_valkey_loss"] == 1, res["violations"]
