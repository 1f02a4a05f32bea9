"""Section 10 (security boundary) and section 11 (audit) of the reference lease server.

Refusals must happen in the contract's order and before any backend work: the
tests count Valkey's commands (INFO commandstats) around each refused request;
the only commands allowed are the audit XADD (the event of the refusal itself)
and the counter's own INFO.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import socket
import threading
import time

import httpx
import pytest
import redis

from lab.server import backend as keys
from lab.server.audit import AUDIT_FIELDS, EVENT_TYPES, event_from_stream
from lab.server.testing import CommandCounter, body, command_delta, demo_principals, identity, in_process_server
from lab.stack.leaseserver import LeaseServerProcess

from conftest import until, wait_until

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


# -- an attacker's inputs, against `python -m lab.server` over real HTTP ------------------------------

SHORT_TIMEOUTS = {"header_timeout_ms": 1000, "body_timeout_ms": 1000}


@pytest.fixture
def live(valkey, run_dir):
    """A real server process (uvicorn, 1 s header and body timeouts) on the session Valkey."""
    principals, api_keys = demo_principals(run_dir)
    config = run_dir / "server.json"
    config.write_text(json.dumps(SHORT_TIMEOUTS))
    server = LeaseServerProcess(run_dir, valkey_url=valkey.url, principals_file=principals, name="lease-hostile",
                                config_file=config)
    server.start()
    server.keys = api_keys
    try:
        yield server
    finally:
        server.stop()


def server_log(server) -> str:
    return server.log_path.read_text(errors="replace")


def assert_quiet_log(server):
    """No traceback and no error line: hostile input is the client's problem, not the server's."""
    text = server_log(server)
    assert "Traceback" not in text and " ERROR " not in text, text[-2000:]


def raw_request(server, head: str) -> socket.socket:
    """A socket to the server with `head` (request line and headers, CRLF-separated) already sent."""
    sock = socket.create_connection((server.host, server.ports["http"]), timeout=30)
    sock.sendall(head.encode("latin-1"))
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """Has the server closed this connection (EOF or reset) without us reading a response?"""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def audited_refusals(valkey, code: str) -> list[dict]:
    vk = redis.Redis.from_url(valkey.url, decode_responses=True)
    try:
        events = [event_from_stream(f) for _, f in vk.xrange(keys.AUDIT_STREAM)]
    finally:
        vk.close()
    return [e for e in events if e.get("result_code") == code]


def test_hostile_bodies_and_queries_are_400_not_retryable_without_a_traceback(live):
    headers = {"authorization": f"Bearer {live.keys['lease-a1']}"}
    deep: object = 0
    for _ in range(254):
        deep = [deep]
    commit = {**body(ttl_ms=None), "fencing_token": 1, "lease_id": "l-1", "doc": "doc-1", "body": {"append": deep}}
    acquire_deadlines = ["\u0662\u0660\u0663\u0660-01-01T00:00:00Z", "2030-01-01T00:00:00\u00b2Z", "9" * 4400]
    with httpx.Client(base_url=live.url, headers=headers, timeout=30) as c:
        replies = [c.post("/api/v1/commits", json=commit),
                   c.post(P + "/acquire", json={**body(), "metadata": {"k": deep}})]
        for text in acquire_deadlines:
            replies.append(c.post(P + "/acquire", json={**body(), "deadline_at": text}))
        for value in ("\u00b2", "\u0661", "9" * 4400, "\u0661\u0660"):
            replies.append(c.get(P, params={"deadline_at": value}))
            replies.append(c.get(P, params={"limit": value}))
            replies.append(c.get(P + "/00000000-0000-4000-8000-000000000000", params={"deadline_at": value}))
        for r in replies:
            b = r.json()
            assert (r.status_code, b["code"], b["retryable"]) == (400, "invalid_lease_request", False), r.text
        assert c.get("/healthz").status_code == 200  # and the server is still fine
    assert_quiet_log(live)


def test_a_client_that_leaves_mid_body_is_a_400_and_no_error(live, valkey):
    sock = raw_request(live, f"POST {P}/acquire HTTP/1.1\r\nHost: lease\r\nContent-Type: application/json\r\n"
                             f"Authorization: Bearer {live.keys['lease-a1']}\r\nContent-Length: 500\r\n\r\n")
    sock.sendall(b'{"tenant_id": "tenant-a", "program_id": "pro')
    wait_until(lambda: live.healthy(), what="the request to reach the app")  # a later request: ours is in
    sock.close()
    events = wait_until(lambda: audited_refusals(valkey, "invalid_lease_request"), what="the refusal's audit event")
    assert [(e["http_status"], e["retryable"], e["principal_id"]) for e in events] == [(400, False, "lease-a1")]
    assert_quiet_log(live)


def test_slow_request_headers_are_cut_off(live):
    idle = socket.create_connection((live.host, live.ports["http"]), timeout=60)  # sends nothing at all
    slow = raw_request(live, f"GET {P} HTTP/1.1\r\nHost: lease\r\n")
    sent = 0
    while not closed_by_peer(slow):  # one header byte every 50 ms: 60 s of trickle if never cut off
        assert sent < 1200, "the server kept a connection whose headers never completed"
        try:
            slow.sendall(b"X-Slow: 1\r\n"[sent % 11:sent % 11 + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 1
        time.sleep(0.05)
    assert idle.recv(1) == b""  # closed by the server, not by our 60 s socket timeout
    slow.close()
    idle.close()
    assert_quiet_log(live)


def test_a_slow_body_is_cut_off_with_a_400(live):
    sock = raw_request(live, f"POST {P}/acquire HTTP/1.1\r\nHost: lease\r\nContent-Type: application/json\r\n"
                             f"Authorization: Bearer {live.keys['lease-a1']}\r\nContent-Length: 2000\r\n\r\n")
    sock.settimeout(0)
    reply = b""
    for i in range(1200):  # one body byte every 50 ms: 60 s of trickle if never cut off
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            chunk = None
        except ConnectionResetError:
            break
        if chunk == b"":
            break
        if chunk:
            reply += chunk
            continue
        try:
            sock.sendall(b" ")
        except (BrokenPipeError, ConnectionResetError, BlockingIOError):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the server kept reading a body that never completed")
    sock.close()
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head.lower(), reply
    b = json.loads(payload)
    assert (b["code"], b["retryable"]) == ("invalid_lease_request", False) and b["msg"].startswith("body:")
    assert_quiet_log(live)


# -- waiting acquires are shared out ---------------------------------------------------------------

async def test_one_tenant_cannot_take_every_waiting_slot(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url, max_waiters=4, max_waiters_per_tenant=2,
                                 min_ttl_ms=100) as s:
        service = s.server.service
        held = (await s.acquire(target_id="busy-a", ttl_ms=60_000)).json()["lease"]
        greedy = [asyncio.create_task(s.acquire(p, target_id="busy-a", wait_ms=2500, deadline_in_ms=4000))
                  for p in ("lease-a1", "lease-a1-peer", "lease-a1", "lease-a1-peer")]
        # every tenant-a request is either waiting or already answered
        await until(lambda: service.waiters + sum(t.done() for t in greedy) == len(greedy), what="tenant a")
        assert service.waiters == 2  # tenant a's share; its other two got the plain conflict at once
        b_lease = (await s.acquire("lease-b1", tenant_id="tenant-b", target_id="busy-b")).json()["lease"]
        waiter = asyncio.create_task(s.acquire("lease-b1", tenant_id="tenant-b", target_id="busy-b",
                                               wait_ms=4000, deadline_in_ms=5000))
        await until(lambda: service.waiters == 3 or waiter.done(), what="tenant b's waiter")
        assert not waiter.done(), (await waiter).text  # tenant b still got a waiting slot
        assert (await s.release(b_lease, principal="lease-b1")).status_code == 200
        r = await waiter
        assert r.json()["code"] == "lease_acquired", r.text
        assert (await s.release(held)).status_code == 200
        codes = sorted(r.json()["code"] for r in await asyncio.gather(*greedy))
        assert codes.count("lease_conflict") >= 2 and set(codes) <= {"lease_conflict", "lease_acquired"}
        assert service.waiters == 0 and not service.waiters_by


# -- no credential in a body, however it is spelled ------------------------------------------------

def _escape_one(text: str, secret: str) -> str:
    """`text` (JSON) with one character of `secret` written as a \\u escape."""
    return text.replace(secret, secret[:7] + "\\u%04x" % ord(secret[7]) + secret[8:])


async def test_a_secret_in_a_body_is_refused_however_it_is_escaped(srv, valkey):
    own = srv.keys["lease-a1"]
    other = srv.keys["lease-b1"]
    assert (await srv.acquire("lease-b1", tenant_id="tenant-b", target_id="warm")).status_code == 200
    attempts = [
        _escape_one(json.dumps(body(metadata={"note": own.split(".")[2]})), own.split(".")[2]),
        _escape_one(json.dumps(body(target_id="x-" + own.split(".")[2])), own.split(".")[2]),
        json.dumps(body(target_id=other)),                          # another principal's whole key
        _escape_one(json.dumps(body(target_id=other)), other.split(".")[2]),
        json.dumps(body(target_id=other.split(".")[2])),            # its bare secret (it has authenticated)
        json.dumps(body(metadata={"k": "flk.someone-k1." + "A" * 43})),  # any key-shaped value
        json.dumps({**body(), "metadata": {other.split(".")[2]: 1}}),  # as an object key
    ]
    for text in attempts:
        r = await srv.client.post(P + "/acquire", content=text.encode(), headers=srv.headers(
            "lease-a1", **{"content-type": "application/json"}))
        b = r.json()
        assert (r.status_code, b["code"]) == (400, "invalid_lease_request"), text
        assert b["msg"].startswith("body:") and "key" in b["msg"]
    r = await srv.client.get(P, params={**identity(target_id=other)}, headers=srv.headers("lease-a1"))
    assert (r.status_code, r.json()["msg"].split(":")[0]) == (400, "query")
    vk = redis.Redis.from_url(valkey.url)
    try:
        stored = b"".join(vk.dump(k) or b"" for k in vk.keys("*"))
    finally:
        vk.close()
    for api_key in (own, other):
        assert api_key.split(".")[2].encode() not in stored


# -- the API key is compared exactly, after HTTP's own whitespace rules only ----------------------------

def read_reply(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset ends it too)."""
    reply = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return reply
        if not chunk:
            return reply
        reply += chunk


