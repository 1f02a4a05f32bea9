"""The async client for the lease server's wire API (contract section 13).

`LeaseClient` turns every call into a typed `Result` and never raises for a
server or network answer: the caller reads `outcome` (ok / fail / info, see
`lab.client.results`). Every call has a finite deadline: its body carries
`deadline_at` (integer Unix ms) and the whole HTTP exchange (pool wait,
connect, send, receive) is bounded by it.

Transports (`transport="auto"` picks): plain `http://` goes through
`lab.client.http11` (our request framing and keep-alive pool, replies parsed
by httptools); `https://` and URLs an environment proxy applies to go through
aiohttp (`lab.client.aio`, imported on first use); an `httpx.AsyncClient`
passed as `http=` is used as it is (tests answer from `httpx.MockTransport`,
lab.server.testing from `httpx.ASGITransport`). bench/client_path.py measured
the libraries: none came within 2x of a minimal client's CPU per request.

Whether a request may have left when the exchange failed is learnt from the
transport: http11 and aiohttp (`_ProbingConnector`) flag the moment a
connection is in hand, after the pool wait and the connect and before a byte
of the request is written; httpcore traces `send_request_headers.started`.
Not flagged -> nothing was sent -> `fail` (`deadline_exceeded` for our
deadline, `connect_error` when the connection could not be made); flagged ->
`info`. A transport that flags nothing (MockTransport, ASGITransport) is
treated as "may have sent". No transport re-sends a request on its own.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from typing import Any, Mapping
from urllib.parse import quote, urlencode, urlsplit
from urllib.request import getproxies, proxy_bypass

import httpx
from yarl import URL

from lab.client import http11
from lab.client import results as R
from lab.client.results import Call, Identity, Lease, LeaseProtocolError, Result

import orjson  # several times faster than json for these small bodies (a hard dependency)

_dumps = orjson.dumps
_loads = orjson.loads
_DecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)

API = "/api/v1/target-leases"
COMMITS = "/api/v1/commits"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 512
# auto: http11 for plain http:// (the lab's stacks, Toxiproxy links, most --url servers), aiohttp for https://
# and for an HTTP(S)_PROXY from the environment; an `http=` httpx client always wins
TRANSPORTS = ("auto", "http11", "aiohttp")
KEEPALIVE_EXPIRY_S = http11.KEEPALIVE_EXPIRY_S  # both transports keep sockets the same time


def _env_proxy(base_url: str) -> str | None:
    """The HTTP(S)_PROXY that applies to `base_url` (NO_PROXY honoured), as httpx's trust_env did."""
    u = urlsplit(base_url)
    proxies = getproxies()
    proxy = proxies.get(u.scheme) or proxies.get("all")
    if not proxy or (u.hostname and proxy_bypass(u.hostname)):
        return None
    return proxy if "://" in proxy else "http://" + proxy


def new_request_id() -> str:
    """A fresh random request id (128 bits, hex)."""
    return os.urandom(16).hex()


def now_ms() -> int:
    """Wall-clock Unix time in integer milliseconds."""
    return time.time_ns() // 1_000_000


