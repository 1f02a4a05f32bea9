"""The CouchDB client and the fence guard against the real pouchdb-server."""

from __future__ import annotations

from lab.couch import CouchClient


async def test_fence_guard_refuses_lower_token_even_with_current_rev(store):
    async with CouchClient(store.url) as c:
        await c.ensure_db("fence1")
        assert (await c.put("fence1", "doc", {"fence_token": 5, "entries": [[0, 5, 1]]})).ok
        cur = await c.get("fence1", "doc")
        stale = await c.put("fence1", "doc", {"_rev": cur["_rev"], "fence_token": 4, "entries": []})
        assert stale.forbidden and "stale_token" in stale.reason
        assert (await c.get("fence1", "doc"))["entries"] == [[0, 5, 1]]
        same = await c.put("fence1", "doc", {"_rev": cur["_rev"], "fence_token": 5, "entries": [[0, 5, 1], [0, 5, 2]]})
        assert same.ok


async def test_rev_mvcc_conflict_and_no_deletes_of_fenced_docs(store):
    async with CouchClient(store.url) as c:
        await c.ensure_db("fence2")
        first = await c.put("fence2", "doc", {"fence_token": 1})
        assert first.ok
        assert (await c.put("fence2", "doc", {"fence_token": 2})).conflict  # no _rev
        cur = await c.get("fence2", "doc")
        gone = await c.put("fence2", "doc", {"_rev": cur["_rev"], "_deleted": True, "fence_token": 9})
        assert gone.forbidden
        assert await c.get("fence2", "missing") is None


async def test_ensure_db_is_idempotent_and_lists_docs(store):
    async with CouchClient(store.url) as c:
        await c.ensure_db("fence3")
        await c.ensure_db("fence3")
        await c.put("fence3", "a", {"fence_token": 1})
        docs = await c.all_docs("fence3")
        assert [d["_id"] for d in docs] == ["a"]
