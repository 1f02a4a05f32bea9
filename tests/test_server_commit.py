"""The fenced-write boundary, `POST /api/v1/commits` (contract section 7, C24-C29), on real Valkey and pouchdb.

Every test reads the outcome back from the store itself: what the document
holds, not only what the server answered. The paused-holder scenario is made
deterministic with the server's commit hooks: holder A is validated before its
lease expires, then held between validation and its store write while B
acquires (a greater token) and commits; released, A's late write is refused by
the store's token guard, and the same scenario against the planted
`commit_mode: unfenced` lets A's older-token entry land after B's (the fence is
what protects the data).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
import redis

from lab.client import Identity, LeaseClient
from lab.couch import CouchClient
from lab.server import backend as keys
from lab.server.__main__ import parse_args
from lab.server.auth import provision_demo_principals, write_principals_file
from lab.server.settings import Settings, SettingsError, settings_from_dict
from lab.server.testing import COMMITS, CommandCounter, body, command_delta, identity, in_process_server
from lab.server.wire import now_ms
from lab.stack.leaseserver import LeaseServerProcess
from lab.stack.store import PouchDBProcess
from lab.stack.valkey import ValkeyProcess

from conftest import lease_expired


@pytest.fixture
def db_name() -> str:
    """A database of its own in the session store."""
    return "fl" + uuid.uuid4().hex[:12]


@pytest.fixture
async def srv(valkey, store, run_dir, db_name):
    """An in-process server with the fenced boundary on its own store database."""
    async with in_process_server(run_dir, valkey.url, store_url=store.url, store_db=db_name, min_ttl_ms=50) as s:
        yield s


@pytest.fixture
def vk(valkey):
    """A direct client of the session Valkey (to look at and tamper with keys)."""
    c = redis.Redis.from_url(valkey.url, decode_responses=True)
    yield c
    c.close()


async def read_doc(store_url: str, db: str, doc: str) -> dict | None:
    """The document as the store holds it (None when absent)."""
    async with CouchClient(store_url) as c:
        return await c.get(db, doc)


async def acquired(s, principal: str = "lease-a1", **fields) -> dict:
    """Acquire, asserting success; the lease object."""
    r = await s.acquire(principal, **fields)
    assert r.status_code == 200, r.text
    return r.json()["lease"]


def accepted(r) -> dict:
    """The commit result of a commit_accepted envelope."""
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["status"] == "success" and b["code"] == "commit_accepted" and b["correlation_id"]
    return b["commit"]


def lost(r, words: str = "") -> dict:
    """Assert a 409 lease_lost whose message contains `words`."""
    assert r.status_code == 409, r.text
    b = r.json()
    assert b["code"] == "lease_lost" and b["retryable"] is False, b
    assert words in b["msg"], b["msg"]
    return b


def audit_events(run_dir, event_type: str) -> list[dict]:
    """The audit file's events of one type."""
    path = run_dir / "audit.jsonl"
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event_type"] == event_type]


# -- the happy path, C27 guard installed, C28 fence record ---------------------------------------------------

async def test_commit_writes_the_document_with_its_fence_record(srv, store, db_name, vk, run_dir):
    lease = await acquired(srv, ttl_ms=5000, execution_id="exec-7", trace_id="trace-7")
    r = await srv.commit(lease, "doc-k0", {"append": ["p0", lease["fencing_token"], 1]}, request_id="c-1")
    c = accepted(r)
    assert c["doc"] == "doc-k0" and c["db"] == db_name and c["rev"].startswith("1-")
    assert c["accepted_token"] == lease["fencing_token"] and c["lease_id"] == lease["lease_id"]
    assert lease["acquired_at_ms"] <= c["validated_at_ms"] < lease["expires_at_ms"]
    doc = await read_doc(store.url, db_name, "doc-k0")
    assert doc["_rev"] == c["rev"] and doc["entries"] == [["p0", lease["fencing_token"], 1]]
    assert doc["fence_token"] == lease["fencing_token"] and doc["fence_lease_id"] == lease["lease_id"]
    assert doc["fence_lock_key"] == lease["lock_key"]
    assert doc["fence_execution_id"] == "exec-7" and doc["fence_trace_id"] == "trace-7"
    assert doc["fence_validated_at_ms"] == c["validated_at_ms"]
    assert [e[:2] + e[3:] for e in doc["fence_applied"]] == [["c-1", "lease-a1", lease["fencing_token"],
                                                             c["validated_at_ms"]]]
    # C26: the commit raised the identity's durable high-water mark to its token (no TTL)
    assert vk.get(keys.hwm_key(lease["lock_key"])) == str(lease["fencing_token"])
    assert vk.pttl(keys.hwm_key(lease["lock_key"])) == -1
    # `set` merges fields and keeps the entries; the store's own guard (C27's second fence) is installed
    c2 = accepted(await srv.commit(lease, "doc-k0", {"set": {"status": "done", "n": 2}}))
    doc = await read_doc(store.url, db_name, "doc-k0")
    assert doc["status"] == "done" and doc["n"] == 2 and len(doc["entries"]) == 1 and doc["_rev"] == c2["rev"]
    guard = await read_doc(store.url, db_name, "_design/fence")
    assert "stale_token" in guard["validate_doc_update"]
    await srv.server.audit.flush()
    events = audit_events(run_dir, "target_lease_commit")
    assert [(e["result_code"], e["fencing_token"]) for e in events] == [("commit_accepted", lease["fencing_token"])] * 2


