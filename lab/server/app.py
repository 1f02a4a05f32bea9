"""The HTTP API of the reference lease server (contract section 13), on Starlette.

Every lease request goes through the same checks in the contract's order
(section 10): credential (401), capability (403), body size and JSON (400),
identity normalization (400), scope (403), the rest of the canonical request
(400), deadline (408), rate limit (429), and only then one backend script call.
A refusal never reaches Valkey. Every response carries the section-9 envelope
and a `correlation_id` (the `X-Correlation-ID` header is echoed when it is a
safe id, otherwise one is generated; one that could be a credential is a 400,
checked first and never echoed or audited); an unexpected exception becomes a 503
`lease_backend_unavailable` envelope, never a bare 500 page. Every lease
request, accepted or not, emits exactly one audit event.

`POST /api/v1/commits` (the fenced-write boundary, commit.py) goes through the
same checks; the recovery rule (recovery.py) may hold every mutation at 503
while it re-establishes the fencing floor after a Valkey restart.

`create_app(settings)` builds the app; tests run it in process with
`httpx.ASGITransport` (see lab/server/testing.py) and `python -m lab.server`
serves it with uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from typing import Any, AsyncIterator, Callable

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from lab.server.audit import AuditLog
from lab.server.auth import CAP_FORCE, CAP_LEASE, Authenticator, Principal
from lab.server.backend import Backend
from lab.server.commit import CommitService
from lab.server.errors import LeaseError, invalid
from lab.server.identity import IDENTITY_FIELDS, KEY_PREFIX, IdentityError, normalize_identifier, normalize_target_id
from lab.server.openapi import openapi_document
from lab.server.recovery import Recovery, RecoveryGate
from lab.server.service import LeaseService, Outcome
from lab.server.settings import Settings
from lab.server.store import DocumentStore, StoreError
from lab.server.wire import (
    INSPECT_QUERY_FIELDS,
    LIST_QUERY_FIELDS,
    KnownSecrets,
    ascii_int,
    check_fields,
    check_lease_id,
    check_query,
    ensure_no_credential,
    holds_own_key,
    json_strings,
    parse_identity,
    parse_json_object,
    parse_mutation,
    now_ms,
    query_deadline,
)

log = logging.getLogger("lab.server")

_CID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
_CURSOR_RE = re.compile(r"c1\.[A-Za-z0-9_-]{43}\Z")
_PRINCIPAL_RE = re.compile(r"[a-z0-9][a-z0-9._:-]{0,63}\Z")
_DIGITS_RE = re.compile(r"[0-9]{1,16}\Z")
DEFAULT_READ_TIMEOUT_MS = 2_000
_BACKEND_ANSWERED = frozenset({"lease_conflict", "lease_lost", "idempotency_conflict", "lease_not_found"})
JSON = "application/json"

EVENT_TYPE = {
    "acquire": "target_lease_acquire", "renew": "target_lease_renew", "release": "target_lease_release",
    "force_release": "target_lease_force_release", "revoke": "target_lease_revoke",
    "inspect": "target_lease_inspect", "list": "target_lease_list", "commit": "target_lease_commit",
}
COMMIT_REJECTED = "target_lease_commit_rejected"
CAPABILITY = {"acquire": (CAP_LEASE,), "renew": (CAP_LEASE,), "release": (CAP_LEASE,),
              "force_release": (CAP_FORCE,), "revoke": (CAP_FORCE,),
              "inspect": (CAP_LEASE, CAP_FORCE), "list": (CAP_LEASE, CAP_FORCE), "commit": (CAP_LEASE,)}


def json_response(body: dict[str, Any], status: int, correlation_id: str, retry_after_ms: int | None = None) -> Response:
    """A JSON response carrying the correlation id (and Retry-After when advised)."""
    headers = {"x-correlation-id": correlation_id}
    if retry_after_ms is not None:
        headers["retry-after"] = str(max(1, (retry_after_ms + 999) // 1000))
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type=JSON)


def success_body(outcome: Outcome, correlation_id: str) -> dict[str, Any]:
    """The section-9 success envelope."""
    body: dict[str, Any] = {"status": "success", "code": outcome.code, "correlation_id": correlation_id}
    if outcome.lease is not None:
        body["lease"] = outcome.lease
    body.update(outcome.extra)
    return body


def correlation_id_of(request: Request, holds_secret: Callable[[list[str]], bool]) -> tuple[str, LeaseError | None]:
    """The id a request's answer and audit event carry, and the refusal of an X-Correlation-ID that could be a key.

    The caller's id when it is 1-128 characters of A-Z a-z 0-9 . _ : - (else a
    fresh one), unless it holds the key this request presents, anything shaped
    like an API key or the secret of a credential this instance has verified
    (`holds_secret`: KnownSecrets.found_in): then a fresh id and a 400.
    Refused rather than replaced: the id is echoed and audited, so a caller
    that puts its key there must learn it at once, not have it silently
    dropped and go on sending it; and the caller's id is never stored or echoed.
    """
    sent = request.headers.get("x-correlation-id")
    if sent is None:
        return uuid.uuid4().hex, None
    if holds_own_key(sent.encode("utf-8", "replace"), request.headers.get("authorization")) or holds_secret([sent]):
        return uuid.uuid4().hex, invalid("x-correlation-id", "must not hold an API key or its secret (it is echoed "
                                                             "and audited); send an id of your own")
    if _CID_RE.match(sent):
        return sent, None
    return uuid.uuid4().hex, None


class IncompleteBody(LeaseError):
    """A body that never arrived whole (too slow, or the client left): 400, and the connection is closed."""

    def __init__(self, problem: str):
        super().__init__("invalid_lease_request", f"body: {problem}")


async def read_body(request: Request, limit: int, timeout_s: float = 10.0) -> bytes:
    """The request body within `timeout_s`, refusing anything over `limit` bytes before reading it all."""
    length = request.headers.get("content-length")
    if length is not None:
        if not _DIGITS_RE.match(length):
            raise invalid("content-length", "must be a non-negative integer of ASCII digits")
        if int(length) > limit:
            raise invalid("body", f"must be at most {limit} bytes (got {length})")
    chunks = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                chunks += chunk
                if len(chunks) > limit:
                    raise invalid("body", f"must be at most {limit} bytes")
    except TimeoutError:
        raise IncompleteBody(f"not received within {round(timeout_s * 1000)} ms (slow sender)") from None
    except ClientDisconnect:
        raise IncompleteBody("the client disconnected before sending all of it") from None
    return bytes(chunks)


class LeaseServer:
    """One server instance: authenticator, backend, service, audit and the route handlers."""

    def __init__(self, settings: Settings, authenticator: Authenticator | None = None):
        self.settings = settings.validate()
        backend_cls, service_cls, commits_cls = Backend, LeaseService, CommitService
        if settings.mutant:  # a planted bug, lab runs only (--allow-mutants): lab/server/mutants
            from lab.server.mutants.variants import server_parts  # the unmodified server never loads the mutants

            self.settings, backend_cls, service_cls, commits_cls = server_parts(self.settings)
            settings = self.settings
        self.auth = authenticator or Authenticator.from_file(settings.principals_file)
        self.backend = backend_cls(settings)
        self.store = DocumentStore(settings) if settings.store_url else None
        self.gate = RecoveryGate(active=settings.recovery == "on")  # without a store it fails closed (recovery.py)
        self.service = service_cls(settings, self.backend, self.gate)
        self.commits = commits_cls(settings, self.service, self.store, self.gate)
        self.audit = AuditLog(self.backend, settings.audit_log or None, stream_maxlen=settings.audit_stream_maxlen,
                              queue_max=settings.audit_queue_max)
        self.recovery = Recovery(settings, self.backend, self.store, self.gate, on_revoked=self.recovery_revoked)
        self._openapi = orjson.dumps(openapi_document(self.settings))
        self.secrets = KnownSecrets()  # digests of verified secrets: the no-credential-in-body rule

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Start the backend, the audit writer, the store and the recovery rule; close them at shutdown."""
        await self.backend.start()
        await self.audit.start()
        if self.store is not None:
            try:
                await self.store.prepare(_loop_time() + self.settings.max_backend_timeout_ms / 1000)
            except StoreError as e:
                log.warning("document store not ready at start-up (%s); commits will prepare it", e)
        await self.recovery.start()
        try:
            yield
        finally:
            await self.recovery.close()
            await self.audit.close()
            if self.store is not None:
                await self.store.close()
            await self.backend.close()

    def routes(self) -> list[Route]:
        p = "/api/v1/target-leases"
        return [
            Route(p + "/acquire", self.acquire, methods=["POST"]),
            Route(p + "/{lease_id}/renew", self.renew, methods=["POST"]),
            Route(p + "/{lease_id}/release", self.release, methods=["POST"]),
            Route(p + "/{lease_id}/force-release", self.force_release, methods=["POST"]),
            Route(p + "/{lease_id}/revoke", self.revoke, methods=["POST"]),
            Route(p + "/{lease_id}", self.inspect_by_id, methods=["GET"]),
            Route(p, self.list_or_inspect, methods=["GET"]),
            Route("/api/v1/commits", self.commit, methods=["POST"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]

    # -- endpoints ---------------------------------------------------------------
    async def acquire(self, request: Request) -> Response:
        return await self.mutation(request, "acquire")

    async def renew(self, request: Request) -> Response:
        return await self.mutation(request, "renew")

    async def release(self, request: Request) -> Response:
        return await self.mutation(request, "release")

    async def force_release(self, request: Request) -> Response:
        return await self.mutation(request, "force_release")

    async def revoke(self, request: Request) -> Response:
        return await self.mutation(request, "revoke")

    async def commit(self, request: Request) -> Response:
        return await self.mutation(request, "commit")

    async def inspect_by_id(self, request: Request) -> Response:
        return await self.read(request, "inspect")

    async def list_or_inspect(self, request: Request) -> Response:
        op = "inspect" if any(name in request.query_params for name in IDENTITY_FIELDS) else "list"
        return await self.read(request, op)

    async def healthz(self, request: Request) -> Response:
        """200 when Valkey answers and the scripts are loaded, else 503."""
        cid, refused = correlation_id_of(request, self.secrets.found_in)
        if refused is not None:
            return json_response(refused.envelope(cid), refused.status, cid)
        loop_deadline = _loop_time() + 0.5
        ok = await self.backend.ping(loop_deadline)
        if ok and not self.backend.scripts_loaded:
            try:
                await self.backend.load_scripts(_loop_time() + 1.0)
            except Exception as e:  # noqa: BLE001 - reported as unhealthy, never raised
                log.warning("script load failed: %s", type(e).__name__)
        if ok and self.backend.scripts_loaded and self.gate.ready:
            return json_response({"status": "success", "code": "healthy", "correlation_id": cid,
                                  "instance_id": self.settings.instance_id, "backend": "ok",
                                  "audit_dropped": self.audit.dropped, "recovery": self.gate.describe(),
                                  "commit_mode": self.settings.commit_mode}, 200, cid)
        if ok and self.backend.scripts_loaded:
            err = LeaseError("lease_backend_unavailable", "recovering the fencing floor after a Valkey restart",
                             retry_after_ms=200)
        else:
            err = LeaseError("lease_backend_unavailable", "the lease store is not reachable", retry_after_ms=500)
        return json_response(err.envelope(cid), err.status, cid, err.retry_after_ms)

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type=JSON)

    # -- the request pipeline ------------------------------------------------------------
    def authenticate(self, request: Request, op: str, event: dict[str, Any]) -> Principal:
        """Credential (401), then capability (403) — before anything else is looked at."""
        authorization = request.headers.get("authorization")
        principal = self.auth.authenticate(authorization)
        if principal is None:
            raise LeaseError("invalid_credential", "missing, malformed or unknown API key (use Authorization: Bearer)")
        self.secrets.add(authorization)
        event["principal_id"] = principal.principal_id
        event["credential_id"] = principal.credential_id
        if not any(principal.can(cap) for cap in CAPABILITY[op]):
            raise LeaseError("access_denied", f"this principal lacks the capability for {op.replace('_', '-')}")
        return principal

    def new_event(self, op: str, correlation_id: str) -> dict[str, Any]:
        return {"event_type": EVENT_TYPE[op], "server_instance_id": self.settings.instance_id,
                "observed_at_ms": now_ms(), "correlation_id": correlation_id}

    async def mutation(self, request: Request, op: str) -> Response:
        """acquire / renew / release / force-release / revoke / commit."""
        started = time.perf_counter()
        cid, refused = correlation_id_of(request, self.secrets.found_in)
        event = self.new_event(op, cid)
        admin = op in ("force_release", "revoke")
        try:
            if refused is not None:  # first: even a 401 would echo it
                raise refused
            principal = self.authenticate(request, op, event)
            lease_id = "" if op in ("acquire", "commit") else check_lease_id(request.path_params["lease_id"])
            if lease_id:
                event["lease_id"] = lease_id
            raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_ms / 1000)
            body = parse_json_object(raw, self.settings.max_body_depth)
            ensure_no_credential(raw, request.headers.get("authorization"), json_strings(body), self.secrets.found_in)
            identity = parse_identity(body)
            event.update(identity.as_dict())
            if not principal.allows(identity):
                raise LeaseError("access_denied", "the identity is outside this principal's scope")
            check_fields(op, body)
            req = parse_mutation(op, body, identity, lease_id, self.settings)
            f = req.fields
            event.update(request_id=req.request_id, service_instance_id=req.service_instance_id,
                         trace_id=f["trace_id"] or None, execution_id=f["execution_id"] or None,
                         job_id=f["job_id"] or None)
            if admin:
                event["admin_reason"] = f["reason"]
                event["incident_id"] = f.get("incident_id") or None
            if op == "commit":  # the caller's own claim: the lease it commits under
                event.update(lease_id=req.lease_id, fencing_token=f["fencing_token"])
            if op in ("acquire", "renew"):
                self.service.call_deadline(req.deadline_ms)  # 408 before spending a rate token
                self.service.check_rate(principal, identity.lock_key())
            if op == "acquire":
                outcome = await self.service.acquire(principal, req)
            elif op == "renew":
                outcome = await self.service.renew(principal, req)
            elif op == "release":
                outcome = await self.service.release(principal, req)
            elif op == "commit":
                outcome = await self.commits.commit(principal, req)
            else:
                partial = {k: v for k, v in event.items() if k != "lease_id"}
                partial.update(http_status=200, replayed=False)
                outcome = await self.service.end_by_admin(principal, req, event["event_type"], orjson.dumps(partial))
        except LeaseError as e:
            if op == "commit":
                event["event_type"] = COMMIT_REJECTED
            return self.refuse(e, cid, event, started)
        except Exception:  # noqa: BLE001 - the envelope, never a bare 500
            log.exception("unhandled error in %s", op)
            if op == "commit":
                event["event_type"] = COMMIT_REJECTED
            return self.refuse(LeaseError("lease_backend_unavailable", "internal error; nothing is assumed"),
                               cid, event, started)
        event.update(outcome.audit)
        event.update(result_code=outcome.code, http_status=200, retryable=False, backend_health="ok",
                     latency_ms=round((time.perf_counter() - started) * 1000, 3))
        try:
            if admin:
                # C15: durably audited before success is reported (the stream event came from the script)
                await self.audit.emit_durable(event, in_stream=not outcome.extra.get("replayed"))
            else:
                self.audit.emit(event)
        except Exception:  # noqa: BLE001 - the mutation happened; reporting it is what matters now
            log.exception("audit write failed after %s succeeded", op)
        return json_response(success_body(outcome, cid), 200, cid)

    async def read(self, request: Request, op: str) -> Response:
        """inspect (by lease id or by identity) and list."""
        started = time.perf_counter()
        cid, refused = correlation_id_of(request, self.secrets.found_in)
        event = self.new_event(op, cid)
        try:
            if refused is not None:  # first: even a 401 would echo it
                raise refused
            principal = self.authenticate(request, op, event)
            query = self.query(request)
            ensure_no_credential(request.url.query.encode(), request.headers.get("authorization"),
                                 [*query, *query.values()], self.secrets.found_in, where="query")
            deadline_ms = self.read_deadline(query)
            if "lease_id" in request.path_params:
                check_query(query, frozenset({"deadline_at"}))
                lease_id = check_lease_id(request.path_params["lease_id"])
                event["lease_id"] = lease_id
                outcome = await self.service.inspect_lease(principal, lease_id, deadline_ms)
            elif op == "inspect":
                check_query(query, INSPECT_QUERY_FIELDS)
                identity = parse_identity(query)
                event.update(identity.as_dict())
                if not principal.allows(identity):
                    raise LeaseError("access_denied", "the identity is outside this principal's scope")
                outcome = await self.service.inspect_identity(identity, deadline_ms)
            else:
                check_query(query, LIST_QUERY_FIELDS)
                filters, limit, after = self.list_params(query)
                outcome = await self.service.list_leases(principal, filters, limit, after, deadline_ms)
        except LeaseError as e:
            return self.refuse(e, cid, event, started)
        except Exception:  # noqa: BLE001 - the envelope, never a bare 500
            log.exception("unhandled error in %s", op)
            return self.refuse(LeaseError("lease_backend_unavailable", "internal error; nothing is assumed"),
                               cid, event, started)
        event.update(outcome.audit)
        event.update(result_code=outcome.code, http_status=200, retryable=False, backend_health="ok",
                     latency_ms=round((time.perf_counter() - started) * 1000, 3))
        try:
            self.audit.emit(event)
        except Exception:  # noqa: BLE001 - never turn a read into an error after the fact
            log.exception("audit write failed after %s", op)
        return json_response(success_body(outcome, cid), 200, cid)

    def recovery_revoked(self, flat: list[str], backend_now: int) -> None:
        """Audit one restored lease the recovery sweep ended (a system revoke, not an HTTP request)."""
        try:
            rec = dict(zip(flat[0::2], flat[1::2]))
            event = self.new_event("revoke", "recovery-" + uuid.uuid4().hex)
            event.update(zip(IDENTITY_FIELDS, orjson.loads(rec["identity"])))
            event.update(principal_id="lease-server:recovery", backend_time_ms=backend_now, lease_id=rec["lease_id"],
                         fencing_token=int(rec["fencing_token"]), service_instance_id=rec["service_instance_id"],
                         previous_state="active", resulting_state="revoked", result_code="lease_revoked",
                         retryable=False, backend_health="ok", admin_reason=rec.get("admin_reason"))
            self.audit.emit(event)
        except Exception:  # noqa: BLE001 - the sweep is what matters; its audit line is best effort
            log.exception("audit of a recovery revocation failed")

    def refuse(self, err: LeaseError, cid: str, event: dict[str, Any], started: float) -> Response:
        """Audit and render an error envelope."""
        event.update(result_code=err.code, http_status=err.status, retryable=err.retryable,
                     backend_health=err.backend_health or ("ok" if err.code in _BACKEND_ANSWERED else "not_contacted"),
                     latency_ms=round((time.perf_counter() - started) * 1000, 3))
        try:
            self.audit.emit(event)
        except Exception:  # noqa: BLE001 - a failed audit write must not turn into a 500
            log.exception("audit emit failed")
        response = json_response(err.envelope(cid), err.status, cid, err.retry_after_ms)
        if isinstance(err, IncompleteBody):  # the rest of the body is not worth waiting for
            response.headers["connection"] = "close"
        return response

    # -- query helpers ------------------------------------------------------------------
    @staticmethod
    def query(request: Request) -> dict[str, str]:
        """Query parameters as a dict; a repeated parameter is a 400."""
        out: dict[str, str] = {}
        for name, value in request.query_params.multi_items():
            if name in out:
                raise invalid(name[:64], "must not be repeated")
            out[name] = value
        return out

    @staticmethod
    def read_deadline(query: dict[str, str]) -> int:
        """A read's deadline: `deadline_at` when given, else a short server default."""
        raw = query.get("deadline_at")
        if raw is None:
            return now_ms() + DEFAULT_READ_TIMEOUT_MS
        return query_deadline(raw)

    def list_params(self, query: dict[str, str]) -> tuple[dict[str, str], int, str]:
        """Filters, page size and the cursor's lock key for list."""
        filters: dict[str, str] = {}
        if "owner" in query:
            if not _PRINCIPAL_RE.match(query["owner"]):
                raise invalid("owner", "must be a principal id")
            filters["owner"] = query["owner"]
        try:
            if "program" in query:
                filters["program"] = normalize_identifier("program", query["program"])
            if "target" in query:
                filters["target"] = normalize_target_id(query["target"])
        except IdentityError as e:
            raise invalid("target" if e.field == "target_id" else e.field, e.problem) from None
        limit = self.settings.default_page_size
        if "limit" in query:
            limit = ascii_int(query["limit"], "limit", 1, self.settings.max_page_size)
        after = ""
        if "cursor" in query:
            if not _CURSOR_RE.match(query["cursor"]):
                raise invalid("cursor", "is not a cursor returned by this API")
            after = KEY_PREFIX + query["cursor"][3:]
        return filters, limit, after

    # -- framework-level errors ------------------------------------------------------------
    async def http_exception(self, request: Request, exc: Exception) -> Response:
        """Unknown paths and methods: a 400 envelope (the section-9 table has no other code for them)."""
        cid, _ = correlation_id_of(request, self.secrets.found_in)  # this answer is an error already
        what = "method not allowed" if getattr(exc, "status_code", 404) == 405 else "no such endpoint"
        err = invalid("path", f"{what}: {request.method} {request.url.path[:100]}")
        return json_response(err.envelope(cid), err.status, cid)

    async def unhandled(self, request: Request, exc: Exception) -> Response:
        """Last resort for anything that escaped a handler: 503, never a bare 500 page."""
        cid, _ = correlation_id_of(request, self.secrets.found_in)  # this answer is an error already
        err = LeaseError("lease_backend_unavailable", "internal error; nothing is assumed")
        return json_response(err.envelope(cid), err.status, cid)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def create_app(settings: Settings, authenticator: Authenticator | None = None) -> Starlette:
    """The Starlette app of one server instance (its lifespan opens Valkey and the audit log)."""
    server = LeaseServer(settings, authenticator)
    app = Starlette(routes=server.routes(), lifespan=server.lifespan,
                    exception_handlers={HTTPException: server.http_exception, Exception: server.unhandled})
    app.router.redirect_slashes = False
    app.state.server = server
    return app
