"""One test (or a few) per contract rule C4-C23, against the in-process server and a real Valkey.

Each test is named after the rule it covers. Expiry tests use TTLs of a few
hundred milliseconds and sleep just past them.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from lab.server import backend as keys
from lab.server.audit import event_from_stream
from lab.server.identity import normalize_identity
from lab.server.testing import CommandCounter, body, command_delta, identity, in_process_server
from lab.server.wire import now_ms

from conftest import lease_expired, until_backend_time

P = "/api/v1/target-leases"


@pytest.fixture
async def srv(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url, min_ttl_ms=50) as s:
        yield s


@pytest.fixture
def vk(valkey):
    c = redis.Redis.from_url(valkey.url, decode_responses=True)
    yield c
    c.close()


def lock_key(**changes) -> str:
    return normalize_identity(identity(**changes)).lock_key()


async def acquired(srv, principal="lease-a1", **fields) -> dict:
    r = await srv.acquire(principal, **fields)
    assert r.status_code == 200, r.text
    return r.json()["lease"]


# -- C4: the stored tuple is compared on every read ------------------------------------------

async def test_c4_tampered_identity_fails_closed(srv, vk):
    lease = await acquired(srv)
    k = lock_key()
    stored = json.loads(vk.hget(k, "identity"))
    stored[5] = "other-workflow"
    vk.hset(k, "identity", json.dumps(stored, separators=(",", ":")))
    counter = vk.get(keys.fence_key(k))
    for r in (await srv.renew(lease), await srv.release(lease), await srv.acquire(request_id="fresh"),
              await srv.client.get(P, params=identity(), headers=srv.headers("lease-a1"))):
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "lease_backend_unavailable" and r.json()["retryable"] is False
        assert "other-workflow" not in r.text and k not in r.text
    assert vk.get(keys.fence_key(k)) == counter  # no acquisition over ambiguity


async def test_c4_malformed_record_fails_closed(srv, vk):
    lease = await acquired(srv)
    vk.hset(lock_key(), "fencing_token", "not-a-number")
    r = await srv.renew(lease)
    assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable"
    vk.delete(lock_key())
    vk.set(lock_key(), "a string where a hash belongs")
    r = await srv.acquire()
    assert r.status_code == 503 and r.json()["retryable"] is False


async def test_c4_lease_id_inspect_rederives_the_key(srv, vk):
    lease = await acquired(srv)
    vk.hset(keys.lease_index_key(lease["lease_id"]), "i", json.dumps(list(identity(workflow_name="x").values()),
                                                                     separators=(",", ":")))
    r = await srv.inspect(lease["lease_id"])
    assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable"


# -- C5: a durable counter per identity --------------------------------------------------------

async def test_c5_counter_survives_release_expiry_and_revoke(srv, vk):
    k = lock_key()
    tokens = []
    lease = await acquired(srv)
    tokens.append(lease["fencing_token"])
    assert (await srv.release(lease)).status_code == 200
    lease = await acquired(srv, ttl_ms=60)
    tokens.append(lease["fencing_token"])
    await lease_expired(srv, lease)
    lease = await acquired(srv)
    tokens.append(lease["fencing_token"])
    assert (await srv.admin("revoke", lease)).status_code == 200
    vk.delete(k)  # even a deleted record leaves the counter
    lease = await acquired(srv)
    tokens.append(lease["fencing_token"])
    assert tokens == [1, 2, 3, 4]
    assert vk.get(keys.fence_key(k)) == "4"
    assert vk.pttl(keys.fence_key(k)) == -1  # never a TTL


async def _limit_refuses(srv, vk, limit: int, words: str) -> None:
    """The counter one below `limit`: one acquisition gets `limit`, the next is refused; nothing wraps."""
    k = lock_key()
    vk.set(keys.fence_key(k), str(limit - 1))
    lease = await acquired(srv)
    assert lease["fencing_token"] == limit
    assert (await srv.release(lease)).status_code == 200
    r = await srv.acquire()
    assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable"
    assert r.json()["retryable"] is False and words in r.json()["msg"]
    assert vk.get(keys.fence_key(k)) == str(limit)
    assert vk.exists(k) == 0


async def test_c5_counter_near_its_limit_refuses_and_never_wraps(valkey, vk, run_dir):
    """The server's numeric limit (`fence_max`; at most 2^53 - 1, JSON-safe), below the recovery epoch's end."""
    async with in_process_server(run_dir, valkey.url, min_ttl_ms=50, fence_max=2**20) as srv:
        await _limit_refuses(srv, vk, 2**20, "limit")


async def test_c5_counter_at_the_end_of_its_recovery_epoch_refuses_and_never_wraps(srv, vk):
    """The recovery rule's epoch e issues tokens up to (e + 1) * 2^32 - 1 (docs/server.md); past it: refused."""
    await _limit_refuses(srv, vk, 2**32 - 1, "recovery epoch")


