"""The two 503s of section 9, C19 and C23, with a dedicated Valkey per test that the test stops or pauses.

- lease_backend_unavailable: Valkey is stopped; nothing is assumed, and the
  server recovers (reloading its scripts) when Valkey comes back.
- lease_outcome_unknown: Valkey is paused (SIGSTOP) after the request was
  written; the retry by request_id settles it (C19), and a renewal whose reply
  misses the deadline grants nothing (C23).
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from lab.server import backend as keys
from lab.server.identity import normalize_identity
from lab.server.testing import body, identity, in_process_server
from lab.stack.valkey import ValkeyProcess

from conftest import until

P = "/api/v1/target-leases"


@pytest.fixture
def own_valkey(run_dir):
    v = ValkeyProcess(run_dir, name="valkey-own").start()
    try:
        yield v
    finally:
        if v.alive():
            v.resume()
        v.stop()


def counter_value(v: ValkeyProcess, **changes) -> str | None:
    c = redis.Redis.from_url(v.url, decode_responses=True)
    try:
        return c.get(keys.fence_key(normalize_identity(identity(**changes)).lock_key()))
    finally:
        c.close()


async def test_503_backend_unavailable_when_valkey_is_down_and_recovery(own_valkey, run_dir):
    async with in_process_server(run_dir, own_valkey.url) as s:
        assert (await s.acquire(target_id="warm")).status_code == 200
        own_valkey.stop()
        # Wait until the server has seen the closed connection (its health check fails). (A request
        # racing the crash itself would rightly get lease_outcome_unknown: Valkey might have executed it.)
        async def valkey_gone() -> bool:
            return not await s.server.backend.ping(asyncio.get_running_loop().time() + 0.5)

        await until(valkey_gone, what="the server to see Valkey gone")
        for r in (await s.acquire(), await s.client.get(P, headers=s.headers("lease-a1")),
                  await s.client.get("/healthz")):
            assert r.status_code == 503, r.text
            b = r.json()
            assert b["code"] == "lease_backend_unavailable" and b["retryable"] is True
            assert "Connection" not in b["msg"] and "127.0.0.1" not in r.text  # no backend detail
        own_valkey.start()  # empty (no persistence): every counter is gone
        # no store, so no durable epoch to move above the lost counters: fail closed (recovery.py), a
        # definite refusal, never a token issued again (the "warm" identity's counter restarted at 0)
        for _ in range(20):
            r = await s.acquire(target_id="warm", service_instance_id="worker-2")
            assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable", r.text
            assert r.json()["submitted"] is False, r.text
            await asyncio.sleep(0.05)
        assert s.server.gate.state == "failed_closed"
        assert (await s.client.get("/healthz")).status_code == 503


async def test_503_outcome_unknown_when_valkey_stalls_after_submission(own_valkey, run_dir):
    async with in_process_server(run_dir, own_valkey.url) as s:
        assert (await s.acquire(target_id="warm")).status_code == 200  # a pooled, connected connection
        b = body(deadline_in_ms=300)
        own_valkey.pause()
        try:
            r = await s.client.post(P + "/acquire", json=b, headers=s.headers("lease-a1"))
        finally:
            own_valkey.resume()
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "lease_outcome_unknown" and r.json()["retryable"] is True
        # C19: the retry by request_id settles it, and the lease exists exactly once
        retry = await s.client.post(P + "/acquire", json={**b, "deadline_at": body()["deadline_at"]},
                                    headers=s.headers("lease-a1"))
        assert retry.status_code == 200 and retry.json()["code"] == "lease_acquired"
        assert retry.json()["lease"]["fencing_token"] == 1
        assert counter_value(own_valkey) == "1"
        # the connection that timed out was dropped, not reused: later answers match their requests
        for i in range(5):
            r = await s.acquire(target_id=f"after-{i}")
            assert r.json()["lease"]["target_id"] == f"after-{i}"


async def test_c23_a_late_renewal_reply_grants_nothing(own_valkey, run_dir):
    async with in_process_server(run_dir, own_valkey.url) as s:
        lease = (await s.acquire(ttl_ms=5000)).json()["lease"]
        own_valkey.pause()
        try:
            r = await s.renew(lease, deadline_at=body()["deadline_at"] - 4800)
        finally:
            own_valkey.resume()
        assert r.status_code == 503 and r.json()["code"] == "lease_outcome_unknown"
        assert "lease" not in r.json()


async def test_c23_not_started_before_the_deadline_is_deadline_exceeded(own_valkey, run_dir):
    async with in_process_server(run_dir, own_valkey.url) as s:
        own_valkey.stop()  # the server's pooled connection dies with it ...
        own_valkey.start()
        # until the event loop has read the EOF on the pooled connection (checked at checkout)
        await until(lambda: all(c._reader is None or c._reader.at_eof() for c in s.server.backend._idle),
                    what="the pooled connection to read EOF")
        own_valkey.pause()  # ... so the new connection's handshake cannot finish: nothing was submitted
        try:
            r = await s.acquire(deadline_in_ms=300)
        finally:
            own_valkey.resume()
        assert r.status_code == 408 and r.json()["code"] == "deadline_exceeded"
        assert counter_value(own_valkey) is None
        r = await s.acquire()  # Valkey restarted and there is no store: failed closed (recovery.py), definitely
        assert r.status_code == 503 and r.json()["submitted"] is False, r.text
