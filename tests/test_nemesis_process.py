"""Process faults against real processes: kill/restart and pause/resume of lease servers, Valkey, the store.

Each fault is shown on real traffic (a request to a killed or paused server
fails; after the stop op it succeeds), Valkey's persistence modes are shown
keeping exactly what they promise across a SIGKILL, and the heal is shown to
leave nothing stopped or dead. The client-pause gate is shown holding and
releasing an asyncio client.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import redis

from lab.client import LeaseClient
from lab.stack.valkey import ValkeyProcess
from nemesis.core import compose
from nemesis.process_faults import (
    ClientPauses,
    ProcessHealError,
    client_pause,
    heal_processes,
    is_stopped,
    kill,
    pause,
    stack_targets,
)
from workloads.common import identity_for, pick_credential
from nemesis.core import invocation as op


def lease_api(stack, server="lease-1", timeout_s=2.0):
    """A LeaseClient for the stack's lease principal against one server."""
    cred = pick_credential(json.loads(stack.credentials_file.read_text()))
    return LeaseClient(stack.process(server).url, cred["api_key"], service_instance_id="w-1", timeout_s=timeout_s)


def healthz(url):
    """GET /healthz's status code."""
    return httpx.get(url + "/healthz", timeout=2.0).status_code


# -- kill ----------------------------------------------------------------------------------
async def test_killed_lease_server_refuses_requests_and_serves_again_after_restart(make_stack):
    stack = make_stack(servers=1, store=False)
    nem = kill(stack_targets(stack), rng=7, targets=["lease-1"])
    assert nem.fs == {"start-kill", "stop-kill"}
    await nem.setup(None)
    srv = stack.process("lease-1")
    old_pid = srv.pid
    async with lease_api(stack) as api:
        assert (await api.acquire(identity_for("k1"), ttl_ms=5000)).outcome == "ok"
        started = await nem.invoke(None, op("start-kill"))
        v = started["value"]
        assert started["type"] == "info" and started["process"] == "nemesis" and started["f"] == "start-kill"
        assert v == {"fault": "kill", "phase": "start", "targets": ["lease-1"], "signal": "SIGKILL",
                     "killed": {"lease-1": {"pid": old_pid}}, "restart_after_s": None}
        assert not srv.alive()
        down = await api.acquire(identity_for("k2"), ttl_ms=5000)
        assert (down.outcome, down.code) == ("fail", "connect_error"), "nothing listens on a killed server"
        stopped = await nem.invoke(None, op("stop-kill"))
        r = stopped["value"]["restarted"]["lease-1"]
        assert stopped["value"]["phase"] == "end" and "error" not in stopped
        assert r["ready"] and r["by"] == "stop" and r["pid"] == srv.pid != old_pid
        assert healthz(srv.url) == 200
        up = await api.acquire(identity_for("k2"), ttl_ms=5000)
        assert up.outcome == "ok", up
    again = await nem.invoke(None, op("stop-kill"))
    assert again["value"] == {"fault": "kill", "phase": "none", "restarted": {}}
    await nem.teardown(None)


@pytest.mark.parametrize("persistence", ["none", "everysec", "always"])
async def test_valkey_kill_keeps_what_its_persistence_promises(tmp_path, persistence):
    v = ValkeyProcess(tmp_path, persistence=persistence).start()
    try:
        nem = kill({"valkey": v}, rng=1)
        await nem.setup(None)
        c = redis.Redis.from_url(v.url)
        acked = sum(1 for _ in range(300) if c.incr("ctr"))
        if persistence == "everysec":
            # a SIGKILL loses only what Valkey has not yet written to the AOF (the kernel keeps the rest):
            # wait until its AOF buffer is empty and no fsync is queued
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                info = c.info("persistence")
                if info["aof_buffer_length"] == 0 and info["aof_pending_bio_fsync"] == 0:
                    break
                time.sleep(0.01)
        c.close()
        started = await nem.invoke(None, op("start-kill"))
        assert started["value"]["killed"]["valkey"]["persistence"] == persistence
        stopped = await nem.invoke(None, op("stop-kill"))
        assert stopped["value"]["restarted"]["valkey"]["ready"]
        c = redis.Redis.from_url(v.url)
        got = c.get("ctr")
        c.close()
        if persistence == "none":
            assert got is None, "without persistence a crash loses everything"
        else:
            assert int(got) == acked == 300, "every acknowledged INCR survives the crash"
        await nem.teardown(None)
    finally:
        v.stop()


