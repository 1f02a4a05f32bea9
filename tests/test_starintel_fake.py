"""A fake StarIntel lease server, built from the dialect spec, and tests that it speaks the dialect.

`/work/shared/spec/starintel-http-dialect.md` (and the server's route file it
describes) is all this fake knows: in-memory leases with fencing counters per
identity, a TTL measured by its own clock (`FakeClock`, movable by tests),
idempotency by `request_id` / `Idempotency-Key` (mismatch and required
errors, replays of successful mutations, `idempotency_conflict` on a changed
body), `star_sk_v1_<credential-id>_<hex-secret>` bearer keys with
capabilities and scopes, the dialect's bare codes under its own statuses,
lease records with a nested identity and Unix-ms times, and a
`service_instance_id` that is each instance's own. Several app instances
share one `FakeStore` (one Valkey behind several servers). `FakeStore.inject`
makes the next call of an operation answer a given code, before or after
performing it, to drive the client's definite / indefinite split.

The app runs in-process (`httpx.ASGITransport`) or on real sockets in a
background thread (`FakeCluster`, uvicorn servers stopped on exit).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from lab.stack.process import free_port

API = "/api/v1/target-leases"
IDENTITY = ("tenant_id", "program_id", "target_namespace", "target_id", "actor_name", "workflow_name",
            "operation_class")
REQUIRED = ("tenant_id", "program_id", "target_namespace", "target_id", "actor_name")
DEFAULT_TTL_MS = 30_000  # STAR_TARGET_LEASE_DEFAULT_TTL_MS
MAX_LIFETIME_MS = 300_000  # STAR_TARGET_LEASE_MAXIMUM_LIFETIME_MS
DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS = 5_000, 60_000
STATUS = {"acquired": 201, "renewed": 200, "released": 200, "found": 200, "listed": 200, "revoked": 200,
          "invalid_request": 400, "unauthenticated": 401, "unauthorized": 403, "not_found": 404, "conflict": 409,
          "idempotency_conflict": 409, "not_owner": 409, "stale_token": 412, "expired": 412, "rate_limited": 429,
          "backend_unavailable": 503, "outcome_unknown": 503, "deadline_exceeded": 504}
MESSAGES = {"acquired": "Target lease acquired", "conflict": "Target lease is held by another owner",
            "stale_token": "Target lease fencing token is stale", "expired": "Target lease has expired",
            "not_owner": "Target lease ownership does not match", "not_found": "Target lease not found"}


class FakeClock:
    """The server's own clock: wall time in Unix ms plus an offset tests move."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    def advance(self, ms: int) -> None:
        self.offset_ms += ms


@dataclass
class Principal:
    id: str
    capabilities: tuple[str, ...]
    scopes: tuple[str, ...]


@dataclass
class FakeStore:
    """What every fake instance shares: leases, counters, idempotency records, credentials, injected faults."""

    clock: FakeClock = field(default_factory=FakeClock)
    current: dict[tuple, dict] = field(default_factory=dict)  # identity -> its current lease record
    by_id: dict[str, dict] = field(default_factory=dict)
    counters: dict[tuple, int] = field(default_factory=dict)  # never reset: the fencing counter (C5)
    idempotency: dict[tuple, tuple[str, int, dict]] = field(default_factory=dict)
    credentials: dict[str, tuple[str, Principal]] = field(default_factory=dict)
    faults: list[tuple[str, str, bool, int | None]] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)  # what arrived: method, path, headers, body
    ids: Any = field(default_factory=lambda: itertools.count(1))

    def add_credential(self, principal_id: str, capabilities=("targets:lease",),
                       scopes=("tenant:*", "program:*", "actor:*")) -> str:
        """A new API key `star_sk_v1_<id>_<hex>` for a principal."""
        cred_id = f"cred{len(self.credentials) + 1}"
        secret = os.urandom(32).hex()
        self.credentials[cred_id] = (secret, Principal(principal_id, tuple(capabilities), tuple(scopes)))
        return f"star_sk_v1_{cred_id}_{secret}"

    def inject(self, op: str, code: str, *, after: bool = False, status: int | None = None) -> None:
        """The next `op` answers `code` (under `status`, default the dialect's); with `after`, once it has run."""
        self.faults.append((op, code, after, status))

    def take_fault(self, op: str) -> tuple[str, bool, int | None] | None:
        for i, (fop, code, after, status) in enumerate(self.faults):
            if fop == op:
                del self.faults[i]
                return code, after, status
        return None


