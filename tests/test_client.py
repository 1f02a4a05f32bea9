"""Unit tests of lab.client: the wire shape of requests and the ok / fail / info split.

Server replies come from `httpx.MockTransport`; the transport-level cases
(connection refused, reset after send, silence, pool exhaustion) use real
loopback sockets, because only the real transport reports whether a request
began to leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from lab.client import Call, Identity, Lease, LeaseClient, LeaseFailed, LeaseIndeterminate, http11, parse_time_ms
from lab.client.results import LeaseProtocolError
from lab.stack.process import free_port

from conftest import until

IDENT = Identity("t1", "p1", "ns", "target-1", "actor", "wf")
T0 = "2030-01-02T03:04:05.678Z"
T0_MS = 1893553445678


def record(**over):
    """A complete lease record as the server puts it on the wire."""
    r = {"record_version": 1, "lock_key": "starintel:target-lease:v1:abc", **IDENT.as_dict(),
         "lease_id": "L1", "owner_principal_id": "pr1", "owner_client_id": "c1", "owner_credential_id": "cred1",
         "service_instance_id": "w1", "fencing_token": 7, "acquired_at": T0, "renewed_at": T0,
         "expires_at": "2030-01-02T03:04:15.678Z", "ttl_ms": 10000, "maximum_lifetime_ms": 60000,
         "execution_id": "e1", "job_id": None, "trace_id": "tr1", "request_id": "r1", "metadata": {"a": 1},
         "state": "active"}
    r.update(over)
    return r


def success(code="lease_acquired", **over):
    return {"status": "success", "code": code, "correlation_id": "corr-1", "lease": record(**over)}


def error(code, retryable=False, **extra):
    return {"status": "error", "code": code, "msg": f"because {code}", "correlation_id": "corr-2",
            "retryable": retryable, **extra}


def mock_client(handler, **kw) -> LeaseClient:
    """A LeaseClient whose HTTP exchanges are answered by `handler(request)`."""
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return LeaseClient("http://lease.test", "key-1", service_instance_id="w1", timeout_s=2.0, http=http, **kw)


def replying(status, payload, seen=None):
    """A handler that records each request and answers `payload` (JSON unless bytes)."""
    async def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        if isinstance(payload, bytes):
            return httpx.Response(status, content=payload)
        return httpx.Response(status, json=payload)
    return handler


def a_lease(**over) -> Lease:
    return Lease.from_wire(record(**over))


# -- request shape ---------------------------------------------------------------

async def test_acquire_sends_the_contract_body_with_an_integer_deadline():
    seen = []
    client = mock_client(replying(200, success(), seen))
    before = client.clock_ms()
    r = await client.acquire(IDENT, ttl_ms=10000, request_id="r1", deadline_s=1.5, execution_id="e1",
                             metadata={"k": "v"})
    req = seen[0]
    body = json.loads(req.content)
    assert req.method == "POST" and req.url.path == "/api/v1/target-leases/acquire"
    assert req.headers["authorization"] == "Bearer key-1"
    assert {k: body[k] for k in IDENT.as_dict()} == IDENT.as_dict()
    assert body["operation_class"] == "default"
    assert body["request_id"] == "r1" and body["service_instance_id"] == "w1" and body["ttl_ms"] == 10000
    assert body["execution_id"] == "e1" and body["metadata"] == {"k": "v"}
    assert isinstance(body["deadline_at"], int) and before + 1500 <= body["deadline_at"] <= client.clock_ms() + 1500
    assert "wait_ms" not in body and "maximum_lifetime_ms" not in body
    assert r.outcome == "ok" and r.code == "lease_acquired" and r.http_status == 200
    assert r.correlation_id == "corr-1" and r.latency_ns > 0 and not r.late


async def test_renew_and_release_name_the_lease_and_its_token():
    seen = []
    client = mock_client(replying(200, success("lease_renewed"), seen))
    lease = a_lease(lease_id="a/b..c", fencing_token=42)
    await client.renew(lease, deadline_at_ms=client.clock_ms() + 1000)
    await client.release(lease, request_id="rel-1")
    renew, release = seen
    assert renew.url.raw_path.decode() == "/api/v1/target-leases/a%2Fb..c/renew"
    assert release.url.raw_path.decode() == "/api/v1/target-leases/a%2Fb..c/release"
    for req in (renew, release):
        body = json.loads(req.content)
        assert body["fencing_token"] == 42 and body["tenant_id"] == "t1" and body["service_instance_id"] == "w1"
    assert json.loads(release.content)["request_id"] == "rel-1"
    assert json.loads(renew.content)["request_id"] != "rel-1"


async def test_admin_calls_carry_the_reason_and_reads_carry_the_deadline_as_a_query():
    seen = []
    client = mock_client(replying(200, success("lease_revoked"), seen))
    lease = a_lease()
    await client.force_release(lease, "stuck worker")
    await client.revoke(lease, "incident-9", incident_id="INC-9")
    await client.inspect("L1")
    await client.inspect(IDENT)
    fr, rv, by_id, by_identity = seen
    assert fr.url.path.endswith("/L1/force-release") and json.loads(fr.content)["reason"] == "stuck worker"
    assert rv.url.path.endswith("/L1/revoke") and json.loads(rv.content)["reason"] == "incident-9"
    assert json.loads(rv.content)["incident_id"] == "INC-9" and "incident_id" not in json.loads(fr.content)
    assert by_id.method == "GET" and by_id.url.path == "/api/v1/target-leases/L1"
    assert int(by_id.url.params["deadline_at"]) > 0
    assert by_identity.url.path == "/api/v1/target-leases"
    assert dict(by_identity.url.params) | {"deadline_at": "x"} == IDENT.as_dict() | {"deadline_at": "x"}


async def test_list_parses_leases_and_cursor():
    payload = {"status": "success", "code": "lease_listed", "correlation_id": "c",
               "leases": [record(lease_id="L1"), record(lease_id="L2", fencing_token=8)], "cursor": "next-page"}
    seen = []
    client = mock_client(replying(200, payload, seen))
    r = await client.list({"program": "p1"}, limit=2, cursor="page-1")
    assert r.outcome == "ok" and [x.lease_id for x in r.leases] == ["L1", "L2"] and r.cursor == "next-page"
    params = seen[0].url.params
    assert params["program"] == "p1" and params["limit"] == "2" and params["cursor"] == "page-1"


async def test_commit_sends_lease_fields_document_and_body():
    seen = []
    reply = {"status": "success", "code": "commit_accepted", "correlation_id": "c", "doc": "d1", "rev": "2-x",
             "accepted_token": 7}
    client = mock_client(replying(200, reply, seen))
    r = await client.commit(a_lease(), "d1", {"n": 1})
    body = json.loads(seen[0].content)
    assert seen[0].url.path == "/api/v1/commits"
    assert body["lease_id"] == "L1" and body["fencing_token"] == 7 and body["lock_key"].startswith("starintel:")
    assert body["expires_at"] == T0_MS + 10000 and body["doc"] == "d1" and body["body"] == {"n": 1}
    assert body["execution_id"] == "e1" and body["trace_id"] == "tr1"
    assert r.outcome == "ok" and r.data["rev"] == "2-x" and r.lease is None


# -- typed lease -------------------------------------------------------------------

def test_lease_record_is_typed_with_times_in_unix_ms():
    lease = a_lease(surprise="kept")
    both = a_lease(expires_at_ms=T0_MS + 1, ended_at=T0, end_reason="release")
    assert both.expires_at_ms == T0_MS + 1 and both.ended_at_ms == T0_MS and both.end_reason == "release"
    with pytest.raises(LeaseProtocolError, match="expires_at_ms"):
        a_lease(expires_at_ms="soon")
    assert lease.acquired_at_ms == lease.renewed_at_ms == T0_MS
    assert lease.expires_at_ms == T0_MS + 10000 and lease.fencing_token == 7 and lease.state == "active"
    assert lease.identity == IDENT and lease.extra == {"surprise": "kept"}
    assert lease.history_value()["expires_at_ms"] == T0_MS + 10000


def test_parse_time_accepts_offsets_and_integers_and_rejects_naive_times():
    assert parse_time_ms("2030-01-02T04:04:05.678+01:00") == T0_MS
    assert parse_time_ms(T0_MS) == T0_MS
    with pytest.raises(LeaseProtocolError, match="UTC offset"):
        parse_time_ms("2030-01-02T03:04:05.678")
    with pytest.raises(LeaseProtocolError, match="RFC 3339"):
        parse_time_ms("yesterday")


# -- classification of server replies ---------------------------------------------

SECTION_9 = [
    (200, "lease_acquired", "ok"), (200, "lease_renewed", "ok"), (200, "lease_released", "ok"),
    (200, "lease_inspected", "ok"), (200, "lease_revoked", "ok"),
    (400, "invalid_lease_request", "fail"), (401, "invalid_credential", "fail"), (403, "access_denied", "fail"),
    (404, "lease_not_found", "fail"), (408, "deadline_exceeded", "fail"), (409, "lease_conflict", "fail"),
    (409, "lease_lost", "fail"), (409, "idempotency_conflict", "fail"), (429, "lease_rate_limited", "fail"),
    (503, "lease_backend_unavailable", "info"), (503, "lease_outcome_unknown", "info"),
]


@pytest.mark.parametrize("status,code,outcome", SECTION_9)
async def test_every_section_9_code_is_classified(status, code, outcome):
    payload = success(code) if status == 200 else error(code, retryable=status in (429, 503), retry_after_ms=250)
    r = await mock_client(replying(status, payload)).acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code, r.http_status) == (outcome, code, status)
    if status == 200:
        assert r.lease.lease_id == "L1"
    else:
        assert r.msg == f"because {code}" and r.retry_after_ms == 250 and r.correlation_id == "corr-2"
        assert r.lease is None and r.retryable is (status in (429, 503))


async def test_backend_unavailable_is_definite_only_when_nothing_was_submitted():
    marked = error("lease_backend_unavailable", True, submitted=False)
    r = await mock_client(replying(503, marked)).acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code) == ("fail", "lease_backend_unavailable")
    r = await mock_client(replying(503, error("lease_backend_unavailable", True, submitted=True))).acquire(IDENT, ttl_ms=1000)
    assert r.outcome == "info"
    trusting = mock_client(replying(503, error("lease_backend_unavailable", True)), backend_unavailable_is_definite=True)
    assert (await trusting.acquire(IDENT, ttl_ms=1000)).outcome == "fail"


@pytest.mark.parametrize("status,payload,code", [
    (500, b"Internal Server Error", "unparseable_response"),
    (502, b"<html>bad gateway</html>", "unparseable_response"),
    (200, b"{not json", "unparseable_response"),
    (200, b"[1, 2]", "unparseable_response"),
    (200, {"status": "success", "code": "lease_acquired", "lease": {"lease_id": "L1"}}, "unparseable_response"),
    (200, {"status": "success", "code": "lease_acquired"}, "unparseable_response"),
    (200, {"status": "error", "code": "lease_conflict"}, "lease_conflict"),
    (409, {"status": "error", "code": "something_new"}, "something_new"),
    (500, {"status": "error", "code": "lease_conflict"}, "lease_conflict"),
    (409, {"status": "success", "code": "lease_conflict"}, "lease_conflict"),
])
async def test_unusable_or_unexpected_replies_are_indeterminate(status, payload, code):
    r = await mock_client(replying(status, payload)).acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code, r.http_status) == ("info", code, status)


async def test_a_definite_code_is_only_trusted_under_its_section_9_status():
    r = await mock_client(replying(503, error("lease_conflict"))).acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code) == ("info", "lease_conflict")
    r = await mock_client(replying(409, error("lease_not_found"))).acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code) == ("info", "lease_not_found")
    r = await mock_client(replying(409, error("lease_outcome_unknown"))).acquire(IDENT, ttl_ms=1000)
    assert r.outcome == "info"


@pytest.mark.parametrize("exc,outcome,code", [
    (httpx.ConnectError("refused"), "fail", "connect_error"),
    (httpx.ReadTimeout("slow"), "info", "timeout"),
    (httpx.ReadError("reset"), "info", "connection_lost"),
    (httpx.RemoteProtocolError("Server disconnected without sending a response."), "info", "connection_lost"),
    (httpx.WriteError("broken pipe"), "info", "connection_lost"),
    (httpx.PoolTimeout("pool"), "fail", "deadline_exceeded"),
    (httpx.DecodingError("bad gzip"), "info", "unparseable_response"),
])
async def test_transport_errors_are_split_by_whether_anything_was_sent(exc, outcome, code):
    def handler(request):
        raise exc
    r = await mock_client(handler).acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code, r.http_status) == (outcome, code, None)
    assert r.call.request_id is not None


async def test_deadline_already_passed_sends_nothing():
    seen = []
    client = mock_client(replying(200, success(), seen))
    r = await client.acquire(IDENT, ttl_ms=1000, deadline_at_ms=client.clock_ms() - 1)
    assert (r.outcome, r.code) == ("fail", "deadline_exceeded") and seen == []


async def test_deadline_expiring_inside_an_untraced_transport_is_indeterminate():
    async def handler(request):
        await asyncio.sleep(5)
        return httpx.Response(200, json=success())
    r = await mock_client(handler).acquire(IDENT, ttl_ms=1000, deadline_s=0.05)
    assert (r.outcome, r.code) == ("info", "timeout")


# -- C23: a late renewal grants nothing ---------------------------------------------

class FakeClock:
    """A settable wall clock in Unix ms (the client's `clock_ms`)."""

    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


async def test_renewal_reply_after_the_deadline_grants_nothing():
    clock = FakeClock(T0_MS)

    async def handler(request):
        clock.ms = json.loads(request.content)["deadline_at"] + 1  # the reply lands 1 ms after the deadline
        return httpx.Response(200, json=success("lease_renewed"))
    client = mock_client(handler, clock_ms=clock)
    r = await client.renew(a_lease(), deadline_s=1.0)
    assert r.late and (r.outcome, r.code) == ("info", "late_reply")
    # an on-time renewal is granted
    clock_ok = FakeClock(T0_MS)
    on_time = mock_client(replying(200, success("lease_renewed")), clock_ms=clock_ok)
    r = await on_time.renew(a_lease(), deadline_s=1.0)
    assert not r.late and r.outcome == "ok"


async def test_late_acquire_reply_is_reported_but_still_what_happened():
    clock = FakeClock(T0_MS)

    async def handler(request):
        clock.ms += 5000
        return httpx.Response(200, json=success())
    r = await mock_client(handler, clock_ms=clock).acquire(IDENT, ttl_ms=1000, deadline_s=1.0)
    assert r.late and r.outcome == "ok"


# -- resolve (C17, C19) -----------------------------------------------------------

async def test_resolve_resends_the_same_request_id_with_a_fresh_deadline():
    seen = []
    replies = [httpx.Response(503, json=error("lease_outcome_unknown", True)), httpx.Response(200, json=success())]

    def handler(request):
        seen.append(json.loads(request.content))
        return replies.pop(0)
    client = mock_client(handler)
    first = await client.acquire(IDENT, ttl_ms=1000, deadline_s=1.0)
    assert first.outcome == "info"
    settled = await client.resolve(first, deadline_s=3.0)
    assert settled.outcome == "ok" and settled.lease.fencing_token == 7
    assert seen[0]["request_id"] == seen[1]["request_id"]
    assert seen[1]["deadline_at"] > seen[0]["deadline_at"]
    assert {k: v for k, v in seen[0].items() if k != "deadline_at"} == {k: v for k, v in seen[1].items() if k != "deadline_at"}
    assert await client.resolve(settled) is settled


async def test_resolve_retries_while_indeterminate():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(503, json=error("lease_outcome_unknown", True))
    client = mock_client(handler)
    r = await client.resolve(Call("acquire", "POST", "/api/v1/target-leases/acquire", {"request_id": "r9"}),
                             attempts=3, backoff_s=0)
    assert r.outcome == "info" and len(calls) == 3


# -- results helpers and eager validation -------------------------------------------

async def test_raise_for_outcome():
    ok = await mock_client(replying(200, success())).acquire(IDENT, ttl_ms=1000)
    assert ok.raise_for_outcome() is ok and ok.error() is None
    with pytest.raises(LeaseFailed, match="lease_conflict"):
        (await mock_client(replying(409, error("lease_conflict"))).acquire(IDENT, ttl_ms=1000)).raise_for_outcome()
    unknown = await mock_client(replying(503, error("lease_outcome_unknown"))).acquire(IDENT, ttl_ms=1000)
    assert unknown.error() == {"code": "lease_outcome_unknown", "msg": "because lease_outcome_unknown"}
    with pytest.raises(LeaseIndeterminate):
        unknown.raise_for_outcome()


async def test_bad_arguments_get_clear_errors():
    client = mock_client(replying(200, success()))
    with pytest.raises(ValueError, match="ttl_ms must be an integer >= 1"):
        await client.acquire(IDENT, ttl_ms=0)
    with pytest.raises(ValueError, match="not both"):
        await client.acquire(IDENT, ttl_ms=10, deadline_s=1, deadline_at_ms=5)
    with pytest.raises(ValueError, match="finite number of seconds"):
        await client.acquire(IDENT, ttl_ms=10, deadline_s=float("inf"))
    with pytest.raises(TypeError, match="lease_id string or an Identity"):
        await client.inspect(42)
    with pytest.raises(ValueError, match="non-empty reason"):
        await client.revoke(a_lease(), " ")
    with pytest.raises(ValueError, match="Identity.target_id"):
        Identity("t", "p", "ns", "", "a", "w")
    with pytest.raises(ValueError, match="base_url"):
        LeaseClient("localhost:80", "k", service_instance_id="w")


# -- real sockets: every transport, every way an exchange can end ------------------------

@pytest.fixture(params=["http11", "aiohttp"])
def transport(request):
    """The client's own transports for a real network (httpx is only ever injected, see mock_client)."""
    return request.param


@contextlib.asynccontextmanager
async def tcp_server(on_connection):
    """A loopback TCP server running `on_connection(reader, writer)`; yields its base URL."""
    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader):
    """Consume one HTTP/1.1 request (headers and Content-Length body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def test_connection_refused_is_a_definite_failure(transport):
    async with LeaseClient(f"http://127.0.0.1:{free_port()}", "k", service_instance_id="w",
                           transport=transport) as client:
        r = await client.acquire(IDENT, ttl_ms=1000, deadline_s=2)
    assert (r.outcome, r.code) == ("fail", "connect_error")


async def test_connection_reset_after_the_request_was_sent_is_indeterminate(transport):
    async def drop(reader, writer):
        await read_request(reader)
        writer.transport.abort()
    async with tcp_server(drop) as url, \
            LeaseClient(url, "k", service_instance_id="w", transport=transport) as client:
        r = await client.acquire(IDENT, ttl_ms=1000, deadline_s=2)
    assert (r.outcome, r.code) == ("info", "connection_lost")


async def test_silence_after_sending_is_an_indeterminate_timeout(transport):
    got = asyncio.Event()

    async def silent(reader, writer):
        await read_request(reader)
        got.set()
        await asyncio.sleep(10)
    async with tcp_server(silent) as url, \
            LeaseClient(url, "k", service_instance_id="w", transport=transport) as client:
        r = await client.acquire(IDENT, ttl_ms=1000, deadline_s=0.3)
    assert got.is_set() and (r.outcome, r.code) == ("info", "timeout")


async def test_deadline_spent_waiting_for_a_pooled_connection_is_a_definite_failure(transport):
    requests = []

    async def slow(reader, writer):
        requests.append(await read_request(reader))
        await asyncio.sleep(10)
    async with tcp_server(slow) as url, LeaseClient(url, "k", service_instance_id="w", max_connections=1,
                                                 transport=transport) as client:
        hog = asyncio.create_task(client.acquire(IDENT, ttl_ms=1000, deadline_s=1.0))
        await until(lambda: requests, what="the hog's request to hold the only connection")
        starved = await client.acquire(IDENT, ttl_ms=1000, deadline_s=0.2)
        held = await hog
    assert (starved.outcome, starved.code) == ("fail", "deadline_exceeded")
    assert (held.outcome, held.code) == ("info", "timeout") and len(requests) == 1


async def test_a_real_reply_over_keep_alive_is_ok(transport):
    async def answer(reader, writer):
        payload = json.dumps(success()).encode()
        for _ in range(2):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            await writer.drain()
        writer.close()
    async with tcp_server(answer) as url, \
            LeaseClient(url, "k", service_instance_id="w", transport=transport) as client:
        first = await client.acquire(IDENT, ttl_ms=1000)
        second = await client.release(first.lease)
    assert first.outcome == second.outcome == "ok" and first.lease.fencing_token == 7


async def test_many_concurrent_calls_share_keep_alive_connections(transport):
    connections = []

    async def answer_forever(reader, writer):
        connections.append(writer)
        payload = json.dumps(success()).encode()
        try:
            while True:
                await read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()
    async with tcp_server(answer_forever) as url, LeaseClient(url, "k", service_instance_id="w",
                                                              max_connections=20, transport=transport) as client:
        for _ in range(3):
            results = await asyncio.gather(*(client.acquire(IDENT, ttl_ms=1000) for _ in range(40)))
            assert [r.outcome for r in results] == ["ok"] * 40
    assert 1 < len(connections) <= 20  # concurrent, bounded by max_connections, reused across rounds


# -- the aiohttp transport: every way an exchange can break, on real sockets ----------------

def reply_bytes(head: bytes, body: bytes = b"") -> bytes:
    return head + b"\r\n\r\n" + body


async def exchange_with(reply: bytes | None, transport: str, *, deadline_s: float = 2.0):
    """One acquire against a server that reads the request, writes `reply` (None: nothing) and closes."""
    got = []

    async def serve(reader, writer):
        got.append(await read_request(reader))
        if reply is not None:
            writer.write(reply)
            await writer.drain()
        writer.close()
    async with tcp_server(serve) as url, \
            LeaseClient(url, "k", service_instance_id="w", transport=transport) as client:
        r = await client.acquire(IDENT, ttl_ms=1000, deadline_s=deadline_s)
    assert len(got) == 1, "the request must have reached the server"
    return r


async def test_a_clean_close_without_a_reply_is_indeterminate(transport):
    r = await exchange_with(None, transport)
    assert (r.outcome, r.code, r.http_status) == ("info", "connection_lost", None)


async def test_a_malformed_status_line_is_indeterminate(transport):
    r = await exchange_with(reply_bytes(b"HTTP/1.1 twohundred OK\r\ncontent-length: 2", b"{}"), transport)
    assert (r.outcome, r.code) == ("info", "connection_lost")


async def test_a_body_cut_short_is_indeterminate(transport):
    payload = json.dumps(success()).encode()
    r = await exchange_with(reply_bytes(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                                        + str(len(payload) + 50).encode(), payload), transport)
    assert (r.outcome, r.code) == ("info", "connection_lost")


async def test_an_undecodable_content_encoding_is_an_indeterminate_bad_reply(transport):
    r = await exchange_with(reply_bytes(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                        b"content-encoding: gzip\r\ncontent-length: 12", b"not gzip!!!!"), transport)
    assert (r.outcome, r.code) == ("info", "unparseable_response")


async def test_a_reply_that_is_not_json_is_indeterminate_with_its_status(transport):
    r = await exchange_with(reply_bytes(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 7", b"upstrea"), transport)
    assert (r.outcome, r.code, r.http_status) == ("info", "unparseable_response", 502)


async def test_a_redirect_is_not_followed(transport):
    r = await exchange_with(reply_bytes(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:9/x\r\n"
                                        b"content-length: 0"), transport)
    assert (r.outcome, r.code, r.http_status) == ("info", "unparseable_response", 307)


async def test_a_deadline_spent_connecting_is_a_definite_failure(transport):
    """A listener whose accept queue is full drops SYNs: the connect hangs, nothing can have been sent."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):  # fill the accept queue (never accepted)
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        async with LeaseClient(f"http://127.0.0.1:{port}", "k", service_instance_id="w",
                               transport=transport) as client:
            r = await client.acquire(IDENT, ttl_ms=1000, deadline_s=0.3)
        assert (r.outcome, r.code) == ("fail", "deadline_exceeded"), r
        assert "nothing was sent" in r.msg
    finally:
        for s in fillers:
            s.close()
        listener.close()