async def test_c5_corrupt_counter_fails_closed(srv, vk):
    vk.set(keys.fence_key(lock_key()), "-5")
    r = await srv.acquire()
    assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable"
    assert vk.exists(lock_key()) == 0


# -- C6, C7: the record ---------------------------------------------------------------------

async def test_c6_record_fields_at_acquisition(srv, vk):
    r = await srv.acquire(ttl_ms=1500, maximum_lifetime_ms=4000, execution_id="exec-1", job_id="job-1",
                          trace_id="trace-1", client_id="worker-bin", metadata={"note": "hello", "n": 3})
    assert r.status_code == 200
    lease = r.json()["lease"]
    assert lease["renewed_at"] == lease["acquired_at"] and lease["renewed_at_ms"] == lease["acquired_at_ms"]
    assert lease["ttl_ms"] == 1500 and lease["maximum_lifetime_ms"] == 4000
    assert lease["expires_at_ms"] == lease["acquired_at_ms"] + 1500
    assert lease["expires_at_ms"] <= lease["acquired_at_ms"] + lease["maximum_lifetime_ms"]
    assert lease["acquired_at"].endswith("Z") and len(lease["acquired_at"]) == len("2030-01-01T00:00:00.000Z")
    assert (lease["owner_principal_id"], lease["owner_credential_id"]) == ("lease-a1", "lease-a1-k1")
    assert (lease["execution_id"], lease["job_id"], lease["trace_id"], lease["owner_client_id"]) == \
        ("exec-1", "job-1", "trace-1", "worker-bin")
    assert lease["metadata"] == {"note": "hello", "n": 3} and lease["state"] == "active"
    assert lease["record_version"] == 1 and lease["lock_key"] == lock_key()
    stored = vk.hgetall(lock_key())
    assert stored["identity"] == json.dumps(list(identity().values()), separators=(",", ":"))


async def test_c6_renew_never_passes_the_maximum_lifetime(srv):
    lease = await acquired(srv, ttl_ms=1000, maximum_lifetime_ms=1200)
    await until_backend_time(srv.server.settings.valkey_url, lease["acquired_at_ms"] + 201)  # now + ttl > lifetime
    r = await srv.renew(lease)
    assert r.status_code == 200
    renewed = r.json()["lease"]
    assert renewed["expires_at_ms"] == lease["acquired_at_ms"] + 1200


async def test_c7_token_never_changes_during_a_lease(srv):
    lease = await acquired(srv)
    for ttl in (None, 800, 2000):
        fields = {} if ttl is None else {"ttl_ms": ttl}
        r = await srv.renew(lease, **fields)
        assert r.status_code == 200
        got = r.json()["lease"]
        assert (got["fencing_token"], got["lease_id"]) == (lease["fencing_token"], lease["lease_id"])
        assert got["ttl_ms"] == (ttl or 1000)


# -- C8: unknown fields, secrets, oversized metadata --------------------------------------------

