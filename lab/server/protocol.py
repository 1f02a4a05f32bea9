"""uvicorn's HTTP protocol with bounds on a request's line and headers: time, size and field count.

uvicorn bounds the idle time between requests (`timeout_keep_alive`) but not
the time a request's line and headers take to arrive: a client sending a byte
now and then holds its socket, and a connection slot, forever. uvicorn has no
option for it, so this subclass arms a timer when a connection opens and when
a request begins, cancels it once the headers are complete, and closes the
connection when it fires. The body's own timeout lives in the app
(`read_body`, setting `body_timeout_ms`), where a 400 can still be sent.

Nor does uvicorn bound their size with httptools (llhttp has no limit, and
httptools joins a header's pieces into one bytes object: a 50 MB header block
was parsed whole and answered 200); its one size option,
`h11_max_incomplete_event_size`, is for h11 only and answers 400, not the 431
of RFC 6585. So this subclass counts the bytes fed to the parser while a
request's line and headers are being read, and the header fields as they are
parsed; past `max_header_bytes` or `max_header_fields` it answers 431 and
closes. It feeds the parser at most `max_header_bytes` at a time, so the count
is exact for a request whose head starts a read (every request but a
pipelined one, whose head may start inside a piece: at most twice the bound).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol


class HeadTooLarge(Exception):
    """Raised from a parser callback: the request has too many header fields (answered 431)."""


class GuardedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that bounds a request's line and headers: `header_timeout_s`, then 431 past the size bounds."""

    header_timeout_s = 10.0
    max_header_bytes = 16_384
    max_header_fields = 100
    linger_s = 2.0  # after a 431, how long what the client still sends is read and dropped
    _header_timer: asyncio.TimerHandle | None = None
    _linger_timer: asyncio.TimerHandle | None = None
    _in_head = True        # the bytes being fed belong to a request's line and headers
    _head_bytes = 0
    _head_fields = 0
    _too_large: str | None = None  # set once a 431 is decided: what was too large

    # -- the header timeout --------------------------------------------------------
    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection whose request headers took over %.1f s", self.header_timeout_s)
            self.transport.close()

    # -- the size bounds ---------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._too_large is not None:
            return  # lingering after a 431: read and drop
        view = memoryview(data)
        while view:
            room = self.max_header_bytes - self._head_bytes if self._in_head else self.max_header_bytes
            if room <= 0:
                self._refuse_head(f"the request line and headers exceed {self.max_header_bytes} bytes")
                return
            piece, view = view[:room], view[room:]
            if self._in_head:
                self._head_bytes += len(piece)
            super().data_received(piece)
            if self._too_large is not None or self.transport.is_closing() or self.transport.get_protocol() is not self:
                return

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.max_header_fields:
            self._too_large = f"more than {self.max_header_fields} header fields"
            raise HeadTooLarge(self._too_large)  # uvicorn catches the parser error and calls send_400_response
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        if self._too_large is not None:
            self._refuse_head(self._too_large)
        else:
            super().send_400_response(msg)

    def _refuse_head(self, what: str) -> None:
        """Answer 431 (RFC 6585), then drop what the client still sends for `linger_s` and close."""
        self._too_large = what
        self._disarm_header_timer()
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request's answer is due first
            self.transport.close()
            return
        self.logger.info("431: %s", what)
        msg = f"{what} (at most {self.max_header_bytes} bytes and {self.max_header_fields} fields)\n".encode()
        head = [STATUS_LINE[431]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: text/plain; charset=utf-8\r\ncontent-length: ", str(len(msg)).encode(),
                 b"\r\nconnection: close\r\n\r\n", msg]
        self.transport.write(b"".join(head))
        # a lingering close, as nginx does: closing with unread data would reset the connection, and a client
        # still sending its headers would see the reset instead of the 431
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger_timer = self.loop.call_later(self.linger_s, self.transport.close)

    # -- parser and connection callbacks --------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_fields = 0
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0  # what follows is the next request's line and headers

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)


def protocol_class(header_timeout_ms: int, max_header_bytes: int, max_header_fields: int) -> type[GuardedProtocol]:
    """The protocol class for uvicorn's `http=` with these bounds (settings of the same names)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"header_timeout_s": header_timeout_ms / 1000,
                                                        "max_header_bytes": max_header_bytes,
                                                        "max_header_fields": max_header_fields})
