"""lab.client against the real reference server and a real Valkey.

Most tests run the server in process (`httpx.ASGITransport`, lab.server.testing);
one runs `python -m lab.server` as a `LeaseServerProcess` over real HTTP. The
assertions are about results the backend decided: tokens, lease ids, states
and the ok / fail / info split, never timings.
"""

from __future__ import annotations

import asyncio
import contextlib

from lab.client import Identity, LeaseClient, Result, now_ms
from lab.server.testing import demo_principals, in_process_server
from lab.stack.leaseserver import LeaseServerProcess
from lab.stack.process import free_port

from conftest import lease_expired

IDENT = Identity("tenant-a", "program-1", "dns", "example.com", "actor-1", "recon")


@contextlib.asynccontextmanager
async def clients(run_dir, valkey_url, *principals, **settings):
    """An in-process server and one LeaseClient per demo principal named (sharing its ASGI client)."""
    async with in_process_server(run_dir, valkey_url, **settings) as srv:
        yield [LeaseClient("http://lease.test", srv.keys[p], service_instance_id=f"worker-{i}", http=srv.client)
               for i, p in enumerate(principals)]


def assert_ok(r: Result, code: str) -> None:
    assert (r.outcome, r.code) == ("ok", code), (r.code, r.msg)


async def test_round_trip_with_typed_results(valkey, run_dir):
    async with clients(run_dir, valkey.url, "lease-a1") as (c,):
        acq = await c.acquire(IDENT, ttl_ms=10_000, execution_id="exec-1", trace_id="trace-1", metadata={"n": 1})
        assert_ok(acq, "lease_acquired")
        lease = acq.lease
        assert lease.state == "active" and lease.fencing_token == 1 and lease.identity == IDENT
        assert lease.renewed_at_ms == lease.acquired_at_ms and lease.expires_at_ms == lease.acquired_at_ms + 10_000
        assert lease.ttl_ms == 10_000 and lease.owner_principal_id == "lease-a1"
        assert lease.service_instance_id == "worker-0" and lease.execution_id == "exec-1"
        assert lease.metadata == {"n": 1} and lease.lock_key.startswith("starintel:target-lease:v1:")
        assert acq.http_status == 200 and acq.correlation_id

        ren = await c.renew(lease, ttl_ms=20_000)
        assert_ok(ren, "lease_renewed")
        assert ren.lease.lease_id == lease.lease_id and ren.lease.fencing_token == lease.fencing_token
        assert ren.lease.renewed_at_ms >= lease.renewed_at_ms
        assert ren.lease.expires_at_ms == ren.lease.renewed_at_ms + 20_000

        by_id = await c.inspect(lease.lease_id)
        by_identity = await c.inspect(IDENT)
        assert_ok(by_id, "lease_inspected")
        assert by_id.lease.lease_id == by_identity.lease.lease_id == lease.lease_id
        assert by_identity.lease.expires_at_ms == ren.lease.expires_at_ms

        listed = await c.list({"program": "program-1"}, limit=10)
        assert_ok(listed, "lease_listed")
        assert [x.lease_id for x in listed.leases] == [lease.lease_id] and listed.cursor is None

        rel = await c.release(ren.lease)
        assert_ok(rel, "lease_released")
        assert rel.lease.state == "released" and rel.lease.fencing_token == 1
        assert (await c.inspect(lease.lease_id)).lease.state == "released"
        assert (await c.list({"program": "program-1"})).leases == []

        again = await c.acquire(IDENT, ttl_ms=10_000)
        assert_ok(again, "lease_acquired")
        assert again.lease.fencing_token == 2 and again.lease.lease_id != lease.lease_id


async def test_list_pages_with_the_cursor(valkey, run_dir):
    async with clients(run_dir, valkey.url, "lease-a1") as (c,):
        acquired = set()
        for i in range(3):
            r = await c.acquire(Identity("tenant-a", "program-1", "dns", f"host-{i}", "actor-1", "recon"), ttl_ms=10_000)
            acquired.add(r.lease.lease_id)
        first = await c.list(limit=2)
        second = await c.list(limit=2, cursor=first.cursor)
        assert len(first.leases) == 2 and first.cursor and len(second.leases) == 1
        assert {x.lease_id for x in first.leases + second.leases} == acquired