@pytest.mark.parametrize("extra,field", [
    ({"owner_principal_id": "admin"}, "owner_principal_id"),
    ({"fencing_token": 99}, "fencing_token"),
    ({"metadata": {"password": "hunter2"}}, "metadata.password"),
    ({"metadata": {"note": "Bearer abc"}}, "metadata.note"),
    ({"metadata": {"blob": "x" * 2000}}, "metadata"),
    ({"metadata": {"a": {"b": {"c": {"d": {"e": 1}}}}}}, "metadata.a.b.c.d"),
    ({"metadata": [1, 2]}, "metadata"),
])
async def test_c8_unknown_fields_secrets_and_oversized_metadata_are_rejected(srv, vk, extra, field):
    r = await srv.acquire(**extra)
    assert r.status_code == 400 and r.json()["code"] == "invalid_lease_request"
    assert r.json()["msg"].startswith(field + ":"), r.json()["msg"]
    assert vk.exists(lock_key()) == 0


async def test_c8_the_callers_own_key_in_the_body_is_rejected(srv, vk):
    r = await srv.acquire(metadata={"note": srv.keys["lease-a1"][4:]})
    assert r.status_code == 400 and "API key" in r.json()["msg"]
    assert srv.keys["lease-a1"] not in r.text
    assert vk.exists(lock_key()) == 0


# -- C9, C10: states ------------------------------------------------------------------------

async def test_c9_no_transition_leaves_a_terminal_state(srv):
    lease = await acquired(srv)
    assert (await srv.release(lease)).status_code == 200
    for r in (await srv.renew(lease), await srv.release(lease, request_id="again"),
              await srv.admin("revoke", lease), await srv.admin("force-release", lease)):
        assert r.status_code == 409 and r.json()["code"] == "lease_lost", r.text
    r = await srv.inspect(lease["lease_id"])
    assert r.json()["lease"]["state"] == "released"


async def test_c9_admin_operations_never_touch_a_successor(srv):
    old = await acquired(srv, ttl_ms=60)
    await lease_expired(srv, old)
    new = await acquired(srv, principal="lease-a1-peer")
    assert new["fencing_token"] > old["fencing_token"]
    # stale admin operations name the old lease, or the new lease with the old token
    assert (await srv.admin("force-release", old)).json()["code"] == "lease_lost"
    assert (await srv.admin("revoke", {**new, "fencing_token": old["fencing_token"]})).json()["code"] == "lease_lost"
    r = await srv.client.get(P, params=identity(), headers=srv.headers("lease-a1"))
    assert r.json()["lease"]["lease_id"] == new["lease_id"] and r.json()["lease"]["state"] == "active"


async def test_c10_an_expired_record_is_expired_even_while_stored(srv, vk):
    lease = await acquired(srv, ttl_ms=80)
    await lease_expired(srv, lease)
    assert vk.hget(lock_key(), "lease_id") == lease["lease_id"]  # physically still there
    r = await srv.client.get(P, params=identity(), headers=srv.headers("lease-a1"))
    assert r.json()["lease"]["state"] == "expired"
    assert (await srv.inspect(lease["lease_id"])).json()["lease"]["state"] == "expired"
    assert (await srv.renew(lease)).json()["code"] == "lease_lost"
    assert (await srv.release(lease)).json()["code"] == "lease_lost"
    listed = await srv.client.get(P, headers=srv.headers("lease-a1"))
    assert listed.json()["leases"] == []
    successor = await acquired(srv, principal="lease-a1-peer")
    assert successor["fencing_token"] == lease["fencing_token"] + 1
    # the expired lease's terminal evidence was kept
    r = await srv.inspect(lease["lease_id"])
    assert r.json()["lease"]["state"] == "expired" and r.json()["lease"]["end_reason"] == "expired"


# -- C11: acquire-if-free ---------------------------------------------------------------------

