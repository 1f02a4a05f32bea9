"""A lean HTTP/1.1 keep-alive transport for `LeaseClient` on plain `http://` (replies parsed by httptools).

Hand-written because no maintained asyncio client comes within 2x of a minimal client's CPU per request
(bench/client_path.py: aiohttp and aiosonic about 2.5x, httpx and httpcore tens of times), and the lab's
client must cost at most 100 us of CPU per operation (issue 13). The parsing, the part that is easy to get
wrong (chunked bodies, keep-alive rules, malformed replies), is llhttp's through `httptools`, the parser
uvicorn uses; this module only frames requests, pools connections and reports how an exchange ended.

What it reports is the definite / indefinite split's raw material (lab.client.lease):
- `ConnectFailed`: the connection could not be made (refused, unreachable, DNS): nothing was sent;
- the caller's probe's `sent` stays False until a connection is in hand and the request is about to be written, so a
  deadline striking before that (pool wait, connect) proves nothing left;
- `ExchangeLost` (the connection broke or the reply was malformed) and deadlines after `sent` are `info`.
A request is never re-sent on another connection. A connection that did not finish its exchange cleanly is
closed, never reused.
"""

from __future__ import annotations

import asyncio
import collections
import time
import zlib
from typing import Any

import httptools

# below uvicorn's 5 s keep-alive timeout, so a client never reuses a socket the server is closing (both transports)
KEEPALIVE_EXPIRY_S = 2.0


class ConnectFailed(OSError):
    """The TCP connection could not be made: nothing of the request was sent."""


class ExchangeLost(OSError):
    """The exchange broke after the request may have left (reset, closed, malformed reply)."""


class BadEncoding(ValueError):
    """A complete reply whose body could not be decoded (its content-encoding)."""


class Reply:
    """A complete HTTP reply: status, body (decoded), headers (`.get` by lower-case name); what
    `LeaseClient._decode` reads, whichever transport carried it (httpx's Response has the same three)."""

    __slots__ = ("status_code", "content", "headers")

    def __init__(self, status_code: int, content: bytes, headers: dict[str, str]):
        self.status_code, self.content, self.headers = status_code, content, headers


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one exchange in flight."""

    __slots__ = ("transport", "parser", "waiter", "status", "headers", "body", "complete", "closed", "released_at",
                 "loop", "_header_done", "_keep_alive")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.released_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers, self.body = 0, {}, []
        self.complete = False
        self._header_done = False
        self._keep_alive = False

    # -- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: the connection's framing is lost
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ExchangeLost(f"malformed reply: {e}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self._header_done and not self.complete and self._reads_until_close():
                self.on_message_complete()  # a reply delimited by the end of the connection
            else:
                self._fail(ExchangeLost(f"connection closed before a complete reply ({exc or 'EOF'})"))

    # -- httptools callbacks ---------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._header_done = True
        self.status = self.parser.get_status_code()
        self._keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # 1xx interim reply: the real one follows on the same connection
            self.status, self.headers, self.body, self._header_done = 0, {}, [], False
            return
        self.complete = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _reads_until_close(self) -> bool:
        h = self.headers
        return "content-length" not in h and "chunked" not in h.get("transfer-encoding", "").lower()

    def _fail(self, exc: BaseException) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        return self.complete and self._keep_alive and not self.closed and not self.transport.is_closing()

    async def exchange(self, request: bytes) -> Reply:
        """Write one request and wait for its complete reply."""
        self._reset()
        self.waiter = self.loop.create_future()
        try:
            self.transport.write(request)
            await self.waiter
        finally:
            self.waiter = None
        body = b"".join(self.body)
        encoding = self.headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            try:
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS if "gzip" in encoding else zlib.MAX_WBITS)
            except zlib.error as e:
                raise BadEncoding(f"cannot decode the {encoding} body: {e}") from None
        return Reply(self.status, body, self.headers)


class Pool:
    """Keep-alive connections to one host:port (LIFO reuse), at most `limit` open; callers wait for a slot."""

    def __init__(self, host: str, port: int, *, limit: int, keepalive_s: float, ssl: Any = None,
                 server_hostname: str | None = None):
        self.host, self.port, self.limit, self.keepalive_s = host, port, limit, keepalive_s
        self.ssl, self.server_hostname = ssl, server_hostname
        self.idle: list[_Connection] = []
        self.open = 0  # connections open or being opened (idle ones included)
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    async def request(self, request: bytes, probe: Any) -> Reply:
        """One exchange on a pooled connection; `probe.sent` turns True just before the write."""
        conn = await self._acquire()
        ok = False
        try:
            probe.sent = True  # a connection is in hand: from here the request may have left
            reply = await conn.exchange(request)
            ok = conn.reusable()
            return reply
        finally:
            self._release(conn, ok)

    async def _acquire(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # connections belong to the loop that opened them
            self._drop_all()
            self.loop = loop
        while True:
            now = time.monotonic()
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed and not conn.transport.is_closing() and now - conn.released_at < self.keepalive_s:
                    return conn
                conn.close()
                self.open -= 1
            if self.open < self.limit:
                self.open += 1
                try:
                    _, conn = await loop.create_connection(lambda: _Connection(loop), self.host, self.port,
                                                           ssl=self.ssl, server_hostname=self.server_hostname)
                except BaseException as e:
                    self.open -= 1
                    self._wake()
                    if isinstance(e, OSError):  # refused, unreachable, DNS failure, TLS handshake failure
                        raise ConnectFailed(*e.args) from e
                    raise
                return conn
            waiter = loop.create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if not waiter.cancelled() and waiter.done():
                    self._wake()  # we were woken but leave: pass the slot on
                raise
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)

    def _release(self, conn: _Connection, reusable: bool) -> None:
        if reusable and not self.closed:
            conn.released_at = time.monotonic()
            self.idle.append(conn)
        else:
            conn.close()
            self.open -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _drop_all(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        self.open = 0
        self.waiters.clear()

    def close(self) -> None:
        """Close every idle connection (in-flight ones close when their exchange ends)."""
        self.closed = True
        for conn in self.idle:
            conn.close()
            self.open -= 1
        self.idle.clear()


def header_block(headers: list[tuple[str, str]]) -> bytes:
    """`name: value` lines; a CR, LF or NUL in a name or value is refused (it would forge headers)."""
    out = []
    for name, value in headers:
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"HTTP header {name!r} holds a line break or NUL")
        out.append(f"{name}: {value}\r\n")
    return "".join(out).encode("latin-1")


def request_bytes(method: str, target: str, host_header: str, headers: bytes, body: bytes | None) -> bytes:
    """One HTTP/1.1 request: request line, Host, a header block (`header_block`), Content-Length, body."""
    head = f"{method} {target} HTTP/1.1\r\nhost: {host_header}\r\n".encode("ascii")
    if body is None:
        return head + headers + b"\r\n"
    return head + headers + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
