"""uvicorn's HTTP protocol with a read timeout on a request's line and headers (slow senders).

uvicorn bounds the idle time between requests (`timeout_keep_alive`) but not
the time a request's line and headers take to arrive: a client sending a byte
now and then holds its socket, and a connection slot, forever. uvicorn has no
option for it, so this subclass arms a timer when a connection opens and when
a request begins, cancels it once the headers are complete, and closes the
connection when it fires. The body's own timeout lives in the app
(`read_body`, setting `body_timeout_ms`), where a 400 can still be sent.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that closes a connection whose request headers take over `header_timeout_s`."""

    header_timeout_s = 10.0
    _header_timer: asyncio.TimerHandle | None = None

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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)


def protocol_class(header_timeout_ms: int) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's `http=` with this header timeout."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": header_timeout_ms / 1000})