async def test_c11_acquire_over_an_active_lease_changes_nothing(srv, vk):
    lease = await acquired(srv)
    before = vk.hgetall(lock_key()), vk.get(keys.fence_key(lock_key()))
    r = await srv.acquire(principal="lease-a1-peer")
    assert r.status_code == 409 and r.json()["code"] == "lease_conflict"
    assert 0 < r.json()["retry_after_ms"] <= 1000 and r.json()["retryable"] is True
    assert "lease-a1" not in r.text and lease["lease_id"] not in r.text  # nothing about the holder
    assert (vk.hgetall(lock_key()), vk.get(keys.fence_key(lock_key()))) == before


async def test_c11_concurrent_acquires_have_one_winner(srv, vk):
    results = await asyncio.gather(*(srv.acquire(principal="wildcard" if i % 2 else "lease-a1") for i in range(40)))
    codes = sorted(r.json()["code"] for r in results)
    assert codes.count("lease_acquired") == 1 and codes.count("lease_conflict") == 39
    assert vk.get(keys.fence_key(lock_key())) == "1"


# -- C12, C13: renew and release need every matching field ------------------------------------------

@pytest.mark.parametrize("mismatch", ["lease_id", "principal", "service_instance_id", "fencing_token", "identity"])
async def test_c12_renew_needs_every_matching_field(srv, vk, mismatch):
    lease = await acquired(srv)
    before = vk.hgetall(lock_key())
    kwargs: dict = {}
    if mismatch == "lease_id":
        kwargs["lease_id"] = "0f0f0f0f-0000-4000-8000-000000000000"
    elif mismatch == "principal":
        kwargs["principal"] = "lease-a1-peer"
    elif mismatch == "service_instance_id":
        kwargs["service_instance_id"] = "worker-2"
    elif mismatch == "fencing_token":
        kwargs["fencing_token"] = lease["fencing_token"] + 1
    else:
        kwargs["workflow_name"] = "other-workflow"
    r = await srv.renew(lease, **kwargs)
    assert r.status_code == 409 and r.json()["code"] == "lease_lost", r.text
    assert vk.hgetall(lock_key()) == before
    r = await srv.release(lease, **kwargs)
    assert r.status_code == 409 and r.json()["code"] == "lease_lost"
    assert vk.hgetall(lock_key()) == before


async def test_c12_renew_moves_expiry_by_backend_time(srv):
    lease = await acquired(srv, ttl_ms=2000)
    await until_backend_time(srv.server.settings.valkey_url, lease["acquired_at_ms"] + 1)
    r = await srv.renew(lease, ttl_ms=400)
    assert r.status_code == 200
    got = r.json()["lease"]
    assert got["renewed_at_ms"] > lease["acquired_at_ms"]
    assert got["expires_at_ms"] == got["renewed_at_ms"] + 400
    assert got["acquired_at_ms"] == lease["acquired_at_ms"]


async def test_c12_an_expired_lease_is_never_revived(srv, vk):
    lease = await acquired(srv, ttl_ms=60)
    await lease_expired(srv, lease)
    r = await srv.renew(lease)
    assert r.status_code == 409 and r.json()["code"] == "lease_lost" and "expired" in r.json()["msg"]
    assert int(vk.hget(lock_key(), "expires_at")) == lease["expires_at_ms"]


async def test_c13_stale_release_never_deletes_a_successor(srv, vk):
    old = await acquired(srv, ttl_ms=60)
    await lease_expired(srv, old)
    new = await acquired(srv)
    r = await srv.release(old)
    assert r.status_code == 409 and r.json()["code"] == "lease_lost"
    r = await srv.renew(old)
    assert r.status_code == 409
    assert vk.hget(lock_key(), "lease_id") == new["lease_id"]
    r = await srv.release(new)
    assert r.status_code == 200 and r.json()["lease"]["state"] == "released"
    assert vk.exists(lock_key()) == 0
    history = [json.loads(e) for e in vk.lrange(keys.history_key(lock_key()), 0, -1)]
    states = [dict(zip(e[0::2], e[1::2]))["state"] for e in history]
    assert states == ["released", "expired"]