class Refused(Exception):
    """A request answered with a dialect code before the operation ran."""

    def __init__(self, code: str, msg: str | None = None, status: int | None = None):
        super().__init__(code)
        self.code, self.msg, self.status = code, msg, status


def envelope(code: str, *, lease=None, leases=None, msg=None, correlation_id="corr", status=None) -> JSONResponse:
    """The dialect's envelope under its status (no retryable, no retry_after_ms)."""
    http = status or STATUS.get(code, 500)
    body: dict[str, Any] = {"status": "success" if http < 400 else "error", "code": code,
                            "msg": msg or MESSAGES.get(code, code.replace("_", " ")), "correlation_id": correlation_id}
    if lease is not None:
        body["lease"] = lease
    if leases is not None:
        body["leases"] = leases
    return JSONResponse(body, status_code=http)


class FakeInstance:
    """One StarIntel server instance (its own service_instance_id) over a shared store."""

    def __init__(self, store: FakeStore, service_instance_id: str):
        self.store = store
        self.service_instance_id = service_instance_id

    # -- request plumbing ------------------------------------------------------
    def principal(self, request: Request) -> Principal:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or " " in auth[7:]:
            raise Refused("invalid_credential", "Authentication failed", 401)
        parts = auth[7:].split("_")
        if len(parts) != 5 or parts[:3] != ["star", "sk", "v1"] or parts[3] not in self.store.credentials:
            raise Refused("invalid_credential", "Authentication failed", 401)
        secret, principal = self.store.credentials[parts[3]]
        if parts[4] != secret:
            raise Refused("invalid_credential", "Authentication failed", 401)
        return principal

    async def body(self, request: Request) -> dict:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise Refused("invalid_lease_request", "Request body must be a JSON object", 400)
        return body

    @staticmethod
    def request_id(request: Request, body: dict) -> str:
        header, body_id = request.headers.get("idempotency-key"), body.get("request_id")
        if header and body_id and header != body_id:
            raise Refused("idempotency_key_mismatch", "Idempotency-Key and request_id must match", 400)
        rid = header or body_id
        if not isinstance(rid, str) or not rid:
            raise Refused("idempotency_key_required", "A logical request id is required", 400)
        return rid

    @staticmethod
    def identity(source: Any, *, query: bool = False) -> tuple:
        values = []
        for name in IDENTITY:
            v = source.get(name)
            if v is None and name in ("workflow_name", "operation_class"):
                v = "default"
            if not isinstance(v, str) or not v:
                raise Refused("missing_query_parameter" if query else "invalid_lease_request",
                              f"Lease request requires a non-empty {name} field", 400)
            values.append(v)
        return tuple(values)

    @staticmethod
    def positive(body: dict, name: str, required: bool = False) -> int | None:
        v = body.get(name)
        if v is None and not required:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise Refused("invalid_lease_request", f"Lease field {name} must be a positive integer", 400)
        return v

    @staticmethod
    def authorize(principal: Principal, identity: tuple, capability: str) -> None:
        if capability not in principal.capabilities and "admin" not in principal.capabilities:
            raise Refused("unauthorized", "Access denied")
        want = {"tenant": identity[0], "program": identity[1], "target-namespace": identity[2],
                "target": identity[3], "actor": identity[4]}
        for kind, value in want.items():
            allowed = [s.split(":", 1)[1] for s in principal.scopes if s.startswith(kind + ":")]
            if allowed and "*" not in allowed and value not in allowed:
                raise Refused("unauthorized", "Access denied")

    def timeout_ms(self, request: Request) -> int:
        """X-Request-Timeout-Ms: 1..max, else the default (as the server's middleware)."""
        try:
            v = int(request.headers.get("x-request-timeout-ms", ""))
        except ValueError:
            return DEFAULT_TIMEOUT_MS
        return v if 1 <= v <= MAX_TIMEOUT_MS else DEFAULT_TIMEOUT_MS

    def record_json(self, rec: dict) -> dict:
        """The record as the dialect shows it: nested identity, Unix-ms times, no service_instance_id."""
        out = {k: v for k, v in rec.items() if k not in ("identity", "service_instance_id")}
        out["identity"] = dict(zip(IDENTITY, rec["identity"]))
        if out["state"] == "active" and self.store.clock.now_ms() >= rec["expires_at"]:
            out["state"] = "expired"
        return out

    async def handle(self, request: Request, op: str) -> JSONResponse:
        """Authenticate, validate, replay or run `op`, inject faults; every refusal is the dialect's envelope."""
        self.store.requests.append({"method": request.method, "path": request.url.path,
                                    "headers": dict(request.headers), "op": op})
        try:
            principal = self.principal(request)
            self.store.requests[-1]["timeout_ms"] = self.timeout_ms(request)
            if op in ("inspect", "list"):
                fault = self.store.take_fault(op)
                if fault:
                    return envelope(fault[0], status=fault[2])
                return await getattr(self, op)(request, principal)
            body = await self.body(request)
            self.store.requests[-1]["body"] = body
            rid = self.request_id(request, body)
            identity = self.identity(body)
            self.authorize(principal, identity, "targets:force-release" if op == "revoke" else "targets:lease")
            fault = self.store.take_fault(op)
            if fault and not fault[1]:
                return envelope(fault[0], status=fault[2])
            key = (op, identity, principal.id, rid)
            digest = hashlib.sha256(json.dumps({k: v for k, v in body.items() if k != "request_id"},
                                               sort_keys=True).encode()).hexdigest()
            stored = self.store.idempotency.get(key)
            if stored is not None:
                if stored[0] != digest:
                    return envelope("idempotency_conflict", msg="Request id was reused with conflicting content")
                return JSONResponse(stored[2], status_code=stored[1])
            code, rec = getattr(self, op)(principal, identity, body, request.path_params.get("lease_id"))
            resp = envelope(code, lease=self.record_json(rec) if rec else None)
            if resp.status_code < 400:  # successful mutations are replayed, not re-run
                self.store.idempotency[key] = (digest, resp.status_code, json.loads(resp.body))
            if fault:
                return envelope(fault[0], status=fault[2])
            return resp
        except Refused as r:
            return envelope(r.code, msg=r.msg, status=r.status or STATUS.get(r.code, 400))

    # -- operations ----------------------------------------------------------------
    def acquire(self, principal: Principal, identity: tuple, body: dict, _: None) -> tuple[str, dict | None]:
        now = self.store.clock.now_ms()
        ttl = self.positive(body, "ttl_ms") or DEFAULT_TTL_MS
        life = self.positive(body, "maximum_lifetime_ms") or MAX_LIFETIME_MS
        rec = self.store.current.get(identity)
        if rec is not None and rec["state"] == "active" and now < rec["expires_at"]:
            return "conflict", None
        token = self.store.counters[identity] = self.store.counters.get(identity, 0) + 1
        rec = {"lease_id": f"lease-{next(self.store.ids)}", "identity": identity,
               "dataset_id": body.get("dataset_id"), "owner_principal_id": principal.id,
               "service_instance_id": self.service_instance_id, "fencing_token": token, "acquired_at": now,
               "renewed_at": now, "expires_at": now + min(ttl, life), "ttl_ms": ttl, "maximum_lifetime_ms": life,
               "execution_id": None, "job_id": None, "trace_id": None, "state": "active",
               "metadata": body.get("metadata") or {}}
        self.store.current[identity] = self.store.by_id[rec["lease_id"]] = rec
        return "acquired", rec

    def _owned(self, principal: Principal, identity: tuple, body: dict, lease_id: str, *,
               admin: bool = False) -> dict:
        """The preflight and compare of renew / release / revoke: the exact current lease of this owner."""
        token = self.positive(body, "fencing_token", required=True)
        rec = self.store.current.get(identity)
        if rec is None:
            raise Refused("not_found")
        if rec["lease_id"] != lease_id or rec["fencing_token"] != token:
            raise Refused("stale_token")
        if self.store.clock.now_ms() >= rec["expires_at"]:
            rec["state"] = "expired"
            raise Refused("expired")
        if not admin and (rec["owner_principal_id"] != principal.id
                          or rec["service_instance_id"] != self.service_instance_id):
            raise Refused("not_owner")
        return rec

    def renew(self, principal: Principal, identity: tuple, body: dict, lease_id: str) -> tuple[str, dict]:
        rec = self._owned(principal, identity, body, lease_id)
        now = self.store.clock.now_ms()
        ttl = self.positive(body, "ttl_ms") or DEFAULT_TTL_MS  # not the lease's own TTL
        rec.update(renewed_at=now, ttl_ms=ttl,
                   expires_at=min(now + ttl, rec["acquired_at"] + rec["maximum_lifetime_ms"]))
        return "renewed", rec

    def release(self, principal: Principal, identity: tuple, body: dict, lease_id: str) -> tuple[str, dict]:
        rec = self._owned(principal, identity, body, lease_id)
        rec["state"] = "released"
        del self.store.current[identity]  # compare-and-delete; the record stays readable by id
        return "released", rec

    def revoke(self, principal: Principal, identity: tuple, body: dict, lease_id: str) -> tuple[str, dict]:
        if not isinstance(body.get("reason"), str) or not body["reason"]:
            raise Refused("invalid_lease_request", "Lease request requires a non-empty reason field", 400)
        rec = self._owned(principal, identity, body, lease_id, admin=True)
        rec["state"] = "revoked"
        del self.store.current[identity]
        return "revoked", rec

    async def inspect(self, request: Request, principal: Principal) -> JSONResponse:
        identity = self.identity(request.query_params, query=True)
        self.authorize(principal, identity, "targets:lease")
        rec = self.store.by_id.get(request.path_params["lease_id"])
        if rec is None or rec["identity"] != identity:
            return envelope("not_found")
        return envelope("found", lease=self.record_json(rec))

    async def list(self, request: Request, principal: Principal) -> JSONResponse:
        if "targets:lease" not in principal.capabilities and "admin" not in principal.capabilities:
            return envelope("unauthorized")
        q = request.query_params
        out = []
        for rec in self.store.current.values():
            if ((q.get("target_id") and rec["identity"][3] != q["target_id"])
                    or (q.get("program_id") and rec["identity"][1] != q["program_id"])
                    or (q.get("owner_principal_id") and rec["owner_principal_id"] != q["owner_principal_id"])):
                continue
            try:
                self.authorize(principal, rec["identity"], "targets:lease")
            except Refused:
                continue  # out of scope: not listed
            out.append(self.record_json(rec))
        return envelope("listed", leases=out)