async def test_the_lease_client_reads_the_commit_result(srv, store, db_name):
    ident = Identity(**identity(target_id="client-commit"))
    api = LeaseClient("http://lease.test", srv.keys["lease-a1"], service_instance_id="w-1", http=srv.client)
    lease = (await api.acquire(ident, ttl_ms=5000, execution_id="e-1", trace_id="t-1")).lease
    r = await api.commit(lease, "doc-client", {"append": ["w-1", lease.fencing_token, 1]}, request_id="rq-1")
    assert (r.outcome, r.code) == ("ok", "commit_accepted"), r.msg
    assert r.data["commit"]["accepted_token"] == lease.fencing_token and r.data["commit"]["rev"].startswith("1-")
    again = await api.resolve(r.call)  # an idempotent re-send of the same call
    assert again.outcome == "ok" and again.data["commit"] == {**r.data["commit"], "replayed": True}
    doc = await read_doc(store.url, db_name, "doc-client")
    assert doc["entries"] == [["w-1", lease.fencing_token, 1]]


# -- C24: the identity, the lock key and the target document ---------------------------------------------------

async def test_c24_identity_lock_key_and_document_must_agree(srv, store, db_name):
    lease = await acquired(srv, ttl_ms=5000)
    other = await acquired(srv, ttl_ms=5000, target_id="other.example")
    r = await srv.commit(lease, "doc-a", lock_key=other["lock_key"])
    assert r.status_code == 400 and r.json()["code"] == "invalid_lease_request" and "lock_key" in r.json()["msg"]
    # the lease, named under another identity: not this caller's lease there (and the lock_key field is optional)
    r = await srv.commit({**lease, **identity(target_id="other.example"), "lock_key": other["lock_key"]}, "doc-a")
    lost(r, "not held")
    r = await srv.commit({**lease, **identity(target_id="other.example")}, "doc-a", lock_key=None)
    lost(r, "not held")
    assert await read_doc(store.url, db_name, "doc-a") is None
    # a document fenced by one identity is not writable under another identity's lease
    accepted(await srv.commit(other, "doc-a"))
    r = await srv.commit(lease, "doc-a")
    assert r.status_code == 400 and "another lock identity" in r.json()["msg"]
    doc = await read_doc(store.url, db_name, "doc-a")
    assert doc["fence_lock_key"] == other["lock_key"] and doc["entries"] == [1]


# -- C25: this exact lease, active and unexpired by backend time --------------------------------------------

async def test_c25_only_the_exact_unexpired_lease_commits(srv, store, db_name, run_dir):
    lease = await acquired(srv, ttl_ms=5000)
    lost(await srv.commit(lease, "doc-b", fencing_token=lease["fencing_token"] + 1), "token")
    lost(await srv.commit(lease, "doc-b", service_instance_id="worker-2"), "not owner")
    lost(await srv.commit(lease, "doc-b", principal="lease-a1-peer"), "not owner")
    lost(await srv.commit(lease, "doc-b", lease_id=str(uuid.uuid4())), "not held")
    assert (await srv.release(lease)).status_code == 200
    lost(await srv.commit(lease, "doc-b"), "not held")
    short = await acquired(srv, ttl_ms=100)
    await lease_expired(srv, short)
    lost(await srv.commit(short, "doc-b"), "expired")  # C29: validated after expiry
    assert await read_doc(store.url, db_name, "doc-b") is None  # nothing reached the store
    await srv.server.audit.flush()
    rejected = audit_events(run_dir, "target_lease_commit_rejected")
    assert len(rejected) == 6 and {e["result_code"] for e in rejected} == {"lease_lost"}
    assert all(e["http_status"] == 409 and e["lease_id"] for e in rejected)