async def test_a_broken_keep_alive_connection_is_not_retried_behind_the_callers_back(transport):
    """A reused connection the server drops after reading: one request, one `info` (aiohttp would re-send a
    GET/DELETE once; the lab records one request per op)."""
    requests = []

    async def once_then_drop(reader, writer):
        payload = json.dumps({"status": "success", "code": "lease_listed", "leases": []}).encode()
        requests.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        await writer.drain()
        requests.append(await read_request(reader))
        writer.transport.abort()
    async with tcp_server(once_then_drop) as url, \
            LeaseClient(url, "k", service_instance_id="w", transport=transport) as client:
        first = await client.list()
        second = await client.list()
    assert first.outcome == "ok"
    assert (second.outcome, second.code) == ("info", "connection_lost")
    assert len(requests) == 2


def _request_info():
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    url = URL("http://127.0.0.1:9/api/v1/target-leases/acquire")
    return aiohttp.RequestInfo(url, "POST", CIMultiDictProxy(CIMultiDict()), url)


@pytest.mark.parametrize("make_exc,code_before,code_after", [
    (lambda: __import__("aiohttp").ServerDisconnectedError(), "connection_lost", "connection_lost"),
    (lambda: __import__("aiohttp").ClientOSError(104, "reset"), "connection_lost", "connection_lost"),
    (lambda: __import__("aiohttp").ClientResponseError(_request_info(), (), message="bad status line"),
     "connection_lost", "connection_lost"),
    (lambda: __import__("aiohttp").ClientPayloadError("Response payload is not completed"),
     "connection_lost", "connection_lost"),
    (lambda: __import__("aiohttp").SocketTimeoutError("read"), "deadline_exceeded", "timeout"),
    (lambda: TimeoutError(), "deadline_exceeded", "timeout"),
    (lambda: ConnectionResetError(104, "reset"), "connection_lost", "connection_lost"),
])
@pytest.mark.parametrize("sent", [False, True])
async def test_aiohttp_errors_are_split_by_whether_a_connection_was_in_hand(monkeypatch, make_exc, code_before,
                                                                            code_after, sent):
    """Every aiohttp error kind: `fail` when the transport had no connection yet (nothing written), else `info`."""
    async def exchange(self, call, content, params, headers, probe):
        probe.sent = sent
        raise make_exc()
    monkeypatch.setattr(LeaseClient, "_aiohttp_exchange", exchange)
    async with LeaseClient("http://127.0.0.1:9", "k", service_instance_id="w", transport="aiohttp") as client:
        r = await client.acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code) == (("info", code_after) if sent else ("fail", code_before))