def test_a_key_followed_by_a_unicode_space_does_not_authenticate(live):
    key = live.keys["lease-a1"].encode()

    def status(authorization: bytes) -> bytes:  # raw: httpx itself refuses a header value ending in whitespace
        sock = socket.create_connection((live.host, live.ports["http"]), timeout=30)
        try:
            sock.sendall(b"GET " + P.encode() + b" HTTP/1.1\r\nHost: lease\r\nConnection: close\r\n"
                         b"Authorization: " + authorization + b"\r\n\r\n")
            return read_reply(sock).split(b" ", 2)[1]
        finally:
            sock.close()

    assert status(b"Bearer " + key) == b"200"
    assert status(b"Bearer " + key + b" \t ") == b"200"  # optional whitespace (RFC 9110: SP and HTAB only)
    assert status(b"Bearer  " + key) == b"200"          # 1*SP after the scheme
    for space in (b"\xa0", b"\x85", b"\xc2\xa0", b"\xc2\x85", b"\xe2\x80\x83"):  # NBSP, NEL (raw, UTF-8), EM SPACE
        assert status(b"Bearer " + key + space) == b"401", space
        assert status(b"Bearer " + space + key) == b"401", space
    assert_quiet_log(live)


# -- X-Correlation-ID: never a credential (issue 18, item 10) ---------------------------------------