# -- C26: the durable high-water mark ------------------------------------------------------------------------

async def test_c26_a_token_below_the_high_water_mark_is_refused(srv, store, db_name, vk):
    lease = await acquired(srv, ttl_ms=5000)
    vk.set(keys.hwm_key(lease["lock_key"]), str(lease["fencing_token"] + 5))  # a newer token was accepted
    lost(await srv.commit(lease, "doc-c"), "high-water mark")
    assert await read_doc(store.url, db_name, "doc-c") is None
    assert vk.get(keys.hwm_key(lease["lock_key"])) == str(lease["fencing_token"] + 5)  # never lowered
    vk.set(keys.hwm_key(lease["lock_key"]), "garbage")
    r = await srv.commit(lease, "doc-c")
    assert r.status_code == 503 and r.json()["retryable"] is False  # a corrupt mark fails closed


# -- C27: conditional writes -----------------------------------------------------------------------------------

async def test_c27_concurrent_commits_all_land_exactly_once(srv, store, db_name):
    lease = await acquired(srv, ttl_ms=10_000)
    rs = await asyncio.gather(*(srv.commit(lease, "doc-d", {"append": i}) for i in range(8)))
    revs = [accepted(r)["rev"] for r in rs]
    doc = await read_doc(store.url, db_name, "doc-d")
    assert sorted(doc["entries"]) == list(range(8))  # no lost update: every write was _rev-conditional
    assert doc["_rev"].startswith("8-") and len(set(revs)) == 8


# -- C29 and the paused holder -----------------------------------------------------------------------------

class Pause:
    """A commit hook that holds one request (by request_id) until released."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, req) -> None:
        if req.request_id == self.request_id:
            self.entered.set()
            await self.release.wait()


async def paused_holder(s, doc: str) -> tuple[dict, dict, dict, object]:
    """A validated, then paused past its expiry; B acquires and commits; then A's write goes on."""
    a = await acquired(s, ttl_ms=300, service_instance_id="worker-a")
    pause = Pause("a-late")
    s.server.commits.hooks["validated"] = pause
    a_commit = asyncio.create_task(s.commit(a, doc, {"append": ["a", a["fencing_token"]]}, request_id="a-late",
                                            service_instance_id="worker-a"))
    await asyncio.wait_for(pause.entered.wait(), 5)  # A is validated (before its expiry) and now paused
    b = await acquired(s, "lease-a1-peer", ttl_ms=5000, wait_ms=3000, service_instance_id="worker-b")
    assert b["fencing_token"] > a["fencing_token"]
    b_result = accepted(await s.commit(b, doc, {"append": ["b", b["fencing_token"]]}, principal="lease-a1-peer",
                                       service_instance_id="worker-b"))
    pause.release.set()
    return a, b, b_result, await a_commit


async def test_c29_a_paused_holders_late_write_is_refused_by_the_store_guard(srv, store, db_name):
    a, b, _, a_result = await paused_holder(srv, "doc-e")
    lost(a_result, "stale token: the document already holds")  # refused by the store guard (403)
    doc = await read_doc(store.url, db_name, "doc-e")
    assert doc["entries"] == [["b", b["fencing_token"]]] and doc["fence_token"] == b["fencing_token"]


