"""The aiohttp transport of `LeaseClient`: `https://` URLs and URLs an environment proxy applies to.

Imported only when used (aiohttp takes a few hundred ms to import). What it tells the client:
whether a connection was in hand when the exchange failed (`_ProbingConnector`), and which of aiohttp's
errors mean "never connected" (`connect_failed`), "a reply that cannot be decoded" (`undecodable`) or
"the exchange broke" (`transport_error`). lab.client.lease turns those into the definite / indefinite split.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import aiohttp
from aiohttp.http_exceptions import ContentEncodingError

from lab.client.http11 import KEEPALIVE_EXPIRY_S


_PROBE: contextvars.ContextVar[Any] = contextvars.ContextVar("lab_client_probe", default=None)


class _ProbingConnector(aiohttp.TCPConnector):
    """aiohttp's pool, telling the calling task's `_SendProbe` the moment a connection is in hand.

    `connect` returns after the pool wait, DNS, TCP connect, TLS and proxy CONNECT, and before a byte of the
    request is written; nothing awaits between its return and the flag, so a deadline that strikes before it
    proves nothing left. A connector hook rather than aiohttp's TraceConfig: the trace signals cost ~10 us of
    CPU per request.
    """

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        probe = _PROBE.get()
        if probe is not None:
            probe.sent = True
        return conn


def new_session(max_connections: int, proxy: str | None) -> aiohttp.ClientSession:
    """One aiohttp session: a keep-alive pool of up to `max_connections`, no cookies, no redirects, no retries."""
    connector = _ProbingConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_EXPIRY_S)
    session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                    proxy=proxy, skip_auto_headers=("User-Agent",),
                                    timeout=aiohttp.ClientTimeout(total=None))  # our own deadline bounds each call
    # aiohttp re-sends an idempotent-method request (GET, DELETE) once when a reused connection breaks; the lab
    # records one request per op, and a re-send after "may have left" would hide an indefinite outcome
    session._retry_connection = False
    return session


def undecodable(exc: BaseException) -> bool:
    """Is `exc` a ClientPayloadError caused by a body aiohttp could not decode (its content-encoding)?"""
    if not isinstance(exc, aiohttp.ClientPayloadError):
        return False
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ContentEncodingError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def connect_failed(exc: BaseException) -> bool:
    """The connection (TCP, TLS or proxy) was never made: nothing of the request left."""
    return isinstance(exc, aiohttp.ClientConnectorError)


def transport_error(exc: BaseException) -> bool:
    """Any other aiohttp failure of the exchange (reset, closed, malformed or cut-short reply)."""
    return isinstance(exc, aiohttp.ClientError)


async def exchange(client: Any, method: str, url: Any, content: bytes | None, headers: Any,
                   probe: Any) -> tuple[int, bytes, Any]:
    """One request on `client`'s session (made here, per event loop): (status, body, headers)."""
    session = client._session
    loop = asyncio.get_running_loop()
    if session is None or session.closed or client._session_loop is not loop:  # a session is bound to its loop
        session = client._session = new_session(client.max_connections, client._proxy)
        client._session_loop = loop
    token = _PROBE.set(probe)
    try:
        async with session.request(method, url, data=content, headers=headers, allow_redirects=False) as resp:
            return resp.status, await resp.read(), resp.headers
    finally:
        _PROBE.reset(token)
