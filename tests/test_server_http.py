"""Section 9 (envelopes and status codes) and section 13 (the wire API) of the reference server.

One test per status code of the section-9 table (the two 503s live in
test_server_failures.py, which needs dedicated Valkeys), the bad-input list
(each a 400 naming the field, never a 500), correlation ids, and the OpenAPI
document.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lab.server.errors import HTTP_STATUS
from lab.server.openapi import openapi_document
from lab.server.testing import body, identity, in_process_server
from lab.server.wire import now_ms

from conftest import lease_expired

P = "/api/v1/target-leases"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
async def srv(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url, min_ttl_ms=50) as s:
        yield s


def assert_error(r, status: int, code: str) -> dict:
    """The section-9 error envelope, exactly."""
    assert r.status_code == status, r.text
    b = r.json()
    assert set(b) - {"retry_after_ms"} == {"status", "code", "msg", "correlation_id", "retryable"}
    assert b["status"] == "error" and b["code"] == code and HTTP_STATUS[code] == status
    assert isinstance(b["retryable"], bool) and b["msg"] and b["correlation_id"]
    assert r.headers["x-correlation-id"] == b["correlation_id"]
    assert "Traceback" not in r.text and "starintel:target-lease" not in r.text
    return b


def assert_success(r, code: str) -> dict:
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["status"] == "success" and b["code"] == code and b["correlation_id"]
    return b


# -- 200: every success code -----------------------------------------------------------------------

async def test_200_every_success_code(srv):
    lease = assert_success(await srv.acquire(), "lease_acquired")["lease"]
    assert_success(await srv.renew(lease), "lease_renewed")
    assert_success(await srv.inspect(lease["lease_id"]), "lease_inspected")
    assert_success(await srv.client.get(P, params=identity(), headers=srv.headers("lease-a1")), "lease_inspected")
    listed = assert_success(await srv.client.get(P, headers=srv.headers("lease-a1")), "lease_listed")
    assert [x["lease_id"] for x in listed["leases"]] == [lease["lease_id"]] and listed["next_cursor"] is None
    assert_success(await srv.release(lease), "lease_released")
    lease = assert_success(await srv.acquire(), "lease_acquired")["lease"]
    assert_success(await srv.admin("force-release", lease), "lease_released")
    lease = assert_success(await srv.acquire(), "lease_acquired")["lease"]
    assert_success(await srv.admin("revoke", lease), "lease_revoked")


# -- 400 -----------------------------------------------------------------------------------------

def _without(name):
    b = body()
    del b[name]
    return b


BAD_INPUTS = [
    ("malformed JSON", b'{"tenant_id": "tenant-a",', "body"),
    ("not an object", b"[1, 2, 3]", "body"),
    ("empty body", b"", "body"),
    ("unknown field", {**body(), "lock_key": "starintel:target-lease:v1:x"}, "lock_key"),
    ("oversized metadata", {**body(), "metadata": {"k": "v" * 5000}}, "metadata"),
    ("control character", {**body(), "actor_name": "actor\u00071"}, "actor_name"),
    ("control character in target", {**body(), "target_id": "exa\tmple.com"}, "target_id"),
    ("path syntax", {**body(), "target_id": "../../etc/passwd"}, "target_id"),
    ("slash in identifier", {**body(), "tenant_id": "tenant-a/x"}, "tenant_id"),
    ("absurd ttl", {**body(), "ttl_ms": 10**15}, "ttl_ms"),
    ("negative ttl", {**body(), "ttl_ms": -1000}, "ttl_ms"),
    ("missing ttl", _without("ttl_ms"), "ttl_ms"),
    ("missing deadline", _without("deadline_at"), "deadline_at"),
    ("missing request_id", _without("request_id"), "request_id"),
    ("missing service instance", _without("service_instance_id"), "service_instance_id"),
    ("missing identity field", _without("target_namespace"), "target_namespace"),
    ("bad request_id", {**body(), "request_id": "has spaces"}, "request_id"),
    ("bad operation class", {**body(), "operation_class": "nuke"}, "operation_class"),
    ("non-string identity", {**body(), "program_id": {"$gt": ""}}, "program_id"),
    ("body too large", {**body(), "metadata": {"k": "v" * 20000}}, "body"),
]


@pytest.mark.parametrize("what,payload,field", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
async def test_400_bad_input_names_the_field(srv, valkey, what, payload, field):
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    r = await srv.client.post(P + "/acquire", content=raw, headers=srv.headers("lease-a1", **{
        "content-type": "application/json"}))
    b = assert_error(r, 400, "invalid_lease_request")
    assert b["msg"].startswith(field + ":"), b["msg"]
    assert b["retryable"] is False


async def test_400_bad_path_and_query(srv):
    r = await srv.client.post(P + "/not%20an%20id/renew", json=body(ttl_ms=None, fencing_token=1),
                              headers=srv.headers("lease-a1"))
    assert assert_error(r, 400, "invalid_lease_request")["msg"].startswith("lease_id:")
    r = await srv.client.get(P, params={"limit": "3", "limit2": "x"}, headers=srv.headers("lease-a1"))
    assert assert_error(r, 400, "invalid_lease_request")["msg"].startswith("limit2:")
    r = await srv.client.get(P + "?limit=2&limit=3", headers=srv.headers("lease-a1"))
    assert assert_error(r, 400, "invalid_lease_request")["msg"].startswith("limit:")
    r = await srv.client.get(P, params={**identity(), "target_id": "a/b"}, headers=srv.headers("lease-a1"))
    assert assert_error(r, 400, "invalid_lease_request")["msg"].startswith("target_id:")


async def test_400_unknown_routes_and_methods_get_the_envelope(srv):
    assert_error(await srv.client.get("/api/v1/nothing-here", headers=srv.headers("lease-a1")), 400,
                 "invalid_lease_request")
    assert_error(await srv.client.delete(P + "/abc", headers=srv.headers("lease-a1")), 400, "invalid_lease_request")


# -- 401, 403 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("auth", [None, "Bearer", "Basic dXNlcjpwYXNz", "Bearer flk.lease-a1-k1.wrong",
                                  "Bearer not-a-key-at-all"])
async def test_401_invalid_credential(srv, auth):
    headers = {} if auth is None else {"authorization": auth}
    r = await srv.client.post(P + "/acquire", json=body(), headers=headers)
    b = assert_error(r, 401, "invalid_credential")
    assert b["retryable"] is False


async def test_403_access_denied_for_capability_and_scope(srv):
    assert_error(await srv.acquire(principal="force-a"), 403, "access_denied")       # no targets:lease
    assert_error(await srv.acquire(principal="nocap-a"), 403, "access_denied")       # no capability at all
    assert_error(await srv.acquire(principal="lease-b1"), 403, "access_denied")      # other tenant
    assert_error(await srv.acquire(principal="lease-a1-dns", target_namespace="ipv4"), 403, "access_denied")
    assert_error(await srv.client.get(P, headers=srv.headers("nocap-a")), 403, "access_denied")


# -- 404, 408 ------------------------------------------------------------------------------------

async def test_404_lease_not_found(srv):
    assert_error(await srv.inspect("00000000-0000-4000-8000-000000000000"), 404, "lease_not_found")
    r = await srv.client.get(P, params=identity(target_id="never.example"), headers=srv.headers("lease-a1"))
    assert_error(r, 404, "lease_not_found")


async def test_408_deadline_exceeded(srv):
    b = assert_error(await srv.acquire(deadline_in_ms=-5), 408, "deadline_exceeded")
    assert b["retryable"] is True
    r = await srv.client.get(P, params={"deadline_at": str(now_ms() - 10)}, headers=srv.headers("lease-a1"))
    assert_error(r, 408, "deadline_exceeded")


# -- 409 x3 --------------------------------------------------------------------------------------

async def test_409_lease_conflict(srv):
    await srv.acquire()
    b = assert_error(await srv.acquire(principal="lease-a1-peer"), 409, "lease_conflict")
    assert b["retryable"] is True and b["retry_after_ms"] > 0


async def test_409_lease_lost(srv):
    lease = (await srv.acquire()).json()["lease"]
    b = assert_error(await srv.renew(lease, principal="lease-a1-peer"), 409, "lease_lost")
    assert b["retryable"] is False and "lease-a1" not in b["msg"]


async def test_409_idempotency_conflict(srv):
    first = body()
    await srv.client.post(P + "/acquire", json=first, headers=srv.headers("lease-a1"))
    r = await srv.client.post(P + "/acquire", json={**first, "ttl_ms": 900}, headers=srv.headers("lease-a1"))
    assert assert_error(r, 409, "idempotency_conflict")["retryable"] is False


# -- 429 -----------------------------------------------------------------------------------------

async def test_429_rate_limited_per_principal_and_target(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url, rate_per_principal_target=1.0, burst_per_principal_target=2) as s:
        codes = [(await s.acquire(principal="lease-a1-peer")).json()["code"] for _ in range(3)]
        assert codes[:2] == ["lease_acquired", "lease_conflict"]
        b = assert_error(await s.acquire(principal="lease-a1-peer"), 429, "lease_rate_limited")
        assert b["retryable"] is True and 0 < b["retry_after_ms"] <= 1000
        # another principal, or another target, has its own bucket
        assert (await s.acquire(principal="lease-a1")).json()["code"] == "lease_conflict"
        assert (await s.acquire(principal="lease-a1-peer", target_id="other.example")).status_code == 200


async def test_429_active_lease_quota(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url, active_lease_quota=2, min_ttl_ms=50) as s:
        a = (await s.acquire(target_id="t1")).json()["lease"]
        t2 = (await s.acquire(target_id="t2", ttl_ms=700)).json()["lease"]
        b = assert_error(await s.acquire(target_id="t3"), 429, "lease_rate_limited")
        assert "quota" in b["msg"] and 0 < b["retry_after_ms"] <= 700
        assert (await s.release(a)).status_code == 200
        assert (await s.acquire(target_id="t3")).status_code == 200
        assert (await s.acquire(target_id="t4")).status_code == 429
        await lease_expired(s, t2)  # its slot frees itself
        assert (await s.acquire(target_id="t4")).status_code == 200


async def test_defaults_let_a_100_way_burst_through(srv):
    rs = await asyncio.gather(*(srv.acquire(target_id=f"burst-{i % 10}") for i in range(100)))
    assert {r.status_code for r in rs} == {200, 409}
    assert sum(r.status_code == 200 for r in rs) == 10


# -- envelopes, correlation ids, no leaks ----------------------------------------------------------

async def test_correlation_id_is_echoed_or_generated(srv):
    r = await srv.acquire()
    assert r.json()["correlation_id"] == r.headers["x-correlation-id"] and len(r.json()["correlation_id"]) >= 16
    r = await srv.client.post(P + "/acquire", json=body(), headers=srv.headers("lease-a1", **{
        "x-correlation-id": "corr-123"}))
    assert r.json()["correlation_id"] == "corr-123" == r.headers["x-correlation-id"]
    r = await srv.client.post(P + "/acquire", json=body(), headers={"x-correlation-id": "corr-456"})
    assert r.status_code == 401 and r.json()["correlation_id"] == "corr-456"
    r = await srv.client.post(P + "/acquire", json=body(), headers={"x-correlation-id": "bad id\u00e9".encode()})
    assert r.json()["correlation_id"] != "bad id\u00e9"


async def test_unhandled_exceptions_become_a_503_envelope(srv, monkeypatch):
    async def boom(*a, **k):
        raise RuntimeError("secret internal detail")
    monkeypatch.setattr(srv.server.service, "acquire", boom)
    b = assert_error(await srv.acquire(), 503, "lease_backend_unavailable")
    assert "secret internal detail" not in json.dumps(b)


async def test_times_are_rfc3339_utc_with_milliseconds(srv):
    lease = (await srv.acquire()).json()["lease"]
    import datetime as dt
    for name in ("acquired_at", "renewed_at", "expires_at"):
        text = lease[name]
        assert text.endswith("Z") and len(text.split(".")[1]) == 4
        parsed = dt.datetime.fromisoformat(text)
        assert int(parsed.timestamp() * 1000) == lease[name + "_ms"]


# -- OpenAPI ---------------------------------------------------------------------------------------

async def test_openapi_is_served_equals_the_docs_file_and_covers_every_route(srv):
    r = await srv.client.get("/openapi.json")
    assert r.status_code == 200
    served = r.json()
    # a server describes its own bounds (this one: min_ttl_ms=50); the docs file holds the defaults
    assert served == json.loads(json.dumps(openapi_document(srv.server.settings)))
    assert served["paths"][P + "/acquire"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]["ttl_ms"]["minimum"] == 50
    assert json.loads((REPO / "docs" / "openapi.json").read_text()) == json.loads(json.dumps(openapi_document()))
    assert served["openapi"].startswith("3.")
    for route in srv.app.routes:
        assert route.path in served["paths"], route.path
        for method in route.methods - {"HEAD"}:
            assert method.lower() in served["paths"][route.path], (route.path, method)
    documented_codes = set(served["components"]["schemas"]["Error"]["properties"]["code"]["enum"])
    assert documented_codes == {c for c, s in HTTP_STATUS.items() if s != 200}


# -- deadline_at is RFC 3339, not whatever fromisoformat takes -----------------------------------------

RFC3339_OK = ["2099-01-01T00:00:00Z", "2099-01-01t00:00:00z", "2099-01-01T00:00:00.123456789+05:30",
              "2098-12-31T23:59:60Z", "2099-01-01T00:00:00-00:00"]
RFC3339_BAD = ["2099-W01-1T00:00:00Z",            # ISO 8601 week date
               "20990101T000000Z",                # ISO 8601 basic format
               "2099-01-01T00:00Z",               # no seconds
               "2099-01-01T00:00:00",             # no zone
               "2099-01-01T00:00:00+0530",        # offset without a colon
               "2099-01-01 00:00:00Z",            # a space for the T
               "2099-02-30T00:00:00Z",            # no such day
               "2099-01-01T00:00:00+24:00",       # no such offset
               "\uff12099-01-01T00:00:00Z",       # a fullwidth digit
               "2099-01-01T00:00:00.\u0661Z"]     # an Arabic-Indic digit


async def test_deadline_at_is_parsed_as_rfc3339(srv):
    for i, text in enumerate(RFC3339_OK):
        r = await srv.acquire(target_id=f"rfc-{i}", deadline_at=text)
        assert_success(r, "lease_acquired")
    for text in RFC3339_BAD:
        b = assert_error(await srv.acquire(target_id="rfc-bad", deadline_at=text), 400, "invalid_lease_request")
        assert b["msg"].startswith("deadline_at:") and b["retryable"] is False, (text, b)
    for text in ("2001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "0001-01-01T00:00:00Z"):  # valid, merely past
        past = assert_error(await srv.acquire(deadline_at=text), 408, "deadline_exceeded")
        assert past["retryable"] is True


async def test_openapi_bounds_are_the_ones_the_server_enforces(srv):
    """At each documented bound the server accepts the value, one step past it refuses it (400 naming it)."""
    import re

    doc = (await srv.client.get("/openapi.json")).json()
    props = doc["paths"][P + "/acquire"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    st = srv.server.settings
    cases = []
    for name, lo, hi in (("ttl_ms", st.min_ttl_ms, st.max_ttl_ms), ("wait_ms", 0, st.max_acquire_wait_ms),
                         ("maximum_lifetime_ms", 1, st.max_lifetime_ms)):
        assert (props[name]["minimum"], props[name]["maximum"]) == (lo, hi), name
        ok_values = [hi] if name == "maximum_lifetime_ms" else [lo, hi]  # it must also be >= ttl_ms
        cases += [(name, v, True) for v in ok_values] + [(name, lo - 1, False), (name, hi + 1, False)]
    target = props["target_id"]
    cases += [("target_id", "t" * target["maxLength"], True), ("target_id", "t" * (target["maxLength"] + 1), False)]
    rid = props["request_id"]
    cases += [("request_id", "r" * rid["maxLength"], True), ("request_id", "r" * (rid["maxLength"] + 1), False)]
    for i, (name, value, accepted) in enumerate(cases):
        fields = {name: value, "target_id": f"bound-{i}"} if name != "target_id" else {name: value}
        if name == "maximum_lifetime_ms":
            fields["ttl_ms"] = st.min_ttl_ms
        r = await srv.acquire(**fields)
        if accepted:
            assert r.status_code == 200, (name, value, r.text)
            await srv.release(r.json()["lease"])
        else:
            assert r.status_code == 400 and r.json()["msg"].startswith(name + ":"), (name, value, r.text)
    # the patterns say what the parsers say
    ident = re.compile(props["tenant_id"]["pattern"])
    assert ident.match("tenant-a") and ident.match("A.b@c") and not ident.match("a..b") and not ident.match("-a")
    deadline = re.compile(props["deadline_at"]["oneOf"][0]["pattern"])
    assert deadline.match("2030-01-01T00:00:00.5+05:30") and not deadline.match("2030-W01-1T00:00:00Z")
    for text in RFC3339_BAD[:6]:
        assert not deadline.match(text), text
    limit = next(q for q in doc["paths"][P]["get"]["parameters"] if q["name"] == "limit")["schema"]
    assert limit["maximum"] == st.max_page_size
    r = await srv.client.get(P, params={"limit": str(limit["maximum"] + 1)}, headers=srv.headers("lease-a1"))
    assert r.status_code == 400 and r.json()["msg"].startswith("limit:")


# -- null: the OpenAPI document and the server agree -------------------------------------------------

def allows_null(schema: dict) -> bool:
    """Does this (OpenAPI 3.1 / JSON Schema) property schema accept JSON null?"""
    if "oneOf" in schema:
        return any(allows_null(s) for s in schema["oneOf"])
    types = schema.get("type")
    nullable_type = types == "null" or (isinstance(types, list) and "null" in types)
    return nullable_type and ("enum" not in schema or None in schema["enum"])


def request_schema(doc: dict, path: str) -> dict:
    return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


async def test_every_optional_field_may_be_null_in_the_document_and_at_the_server(srv):
    """null reads as absent: documented for every optional body field, accepted, and the same request (C16)."""
    doc = (await srv.client.get("/openapi.json")).json()
    for path in doc["paths"]:
        if "post" in doc["paths"][path]:
            schema = request_schema(doc, path)
            for name, prop in schema["properties"].items():
                assert allows_null(prop) == (name not in schema["required"]), (path, name)
    acquire = request_schema(doc, P + "/acquire")
    optional = sorted(set(acquire["properties"]) - set(acquire["required"]))
    assert optional == ["client_id", "execution_id", "job_id", "maximum_lifetime_ms", "metadata", "operation_class",
                        "trace_id", "wait_ms"]
    for i, name in enumerate(optional):
        b = body(target_id=f"null-{i}", **{name: None})
        r = await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))
        lease = assert_success(r, "lease_acquired")["lease"]
        del b[name]  # the same request without the field: a replay, not an idempotency conflict
        again = await srv.client.post(P + "/acquire", json=b, headers=srv.headers("lease-a1"))
        assert assert_success(again, "lease_acquired")["replayed"] is True, (name, again.text)
        nulls = {n: None for n in ("operation_class", "trace_id", "execution_id", "job_id")}
        assert_success(await srv.renew(lease, ttl_ms=None, **nulls), "lease_renewed")
        assert_success(await srv.admin("revoke", lease, incident_id=None, **nulls), "lease_revoked")