class _SendProbe:
    """Whether sending the request may have begun: an httpcore trace hook; set by `_ProbingConnector` for aiohttp."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False

    async def __call__(self, name: str, info: dict) -> None:
        if name.endswith("send_request_headers.started"):
            self.sent = True


class LeaseClient:
    """One principal's (API key's) client for one lease server base URL."""

    def __init__(self, base_url: str, api_key: str, *, service_instance_id: str,
                 timeout_s: float = DEFAULT_TIMEOUT_S, http: httpx.AsyncClient | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, backend_unavailable_is_definite: bool = False,
                 clock_ms=now_ms, transport: str = "auto"):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key must be a non-empty string")
        if not isinstance(service_instance_id, str) or not service_instance_id:
            raise ValueError("service_instance_id must be a non-empty string")
        _check_seconds("timeout_s", timeout_s)
        self.base_url = base_url.rstrip("/")
        self.service_instance_id = service_instance_id
        self.timeout_s = float(timeout_s)
        self.backend_unavailable_is_definite = backend_unavailable_is_definite
        self.clock_ms = clock_ms  # public: tests and the clock nemesis move the client's wall clock
        if not isinstance(max_connections, int) or isinstance(max_connections, bool) or max_connections < 1:
            raise ValueError(f"max_connections must be a positive integer, not {max_connections!r}")
        self.max_connections = max_connections
        self._owns_http = http is None
        self._http = http  # an injected httpx.AsyncClient, or None: http11 or aiohttp
        self._session: Any = None  # the aiohttp ClientSession, made on first use inside the running loop
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._aio: Any = None  # lab.client.aio when this client uses aiohttp
        self._proxy = _env_proxy(self.base_url) if http is None else None
        self._base_url = str(URL(self.base_url))  # percent-encoded once, as aiohttp would on every call
        self._pool: http11.Pool | None = None
        if transport == "http11" and (http is not None or self._proxy or not self._base_url.startswith("http://")):
            raise ValueError("the http11 transport speaks plain http:// without a proxy and without http=")
        if http is None and transport != "aiohttp" and self._proxy is None and self._base_url.startswith("http://"):
            u = URL(self._base_url)
            self._pool = http11.Pool(u.host, u.port, limit=max_connections, keepalive_s=KEEPALIVE_EXPIRY_S)
            self._host_header = u.host_port_subcomponent  # host[:port], IPv6 in brackets, no userinfo
            self._path_prefix = u.raw_path.rstrip("/")
        if http is None and self._pool is None:  # https:// or proxied: aiohttp (a few hundred ms to import)
            from lab.client import aio  # aiohttp: see the line above

            self._aio = aio
        transport = getattr(http, "_transport", None)
        # http11 and aiohttp always tell; an injected httpx client only with its real network transport
        self._transport_traces = http is None or type(transport) is httpx.AsyncHTTPTransport
        # (str, str) pairs: both transports take them as they are (the key is never logged)
        self._headers = [("authorization", "Bearer " + api_key), ("content-type", "application/json"),
                         ("accept", "application/json")]
        self._header_block = http11.header_block(self._headers)

    async def __aenter__(self) -> "LeaseClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool if this client created it."""
        if self._pool is not None:
            self._pool.close()
        if self._owns_http and self._session is not None:
            session, self._session = self._session, None
            await session.close()

    # -- mutations -----------------------------------------------------------
    async def acquire(self, identity: Identity, *, ttl_ms: int, request_id: str | None = None,
                      deadline_s: float | None = None, deadline_at_ms: int | None = None,
                      maximum_lifetime_ms: int | None = None, execution_id: str | None = None,
                      job_id: str | None = None, trace_id: str | None = None,
                      metadata: Mapping[str, Any] | None = None, wait_ms: int | None = None,
                      client_id: str | None = None) -> Result:
        """Acquire-if-free (C11); `wait_ms` asks for the server's bounded wait (C22)."""
        body = self._body(identity, request_id)
        body["ttl_ms"] = _check_ms("ttl_ms", ttl_ms)
        if maximum_lifetime_ms is not None:
            body["maximum_lifetime_ms"] = _check_ms("maximum_lifetime_ms", maximum_lifetime_ms)
        if wait_ms is not None:
            body["wait_ms"] = _check_ms("wait_ms", wait_ms, minimum=0)
        _put_optional(body, execution_id=execution_id, job_id=job_id, trace_id=trace_id, client_id=client_id)
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise TypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
            body["metadata"] = dict(metadata)
        call = Call("acquire", "POST", API + "/acquire", body)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def renew(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                    deadline_s: float | None = None, deadline_at_ms: int | None = None,
                    ttl_ms: int | None = None) -> Result:
        """Renew-if-owner (C12); a reply after the deadline is `info late_reply` (C23)."""
        body = self._lease_body(lease, identity, request_id)
        if ttl_ms is not None:
            body["ttl_ms"] = _check_ms("ttl_ms", ttl_ms)
        call = Call("renew", "POST", f"{API}/{_seg(lease.lease_id)}/renew", body)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def release(self, lease: Lease, *, identity: Identity | None = None, request_id: str | None = None,
                      deadline_s: float | None = None, deadline_at_ms: int | None = None) -> Result:
        """Release-if-owner (C13): compare-and-delete of exactly this lease."""
        body = self._lease_body(lease, identity, request_id)
        call = Call("release", "POST", f"{API}/{_seg(lease.lease_id)}/release", body)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def force_release(self, lease: Lease, reason: str, *, identity: Identity | None = None,
                            request_id: str | None = None, deadline_s: float | None = None,
                            deadline_at_ms: int | None = None) -> Result:
        """Admin force-release of the observed lease (C15); needs `targets:force-release`."""
        return await self._admin("force_release", "force-release", lease, reason, identity, request_id,
                                 deadline_s, deadline_at_ms)

    async def revoke(self, lease: Lease, reason: str, *, incident_id: str | None = None,
                     identity: Identity | None = None, request_id: str | None = None,
                     deadline_s: float | None = None, deadline_at_ms: int | None = None) -> Result:
        """Admin revoke of the observed lease (C15): invalidated, incident recorded."""
        return await self._admin("revoke", "revoke", lease, reason, identity, request_id,
                                 deadline_s, deadline_at_ms, incident_id=incident_id)

    async def commit(self, lease: Lease, doc: str, body: Any, *, identity: Identity | None = None,
                     request_id: str | None = None, deadline_s: float | None = None,
                     deadline_at_ms: int | None = None) -> Result:
        """A fenced write of `body` to document `doc` under `lease` (section 7, POST /api/v1/commits).

        The commit result (`doc`, `rev`, `accepted_token`, ...) is in `Result.data`.
        """
        if not isinstance(doc, str) or not doc:
            raise ValueError(f"doc must be a non-empty document id, not {doc!r}")
        payload = self._lease_body(lease, identity, request_id)
        payload["lease_id"] = lease.lease_id
        payload["lock_key"] = lease.lock_key
        payload["expires_at"] = lease.expires_at_ms
        _put_optional(payload, execution_id=lease.execution_id, trace_id=lease.trace_id)
        payload["doc"] = doc
        payload["body"] = body
        call = Call("commit", "POST", COMMITS, payload)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    # -- reads ---------------------------------------------------------------
    async def inspect(self, target: str | Identity, *, deadline_s: float | None = None,
                      deadline_at_ms: int | None = None) -> Result:
        """The lease with this id, or the active lease of this identity (C14)."""
        if isinstance(target, Identity):
            call = Call("inspect", "GET", API, params=target.as_dict())
        elif isinstance(target, str) and target:
            call = Call("inspect", "GET", f"{API}/{_seg(target)}")
        else:
            raise TypeError(f"inspect needs a lease_id string or an Identity, not {target!r}")
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def list(self, filters: Mapping[str, str] | None = None, *, limit: int | None = None,
                   cursor: str | None = None, deadline_s: float | None = None,
                   deadline_at_ms: int | None = None) -> Result:
        """One page of leases in the caller's scope; `Result.leases` and `Result.cursor` (C14)."""
        params: dict[str, Any] = {}
        for key, value in (filters or {}).items():
            if not isinstance(value, str):
                raise TypeError(f"list filter {key!r} must be a string, not {value!r}")
            params[key] = value
        if limit is not None:
            params["limit"] = _check_ms("limit", limit)
        if cursor is not None:
            params["cursor"] = cursor
        call = Call("list", "GET", API, params=params)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def resolve(self, target: Result | Call, *, deadline_s: float | None = None,
                      deadline_at_ms: int | None = None, attempts: int = 1, backoff_s: float = 0.05) -> Result:
        """Settle an `info` result by re-sending the same call with the same request_id (C17, C19).

        A result that is already ok/fail is returned as it is. Up to `attempts`
        re-sends are made while the answer stays `info`, `backoff_s` apart.
        """
        if isinstance(target, Result):
            if target.outcome != "info":
                return target
            if target.call is None:
                raise ValueError("this result has no call to re-send")
            call = target.call
        elif isinstance(target, Call):
            call = target
        else:
            raise TypeError(f"resolve needs a Result or a Call, not {type(target).__name__}")
        if call.is_mutation and not call.request_id:
            raise ValueError(f"{call.op} call has no request_id to resolve by")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {attempts}")
        result = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(backoff_s)
            result = await self._send(call, self._deadline(deadline_s, deadline_at_ms))
            if result.outcome != "info":
                break
        return result

    # -- internals -------------------------------------------------------------
    def _deadline(self, deadline_s: float | None, deadline_at_ms: int | None) -> int:
        """The call's absolute deadline in Unix ms, from exactly one of the two forms (default timeout_s)."""
        if deadline_at_ms is not None:
            if deadline_s is not None:
                raise ValueError("give deadline_s or deadline_at_ms, not both")
            if not isinstance(deadline_at_ms, int) or isinstance(deadline_at_ms, bool):
                raise TypeError(f"deadline_at_ms must be integer Unix milliseconds, not {deadline_at_ms!r}")
            return deadline_at_ms
        if deadline_s is None:
            deadline_s = self.timeout_s
        else:
            _check_seconds("deadline_s", deadline_s)
        return self.clock_ms() + int(deadline_s * 1000)

    def _body(self, identity: Identity, request_id: str | None) -> dict[str, Any]:
        """The fields every mutation carries (section 13), minus deadline_at."""
        if not isinstance(identity, Identity):
            raise TypeError(f"identity must be an Identity, not {type(identity).__name__}")
        body = identity.as_dict()
        if request_id is None:
            request_id = new_request_id()
        elif not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, not {request_id!r}")
        body["request_id"] = request_id
        body["service_instance_id"] = self.service_instance_id
        return body

    def _lease_body(self, lease: Lease, identity: Identity | None, request_id: str | None) -> dict[str, Any]:
        """A mutation body naming an existing lease: its identity plus its fencing token."""
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease, not {type(lease).__name__}")
        body = self._body(identity if identity is not None else lease.identity, request_id)
        body["fencing_token"] = lease.fencing_token
        return body

    async def _admin(self, op: str, segment: str, lease: Lease, reason: str, identity: Identity | None,
                     request_id: str | None, deadline_s: float | None, deadline_at_ms: int | None,
                     incident_id: str | None = None) -> Result:
        """force-release / revoke: the lease body plus the mandatory reason."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"{op} needs a non-empty reason")
        body = self._lease_body(lease, identity, request_id)
        body["reason"] = reason
        _put_optional(body, incident_id=incident_id)
        call = Call(op, "POST", f"{API}/{_seg(lease.lease_id)}/{segment}", body)
        return await self._send(call, self._deadline(deadline_s, deadline_at_ms))

    async def _send(self, call: Call, deadline_at_ms: int) -> Result:
        """Run one exchange bounded by the deadline and classify how it ended."""
        started = time.monotonic_ns()
        remaining_ms = deadline_at_ms - self.clock_ms()
        if remaining_ms <= 0:
            return Result("fail", R.CLIENT_DEADLINE, msg=R.DEADLINE_BEFORE_SEND, call=call)
        probe = _SendProbe()
        content, params, headers = self._prepare(call, deadline_at_ms, remaining_ms)
        try:
            async with asyncio.timeout(remaining_ms / 1000):
                if self._pool is not None:
                    resp = await self._pool.request(self._request_bytes(call, content, params, headers), probe)
                elif self._http is None:
                    resp = await self._aiohttp_exchange(call, content, params, headers, probe)
                else:
                    resp = await self._http.request(call.method, self.base_url + call.path, content=content,
                                                    params=params, headers=headers, extensions={"trace": probe})
        except Exception as e:  # noqa: BLE001 - every transport's errors, classified below; others re-raised
            failed = self._transport_failure(call, started, probe, e)
            if failed is None:
                raise
            return failed
        latency = time.monotonic_ns() - started
        result = self._decode(call, resp)
        result.latency_ns = latency
        if self.clock_ms() > deadline_at_ms:
            result.late = True
            if call.op == "renew" and result.outcome == "ok":  # C23: a late renewal grants nothing
                result.outcome, result.code = "info", R.LATE_REPLY
                result.msg = "renewal reply arrived after the caller's deadline"
        return result

    def _transport_failure(self, call: Call, started: int, probe: _SendProbe, e: Exception) -> Result | None:
        """The Result of an exchange that raised `e` (None: not a transport error, let it propagate)."""
        aio = self._aio
        if isinstance(e, (TimeoutError, httpx.TimeoutException)):  # our deadline, or a transport's own timeout
            return self._lost(call, started, probe, R.TIMEOUT, e)
        if isinstance(e, (http11.ConnectFailed, httpx.ConnectError)) or (aio is not None and aio.connect_failed(e)):
            # the TCP (or TLS, or proxy) connection was never made: nothing of the request left
            return Result("fail", R.CONNECT_ERROR, msg=str(e) or type(e).__name__, call=call,
                          latency_ns=time.monotonic_ns() - started)
        if isinstance(e, http11.BadEncoding) or (aio is not None and aio.undecodable(e)):
            # a reply arrived whose body cannot be decoded (its content-encoding)
            return Result("info", R.BAD_RESPONSE, msg=str(e), call=call, latency_ns=time.monotonic_ns() - started)
        if isinstance(e, (httpx.TransportError, OSError)) or (aio is not None and aio.transport_error(e)):
            return self._lost(call, started, probe, R.CONNECTION_LOST, e)
        if isinstance(e, httpx.HTTPError):  # a reply arrived but could not be read (e.g. a bad content-encoding)
            return Result("info", R.BAD_RESPONSE, msg=str(e) or type(e).__name__, call=call,
                          latency_ns=time.monotonic_ns() - started)
        return None

    def _request_bytes(self, call: Call, content: bytes | None, params: Mapping[str, Any] | None,
                       headers: Any) -> bytes:
        """The complete HTTP/1.1 request for the http11 transport."""
        target = self._path_prefix + call.path
        if params:
            target += "?" + urlencode(params)
        if headers is self._headers:
            block = self._header_block
        else:
            block = http11.header_block(headers)
        return http11.request_bytes(call.method, target, self._host_header, block, content)

    async def _aiohttp_exchange(self, call: Call, content: bytes | None, params: Mapping[str, Any] | None,
                                headers: Any, probe: _SendProbe) -> http11.Reply:
        """One request over aiohttp (lab.client.aio, imported by the constructor only for this transport)."""
        # the base URL was normalised once (`_base_url`) and our paths are quoted (`_seg`): no re-parsing per call
        url = URL(self._base_url + call.path, encoded=True)
        if params:
            url = url.update_query({k: str(v) for k, v in params.items()})
        status, body, reply_headers = await self._aio.exchange(self, call.method, url, content, headers, probe)
        return http11.Reply(status, body, reply_headers)

    def _prepare(self, call: Call, deadline_at_ms: int, remaining_ms: int) -> tuple[Any, Any, Any]:
        """(content, params, headers) of the request on this wire: our API carries `deadline_at` in it."""
        if call.body is not None:
            body = dict(call.body)
            body["deadline_at"] = deadline_at_ms
            return _dumps(body), None, self._headers
        params = dict(call.params or {})
        params["deadline_at"] = deadline_at_ms
        return None, params, self._headers

    @staticmethod
    def _envelope(call: Call, resp: Any) -> dict[str, Any] | Result:
        """The reply's JSON envelope, or the `info` Result of a reply that has none."""
        try:
            envelope = _loads(resp.content)
        except _DecodeError:
            envelope = None
        if not isinstance(envelope, dict):
            return Result("info", R.BAD_RESPONSE, http_status=resp.status_code, call=call,
                          msg=f"HTTP {resp.status_code} without a JSON envelope: {resp.content[:120]!r}")
        return envelope

    def _lost(self, call: Call, started: int, probe: _SendProbe, code: str, exc: BaseException) -> Result:
        """A transport failure: `fail` if provably nothing was sent, else `info`."""
        latency = time.monotonic_ns() - started
        msg = str(exc) or type(exc).__name__
        # both real transports trace the moment before the request is written (httpcore's
        # send_request_headers.started, aiohttp's connection-obtained), so without that event nothing left
        # (pool wait, DNS, connect, TLS)
        if isinstance(exc, httpx.PoolTimeout) or (self._transport_traces and not probe.sent):
            failed_code = R.CLIENT_DEADLINE if code == R.TIMEOUT else code
            return Result("fail", failed_code, msg=f"{R.NOTHING_SENT}: {msg}", call=call, latency_ns=latency)
        return Result("info", code, msg=msg, call=call, latency_ns=latency)

    def _decode(self, call: Call, resp: Any) -> Result:
        """The typed Result for a complete HTTP reply."""
        status = resp.status_code
        envelope = self._envelope(call, resp)
        if isinstance(envelope, Result):
            return envelope
        outcome, code = R.classify_envelope(status, envelope,
                                            backend_unavailable_is_definite=self.backend_unavailable_is_definite)
        result = Result(outcome, code, http_status=status, call=call, data=envelope,
                        msg=envelope.get("msg"), retryable=envelope.get("retryable"),
                        retry_after_ms=envelope.get("retry_after_ms"),
                        correlation_id=envelope.get("correlation_id") or resp.headers.get("x-correlation-id"))
        try:
            if "lease" in envelope and envelope["lease"] is not None:
                result.lease = Lease.from_wire(envelope["lease"])
            if "leases" in envelope:
                leases = envelope["leases"]
                if not isinstance(leases, builtins.list):
                    raise LeaseProtocolError("leases is not a list")
                result.leases = [Lease.from_wire(x) for x in leases]
                result.cursor = envelope.get("cursor", envelope.get("next_cursor"))
        except LeaseProtocolError as e:
            result.outcome, result.code, result.msg = "info", R.BAD_RESPONSE, f"{code}: {e}"
            return result
        if outcome == "ok" and call.op in _NEEDS_LEASE and result.lease is None:
            result.outcome, result.code, result.msg = "info", R.BAD_RESPONSE, f"{code} without a lease record"
        return result


_NEEDS_LEASE = frozenset({"acquire", "renew", "release", "force_release", "revoke"})


def _seg(lease_id: str) -> str:
    """A lease id as one URL path segment (quoted, so it can never add path syntax)."""
    if not isinstance(lease_id, str) or not lease_id:
        raise ValueError(f"lease_id must be a non-empty string, not {lease_id!r}")
    return quote(lease_id, safe="")


def _check_ms(name: str, value: Any, minimum: int = 1) -> int:
    """An integer count (milliseconds, page size) >= minimum, or a clear error."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return value


def _check_seconds(name: str, value: Any) -> None:
    """A finite positive number of seconds, or a clear error (C22: every deadline is finite)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0 < value < float("inf")):
        raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")


def _put_optional(body: dict[str, Any], **values: str | None) -> None:
    """Add the optional string fields that are set."""
    for key, value in values.items():
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(f"{key} must be a string, not {value!r}")
            body[key] = value