async def test_timed_restart_brings_the_target_back_before_the_stop(tmp_path):
    v = ValkeyProcess(tmp_path).start()
    try:
        nem = kill({"valkey": v}, rng=1, restart_after_s=0.2)
        await nem.setup(None)
        started = await nem.invoke(None, op("start-kill"))
        assert started["value"]["restart_after_s"] == 0.2 and not v.alive()
        deadline = time.monotonic() + 10
        while not v.healthy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert v.healthy(), "the timer restarted Valkey"
        stopped = await nem.invoke(None, op("stop-kill"))
        assert stopped["value"]["restarted"]["valkey"]["by"] == "timer"
        assert stopped["value"]["restarted"]["valkey"]["after_s"] == 0.2
        await nem.teardown(None)
    finally:
        v.stop()


def test_a_restarted_process_survives_the_event_loop_that_restarted_it(tmp_path):
    """A run's processes die with the thread that forked them (PR_SET_PDEATHSIG): restarts must not use a worker thread."""
    v = ValkeyProcess(tmp_path)
    v.die_with_parent = True
    v.start()
    try:
        async def crash_and_restart():
            nem = kill({"valkey": v}, rng=1)
            await nem.invoke(None, op("start-kill"))
            return await nem.invoke(None, op("stop-kill"))

        stopped = asyncio.run(crash_and_restart())  # the loop's worker threads are gone when this returns
        assert stopped["value"]["restarted"]["valkey"]["ready"]
        time.sleep(0.2)
        assert v.alive() and v.healthy(), "the restarted Valkey must outlive the loop's worker threads"
    finally:
        v.stop()


# -- pause -----------------------------------------------------------------------------------
async def test_paused_lease_server_answers_nothing_until_resumed(make_stack):
    stack = make_stack(servers=1, store=False)
    srv = stack.process("lease-1")
    nem = pause(stack_targets(stack), rng=3, targets=["lease-1"])
    await nem.setup(None)
    async with lease_api(stack, timeout_s=0.5) as api:
        started = await nem.invoke(None, op("start-pause"))
        assert started["value"] == {"fault": "pause", "phase": "start", "targets": ["lease-1"], "signal": "SIGSTOP",
                                    "paused": {"lease-1": {"pid": srv.pid, "stopped": True}}}
        assert srv.alive() and is_stopped(srv)
        r = await api.acquire(identity_for("k1"), ttl_ms=5000)
        assert r.outcome == "info" and r.code == "timeout", "the request was sent and never answered"
        busy = await nem.invoke(None, op("start-pause"))
        assert busy["value"]["phase"] == "none" and "already active" in busy["error"]
        stopped = await nem.invoke(None, op("stop-pause"))
        assert stopped["value"] == {"fault": "pause", "phase": "end",
                                    "resumed": {"lease-1": {"pid": srv.pid, "signal": "SIGCONT"}}}
        assert not is_stopped(srv)
        api.timeout_s = 5.0
        assert (await api.acquire(identity_for("k2"), ttl_ms=5000)).outcome == "ok"
    await nem.teardown(None)


async def test_heal_restarts_and_resumes_every_target(make_stack):
    stack = make_stack(servers=2, store=True)
    targets = stack_targets(stack)
    assert list(targets) == ["valkey", "store", "lease-1", "lease-2"], "backends first"
    killer = kill(targets, rng=1)
    pauser = pause(targets, rng=2)
    nem = compose([killer, pauser])
    await nem.setup(None)
    killed = await nem.invoke(None, op("start-kill", {"targets": ["lease-1", "store", "valkey"]}))
    assert sorted(killed["value"]["killed"]) == ["lease-1", "store", "valkey"]
    paused = await nem.invoke(None, op("start-pause", {"targets": ["lease-2"]}))
    assert paused["value"]["paused"]["lease-2"]["stopped"]
    await nem.teardown(None)  # no stop ops: the heal alone must bring everything back
    for name, proc in targets.items():
        assert proc.alive() and not is_stopped(proc), f"{name} left dead or paused"
    for n in ("lease-1", "lease-2"):
        assert healthz(stack.process(n).url) == 200, f"{n} serves (and reaches Valkey) after the heal"


async def test_heal_reports_a_process_it_cannot_bring_back(tmp_path):
    v = ValkeyProcess(tmp_path).start()
    try:
        v.kill()
        v.argv = v.argv + ["--no-such-option", "x"]  # the restart exits at once
        with pytest.raises(ProcessHealError, match="valkey is not running"):
            await heal_processes({"valkey": v}, timeout_s=2)
    finally:
        v.stop()