async def test_c13_owner_is_principal_and_worker_instance_not_the_server(srv):
    lease = await acquired(srv, service_instance_id="worker-7")
    assert lease["service_instance_id"] == "worker-7"
    r = await srv.renew(lease, service_instance_id="worker-7")
    assert r.status_code == 200
    r = await srv.release(lease, service_instance_id="worker-8")
    assert r.json()["code"] == "lease_lost"
    assert (await srv.release(lease, service_instance_id="worker-7")).status_code == 200


# -- C14: inspect and list only within scope ------------------------------------------------------

async def test_c14_inspect_and_list_stay_in_scope(srv):
    mine = await acquired(srv)
    theirs = await acquired(srv, principal="lease-b1", tenant_id="tenant-b")
    r = await srv.inspect(theirs["lease_id"], principal="lease-a1")
    assert r.status_code == 404 and r.json()["code"] == "lease_not_found"
    unknown = await srv.inspect("0f0f0f0f-0000-4000-8000-000000000000")
    assert unknown.status_code == 404 and unknown.json()["msg"] == r.json()["msg"]  # discloses nothing
    r = await srv.client.get(P, params=identity(tenant_id="tenant-b"), headers=srv.headers("lease-a1"))
    assert r.status_code == 403
    listed = await srv.client.get(P, headers=srv.headers("lease-a1"))
    assert [x["lease_id"] for x in listed.json()["leases"]] == [mine["lease_id"]]
    everything = await srv.client.get(P, headers=srv.headers("admin"))
    assert {x["lease_id"] for x in everything.json()["leases"]} == {mine["lease_id"], theirs["lease_id"]}
    assert (await srv.inspect(theirs["lease_id"], principal="admin")).status_code == 200


async def test_c14_list_pages_are_stable_bounded_and_complete(srv):
    ids = set()
    for i in range(7):
        ids.add((await acquired(srv, target_id=f"host-{i}"))["lease_id"])
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        r = await srv.client.get(P, params=params, headers=srv.headers("lease-a1"))
        assert r.status_code == 200 and len(r.json()["leases"]) <= 3
        seen += r.json()["leases"]
        pages += 1
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
        assert "starintel" not in cursor  # opaque: no raw key pattern
    assert {x["lease_id"] for x in seen} == ids and len(seen) == 7 and pages == 3
    assert [x["lock_key"] for x in seen] == sorted(x["lock_key"] for x in seen)
    again = await srv.client.get(P, params={"limit": "3"}, headers=srv.headers("lease-a1"))
    assert [x["lease_id"] for x in again.json()["leases"]] == [x["lease_id"] for x in seen[:3]]


async def test_c14_list_filters_and_limits(srv):
    await acquired(srv, target_id="t1")
    await acquired(srv, principal="lease-a1-peer", target_id="t2")
    await acquired(srv, principal="wildcard", program_id="program-2", target_id="t3")
    get = lambda **q: srv.client.get(P, params=q, headers=srv.headers("admin"))  # noqa: E731
    assert [x["target_id"] for x in (await get(owner="lease-a1-peer")).json()["leases"]] == ["t2"]
    assert [x["target_id"] for x in (await get(program="program-2")).json()["leases"]] == ["t3"]
    assert [x["target_id"] for x in (await get(target="t1")).json()["leases"]] == ["t1"]
    for q, field in (({"limit": "101"}, "limit"), ({"limit": "0"}, "limit"), ({"cursor": "starintel:*"}, "cursor"),
                     ({"pattern": "starintel:*"}, "pattern"), ({"program": "a/b"}, "program")):
        r = await get(**q)
        assert r.status_code == 400 and r.json()["msg"].startswith(field + ":"), r.text


# -- C15: force-release and revoke ---------------------------------------------------------------