async def test_a_correlation_id_that_could_be_a_key_is_refused_and_never_stored(srv, valkey, run_dir):
    own, other = srv.keys["lease-a1"], srv.keys["lease-b1"]
    assert (await srv.acquire("lease-b1", tenant_id="tenant-b", target_id="warm")).status_code == 200
    forged = "flk.someone-k1." + "A" * 43  # key-shaped, valid or not
    attempts = [  # (request, the credential-like id it sends)
        (lambda cid: srv.client.post(P + "/acquire", json=body(), headers=srv.headers(
            "lease-a1", **{"x-correlation-id": cid})), own),                           # the request's own key
        (lambda cid: srv.client.post(P + "/acquire", json=body(), headers={"x-correlation-id": cid}), own),  # no auth
        (lambda cid: srv.client.get(P, headers=srv.headers("lease-a1", **{"x-correlation-id": cid})), other),
        (lambda cid: srv.client.get(P, headers=srv.headers("lease-a1", **{"x-correlation-id": cid})), forged),
        (lambda cid: srv.client.post(P + "/acquire", json=body(), headers=srv.headers(
            "lease-a1", **{"x-correlation-id": cid})), other.split(".")[2]),        # a verified key's bare secret
        (lambda cid: srv.client.post(P + "/acquire", json=body(), headers=srv.headers(
            "lease-a1", **{"x-correlation-id": cid})), "req-" + own.split(".")[2]),  # the secret inside an id
        (lambda cid: srv.client.get("/healthz", headers={"x-correlation-id": cid}), own),
    ]
    for send, cid in attempts:
        r = await send(cid)
        b = r.json()
        assert (r.status_code, b["code"], b["retryable"]) == (400, "invalid_lease_request", False), (cid, r.text)
        assert b["msg"].startswith("x-correlation-id:") and "key" in b["msg"], b
        assert b["correlation_id"] == r.headers["x-correlation-id"] and cid not in r.text
        assert cid not in r.headers["x-correlation-id"]
    ok = await srv.client.post(P + "/acquire", json=body(target_id="fine"), headers=srv.headers(
        "lease-a1", **{"x-correlation-id": "corr-" + "A" * 43}))  # long, but no key: echoed as before
    assert ok.status_code == 200 and ok.json()["correlation_id"] == "corr-" + "A" * 43
    await srv.server.audit.flush()
    audit_file = (run_dir / "audit.jsonl").read_text()
    vk = redis.Redis.from_url(valkey.url)
    try:
        stream = b"".join(f[b"event"] for _, f in vk.xrange(keys.AUDIT_STREAM))
    finally:
        vk.close()
    refusals = [e for e in map(json.loads, audit_file.splitlines()) if e.get("result_code") == "invalid_lease_request"]
    assert len(refusals) == len(attempts) - 1  # every lease request is audited (with a fresh id); healthz is not
    for secret in (own.split(".")[2], other.split(".")[2], forged):
        assert secret not in audit_file and secret.encode() not in stream, secret
    doc = (await srv.client.get("/openapi.json")).json()  # and the document says so, on every operation
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            if path != "/openapi.json":
                param = next(p for p in op["parameters"] if p["name"] == "X-Correlation-ID")
                assert re.search(param["schema"]["not"]["pattern"], forged) and "400" in param["description"]


