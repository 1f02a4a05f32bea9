"""Section 10 (security boundary) and section 11 (audit) of the reference lease server.

Refusals must happen in the contract's order and before any backend work: the
tests count Valkey's commands (INFO commandstats) around each refused request;
the only commands allowed are the audit XADD (the event of the refusal itself)
and the counter's own INFO.
"""

from __future__ import annotations

import json

import pytest
import redis

from lab.server import backend as keys
from lab.server.audit import AUDIT_FIELDS, EVENT_TYPES, event_from_stream
from lab.server.testing import CommandCounter, body, command_delta, in_process_server

P = "/api/v1/target-leases"


@pytest.fixture
async def srv(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url, rate_per_principal_target=1.0,
                                 burst_per_principal_target=3) as s:
        yield s


@pytest.fixture
def counter(valkey):
    c = CommandCounter(valkey.url)
    yield c
    c.close()


async def no_backend_work(srv, counter, request) -> tuple[int, str]:
    """Run `request()`; assert Valkey ran nothing but the refusal's audit XADD."""
    await srv.server.audit.flush()
    before = counter.snapshot()
    r = await request()
    await srv.server.audit.flush()
    delta = command_delta(before, counter.snapshot())
    assert set(delta) <= {"info", "xadd"}, delta
    assert delta.get("xadd", 0) == 1, delta  # exactly the one audit event
    return r.status_code, r.json()["code"]


CROSS_SCOPE = [
    ("cross-tenant", "lease-a1", {"tenant_id": "tenant-b"}),
    ("cross-program", "lease-a1", {"program_id": "program-2"}),
    ("cross-actor", "lease-a1", {"actor_name": "actor-2"}),
    ("cross-target", "lease-a1-dns", {"target_namespace": "ipv4", "target_id": "10.0.0.1"}),
    ("tenant-b principal on tenant-a", "lease-b1", {}),
    ("program-2 principal on program-1", "lease-a1-p2", {}),
    ("actor-2 principal on actor-1", "lease-a1-actor2", {}),
]


@pytest.mark.parametrize("what,principal,changes", CROSS_SCOPE, ids=[c[0] for c in CROSS_SCOPE])
async def test_cross_scope_credentials_are_refused_before_any_valkey_command(srv, counter, what, principal, changes):
    status, code = await no_backend_work(srv, counter, lambda: srv.acquire(principal, **changes))
    assert (status, code) == (403, "access_denied")
    lease = (await srv.acquire("wildcard", **changes)).json()["lease"]
    for op in ("renew", "release"):
        status, code = await no_backend_work(
            srv, counter, lambda: getattr(srv, op)(lease, principal=principal, service_instance_id="worker-1"))
        assert (status, code) == (403, "access_denied")
    status, code = await no_backend_work(
        srv, counter, lambda: srv.client.get(P, params={k: lease[k] for k in (
            "tenant_id", "program_id", "target_namespace", "target_id", "actor_name", "workflow_name")},
            headers=srv.headers(principal)))
    assert (status, code) == (403, "access_denied")


async def test_every_kind_of_refusal_happens_before_the_backend(srv, counter):
    refusals = [
        (401, "invalid_credential", lambda: srv.client.post(P + "/acquire", json=body())),
        (401, "invalid_credential", lambda: srv.client.post(P + "/acquire", json=body(), headers={
            "authorization": "Bearer flk.lease-a1-k1." + "A" * 43})),
        (403, "access_denied", lambda: srv.acquire("force-a")),
        (403, "access_denied", lambda: srv.acquire("nocap-a")),
        (400, "invalid_lease_request", lambda: srv.acquire(ttl_ms=1)),
        (400, "invalid_lease_request", lambda: srv.acquire(surprise=True)),
        (408, "deadline_exceeded", lambda: srv.acquire(deadline_in_ms=-1)),
    ]
    for status, code, request in refusals:
        assert await no_backend_work(srv, counter, request) == (status, code)


async def test_rate_limit_refuses_before_the_backend(srv, counter):
    for _ in range(3):
        await srv.acquire("lease-a1-peer")
    status, code = await no_backend_work(srv, counter, lambda: srv.acquire("lease-a1-peer"))
    assert (status, code) == (429, "lease_rate_limited")


async def test_checks_run_in_the_contract_order(srv):
    junk = {**body(), "tenant_id": "tenant-b", "nonsense": 1, "ttl_ms": -1}
    # credential first: a bad key wins over everything
    r = await srv.client.post(P + "/acquire", json=junk, headers={"authorization": "Bearer nope"})
    assert r.json()["code"] == "invalid_credential"
    # then capability, before the body is even parsed
    r = await srv.client.post(P + "/acquire", content=b"{not json", headers=srv.headers("force-a"))
    assert r.json()["code"] == "access_denied"
    # then scope, before the rest of the canonical request
    r = await srv.client.post(P + "/acquire", json=junk, headers=srv.headers("lease-a1"))
    assert r.json()["code"] == "access_denied"
    # then the canonical request
    r = await srv.client.post(P + "/acquire", json={**junk, "tenant_id": "tenant-a"}, headers=srv.headers("lease-a1"))
    assert r.json()["code"] == "invalid_lease_request" and r.json()["msg"].startswith("nonsense:")