async def test_c15_admin_operations_need_elevated_capability_and_a_reason(srv, vk):
    lease = await acquired(srv)
    r = await srv.admin("force-release", lease, principal="lease-a1")
    assert r.status_code == 403 and r.json()["code"] == "access_denied"
    r = await srv.admin("revoke", lease, principal="force-a", reason="")
    assert r.status_code == 400 and r.json()["msg"].startswith("reason:")
    b = body(ttl_ms=None, fencing_token=lease["fencing_token"])
    r = await srv.client.post(f"{P}/{lease['lease_id']}/revoke", json=b, headers=srv.headers("force-a"))
    assert r.status_code == 400 and r.json()["msg"] == "reason: is required"
    r = await srv.admin("revoke", lease, principal="force-a", fencing_token=lease["fencing_token"] + 1)
    assert r.status_code == 409 and r.json()["code"] == "lease_lost"
    assert vk.hget(lock_key(), "lease_id") == lease["lease_id"]


@pytest.mark.parametrize("op,state,code", [("force-release", "released", "lease_released"),
                                           ("revoke", "revoked", "lease_revoked")])
async def test_c15_admin_end_is_audited_before_success(srv, vk, run_dir, op, state, code):
    lease = await acquired(srv)
    r = await srv.admin(op, lease, principal="force-a", reason="incident 42", incident_id="INC-42")
    if op == "force-release":
        assert r.status_code == 400 and r.json()["msg"].startswith("incident_id:")  # revoke only
        r = await srv.admin(op, lease, principal="force-a", reason="incident 42")
    assert r.status_code == 200 and r.json()["code"] == code and r.json()["lease"]["state"] == state
    # the stream event was written by the same atomic script, so it is there now, without any flush
    events = [event_from_stream(fields) for _, fields in vk.xrange(keys.AUDIT_STREAM)]
    mine = [e for e in events if e.get("event_type") == f"target_lease_{op.replace('-', '_')}"
            and e.get("result_code") == code]
    assert len(mine) == 1
    assert mine[0]["admin_reason"] == "incident 42" and mine[0]["lease_id"] == lease["lease_id"]
    assert mine[0]["fencing_token"] == lease["fencing_token"] and mine[0]["resulting_state"] == state
    assert mine[0]["principal_id"] == "force-a" and mine[0]["correlation_id"] == r.json()["correlation_id"]
    # and the file line was fsynced before the response
    lines = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert any(x["result_code"] == code and x["admin_reason"] == "incident 42" for x in lines)
    # the owner has lost it
    assert (await srv.renew(lease)).json()["code"] == "lease_lost"
    inspected = (await srv.inspect(lease["lease_id"])).json()["lease"]
    assert inspected["state"] == state and inspected["admin_reason"] == "incident 42"
    assert inspected["ended_by"] == "force-a"


# -- C16-C18: idempotency -------------------------------------------------------------------------

async def test_c16_key_is_operation_identity_principal_request_id(srv, vk):
    lease = await acquired(srv, request_id="rid-1")
    # the same request_id from another principal is another request: it conflicts on the lease
    r = await srv.acquire(principal="lease-a1-peer", request_id="rid-1")
    assert r.json()["code"] == "lease_conflict"
    # the same request_id on another identity is another request
    other = await acquired(srv, request_id="rid-1", target_id="other.example")
    assert other["lease_id"] != lease["lease_id"]
    # the same request_id for another operation is another request
    r = await srv.renew(lease, request_id="rid-1")
    assert r.status_code == 200 and not r.json().get("replayed")
    ttl = vk.pttl(keys.idempotency_key("acquire", lock_key(), "lease-a1", "rid-1"))
    assert ttl > 0


@pytest.mark.parametrize("change", [{"ttl_ms": 2000}, {"metadata": {"a": 1}}, {"execution_id": "e2"},
                                    {"service_instance_id": "worker-9"}, {"wait_ms": 10}])
async def test_c16_digest_covers_every_behaviour_affecting_input(srv, vk, change):
    b = body()
    r = await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))
    assert r.status_code == 200
    before = vk.hgetall(lock_key()), vk.get(keys.fence_key(lock_key()))
    r = await srv.client.post(P + "/acquire", json={**b, **change}, headers=srv.headers("lease-a1"))
    assert r.status_code == 409 and r.json()["code"] == "idempotency_conflict"
    assert (vk.hgetall(lock_key()), vk.get(keys.fence_key(lock_key()))) == before