# -- request headers bounded: 431 (RFC 6585), memory flat ---------------------------------------------

def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM: the peak) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def test_a_50_mb_header_block_gets_431_without_the_server_growing(live):
    rss_before, peak_before = rss_kib(live.pid)
    sock = socket.create_connection((live.host, live.ports["http"]), timeout=30)
    replies: list[bytes] = []
    reader = threading.Thread(target=lambda: replies.append(read_reply(sock)))
    reader.start()  # reads while we send, as a client would: the 431 comes long before the 50 MB are sent
    started = time.monotonic()
    sent = 0
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: lease\r\nX-Big: ")
        chunk = b"a" * (1 << 20)
        for _ in range(50):
            sock.sendall(chunk)
            sent += len(chunk)
        sock.sendall(b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed after its 431 and a short linger
    reader.join(60)
    elapsed = time.monotonic() - started
    sock.close()
    rss_after, peak_after = rss_kib(live.pid)
    print(f"50 MB header block: {sent >> 20} MiB sent before the close, answered in {elapsed:.2f} s; server RSS "
          f"{rss_before >> 10} -> {rss_after >> 10} MiB, peak {peak_before >> 10} -> {peak_after >> 10} MiB")
    assert replies and replies[0].startswith(b"HTTP/1.1 431 "), replies[:1]
    assert b"connection: close" in replies[0].lower() and b"16384 bytes" in replies[0]
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get("/healthz").status_code == 200  # and the server is still fine
    assert_quiet_log(live)


def test_header_bytes_and_fields_are_bounded_exactly(live):
    def head(size: int = 0, fields: int = 0) -> bytes:
        """A GET /healthz head of exactly `size` bytes (when given) with `fields` extra header fields."""
        lines = b"GET /healthz HTTP/1.1\r\nHost: lease\r\n" + b"".join(b"X-F%d: 1\r\n" % i for i in range(fields))
        if size:
            pad = size - len(lines) - len(b"X-Pad: \r\n\r\n")
            lines += b"X-Pad: " + b"p" * pad + b"\r\n"
        return lines + b"\r\n"

    def status(*heads: bytes) -> list[bytes]:
        """The status lines the server answers `heads` with, one at a time on one connection."""
        sock = socket.create_connection((live.host, live.ports["http"]), timeout=30)
        out = []
        try:
            for h in heads:
                sock.sendall(h)
                reply = b""
                while b"\r\n\r\n" not in reply:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
                out.append(reply.split(b"\r\n", 1)[0])
                if b" 431 " in out[-1]:
                    break
                length = int(reply.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(reply.partition(b"\r\n\r\n")[2]) < length:
                    reply += sock.recv(65536)
        finally:
            sock.close()
        return out

    assert len(head(16384)) == 16384
    assert status(head(16384)) == [b"HTTP/1.1 200 OK"]
    assert status(head(16385)) == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert status(head(fields=99)) == [b"HTTP/1.1 200 OK"]  # Host and 99 more: 100 fields, the bound
    assert status(head(fields=100)) == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    # on a kept-alive connection each request's head is counted afresh
    assert status(head(16384), head(16384), head(16385)) == [b"HTTP/1.1 200 OK"] * 2 + [
        b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert_quiet_log(live)