@pytest.mark.parametrize("make_exc,code_before,code_after", [
    (lambda: http11.ExchangeLost("connection closed before a complete reply"), "connection_lost", "connection_lost"),
    (lambda: TimeoutError(), "deadline_exceeded", "timeout"),
    (lambda: ConnectionResetError(104, "reset"), "connection_lost", "connection_lost"),
])
@pytest.mark.parametrize("sent", [False, True])
async def test_http11_errors_are_split_by_whether_a_connection_was_in_hand(monkeypatch, make_exc, code_before,
                                                                           code_after, sent):
    """Every http11 error kind: `fail` when no connection was in hand yet (nothing written), else `info`."""
    async def request(self, data, probe):
        probe.sent = sent
        raise make_exc()
    monkeypatch.setattr(http11.Pool, "request", request)
    async with LeaseClient("http://127.0.0.1:9", "k", service_instance_id="w", transport="http11") as client:
        r = await client.acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code) == (("info", code_after) if sent else ("fail", code_before))


@pytest.mark.parametrize("make_exc,outcome,code", [
    (lambda: http11.ConnectFailed(111, "Connection refused"), "fail", "connect_error"),
    (lambda: http11.BadEncoding("cannot decode the gzip body"), "info", "unparseable_response"),
])
async def test_http11_connect_failures_and_undecodable_bodies(monkeypatch, make_exc, outcome, code):
    async def request(self, data, probe):
        probe.sent = code != "connect_error"
        raise make_exc()
    monkeypatch.setattr(http11.Pool, "request", request)
    async with LeaseClient("http://127.0.0.1:9", "k", service_instance_id="w", transport="http11") as client:
        r = await client.acquire(IDENT, ttl_ms=1000)
    assert (r.outcome, r.code, r.http_status) == (outcome, code, None)