async def test_c29_unfenced_mutant_lets_the_stale_write_land(valkey, store, run_dir, db_name):
    """The same scenario through the planted bug: check-then-write without the token guard."""
    async with in_process_server(run_dir, valkey.url, store_url=store.url, store_db=db_name, min_ttl_ms=50,
                                 commit_mode="unfenced", allow_mutants=True) as s:
        a, b, b_result, a_result = await paused_holder(s, "doc-e")
    a_commit = accepted(a_result)
    assert a_commit["db"] == b_result["db"] == db_name + "_unfenced"
    doc = await read_doc(store.url, db_name + "_unfenced", "doc-e")
    # the older token's entry landed after the newer holder's, and the document's token went down
    assert doc["entries"] == [["b", b["fencing_token"]], ["a", a["fencing_token"]]]
    assert doc["fence_token"] == a["fencing_token"] < b["fencing_token"]
    assert await read_doc(store.url, db_name, "doc-e") is None


async def test_c29_commit_after_expiry_and_a_newer_acquisition_is_lost(srv, store, db_name):
    a = await acquired(srv, ttl_ms=300, service_instance_id="worker-a")
    b = await acquired(srv, "lease-a1-peer", ttl_ms=5000, wait_ms=3000, service_instance_id="worker-b")
    accepted(await srv.commit(b, "doc-f", {"append": "b"}, principal="lease-a1-peer",
                              service_instance_id="worker-b"))
    lost(await srv.commit(a, "doc-f", {"append": "a"}, service_instance_id="worker-a"))
    doc = await read_doc(store.url, db_name, "doc-f")
    assert doc["entries"] == ["b"] and doc["fence_token"] == b["fencing_token"]


# -- idempotency (C16-C19) --------------------------------------------------------------------------------

async def test_idempotent_retry_same_result_once_and_changed_body_conflicts(srv, store, db_name, vk):
    lease = await acquired(srv, ttl_ms=5000)
    b = body(ttl_ms=None, **{k: lease[k] for k in identity()})
    b.update(fencing_token=lease["fencing_token"], lease_id=lease["lease_id"], doc="doc-g", body={"append": "x"})
    first = accepted(await srv.client.post(COMMITS, json=b, headers=srv.headers("lease-a1")))
    r = await srv.client.post(COMMITS, json={**b, "deadline_at": now_ms() + 5000, "expires_at": 1},
                              headers=srv.headers("lease-a1"))
    assert r.json()["replayed"] is True and accepted(r) == {**first, "replayed": True}
    r = await srv.client.post(COMMITS, json={**b, "body": {"append": "y"}}, headers=srv.headers("lease-a1"))
    assert r.status_code == 409 and r.json()["code"] == "idempotency_conflict"
    assert (await read_doc(store.url, db_name, "doc-g"))["entries"] == ["x"]
    # the reply and the final idempotency record lost after the store write (a crash): the retry finds the
    # commit in the document's applied list instead of applying it again
    vk.delete(keys.idempotency_key("commit", lease["lock_key"], "lease-a1", b["request_id"]))
    r = await srv.client.post(COMMITS, json={**b, "deadline_at": now_ms() + 5000}, headers=srv.headers("lease-a1"))
    c = accepted(r)
    assert c["replayed"] is True and c["accepted_token"] == first["accepted_token"]
    assert c["validated_at_ms"] == first["validated_at_ms"]
    assert (await read_doc(store.url, db_name, "doc-g"))["entries"] == ["x"]


async def test_a_retry_continues_a_commit_validated_before_a_crash(srv, store, db_name):
    """C19 + C29: the server died between validation and the write; the retry lands it under that validation."""
    lease = await acquired(srv, ttl_ms=200)

    async def crash(req):
        raise RuntimeError("server died after validation")

    srv.server.commits.hooks["validated"] = crash
    r = await srv.commit(lease, "doc-h", request_id="crashy")
    assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable"
    assert await read_doc(store.url, db_name, "doc-h") is None
    del srv.server.commits.hooks["validated"]
    await lease_expired(srv, lease)
    lost(await srv.commit(lease, "doc-h", request_id="fresh"), "expired")  # a new commit is judged now ...
    c = accepted(await srv.commit(lease, "doc-h", request_id="crashy"))  # ... the retry under its validation
    assert c["validated_at_ms"] < lease["expires_at_ms"]
    assert (await read_doc(store.url, db_name, "doc-h"))["entries"] == [1]


# -- the request pipeline: auth order, validation, deadlines, no store --------------------------------------