async def test_conflict_is_a_definite_failure(valkey, run_dir):
    async with clients(run_dir, valkey.url, "lease-a1", "lease-a1-peer") as (a, b):
        held = await a.acquire(IDENT, ttl_ms=10_000)
        assert_ok(held, "lease_acquired")
        r = await b.acquire(IDENT, ttl_ms=10_000)
        assert (r.outcome, r.code, r.http_status) == ("fail", "lease_conflict", 409)
        assert r.lease is None and r.retry_after_ms and r.retryable is True
        assert (await a.inspect(IDENT)).lease.fencing_token == held.lease.fencing_token  # nothing changed


async def test_a_lost_lease_cannot_be_renewed_or_released(valkey, run_dir):
    async with clients(run_dir, valkey.url, "lease-a1") as (c,):
        short = (await c.acquire(IDENT, ttl_ms=100)).lease
        await lease_expired(valkey.url, short)
        r = await c.renew(short)
        assert (r.outcome, r.code, r.http_status) == ("fail", "lease_lost", 409)
        assert (await c.release(short)).code == "lease_lost"

        successor = (await c.acquire(IDENT, ttl_ms=10_000)).lease
        assert successor.fencing_token == short.fencing_token + 1
        stale = await c.release(short)  # a stale release never touches the successor (C13)
        assert (stale.outcome, stale.code) == ("fail", "lease_lost")
        assert (await c.inspect(IDENT)).lease.state == "active"


async def test_idempotent_retry_returns_the_same_lease_and_token(valkey, run_dir):
    async with clients(run_dir, valkey.url, "lease-a1") as (c,):
        first = await c.acquire(IDENT, ttl_ms=10_000, request_id="req-1")
        retry = await c.acquire(IDENT, ttl_ms=10_000, request_id="req-1")
        assert_ok(retry, "lease_acquired")
        assert (retry.lease.lease_id, retry.lease.fencing_token) == (first.lease.lease_id, first.lease.fencing_token)
        assert retry.data.get("replayed") is True

        # an acquire whose reply was lost (info) is settled by re-sending its request_id (C19)
        lost = Result("info", "timeout", call=first.call)
        settled = await c.resolve(lost)
        assert settled.lease.lease_id == first.lease.lease_id and settled.lease.fencing_token == 1

        changed = await c.acquire(IDENT, ttl_ms=20_000, request_id="req-1")
        assert (changed.outcome, changed.code) == ("fail", "idempotency_conflict")

        rel = await c.release(first.lease, request_id="rel-1")
        rel_again = await c.release(first.lease, request_id="rel-1")
        assert_ok(rel_again, "lease_released")
        assert rel_again.lease.lease_id == rel.lease.lease_id
        # the replayed acquire now reports the lease's terminal state (C18)
        replay = await c.acquire(IDENT, ttl_ms=10_000, request_id="req-1")
        assert replay.lease.lease_id == first.lease.lease_id and replay.lease.state == "released"


async def test_refusals_before_any_backend_work(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url) as srv:
        bad_key = LeaseClient("http://lease.test", "flk.nobody-k1." + "x" * 43, service_instance_id="w", http=srv.client)
        r = await bad_key.acquire(IDENT, ttl_ms=1000)
        assert (r.outcome, r.code, r.http_status) == ("fail", "invalid_credential", 401)

        other_tenant = LeaseClient("http://lease.test", srv.keys["lease-b1"], service_instance_id="w", http=srv.client)
        r = await other_tenant.acquire(IDENT, ttl_ms=1000)
        assert (r.outcome, r.code, r.http_status) == ("fail", "access_denied", 403)

        c = LeaseClient("http://lease.test", srv.keys["lease-a1"], service_instance_id="w", http=srv.client)
        r = await c.acquire(IDENT, ttl_ms=1)  # below the server's minimum TTL
        assert (r.outcome, r.code, r.http_status) == ("fail", "invalid_lease_request", 400)
        assert "ttl_ms" in r.msg

        # a client clock 10 s behind: the deadline it sends has already passed at the server (408)
        behind = LeaseClient("http://lease.test", srv.keys["lease-a1"], service_instance_id="w", http=srv.client,
                             clock_ms=lambda: now_ms() - 10_000)
        r = await behind.acquire(IDENT, ttl_ms=1000, deadline_s=1.0)
        assert (r.outcome, r.code, r.http_status) == ("fail", "deadline_exceeded", 408)
        assert (await c.inspect(IDENT)).code == "lease_not_found"