async def test_http11_request_framing_and_header_safety():
    """The request on the wire: one request line, Host, our headers, Content-Length; no header forging."""
    seen = []

    async def answer(reader, writer):
        seen.append(await read_request(reader))
        payload = json.dumps(success()).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                     + hex(len(payload))[2:].encode() + b"\r\n" + payload + b"\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()
    async with tcp_server(answer) as url, \
            LeaseClient(url + "/prefix/", "sekrit", service_instance_id="w", transport="http11") as client:
        r = await client.acquire(IDENT, ttl_ms=1000, request_id="rid-1")
    assert r.ok and r.lease.fencing_token == 7  # a chunked reply is read whole
    head, body = seen[0].split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /prefix/api/v1/target-leases/acquire HTTP/1.1"
    assert f"host: {url.split('//')[1]}".encode() in lines and b"authorization: Bearer sekrit" in lines
    assert f"content-length: {len(body)}".encode() in lines and json.loads(body)["request_id"] == "rid-1"
    with pytest.raises(ValueError, match="line break"):
        LeaseClient(url, "k\r\nx-evil: 1", service_instance_id="w", transport="http11")
    with pytest.raises(ValueError, match="http11 transport"):
        LeaseClient("https://lease.test", "k", service_instance_id="w", transport="http11")
    with pytest.raises(ValueError, match="transport must be one of"):
        LeaseClient(url, "k", service_instance_id="w", transport="curl")