async def test_refusals_before_the_backend_touch_nothing(srv, valkey, store, db_name):
    lease = await acquired(srv, ttl_ms=5000)
    counter = CommandCounter(valkey.url)
    try:
        before = counter.snapshot()
        cases = [
            ({"authorization": "Bearer nope"}, {}, 401, "invalid_credential"),
            (srv.headers("nocap-a"), {}, 403, "access_denied"),
            (srv.headers("lease-b1"), {}, 403, "access_denied"),
            (srv.headers("lease-a1"), {"extra": 1}, 400, "invalid_lease_request"),
            (srv.headers("lease-a1"), {"body": {"append": 1, "set": {}}}, 400, "invalid_lease_request"),
            (srv.headers("lease-a1"), {"body": {"set": {"fence_token": 9}}}, 400, "invalid_lease_request"),
            (srv.headers("lease-a1"), {"body": {"set": {"entries": []}}}, 400, "invalid_lease_request"),
            (srv.headers("lease-a1"), {"doc": "_design/fence"}, 400, "invalid_lease_request"),
            (srv.headers("lease-a1"), {"deadline_at": None}, 400, "invalid_lease_request"),
            (srv.headers("lease-a1"), {"deadline_at": now_ms() - 1}, 408, "deadline_exceeded"),
        ]
        base = body(ttl_ms=None, **{k: lease[k] for k in identity()})
        base.update(fencing_token=lease["fencing_token"], lease_id=lease["lease_id"], doc="doc-i",
                    body={"append": 1})
        for headers, change, status, code in cases:
            r = await srv.client.post(COMMITS, json={**base, **change}, headers=headers)
            assert (r.status_code, r.json()["code"]) == (status, code), (change, r.text)
        after = counter.snapshot()
    finally:
        counter.close()
    assert not ({"evalsha", "eval", "set"} & set(command_delta(before, after))), command_delta(before, after)
    assert await read_doc(store.url, db_name, "doc-i") is None


async def test_without_a_store_commits_are_unavailable(valkey, run_dir):
    async with in_process_server(run_dir, valkey.url) as s:
        lease = await acquired(s, ttl_ms=5000)
        r = await s.commit(lease, "doc-j")
        assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable"
        assert "--store-url" in r.json()["msg"] and r.json()["submitted"] is False
        health = (await s.client.get("/healthz")).json()
        # no store, no durable epoch: this Valkey is trusted at epoch 0, a restart of it fails closed (recovery.py)
        assert health["recovery"] == {"state": "ready", "epoch": 0, "floor": 0}


async def test_commit_delay_never_writes_past_the_deadline(valkey, store, run_dir, db_name):
    """The lab's `commit_delay_ms` pause sits between validation and write, inside the caller's deadline."""
    async with in_process_server(run_dir, valkey.url, store_url=store.url, store_db=db_name,
                                 commit_delay_ms=400) as s:
        lease = await acquired(s, ttl_ms=10_000)
        r = await s.commit(lease, "doc-m", request_id="short", deadline_at=now_ms() + 150)
        assert r.status_code == 408 and "nothing was written" in r.json()["msg"], r.text
        assert await read_doc(store.url, db_name, "doc-m") is None
        accepted(await s.commit(lease, "doc-m", request_id="long"))
        assert (await read_doc(store.url, db_name, "doc-m"))["entries"] == [1]


# -- timeouts: outcome unknown, settled by request_id (C19) -----------------------------------------------

async def test_store_stalls_before_and_after_the_write_is_sent(valkey, run_dir, db_name):
    own = PouchDBProcess(run_dir, name="store-own", in_memory=True).start()
    try:
        async with in_process_server(run_dir, valkey.url, store_url=own.url, store_db=db_name) as s:
            lease = await acquired(s, ttl_ms=10_000)

            async def stall(req):
                own.pause()

            s.server.commits.hooks["validated"] = stall  # the read stalls: nothing was written
            r = await s.commit(lease, "doc-k", request_id="r-read", deadline_at=now_ms() + 500)
            own.resume()
            assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable", r.text
            del s.server.commits.hooks["validated"]
            s.server.commits.hooks["before_put"] = stall  # the write was sent and no reply came
            r = await s.commit(lease, "doc-k", {"append": "w"}, request_id="r-write", deadline_at=now_ms() + 500)
            own.resume()
            assert r.status_code == 503 and r.json()["code"] == "lease_outcome_unknown", r.text
            assert r.json()["retryable"] is True
            del s.server.commits.hooks["before_put"]
            for rid, value in (("r-write", "w"), ("r-read", 1)):  # the retries settle both, applying each once
                accepted(await s.commit(lease, "doc-k", {"append": value}, request_id=rid))
            doc = await read_doc(own.url, db_name, "doc-k")
            assert sorted(map(str, doc["entries"])) == ["1", "w"]
    finally:
        if own.alive():
            own.resume()
        own.stop()