def test_process_nemeses_validate_their_parameters(tmp_path):
    v = ValkeyProcess(tmp_path)
    with pytest.raises(ValueError, match="processes must be a non-empty mapping"):
        kill({}, rng=1)
    with pytest.raises(ValueError, match=r"targets: unknown targets \['lease-9'\]"):
        kill({"valkey": v}, rng=1, targets=["lease-9"])
    with pytest.raises(ValueError, match="restart_after_s must be a number of seconds"):
        kill({"valkey": v}, rng=1, restart_after_s=0)
    with pytest.raises(ValueError, match="rng must be a random.Random or an int seed"):
        pause({"valkey": v}, rng="x")
    nem = kill({"valkey": v}, rng=1)
    with pytest.raises(ValueError, match="unknown value key"):
        asyncio.run(nem.invoke(None, op("start-kill", {"target": "valkey"})))
    with pytest.raises(ValueError, match="does not handle f 'start-pause'"):
        asyncio.run(nem.invoke(None, op("start-pause")))


# -- client pauses -------------------------------------------------------------------------
async def test_client_pause_holds_a_client_at_its_gate_until_the_stop():
    pauses = ClientPauses(concurrency=3)
    nem = client_pause(pauses, rng=5)
    await nem.setup(None)
    started = await nem.invoke(None, op("start-client-pause", {"thread": 1}))
    assert started["value"] == {"fault": "client-pause", "phase": "start", "target": "client-1", "thread": 1,
                                "duration_s": None, "max_duration_s": 60.0}
    assert pauses.is_paused(4) and not pauses.is_paused(0), "process 4 runs on thread 4 mod 3 = 1"
    await asyncio.wait_for(pauses.wait(0), 1)  # another thread passes its gate at once
    held = asyncio.create_task(pauses.wait(4))
    await asyncio.sleep(0.05)
    assert not held.done(), "the paused thread's client stays at its gate"
    stopped = await nem.invoke(None, op("stop-client-pause"))
    assert stopped["value"] == {"fault": "client-pause", "phase": "end", "target": "client-1", "thread": 1,
                                "resumed_by": "stop"}
    await asyncio.wait_for(held, 1)
    await nem.teardown(None)


async def test_client_pause_ends_by_itself_after_its_duration_and_teardown_opens_every_gate():
    pauses = ClientPauses(concurrency=2)
    nem = client_pause(pauses, rng=5, duration_s=0.1)
    started = await nem.invoke(None, op("start-client-pause"))
    thread = started["value"]["thread"]
    await asyncio.wait_for(pauses.wait(thread), 2)  # released by the duration timer
    stopped = await nem.invoke(None, op("stop-client-pause"))
    assert stopped["value"]["phase"] == "end" and stopped["value"]["resumed_by"] == "timer"
    await nem.invoke(None, op("start-client-pause", {"thread": 0, "duration_s": 30}))
    waiter = asyncio.create_task(pauses.wait(2))
    await nem.teardown(None)
    await asyncio.wait_for(waiter, 1)
    assert pauses.paused == []


async def test_a_pause_armed_for_a_holder_closes_the_gate_of_the_first_thread_to_act_on_a_held_lease():
    # Kleppmann's paused holder: a pause drawn at a random moment may meet a thread waiting in an acquire, which
    # makes no stale holder; armed, it waits for a request on a held lease and stops that thread before it goes
    pauses = ClientPauses(concurrency=2)
    nem = client_pause(pauses, rng=5, duration_s=30)
    start = asyncio.create_task(nem.invoke(None, op("start-client-pause", {"holding": True})))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(pauses.wait(0), 1)  # an acquire (not holding) passes its gate
    await asyncio.wait_for(pauses.wait(1, holding=False), 1)
    assert not start.done() and pauses.paused == [], "nothing is paused until a holder acts"
    held = asyncio.create_task(pauses.wait(3, holding=True))  # process 3 is thread 1, about to commit
    started = await asyncio.wait_for(start, 1)
    assert started["value"]["phase"] == "start" and started["value"]["thread"] == 1
    assert started["value"]["holding"] is True and started["value"]["armed"] == [0, 1]
    await asyncio.sleep(0.05)
    assert not held.done(), "the holder is stopped before its request is sent"
    await asyncio.wait_for(pauses.wait(0, holding=True), 1)  # disarmed once it fired: thread 0 goes on
    stopped = await nem.invoke(None, op("stop-client-pause"))
    assert stopped["value"]["resumed_by"] == "stop"
    await asyncio.wait_for(held, 1)
    await nem.teardown(None)