async def test_principal_comes_from_the_key_never_the_body(srv):
    r = await srv.acquire(owner_principal_id="admin")
    assert r.status_code == 400
    lease = (await srv.acquire()).json()["lease"]
    assert lease["owner_principal_id"] == "lease-a1" and lease["owner_credential_id"] == "lease-a1-k1"


# -- audit ------------------------------------------------------------------------------------------

async def test_every_request_emits_one_audit_event_without_secrets(srv, valkey, run_dir):
    secret_note = "metadata-body-must-not-be-audited"
    requests = [
        lambda: srv.acquire(metadata={"note": secret_note}, trace_id="trace-9", execution_id="exec-9", job_id="job-9"),
        lambda: srv.acquire("lease-a1-peer"),                                   # conflict
        lambda: srv.client.post(P + "/acquire", json=body()),                   # 401
        lambda: srv.acquire("lease-b1"),                                        # 403
        lambda: srv.acquire(ttl_ms=0),                                          # 400
        lambda: srv.client.get(P, headers=srv.headers("lease-a1")),             # list
    ]
    responses = [await req() for req in requests]
    lease = responses[0].json()["lease"]
    responses.append(await srv.renew(lease, ttl_ms=2000))
    responses.append(await srv.inspect(lease["lease_id"]))
    responses.append(await srv.admin("revoke", lease, reason="incident 9"))
    await srv.server.audit.flush()
    lines = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    vk = redis.Redis.from_url(valkey.url, decode_responses=True)
    entries = vk.xrange(keys.AUDIT_STREAM)
    assert all(set(fields) == {"event_type", "event"} for _, fields in entries)
    stream = [event_from_stream(fields) for _, fields in entries]
    vk.close()
    assert len(lines) == len(stream) == len(responses)
    assert [e["correlation_id"] for e in lines] == [r.json()["correlation_id"] for r in responses]
    assert sorted(e["correlation_id"] for e in stream) == sorted(e["correlation_id"] for e in lines)
    everything = (run_dir / "audit.jsonl").read_text() + json.dumps(stream)
    for api_key in srv.keys.values():
        assert api_key not in everything and api_key.split(".")[2] not in everything
    assert secret_note not in everything and "starintel:target-lease" not in everything
    for e in lines + stream:
        assert set(e) <= set(AUDIT_FIELDS) and e["event_type"] in EVENT_TYPES
        for field in ("server_instance_id", "observed_at_ms", "correlation_id", "result_code", "http_status",
                      "retryable", "backend_health"):
            assert field in e, (field, e)
    # latency is known only after the reply: every file line has it, and every stream event
    # but the admin ones, which the script itself appends before replying
    assert all("latency_ms" in e for e in lines)
    assert [e["event_type"] for e in stream if "latency_ms" not in e] == ["target_lease_revoke"]
    acquired = lines[0]
    assert acquired["event_type"] == "target_lease_acquire" and acquired["result_code"] == "lease_acquired"
    for field, value in (("principal_id", "lease-a1"), ("credential_id", "lease-a1-k1"),
                         ("service_instance_id", "worker-1"), ("trace_id", "trace-9"), ("execution_id", "exec-9"),
                         ("job_id", "job-9"), ("lease_id", lease["lease_id"]),
                         ("fencing_token", lease["fencing_token"]), ("requested_ttl_ms", 1000),
                         ("effective_ttl_ms", 1000), ("previous_state", "none"), ("resulting_state", "active"),
                         ("tenant_id", "tenant-a"), ("target_id", "example.com"), ("backend_health", "ok")):
        assert acquired[field] == value, field
    assert isinstance(acquired["backend_time_ms"], int) and acquired["latency_ms"] >= 0
    assert lines[1]["result_code"] == "lease_conflict" and "lease_id" not in lines[1]  # never the holder's lease
    assert lines[2]["result_code"] == "invalid_credential" and "principal_id" not in lines[2]
    assert lines[3]["result_code"] == "access_denied" and lines[3]["backend_health"] == "not_contacted"
    assert lines[6]["requested_ttl_ms"] == 2000 and lines[6]["effective_ttl_ms"] == 2000
    assert lines[8]["event_type"] == "target_lease_revoke" and lines[8]["admin_reason"] == "incident 9"
    assert lines[8]["previous_state"] == "active" and lines[8]["resulting_state"] == "revoked"


async def test_principals_file_and_logs_hold_no_keys(srv, run_dir):
    text = (run_dir / "principals.json").read_text()
    for api_key in srv.keys.values():
        assert api_key.split(".")[2] not in text