async def test_valkey_stalls_after_the_validation_was_submitted(store, run_dir, db_name):
    own = ValkeyProcess(run_dir, name="valkey-own").start()
    try:
        async with in_process_server(run_dir, own.url, store_url=store.url, store_db=db_name,
                                     recovery_check_interval_ms=60_000) as s:
            lease = await acquired(s, ttl_ms=10_000)
            await s.server.audit.flush()  # the audit batch is sent: an idle, connected connection waits in the pool
            own.pause()
            try:
                r = await s.commit(lease, "doc-l", request_id="r-v", deadline_at=now_ms() + 300)
            finally:
                own.resume()
            assert r.status_code == 503 and r.json()["code"] == "lease_outcome_unknown", r.text
            accepted(await s.commit(lease, "doc-l", request_id="r-v"))
            assert (await read_doc(store.url, db_name, "doc-l"))["entries"] == [1]
    finally:
        own.resume()
        own.stop()


# -- settings, the command line, and a real server process -------------------------------------------------

def test_planted_bug_settings_need_allow_mutants(tmp_path):
    for name, value in (("commit_mode", "unfenced"), ("recovery", "off")):
        with pytest.raises(SettingsError, match="--allow-mutants"):
            settings_from_dict({name: value})
        assert getattr(Settings(allow_mutants=True, **{name: value}).validate(), name) == value
    with pytest.raises(SettingsError, match="allow_mutants: cannot be set in a config file"):
        settings_from_dict({"allow_mutants": True})
    with pytest.raises(SettingsError, match="commit_mode: must be one of"):
        settings_from_dict({"commit_mode": "maybe"})
    with pytest.raises(SettingsError, match="store_db"):
        settings_from_dict({"store_db": "Bad/Name"})
    records, _ = provision_demo_principals()
    principals = write_principals_file(records, tmp_path / "p.json")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"commit_mode": "unfenced"}))
    argv = ["--host", "127.0.0.1", "--port", "1", "--valkey-url", "redis://127.0.0.1:1/0", "--principals",
            str(principals), "--instance-id", "x", "--audit-log", str(tmp_path / "a.jsonl"), "--config", str(config)]
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    _, settings = parse_args(argv + ["--allow-mutants", "--store-url", "http://127.0.0.1:5984"])
    assert settings.commit_mode == "unfenced" and settings.store_url == "http://127.0.0.1:5984"
    with pytest.raises(SystemExit):
        parse_args(argv + ["--allow-mutants", "--store-url", "ftp://x"])


async def test_commits_through_a_server_process(valkey, store, run_dir, db_name):
    records, credentials = provision_demo_principals()
    principals = write_principals_file(records, run_dir / "principals.json")
    key = next(c["api_key"] for c in credentials if c["principal_id"] == "lease-a1")
    config = run_dir / "server.json"
    config.write_text(json.dumps({"store_db": db_name}))
    server = LeaseServerProcess(run_dir, valkey_url=valkey.url, principals_file=principals, name="lease-commit",
                                config_file=config, store_url=store.url)
    server.start()
    try:
        async with LeaseClient(server.url, key, service_instance_id="w-1") as api:
            ident = Identity(**identity(target_id="process"))
            lease = (await api.acquire(ident, ttl_ms=5000)).lease
            results = [await api.commit(lease, "doc-p", {"append": n}) for n in range(3)]
            assert [r.code for r in results] == ["commit_accepted"] * 3
            assert [r.data["commit"]["accepted_token"] for r in results] == [lease.fencing_token] * 3
        health = (await asyncio.to_thread(httpx.get, server.url + "/healthz")).json()
        assert health["recovery"]["state"] == "ready" and health["recovery"]["epoch"] == 0
    finally:
        server.stop()
    doc = await read_doc(store.url, db_name, "doc-p")
    assert doc["entries"] == [0, 1, 2] and doc["fence_token"] == lease.fencing_token