async def test_c17_retry_returns_the_original_result_and_mutates_nothing(srv, vk):
    b = body()
    first = (await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))).json()
    counter = vk.get(keys.fence_key(lock_key()))
    # a retry may carry a new deadline and a spelling that normalizes to the same identity
    retry = {**b, "deadline_at": now_ms() + 9000, "tenant_id": "TENANT-A", "operation_class": "default"}
    again = (await srv.client.post(P + "/acquire", json=retry, headers=srv.headers("lease-a1"))).json()
    assert again["code"] == "lease_acquired" and again["replayed"] is True
    assert (again["lease"]["lease_id"], again["lease"]["fencing_token"]) == \
        (first["lease"]["lease_id"], first["lease"]["fencing_token"])
    assert vk.get(keys.fence_key(lock_key())) == counter
    lease = first["lease"]
    rb = body(ttl_ms=None, fencing_token=lease["fencing_token"])
    url = f"{P}/{lease['lease_id']}/release"
    r1 = await srv.client.post(url, json=rb, headers=srv.headers("lease-a1"))
    r2 = await srv.client.post(url, json=rb, headers=srv.headers("lease-a1"))
    assert r1.json()["code"] == r2.json()["code"] == "lease_released" and r2.json()["replayed"] is True
    assert r1.json()["lease"]["ended_at_ms"] == r2.json()["lease"]["ended_at_ms"]
    assert vk.llen(keys.history_key(lock_key())) == 1


async def test_c18_replayed_acquire_of_an_ended_lease_reports_its_current_state(srv, vk):
    b = body(ttl_ms=60)
    first = (await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))).json()["lease"]
    await lease_expired(srv, first)
    r = (await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))).json()
    assert r["replayed"] is True and r["lease"]["lease_id"] == first["lease_id"]
    assert r["lease"]["state"] == "expired"
    b2 = body()
    second = (await srv.client.post(P + "/acquire", json=b2, headers=srv.headers("lease-a1"))).json()["lease"]
    assert (await srv.release(second)).status_code == 200
    r = (await srv.client.post(P + "/acquire", json=b2, headers=srv.headers("lease-a1"))).json()
    assert r["replayed"] is True and r["lease"]["fencing_token"] == second["fencing_token"]
    assert r["lease"]["state"] == "released"
    assert vk.get(keys.fence_key(lock_key())) == "2"


async def test_c18_idempotency_records_outlive_the_maximum_lifetime(srv, vk):
    s = srv.server.settings
    b = body()
    await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))
    pttl = vk.pttl(keys.idempotency_key("acquire", lock_key(), "lease-a1", b["request_id"]))
    assert s.max_lifetime_ms < pttl <= s.max_lifetime_ms + s.idempotency_retry_window_ms


# -- C20-C23: time and deadlines ---------------------------------------------------------------------

async def test_c20_backend_time_is_authoritative(srv, vk):
    t0 = vk.time()
    lease = await acquired(srv, deadline_in_ms=60_000)
    t1 = vk.time()
    lo, hi = t0[0] * 1000 + t0[1] // 1000, t1[0] * 1000 + t1[1] // 1000
    assert lo <= lease["acquired_at_ms"] <= hi
    assert lease["expires_at_ms"] == lease["acquired_at_ms"] + 1000  # not the caller's deadline
    r = await srv.acquire(expires_at=now_ms() + 10**9, request_id="x")
    assert r.status_code == 400 and r.json()["msg"].startswith("expires_at:")