async def test_admin_force_release_and_revoke(valkey, run_dir):
    async with clients(run_dir, valkey.url, "lease-a1", "force-a") as (worker, admin):
        lease = (await worker.acquire(IDENT, ttl_ms=10_000)).lease
        denied = await worker.force_release(lease, "not mine to force")
        assert (denied.outcome, denied.code) == ("fail", "access_denied")
        forced = await admin.force_release(lease, "stuck worker")
        assert_ok(forced, "lease_released")
        assert (await worker.renew(lease)).code == "lease_lost"

        lease2 = (await worker.acquire(IDENT, ttl_ms=10_000)).lease
        revoked = await admin.revoke(lease2, "compromised host", incident_id="INC-7")
        assert_ok(revoked, "lease_revoked")
        assert revoked.lease.state == "revoked" and revoked.lease.fencing_token == lease2.fencing_token
        assert (await worker.release(lease2)).code == "lease_lost"


async def test_acquire_waits_for_the_holder_within_wait_ms(valkey, run_dir):
    async with clients(run_dir, valkey.url, "lease-a1", "lease-a1-peer") as (a, b):
        first = (await a.acquire(IDENT, ttl_ms=150)).lease
        r = await b.acquire(IDENT, ttl_ms=1000, wait_ms=3000, deadline_s=4.0)
        assert_ok(r, "lease_acquired")
        assert r.lease.fencing_token == first.fencing_token + 1


async def test_backend_unavailable_is_never_a_success(run_dir):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    async with clients(run_dir, dead, "lease-a1", valkey_connect_timeout_ms=200) as (c,):
        r = await c.acquire(IDENT, ttl_ms=1000, deadline_s=2.0)
    assert (r.code, r.http_status) == ("lease_backend_unavailable", 503)
    # definite only if the server says nothing was submitted (see lab.client.results)
    assert r.outcome == ("fail" if r.data.get("submitted") is False else "info")


async def test_over_real_http_with_a_server_process(valkey, run_dir):
    principals, keys = demo_principals(run_dir)
    server = LeaseServerProcess(run_dir, valkey_url=valkey.url, principals_file=principals, name="lease-client-test")
    server.start()
    try:
        async with LeaseClient(server.url, keys["lease-a1"], service_instance_id="w1") as a, \
                LeaseClient(server.url, keys["lease-a1-peer"], service_instance_id="w2") as b:
            results = await asyncio.gather(*(c.acquire(IDENT, ttl_ms=10_000) for c in (a, b, a, b)))
            winners = [r for r in results if r.ok]
            assert len(winners) == 1 and winners[0].lease.fencing_token == 1  # one winner, one token (C11)
            assert {r.code for r in results if not r.ok} == {"lease_conflict"}
            assert all(r.outcome == "fail" for r in results if not r.ok)
            owner = a if winners[0].lease.owner_principal_id == "lease-a1" else b
            assert_ok(await owner.renew(winners[0].lease), "lease_renewed")
            assert_ok(await owner.release(winners[0].lease), "lease_released")
            url = server.url
        server.stop()
        async with LeaseClient(url, keys["lease-a1"], service_instance_id="w1") as a:
            r = await a.acquire(IDENT, ttl_ms=10_000, deadline_s=2.0)
        assert (r.outcome, r.code) == ("fail", "connect_error")  # nothing was sent
    finally:
        server.stop()


async def test_unknown_outcome_is_indeterminate_and_settled_by_request_id(run_dir):
    from lab.stack.valkey import ValkeyProcess

    valkey = ValkeyProcess(run_dir, name="valkey-paused").start()
    try:
        async with clients(run_dir, valkey.url, "lease-a1") as (c,):
            warm = await c.acquire(Identity("tenant-a", "program-1", "dns", "warm-up", "actor-1", "recon"), ttl_ms=10_000)
            assert_ok(warm, "lease_acquired")  # scripts loaded, a pooled connection is open
            valkey.pause()
            try:
                r = await c.acquire(IDENT, ttl_ms=10_000, deadline_s=0.5)
            finally:
                valkey.resume()
            # the EVALSHA was written to Valkey before the deadline: it may have run
            assert r.outcome == "info" and r.code in ("timeout", "lease_outcome_unknown")
            settled = await c.resolve(r, deadline_s=5.0, attempts=3)
            assert_ok(settled, "lease_acquired")
            assert settled.lease.request_id == r.call.request_id and settled.lease.fencing_token == 1
            assert (await c.inspect(IDENT)).lease.lease_id == settled.lease.lease_id
    finally:
        valkey.stop()
