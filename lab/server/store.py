"""The document store of the fenced-write boundary: a CouchDB-API server (pouchdb-server or CouchDB).

`lab.couch.CouchClient` speaks the API; this module bounds every call by the
request's deadline and classifies failures by the write boundary, the way
backend.py does for Valkey (C19, C23):

- `StoreUnavailable`: nothing was written (a read failed, or a write was never
  sent: the connection could not be made);
- `StoreOutcomeUnknown`: a write was sent and no usable answer came before the
  deadline: it may have been applied;
- a conditional write that the store refuses (`_rev` conflict, the fence
  guard's `forbidden`) is an ordinary `PutResult`, not an exception.

Databases: `store_db` (default `fencelab`) carries the `_design/fence` guard
(`validate_doc_update`: a lower `fence_token` than the stored one, or a delete,
is refused); `<store_db>_unfenced` exists only under the `unfenced` commit mode
(a planted bug) and has no guard. The recovery rule keeps its durable epoch in
the local document `_local/lease-epoch` of `store_db` (never replicated, not in
`_all_docs`, revision-checked like any document).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from lab.couch import CouchClient, CouchError, PutResult
from lab.server.settings import Settings

EPOCH_DOC = "_local/lease-epoch"


class StoreError(Exception):
    """A store call did not produce a usable answer."""


class StoreUnavailable(StoreError):
    """The store could not be read or written; nothing was written."""


class StoreOutcomeUnknown(StoreError):
    """A write was sent and no usable answer came: it may have been applied."""


_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class DocumentStore:
    """Deadline-bounded document reads and conditional writes on one CouchDB-API server."""

    def __init__(self, settings: Settings):
        self.url = settings.store_url
        self.db = settings.store_db
        self.unfenced_db = settings.store_db + "_unfenced"
        self.commit_db = self.unfenced_db if settings.commit_mode == "unfenced" else self.db
        # deadlines bound every exchange (asyncio.timeout_at), so the transport's own timeouts are off
        self.http = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=64,
                                                                        max_keepalive_connections=64))
        self.couch = CouchClient(self.url, http=self.http)
        self._prepared: set[str] = set()

    async def close(self) -> None:
        await self.http.aclose()

    async def prepare(self, deadline: float) -> None:
        """Create the databases and install the fence guard (idempotent; the guard is the second fence, C27)."""
        wanted = [(self.db, True)]
        if self.commit_db != self.db:
            wanted.append((self.commit_db, False))
        for db, fenced in wanted:
            if db in self._prepared:
                continue
            await self._read(self.couch.ensure_db(db, fenced=fenced), deadline)
            self._prepared.add(db)

    async def get(self, db: str, doc_id: str, deadline: float) -> dict[str, Any] | None:
        """The document (None when absent); StoreUnavailable when the store does not answer."""
        doc = await self._read(self.couch.get(db, doc_id), deadline)
        if doc is not None and not isinstance(doc, dict):
            raise StoreUnavailable("the store returned a document that is not a JSON object")
        return doc

    async def all_docs(self, db: str, deadline: float) -> list[dict[str, Any]]:
        """Every non-design document of `db` (recovery reads the accepted tokens)."""
        return await self._read(self.couch.all_docs(db), deadline)

    async def put(self, db: str, doc_id: str, doc: dict[str, Any], deadline: float) -> PutResult:
        """A write conditional on the document's `_rev` (absent `_rev`: create only)."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self.couch.put(db, doc_id, doc)
        except _NOT_SENT as e:
            raise StoreUnavailable(type(e).__name__) from None
        except (TimeoutError, httpx.HTTPError, CouchError, ValueError) as e:
            # sent (or possibly sent) and unanswered, or answered with a server error: it may have been applied
            raise StoreOutcomeUnknown(type(e).__name__) from None

    async def _read(self, call, deadline: float) -> Any:
        """Await a call that writes nothing the caller depends on; any failure is StoreUnavailable."""
        try:
            async with asyncio.timeout_at(deadline):
                return await call
        except (TimeoutError, httpx.HTTPError, CouchError, ValueError) as e:
            raise StoreUnavailable(type(e).__name__) from None