@pytest.mark.parametrize("fields,field", [
    ({"ttl_ms": 10}, "ttl_ms"), ({"ttl_ms": 10**9}, "ttl_ms"), ({"ttl_ms": -1}, "ttl_ms"),
    ({"ttl_ms": 1.5}, "ttl_ms"), ({"ttl_ms": "1000"}, "ttl_ms"), ({"ttl_ms": True}, "ttl_ms"),
    ({"maximum_lifetime_ms": 0}, "maximum_lifetime_ms"), ({"maximum_lifetime_ms": 10**12}, "maximum_lifetime_ms"),
    ({"maximum_lifetime_ms": 500}, "maximum_lifetime_ms"),
])
async def test_c21_ttl_bounds(srv, vk, fields, field):
    r = await srv.acquire(**fields)
    assert r.status_code == 400 and r.json()["msg"].startswith(field + ":"), r.text
    assert vk.exists(lock_key()) == 0


async def test_c21_bounds_are_configurable(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url, min_ttl_ms=200, max_ttl_ms=400, max_lifetime_ms=1000) as s:
        assert (await s.acquire(ttl_ms=150)).status_code == 400
        assert (await s.acquire(ttl_ms=401)).status_code == 400
        lease = (await s.acquire(ttl_ms=400)).json()["lease"]
        assert lease["maximum_lifetime_ms"] == 1000


@pytest.mark.parametrize("deadline", [None, "never", "2030-01-01", "2030-01-01T00:00:00", 1.5e12, True, -5, 2**60,
                                      "inf", [1]])
async def test_c22_deadline_is_required_and_finite(srv, deadline):
    b = body()
    if deadline is None:
        del b["deadline_at"]
    else:
        b["deadline_at"] = deadline
    r = await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))
    assert r.status_code == 400 and r.json()["msg"].startswith("deadline_at:"), r.text


async def test_c22_rfc3339_deadlines_are_accepted(srv):
    import datetime as dt
    later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)).isoformat(timespec="milliseconds")
    r = await srv.client.post(P + "/acquire", json={**body(), "deadline_at": later.replace("+00:00", "Z")},
                              headers=srv.headers("lease-a1"))
    assert r.status_code == 200


async def test_c22_acquire_is_non_blocking_by_default_and_waits_when_asked(srv):
    holder = await acquired(srv, ttl_ms=250)
    r = await srv.acquire(principal="lease-a1-peer")
    assert r.json()["code"] == "lease_conflict"  # at once
    r = await srv.acquire(principal="lease-a1-peer", wait_ms=2000)
    assert r.status_code == 200, r.text
    got = r.json()["lease"]
    assert got["fencing_token"] == holder["fencing_token"] + 1
    assert got["acquired_at_ms"] >= holder["expires_at_ms"]


async def test_c22_waiting_is_bounded(srv):
    await acquired(srv, ttl_ms=5000)
    r = await srv.acquire(principal="lease-a1-peer", wait_ms=150)
    assert r.status_code == 409 and r.json()["code"] == "lease_conflict"
    r = await srv.acquire(principal="lease-a1-peer", wait_ms=10**6)
    assert r.status_code == 400 and r.json()["msg"].startswith("wait_ms:")
    r = await srv.acquire(principal="lease-a1-peer", wait_ms=3000, deadline_in_ms=400)
    assert r.json()["code"] == "lease_conflict"  # the deadline bounds the wait too


async def test_c23_past_deadline_is_refused_before_the_backend(srv, valkey):
    lease = await acquired(srv)
    await srv.server.audit.flush()
    counter = CommandCounter(valkey.url)
    before = counter.snapshot()
    r = await srv.acquire(deadline_in_ms=-1, target_id="late.example")
    assert r.status_code == 408 and r.json()["code"] == "deadline_exceeded" and r.json()["retryable"] is True
    r = await srv.renew(lease, deadline_at=now_ms() - 1000)
    assert r.status_code == 408
    await srv.server.audit.flush()
    delta = command_delta(before, counter.snapshot())
    counter.close()
    assert set(delta) <= {"info", "xadd"}, delta  # only the audit events and our INFO
    assert delta.get("xadd") == 2  # the two refusals were audited