async def test_a_pause_armed_for_a_holder_that_none_meets_says_so_and_pauses_nobody():
    pauses = ClientPauses(concurrency=3)
    nem = client_pause(pauses, rng=5)
    done = await nem.invoke(None, op("start-client-pause", {"holding": True, "thread": 2, "wait_s": 0.1}))
    assert done["value"]["phase"] == "none" and done["value"]["armed"] == [2]
    assert "no client thread of [2] sent a request on a lease it holds within 0.1 s" in done["error"]
    await asyncio.wait_for(pauses.wait(2, holding=True), 1)  # disarmed: a later holder is not paused
    assert pauses.paused == []
    # only the armed thread is paused: thread 0 acting as a holder is not
    start = asyncio.create_task(nem.invoke(None, op("start-client-pause", {"holding": True, "thread": 2})))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(pauses.wait(0, holding=True), 1)
    assert not start.done()
    held = asyncio.create_task(pauses.wait(5, holding=True))
    assert (await asyncio.wait_for(start, 1))["value"]["thread"] == 2
    await nem.teardown(None)
    await asyncio.wait_for(held, 1)
    with pytest.raises(ValueError, match="holding must be true or false"):
        await nem.invoke(None, op("start-client-pause", {"holding": "yes"}))


def test_an_armed_pause_replays_armed_on_the_threads_it_was():
    from nemesis.process_faults import client_pause_replay
    rec = {"fault": "client-pause", "phase": "start", "thread": 1, "duration_s": 2.5, "holding": True,
           "armed": [0, 1, 2]}
    assert client_pause_replay(rec) == {"holding": True, "duration_s": 2.5}
    assert client_pause_replay({**rec, "armed": [1]}) == {"holding": True, "duration_s": 2.5, "thread": 1}
    assert client_pause_replay({"thread": 1, "duration_s": None}) == {"thread": 1, "duration_s": None}


def test_client_pauses_validate():
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        ClientPauses(0)
    pauses = ClientPauses(2)
    with pytest.raises(ValueError, match="client process is an int >= 0"):
        asyncio.run(pauses.wait("nemesis"))
    with pytest.raises(ValueError, match=r"client thread must be an int in \[0, 2\)"):
        pauses.pause(2)
    with pytest.raises(ValueError, match="duration_s must be a number of seconds"):
        client_pause(pauses, rng=1, duration_s=120, max_duration_s=60)
    with pytest.raises(ValueError, match="thread must be one of"):
        asyncio.run(client_pause(pauses, rng=1).invoke(None, op("start-client-pause", {"thread": 5})))


async def test_kill_and_pause_record_who_leads_when_the_system_can_say(tmp_path):
    # issue 18 item 8: a process fault on a system with a leader records the leader at its start (before the
    # fault) and at its stop (after the heal); a probe that fails is said, and the fault still happens
    v = ValkeyProcess(tmp_path).start()
    leads = iter(["valkey", None])

    def probe():
        return next(leads)

    def broken():
        raise OSError("status port closed")

    try:
        for make, start, stop, before, after in ((kill, "start-kill", "stop-kill", "valkey", None),
                                                  (pause, "start-pause", "stop-pause", None, None)):
            nem = make({"valkey": v}, rng=1, leader=probe if make is kill else broken)
            started = await nem.invoke(None, op(start))
            assert started["value"]["phase"] == "start" and started["value"]["leader"] == before
            stopped = await nem.invoke(None, op(stop))
            assert stopped["value"]["phase"] == "end" and stopped["value"]["leader"] == after
            if make is pause:
                assert started["value"]["leader_error"] == "OSError: status port closed"
            await nem.teardown(None)
        unled = await kill({"valkey": v}, rng=1).invoke(None, op("start-kill"))
        assert "leader" not in unled["value"], "a system that names no leader gets no leader field"
    finally:
        v.stop()


def test_the_registry_gives_kill_and_pause_the_stacks_leader_probe(tmp_path):
    from types import SimpleNamespace

    from nemesis.registry import FaultContext, NEMESES

    probe = lambda: "etcd-2"  # noqa: E731
    proc = ValkeyProcess(tmp_path)  # never started: the builders only collect the targets
    for stack, expected in ((SimpleNamespace(processes=[proc], leader_probe=lambda: probe), probe),
                            (SimpleNamespace(processes=[proc]), None)):
        ctx = FaultContext(test=None, stack=stack, seed=1, client_clocks=None, client_pauses=None)
        for name in ("kill", "pause"):
            assert NEMESES[name].build(ctx, [name]).leader is expected
