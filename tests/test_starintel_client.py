"""The StarIntel dialect adapter against the fake server: routes, status/code mapping, the split, findings."""

from __future__ import annotations

import json

import httpx
import pytest

from lab.client import Identity, LeaseClient
from lab.client.starintel import (
    FINDINGS,
    StarIntelClient,
    check_api_key,
    classify_starintel,
    new_findings_log,
    static_findings,
)
from lab.stack.process import free_port
from lab.sut import load_findings
from test_starintel_fake import API, FakeStore, make_app

ID = Identity("tenant-a", "program-1", "fencelab", "k0", "actor-1", "lab")


def client(store: FakeStore, key: str, *, instance: str = "inst-1", findings=None, **kw) -> StarIntelClient:
    """An adapter bound in-process to one fake instance (the URL names the instance)."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(store, instance)))
    return StarIntelClient(f"http://{instance}", key, service_instance_id="worker-1", http=http,
                           findings=findings, **kw)


@pytest.fixture
def store():
    return FakeStore()


@pytest.fixture
def key(store):
    return store.add_credential("alice")


def test_api_key_shape_is_checked_without_echoing_the_secret():
    assert check_api_key("star_sk_v1_cred7_" + "ab" * 32) == "cred7"
    with pytest.raises(ValueError, match="non-empty"):
        check_api_key("")
    for bad in ("sk_live_123", "star_sk_v1_cred_7_abcd", "star_sk_v1_cred7_xyz1", "star_sk_v1_cred7_abc"):
        with pytest.raises(ValueError, match="star_sk_v1_<credential-id>_<hex-secret>") as e:
            check_api_key(bad)
        assert bad not in str(e.value)
    with pytest.raises(ValueError):
        StarIntelClient("http://x", "secret-key-123", service_instance_id="w")


async def test_every_route_and_success_mapping(store, key):
    async with client(store, key) as c:
        a = await c.acquire(ID, ttl_ms=1000, request_id="r-acq")
        assert (a.outcome, a.code, a.http_status) == ("ok", "lease_acquired", 201)
        lease = a.lease
        assert (lease.target_id, lease.workflow_name, lease.operation_class) == ("k0", "lab", "default")
        assert lease.expires_at_ms - lease.acquired_at_ms == 1000 and lease.identity == ID
        sent = store.requests[-1]
        assert (sent["method"], sent["path"]) == ("POST", API + "/acquire")
        assert sent["headers"]["idempotency-key"] == sent["body"]["request_id"] == "r-acq"
        assert 0 < int(sent["headers"]["x-request-timeout-ms"]) <= 5000

        r = await c.renew(lease, request_id="r-ren")
        assert (r.outcome, r.code, r.http_status) == ("ok", "lease_renewed", 200)
        assert store.requests[-1]["body"]["ttl_ms"] == 1000, "renew must carry the lease's own TTL"
        assert r.lease.expires_at_ms - r.lease.renewed_at_ms == 1000 and r.lease.fencing_token == lease.fencing_token

        i = await c.inspect(ID)
        assert (i.outcome, i.code, i.lease.lease_id) == ("ok", "lease_inspected", lease.lease_id)
        assert store.requests[-1]["path"] == API

        rel = await c.release(r.lease, request_id="r-rel")
        assert (rel.outcome, rel.code, rel.lease.state) == ("ok", "lease_released", "released")
        assert (store.requests[-1]["method"], store.requests[-1]["path"]) == ("DELETE", f"{API}/{lease.lease_id}")

        by_id = await c.inspect(lease.lease_id, identity=ID)
        assert (by_id.outcome, by_id.code, by_id.lease.state) == ("ok", "lease_inspected", "released")
        gone = await c.inspect(ID)
        assert (gone.outcome, gone.code) == ("fail", "lease_not_found")
        listed = await c.list({"target_id": "k0"})
        assert (listed.outcome, listed.code, listed.leases) == ("ok", "lease_listed", [])


async def test_lost_lease_codes_are_definite_lease_lost(store, key):
    async with client(store, key) as c:
        lease = (await c.acquire(ID, ttl_ms=1000)).lease
        stale = type(lease)(**{**{f: getattr(lease, f) for f in lease.__slots__}, "fencing_token": 99})
        r = await c.renew(stale)
        assert (r.outcome, r.code, r.http_status) == ("fail", "lease_lost", 412)
        store.clock.advance(1500)
        r = await c.renew(lease)
        assert (r.outcome, r.code, r.http_status) == ("fail", "lease_lost", 412)
        successor = (await c.acquire(ID, ttl_ms=1000)).lease
        assert successor.fencing_token == lease.fencing_token + 1
        r = await c.release(lease)  # a stale release never deletes the successor
        assert (r.outcome, r.code) == ("fail", "lease_lost")
        assert (await c.inspect(ID)).lease.lease_id == successor.lease_id
        await c.release(successor)
        r = await c.renew(successor)  # 404 not_found on a mutation: nothing to renew
        assert (r.outcome, r.code, r.http_status) == ("fail", "lease_lost", 404)
        assert c.findings.observed("mutation.not-found") and c.findings.observed("code.stale_token")


async def test_renew_via_another_instance_is_not_owner_and_a_finding(store, key):
    log = new_findings_log()
    async with client(store, key, instance="inst-1", findings=log) as one, \
            client(store, key, instance="inst-2", findings=log) as two:
        lease = (await one.acquire(ID, ttl_ms=5000)).lease
        r = await two.renew(lease)
        assert (r.outcome, r.code, r.http_status) == ("fail", "lease_lost", 409)
        assert (await one.renew(lease)).ok
        (rec,) = [x for x in log.records() if x["id"] == "owner.server-instance"]
        assert "http://inst-1" in rec["observed"] and "http://inst-2" in rec["observed"]


@pytest.mark.parametrize("op,code,after,status,outcome,contract_code", [
    ("acquire", "outcome_unknown", True, None, "info", "lease_outcome_unknown"),
    ("acquire", "backend_unavailable", False, None, "info", "lease_backend_unavailable"),
    ("acquire", "deadline_exceeded", False, None, "info", "deadline_exceeded"),
    ("inspect", "deadline_exceeded", False, None, "fail", "deadline_exceeded"),
    ("acquire", "rate_limited", False, None, "fail", "lease_rate_limited"),
    ("acquire", "invalid_request", False, None, "fail", "invalid_lease_request"),
    ("acquire", "unauthenticated", False, None, "fail", "invalid_credential"),
    ("acquire", "request_timeout", False, 504, "info", "timeout"),
    ("acquire", "internal_error", False, 500, "info", "unexpected_response"),
    ("acquire", "conflict", False, 500, "info", "lease_conflict"),  # a code under a status outside the table
    ("acquire", "weird", False, 500, "info", "weird"),
])
async def test_definite_and_indefinite_split(store, key, op, code, after, status, outcome, contract_code):
    store.inject("list" if op == "inspect" else op, code, after=after, status=status)  # inspect(identity) lists
    async with client(store, key) as c:
        r = await (c.acquire(ID, ttl_ms=1000) if op == "acquire" else c.inspect(ID))
        assert (r.outcome, r.code) == (outcome, contract_code)
        if status == 500 and code == "conflict":
            assert c.findings.observed("status.unexpected")
        if code == "weird":
            assert c.findings.observed("code.unknown")


async def test_unknown_outcome_is_settled_by_request_id(store, key):
    store.inject("acquire", "outcome_unknown", after=True)
    async with client(store, key) as c:
        r = await c.acquire(ID, ttl_ms=1000, request_id="same")
        assert (r.outcome, r.code) == ("info", "lease_outcome_unknown")
        settled = await c.resolve(r)
        assert (settled.outcome, settled.code) == ("ok", "lease_acquired")
        assert store.counters[tuple(ID.as_dict().values())] == 1, "the retry must not acquire a second time"
        conflict = await c.acquire(ID, ttl_ms=2000, request_id="same")
        assert (conflict.outcome, conflict.code) == ("fail", "idempotency_conflict")


async def test_an_unknown_key_is_invalid_credential(store):
    store.add_credential("alice")
    async with client(store, "star_sk_v1_cred1_" + "00" * 32) as c:
        r = await c.acquire(ID, ttl_ms=1000)
        assert (r.outcome, r.code, r.http_status) == ("fail", "invalid_credential", 401)


async def test_scope_and_capability_denials(store):
    narrow = store.add_credential("bob", scopes=("tenant:other",))
    async with client(store, narrow) as c:
        r = await c.acquire(ID, ttl_ms=1000)
        assert (r.outcome, r.code, r.http_status) == ("fail", "access_denied", 403)
    alice = store.add_credential("alice")
    ops = store.add_credential("ops", ("targets:lease", "targets:force-release"))
    async with client(store, alice) as c, client(store, ops) as admin:
        lease = (await c.acquire(ID, ttl_ms=1000)).lease
        r = await c.revoke(lease, "incident 7")
        assert (r.outcome, r.code) == ("fail", "access_denied")
        r = await admin.revoke(lease, "incident 7", incident_id="INC-7")
        assert (r.outcome, r.code, r.lease.state) == ("ok", "lease_revoked", "revoked")
        assert store.requests[-1]["body"]["reason"] == "incident 7 (incident INC-7)"


async def test_commit_and_force_release_are_unsupported(store, key):
    async with client(store, key) as c:
        lease = (await c.acquire(ID, ttl_ms=1000)).lease
        sent = len(store.requests)
        for r in (await c.commit(lease, "doc-k0", {"x": 1}), await c.force_release(lease, "why")):
            assert (r.outcome, r.code) == ("fail", "unsupported")
        assert len(store.requests) == sent, "nothing may be sent for an operation the dialect lacks"
        assert c.findings.observed("route.commit") and c.findings.observed("route.force-release")
        assert StarIntelClient.capabilities == {"revoke"}


async def test_late_renewal_grants_nothing(store, key):
    ticks = iter(range(0, 10**9, 3000))
    base = store.clock.now_ms()
    async with client(store, key) as c:
        lease = (await c.acquire(ID, ttl_ms=5000)).lease
        c.clock_ms = lambda: base + next(ticks)  # every reading of the client's clock moves 3 s on
        r = await c.renew(lease, deadline_s=5)
        assert (r.outcome, r.code, r.late) == ("info", "late_reply", True)


async def test_transport_failures_follow_the_split(key):
    port = free_port()
    async with StarIntelClient(f"http://127.0.0.1:{port}", key, service_instance_id="w") as c:
        r = await c.acquire(ID, ttl_ms=1000, deadline_s=2)
        assert (r.outcome, r.code) == ("fail", "connect_error")

    async def hang(request):
        raise httpx.ReadTimeout("no reply", request=request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(hang))
    async with StarIntelClient("http://x", key, service_instance_id="w", http=http) as c:
        r = await c.acquire(ID, ttl_ms=1000)
        assert (r.outcome, r.code) == ("info", "timeout"), "a reply lost after sending may have happened"


async def test_bad_arguments_fail_eagerly(store, key):
    async with client(store, key) as c:
        with pytest.raises(ValueError, match="identity"):
            await c.inspect("lease-1")
        with pytest.raises(ValueError, match="pagination"):
            await c.list(limit=10)
        with pytest.raises(ValueError, match="unknown list filter"):
            await c.list({"owner": "x"})
        with pytest.raises(ValueError, match="ttl_ms"):
            await c.acquire(ID, ttl_ms=0)


async def test_findings_are_written_as_observed_and_listed_statically(store, key, tmp_path):
    log = new_findings_log(tmp_path / "findings.jsonl")
    async with client(store, key, findings=log) as c:
        await c.acquire(ID, ttl_ms=1000)
        await c.acquire(ID, ttl_ms=1000)  # conflict: an error envelope without retry_after_ms
    on_disk = load_findings(tmp_path)
    assert {"code.acquired", "codes.bare", "envelope.retry", "record.shape", "record.times"} <= \
        {r["id"] for r in on_disk}
    assert all({"rule", "contract", "dialect", "observed"} <= r.keys() and r["observed"] for r in on_disk)
    assert len(on_disk) == len({r["id"] for r in on_disk}), "each finding is written once"
    assert log.counts["codes.bare"] >= 2
    static = static_findings()
    assert all(r["observed"] is None for r in static)
    assert {"code.stale_token", "code.expired", "code.not_owner", "code.acquired", "code.deadline_exceeded",
            "envelope.retry", "owner.server-instance", "route.commit", "route.release"} <= {r["id"] for r in static}
    (tmp_path / "findings.jsonl").write_text(json.dumps({"rule": "x"}) + "\n")
    with pytest.raises(ValueError, match="findings.jsonl:1"):
        load_findings(tmp_path)


def test_classifier_table_matches_the_spec():
    stat = {"acquired": 201, "renewed": 200, "stale_token": 412, "expired": 412, "not_owner": 409,
            "conflict": 409, "deadline_exceeded": 504, "outcome_unknown": 503, "rate_limited": 429}
    for code, status in stat.items():
        env = {"status": "success" if status < 400 else "error", "code": code}
        outcome, _ = classify_starintel("renew", status, env)
        assert outcome != "info" or code in ("deadline_exceeded", "outcome_unknown")
        assert classify_starintel("renew", status + 1, env)[0] == "info", "a code under another status is untrusted"
    assert classify_starintel("renew", 503, {"status": "error", "code": "backend_unavailable", "submitted": False}) \
        == ("fail", "lease_backend_unavailable")
    assert classify_starintel("renew", 200, ["not", "an", "envelope"]) == ("info", "unparseable_response")
    for code in ("idempotency_key_mismatch", "idempotency_key_required", "missing_query_parameter"):
        assert classify_starintel("acquire", 400, {"status": "error", "code": code}) == \
            ("fail", "invalid_lease_request")
    assert classify_starintel("inspect", 404, {"status": "error", "code": "not_found"}) == ("fail", "lease_not_found")
    assert classify_starintel("release", 404, {"status": "error", "code": "not_found"}) == ("fail", "lease_lost")
    assert set(FINDINGS) >= {"deadline.header", "renew.default-ttl", "idempotency.header"}
    assert issubclass(StarIntelClient, LeaseClient)