async def test_an_environment_proxy_is_used_and_no_proxy_is_honoured(monkeypatch):
    """HTTP_PROXY applies as it did with httpx (trust_env): the request goes to the proxy in absolute form."""
    seen = []

    async def proxy(reader, writer):
        seen.append(await read_request(reader))
        payload = json.dumps(success()).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        await writer.drain()
        writer.close()
    async with tcp_server(proxy) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("http_proxy", raising=False)
        async with LeaseClient("http://lease.test:8080", "k", service_instance_id="w") as client:
            assert client._pool is None and client._proxy == proxy_url  # aiohttp carries proxied URLs
            r = await client.acquire(IDENT, ttl_ms=1000)
        assert r.ok and seen[0].startswith(b"POST http://lease.test:8080/api/v1/target-leases/acquire HTTP/1.1\r\n")
        monkeypatch.setenv("NO_PROXY", "lease.test")
        bypass = LeaseClient("http://lease.test:8080", "k", service_instance_id="w")
        assert bypass._proxy is None and bypass._pool is not None
        await bypass.aclose()


async def test_deadlines_striking_everywhere_leak_no_pool_slot(transport):
    """Calls cut off while waiting for a slot, connecting or awaiting a reply give their slots back."""
    slow = {"on": True}
    accepted, read_while_slow = [], []

    async def serve(reader, writer):
        accepted.append(writer)
        payload = json.dumps(success()).encode()
        try:
            while True:
                await read_request(reader)
                if slow["on"]:
                    read_while_slow.append(1)
                    await asyncio.sleep(10)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
    async with tcp_server(serve) as url, \
            LeaseClient(url, "k", service_instance_id="w", max_connections=2, transport=transport) as client:
        cut = await asyncio.gather(*(client.acquire(IDENT, ttl_ms=1000, deadline_s=0.2) for _ in range(10)))
        assert {(r.outcome, r.code) for r in cut} <= {("info", "timeout"), ("fail", "deadline_exceeded")}
        # a `fail` was never sent: every request the server read is one of the `info` calls
        assert len(read_while_slow) <= sum(r.outcome == "info" for r in cut)
        slow["on"] = False
        again = await asyncio.gather(*(client.acquire(IDENT, ttl_ms=1000, deadline_s=5) for _ in range(6)))
        assert [r.outcome for r in again] == ["ok"] * 6
        if client._pool is not None:
            assert client._pool.open <= 2 and not client._pool.waiters
