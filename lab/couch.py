"""A small async client for the CouchDB HTTP API (pouchdb-server locally, Apache CouchDB in Compose).

Only what the fenced-write path and the workloads need: databases, the fence
design document, document reads, and revision-conditional writes. Written here
rather than taken from a library because the CouchDB client libraries on PyPI
are sync-only or unmaintained; we need httpx with per-call timeouts.

Every write sends `Content-Type: application/json` (pouchdb-server drops bodies
without it).

The fence guard (`FENCE_DESIGN_DOC`) is a `validate_doc_update` function: the
store itself refuses a document whose `fence_token` is lower than the stored
one, and refuses deletes of fenced documents, so even a writer that skipped
the lease check cannot roll a document back to an older holder (C26, C27).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

JSON = {"Content-Type": "application/json"}

FENCE_VALIDATE = """function (newDoc, oldDoc, userCtx, secObj) {
  if (!oldDoc || typeof oldDoc.fence_token !== 'number') { return; }
  if (newDoc._deleted) { throw({forbidden: 'stale_token: fenced documents cannot be deleted'}); }
  if (typeof newDoc.fence_token !== 'number' || newDoc.fence_token < oldDoc.fence_token) {
    throw({forbidden: 'stale_token: ' + newDoc.fence_token + ' < ' + oldDoc.fence_token});
  }
}"""

FENCE_DESIGN_DOC = {"_id": "_design/fence", "validate_doc_update": FENCE_VALIDATE}


class CouchError(RuntimeError):
    """The store answered something other than what the call expects."""

    def __init__(self, status: int, error: str, reason: str):
        super().__init__(f"{status} {error}: {reason}")
        self.status, self.error, self.reason = status, error, reason


@dataclass
class PutResult:
    """Outcome of a conditional write: ok with the new rev, or refused with CouchDB's error."""

    ok: bool
    status: int
    rev: str | None = None
    error: str | None = None
    reason: str | None = None

    @property
    def conflict(self) -> bool:
        """The `_rev` did not match (someone wrote in between)."""
        return self.status == 409

    @property
    def forbidden(self) -> bool:
        """validate_doc_update refused the document (the fence guard)."""
        return self.status == 403


class CouchClient:
    """Async CouchDB API client bound to one server URL."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, http: httpx.AsyncClient | None = None):
        self.url = url.rstrip("/")
        self.http = http or httpx.AsyncClient(timeout=timeout_s)
        self._own_http = http is None

    async def close(self) -> None:
        if self._own_http:
            await self.http.aclose()

    async def __aenter__(self) -> "CouchClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _doc_url(self, db: str, doc_id: str) -> str:
        return f"{self.url}/{quote(db, safe='')}/{quote(doc_id, safe='/_')}"

    async def ensure_db(self, db: str, *, fenced: bool = True) -> None:
        """Create `db` if missing, and install the fence design document if asked."""
        r = await self.http.put(f"{self.url}/{quote(db, safe='')}")
        if r.status_code not in (201, 202, 412):
            raise CouchError(r.status_code, *_err(r))
        if fenced:
            cur = await self.get(db, "_design/fence")
            if cur is None or cur.get("validate_doc_update") != FENCE_VALIDATE:
                body = dict(FENCE_DESIGN_DOC)
                if cur is not None:
                    body["_rev"] = cur["_rev"]
                res = await self.put(db, "_design/fence", body)
                if not res.ok and not res.conflict:
                    raise CouchError(res.status, res.error or "", res.reason or "")

    async def get(self, db: str, doc_id: str) -> dict[str, Any] | None:
        """The document, or None when it does not exist."""
        r = await self.http.get(self._doc_url(db, doc_id))
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise CouchError(r.status_code, *_err(r))
        return r.json()

    async def put(self, db: str, doc_id: str, doc: dict[str, Any]) -> PutResult:
        """Write `doc` (conditional on its `_rev` when present: MVCC); never raises on 409/403."""
        r = await self.http.put(self._doc_url(db, doc_id), json=doc, headers=JSON)
        if r.status_code in (201, 202):
            return PutResult(ok=True, status=r.status_code, rev=r.json().get("rev"))
        if r.status_code in (400, 403, 409, 412):
            error, reason = _err(r)
            return PutResult(ok=False, status=r.status_code, error=error, reason=reason)
        raise CouchError(r.status_code, *_err(r))

    async def all_docs(self, db: str) -> list[dict[str, Any]]:
        """Every non-design document of `db`."""
        r = await self.http.get(f"{self.url}/{quote(db, safe='')}/_all_docs", params={"include_docs": "true"})
        if r.status_code != 200:
            raise CouchError(r.status_code, *_err(r))
        return [row["doc"] for row in r.json()["rows"] if not row["id"].startswith("_design/")]


def _err(r: httpx.Response) -> tuple[str, str]:
    """CouchDB's {error, reason} pair, tolerant of non-JSON bodies."""
    try:
        j = r.json()
        return str(j.get("error", "")), str(j.get("reason", ""))
    except ValueError:
        return "http_error", r.text[:200]