def make_app(store: FakeStore, service_instance_id: str = "starintel-server:fake-1") -> Starlette:
    """A Starlette app serving the dialect's routes for one instance."""
    inst = FakeInstance(store, service_instance_id)

    def route(op: str):
        async def endpoint(request: Request) -> JSONResponse:
            return await inst.handle(request, op)

        return endpoint

    return Starlette(routes=[
        Route(API + "/acquire", route("acquire"), methods=["POST"]),
        Route(API + "/{lease_id}/renew", route("renew"), methods=["POST"]),
        Route(API + "/{lease_id}/revoke", route("revoke"), methods=["POST"]),
        Route(API + "/{lease_id}", route("release"), methods=["DELETE"]),
        Route(API + "/{lease_id}", route("inspect"), methods=["GET"]),
        Route(API, route("list"), methods=["GET"]),
    ])


class FakeCluster:
    """`n` fake instances over one store on real loopback sockets, served by uvicorn in one background thread."""

    def __init__(self, n: int = 2, store: FakeStore | None = None):
        self.store = store or FakeStore()
        self.ports = [free_port() for _ in range(n)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.servers = [uvicorn.Server(uvicorn.Config(make_app(self.store, f"starintel-server:fake-{i + 1}"),
                                                      host="127.0.0.1", port=p, log_level="warning",
                                                      lifespan="off", access_log=False))
                        for i, p in enumerate(self.ports)]
        self.thread = threading.Thread(target=self._serve, name="fake-starintel", daemon=True)

    def _serve(self) -> None:
        async def main():
            await asyncio.gather(*(s.serve() for s in self.servers))

        asyncio.run(main())

    def __enter__(self) -> "FakeCluster":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not all(s.started for s in self.servers):
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.__exit__(None, None, None)
                raise RuntimeError("the fake StarIntel servers did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s in self.servers:
            s.should_exit = True
        self.thread.join(timeout=10)


def asgi_client(store: FakeStore, instance: str = "starintel-server:fake-1") -> httpx.AsyncClient:
    """An httpx client bound in-process to one fake instance."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(store, instance)),
                             base_url="http://fake-starintel")


# ------------------------------------------------------------------------------------------- the fake's own tests

IDENT = {"tenant_id": "t", "program_id": "p", "target_namespace": "ns", "target_id": "x", "actor_name": "a"}


async def test_fake_authenticates_with_star_keys():
    store = FakeStore()
    key = store.add_credential("alice")
    async with asgi_client(store) as http:
        wrong_last = key[:-1] + ("1" if key[-1] == "0" else "0")  # one character off, never the key itself
        for auth in (None, "Bearer nope", "Basic " + key, "Bearer " + wrong_last):
            headers = {"authorization": auth} if auth else {}
            r = await http.post(API + "/acquire", json=dict(IDENT, request_id="r1"), headers=headers)
            assert (r.status_code, r.json()["code"]) == (401, "invalid_credential")
        r = await http.post(API + "/acquire", json=dict(IDENT, request_id="r1"),
                            headers={"authorization": f"Bearer {key}"})
        assert (r.status_code, r.json()["code"]) == (201, "acquired")


async def test_fake_idempotency_key_rules_and_replay():
    store = FakeStore()
    h = {"authorization": f"Bearer {store.add_credential('alice')}"}
    async with asgi_client(store) as http:
        r = await http.post(API + "/acquire", json=IDENT, headers=h)
        assert (r.status_code, r.json()["code"]) == (400, "idempotency_key_required")
        r = await http.post(API + "/acquire", json=dict(IDENT, request_id="a"),
                            headers=dict(h, **{"idempotency-key": "b"}))
        assert (r.status_code, r.json()["code"]) == (400, "idempotency_key_mismatch")
        first = await http.post(API + "/acquire", json=dict(IDENT, ttl_ms=1000),
                                headers=dict(h, **{"idempotency-key": "k"}))
        again = await http.post(API + "/acquire", json=dict(IDENT, ttl_ms=1000, request_id="k"), headers=h)
        assert first.status_code == again.status_code == 201
        assert first.json()["lease"] == again.json()["lease"]
        changed = await http.post(API + "/acquire", json=dict(IDENT, ttl_ms=2000, request_id="k"), headers=h)
        assert (changed.status_code, changed.json()["code"]) == (409, "idempotency_conflict")


async def test_fake_lease_lifecycle_statuses_and_record_shape():
    store = FakeStore()
    h = {"authorization": f"Bearer {store.add_credential('alice')}"}
    async with asgi_client(store) as http:
        acquired = await http.post(API + "/acquire", json=dict(IDENT, request_id="1", ttl_ms=1000), headers=h)
        lease = acquired.json()["lease"]
        assert lease["identity"]["workflow_name"] == "default" and isinstance(lease["expires_at"], int)
        assert "service_instance_id" not in lease and "retry_after_ms" not in lease
        r = await http.post(API + "/acquire", json=dict(IDENT, request_id="2"), headers=h)
        assert (r.status_code, r.json()["code"], "retry_after_ms" in r.json()) == (409, "conflict", False)
        stale = dict(IDENT, request_id="3", fencing_token=lease["fencing_token"] + 1)
        r = await http.post(f"{API}/{lease['lease_id']}/renew", json=stale, headers=h)
        assert (r.status_code, r.json()["code"]) == (412, "stale_token")
        store.clock.advance(1500)
        r = await http.post(f"{API}/{lease['lease_id']}/renew", headers=h,
                            json=dict(IDENT, request_id="4", fencing_token=lease["fencing_token"]))
        assert (r.status_code, r.json()["code"]) == (412, "expired")
        nxt = (await http.post(API + "/acquire", json=dict(IDENT, request_id="5"), headers=h)).json()["lease"]
        assert nxt["fencing_token"] == lease["fencing_token"] + 1
        r = await http.request("DELETE", f"{API}/{nxt['lease_id']}", headers=h,
                               json=dict(IDENT, request_id="6", fencing_token=nxt["fencing_token"]))
        assert (r.status_code, r.json()["code"], r.json()["lease"]["state"]) == (200, "released", "released")
        r = await http.post(f"{API}/{nxt['lease_id']}/renew", headers=h,
                            json=dict(IDENT, request_id="7", fencing_token=nxt["fencing_token"]))
        assert (r.status_code, r.json()["code"]) == (404, "not_found")


async def test_fake_owner_is_the_server_instance():
    store = FakeStore()
    h = {"authorization": f"Bearer {store.add_credential('alice')}"}
    async with asgi_client(store, "inst-1") as one, asgi_client(store, "inst-2") as two:
        lease = (await one.post(API + "/acquire", json=dict(IDENT, request_id="1"), headers=h)).json()["lease"]
        body = dict(IDENT, request_id="2", fencing_token=lease["fencing_token"])
        r = await two.post(f"{API}/{lease['lease_id']}/renew", json=body, headers=h)
        assert (r.status_code, r.json()["code"]) == (409, "not_owner")
        r = await one.post(f"{API}/{lease['lease_id']}/renew", json=body, headers=h)
        assert (r.status_code, r.json()["code"]) == (200, "renewed")


async def test_fake_revoke_needs_the_elevated_capability():
    store = FakeStore()
    h = {"authorization": f"Bearer {store.add_credential('alice')}"}
    admin = {"authorization": f"Bearer {store.add_credential('ops', ('targets:lease', 'targets:force-release'))}"}
    async with asgi_client(store) as http:
        lease = (await http.post(API + "/acquire", json=dict(IDENT, request_id="1"), headers=h)).json()["lease"]
        body = dict(IDENT, request_id="2", fencing_token=lease["fencing_token"], reason="incident")
        r = await http.post(f"{API}/{lease['lease_id']}/revoke", json=body, headers=h)
        assert (r.status_code, r.json()["code"]) == (403, "unauthorized")
        r = await http.post(f"{API}/{lease['lease_id']}/revoke", json=body, headers=admin)
        assert (r.status_code, r.json()["code"], r.json()["lease"]["state"]) == (200, "revoked", "revoked")


def test_fake_cluster_serves_on_sockets_and_stops():
    with FakeCluster(2) as cluster:
        for url in cluster.urls:
            r = httpx.get(url + API, headers={"authorization": "Bearer nope"}, timeout=5)
            assert (r.status_code, r.json()["code"]) == (401, "invalid_credential")
    assert not cluster.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(cluster.urls[0] + API, timeout=2)


def test_fake_timeout_header_is_bounded_like_the_server():
    inst = FakeInstance(FakeStore(), "i")

    def req(value):
        scope = {"type": "http", "headers": [(b"x-request-timeout-ms", value.encode())] if value else []}
        return Request(scope)

    assert [inst.timeout_ms(req(v)) for v in ("250", "0", "999999", "x", None)] == \
        [250, DEFAULT_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, DEFAULT_TIMEOUT_MS]
