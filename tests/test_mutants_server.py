"""Each planted bug changes what the API does, on a real Valkey (and store), while the default server does not.

Every test runs one small deterministic probe twice, against the default
server and against the server with one mutant planted (lab/server/mutants),
and asserts the contract's answer from the first and the bug from the second.
Races are made deterministic with hooks (a barrier between the GET and the SET
of `nonatomic-acquire`, the commit hook that pauses a validated commit), clocks
with a fake wall clock for the one server that reads it.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid

import pytest
import redis

from lab.couch import CouchClient
from lab.server.__main__ import parse_args
from lab.server.auth import provision_demo_principals, write_principals_file
from lab.server.mutants import MUTANT_NAMES, MUTANTS, LuaPatch, get_mutant
from lab.server.mutants import variants
from lab.server.scripts import load_scripts
from lab.server.settings import Settings, SettingsError, settings_from_dict
from lab.server.testing import in_process_server
from lab.stack.valkey import ValkeyProcess

from conftest import lease_expired


async def both(run_dir, valkey_url, mutant: str, probe, **overrides):
    """(the default server's observation, the mutant's): the same probe, each on an identity of its own."""
    async with in_process_server(run_dir / "default", valkey_url, **overrides) as s:
        honest = await probe(s, f"t-default-{run_dir.name}")
    async with in_process_server(run_dir / mutant, valkey_url, allow_mutants=True, mutant=mutant, **overrides) as s:
        planted = await probe(s, f"t-mutant-{run_dir.name}")
    return honest, planted


async def lease_of(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()["lease"]


# -- the registry -----------------------------------------------------------------------------------


def test_every_mutant_patches_the_scripts_it_names_and_marks_each_change():
    builtin = load_scripts()
    for m in MUTANTS.values():
        scripts = variants.patch_scripts(load_scripts(), m.patches)
        for p in m.patches:
            assert f"MUTANT({m.name})" in p.new, (m.name, p.new)
            touched = list(builtin) if p.part == "common" else [p.part]
            for name in touched:
                assert p.new in scripts[name].source and scripts[name].sha != builtin[name].sha
        if not m.patches:
            assert m.settings or m.variants, m.name  # a mutant plants something
            assert all(scripts[n].source == builtin[n].source for n in builtin)


def test_a_patch_that_no_longer_applies_fails_loudly():
    with pytest.raises(variants.MutantError, match="occurs 0 times"):
        variants.patch_scripts(load_scripts(), [LuaPatch("renew", "no such text", "x")])
    with pytest.raises(variants.MutantError, match="not a script"):
        variants.patch_scripts(load_scripts(), [LuaPatch("nope", "x", "y")])


def test_a_mutant_is_refused_without_allow_mutants(tmp_path, capsys):
    with pytest.raises(SettingsError, match="--allow-mutants"):
        Settings(mutant="nonatomic-acquire").validate()
    with pytest.raises(SettingsError, match="unknown mutant 'nope'; known: unfenced-commit"):
        Settings(mutant="nope", allow_mutants=True).validate()
    with pytest.raises(SettingsError, match="--allow-mutants"):
        settings_from_dict({"mutant": "local-clock"})
    assert get_mutant("local-clock").name == "local-clock"
    records, _ = provision_demo_principals()
    principals = write_principals_file(records, tmp_path / "p.json")
    argv = ["--host", "127.0.0.1", "--port", "1", "--valkey-url", "redis://127.0.0.1:1/0", "--principals",
            str(principals), "--instance-id", "x", "--audit-log", str(tmp_path / "a.jsonl")]
    with pytest.raises(SystemExit) as e:
        parse_args(argv + ["--mutant", "volatile-counter"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lab.server: error: mutant: 'volatile-counter' is a planted bug")
    _, settings = parse_args(argv + ["--allow-mutants", "--mutant", "volatile-counter"])
    assert settings.mutant == "volatile-counter" and settings.allow_mutants
    with pytest.raises(SystemExit):
        parse_args(argv + ["--allow-mutants", "--mutant", "nope"])
    assert "unknown mutant 'nope'" in capsys.readouterr().err


def test_the_settings_mutants_plant_their_settings():
    for name, field, value in (("unfenced-commit", "commit_mode", "unfenced"), ("counter-from-snapshot", "recovery",
                                                                                "off")):
        settings, *_ = variants.server_parts(Settings(allow_mutants=True, mutant=name).validate())
        assert getattr(settings, field) == value and getattr(Settings(), field) != value
    assert set(MUTANT_NAMES) >= {"unfenced-commit", "nonatomic-acquire", "volatile-counter", "local-clock",
                                 "no-idempotency", "renew-revives-expired", "release-any-owner",
                                 "stale-cleanup-deletes-successor", "counter-from-snapshot"}


# -- one probe per mutant ---------------------------------------------------------------------------------


async def test_nonatomic_acquire_lets_two_concurrent_acquires_win(valkey, run_dir):
    async def probe(s, target):
        gate = asyncio.Barrier(2)  # the mutant: both reads ("free") happen before either write
        if hasattr(s.server.service, "hooks"):
            s.server.service.hooks["between"] = gate.wait
        rs = await asyncio.gather(s.acquire(target_id=target, service_instance_id="w1"),
                                  s.acquire("lease-a1-peer", target_id=target, service_instance_id="w2"))
        return sorted(r.status_code for r in rs), sorted(r.json()["lease"]["fencing_token"] for r in rs
                                                         if r.status_code == 200)

    honest, planted = await both(run_dir, valkey.url, "nonatomic-acquire", probe)
    assert honest == ([200, 409], [1])
    assert planted == ([200, 200], [1, 2])  # two holders of one identity


async def test_volatile_counter_reissues_a_token_after_an_idle_expiry(valkey, run_dir):
    async def probe(s, target):
        first = await lease_of(await s.acquire(target_id=target, ttl_ms=150))
        await lease_expired(s, first)  # expired, and the identity idle
        second = await lease_of(await s.acquire(target_id=target, ttl_ms=150, service_instance_id="w2"))
        return first["fencing_token"], second["fencing_token"]

    honest, planted = await both(run_dir, valkey.url, "volatile-counter", probe)
    assert honest == (1, 2)
    assert planted == (1, 1)  # token 1, issued twice


async def test_local_clock_lets_a_server_ahead_acquire_over_an_active_lease(valkey, run_dir, monkeypatch):
    class Ahead:
        """A wall clock 5 s ahead, for the one module that reads it (the mutant's backend)."""

        @staticmethod
        def time() -> float:
            import time

            return time.time() + 5

    monkeypatch.setattr(variants, "time", Ahead)

    async def probe(s, target):
        async with in_process_server(run_dir / f"honest-{target}", valkey.url) as honest:
            held = await lease_of(await honest.acquire(target_id=target, ttl_ms=3000))
        r = await s.acquire("lease-a1-peer", target_id=target, ttl_ms=3000, service_instance_id="w2")
        return held["fencing_token"], r.status_code, r.json()["code"]

    honest, planted = await both(run_dir, valkey.url, "local-clock", probe)
    assert honest == (1, 409, "lease_conflict")  # Valkey's TIME: the lease holds for 3 s
    assert planted == (1, 200, "lease_acquired")  # the server's clock says it expired: a second holder


async def test_no_idempotency_executes_a_retry_again(valkey, run_dir):
    async def probe(s, target):
        rid = uuid.uuid4().hex
        first = await s.acquire(target_id=target, request_id=rid)
        retry = await s.acquire(target_id=target, request_id=rid)  # the same request, its reply "lost"
        changed = await s.renew(await lease_of(first), request_id=rid + "-r")
        changed_again = await s.renew(await lease_of(first), request_id=rid + "-r", ttl_ms=900)
        return retry.status_code, retry.json()["code"], changed.status_code, changed_again.json()["code"]

    honest, planted = await both(run_dir, valkey.url, "no-idempotency", probe)
    assert honest == (200, "lease_acquired", 200, "idempotency_conflict")  # the retry is the original result
    assert planted == (409, "lease_conflict", 200, "lease_renewed")  # executed again; changed body accepted


async def test_renew_revives_an_expired_lease(valkey, run_dir):
    async def probe(s, target):
        lease = await lease_of(await s.acquire(target_id=target, ttl_ms=150))
        await lease_expired(s, lease)
        r = await s.renew(lease, ttl_ms=2000)
        state = (await s.inspect(lease["lease_id"])).json()["lease"]["state"]
        return r.json()["code"], state

    honest, planted = await both(run_dir, valkey.url, "renew-revives-expired", probe)
    assert honest == ("lease_lost", "expired")
    assert planted == ("lease_renewed", "active")  # a dead lease is alive again


async def stale_release(s, target):
    """A (150 ms) expires, B acquires; A's release arrives; then B renews."""
    a = await lease_of(await s.acquire(target_id=target, ttl_ms=150, service_instance_id="wa"))
    await lease_expired(s, a)
    b = await lease_of(await s.acquire("lease-a1-peer", target_id=target, ttl_ms=5000, service_instance_id="wb"))
    stale = await s.release(a)
    succ = await s.renew(b, "lease-a1-peer")
    return stale.json()["code"], succ.json()["code"]


async def test_release_any_owner_lets_a_stale_holder_end_its_successor(valkey, run_dir):
    honest, planted = await both(run_dir, valkey.url, "release-any-owner", stale_release)
    assert honest == ("lease_lost", "lease_renewed")
    assert planted == ("lease_released", "lease_lost")  # the successor's lease was ended by A


async def test_stale_cleanup_deletes_the_successor_behind_a_correct_answer(valkey, run_dir):
    honest, planted = await both(run_dir, valkey.url, "stale-cleanup-deletes-successor", stale_release)
    assert honest == ("lease_lost", "lease_renewed")
    assert planted == ("lease_lost", "lease_lost")  # A was told no, and B's record is gone anyway

    async def admin_cleanup(s, target):
        a = await lease_of(await s.acquire(target_id=target, ttl_ms=150, service_instance_id="wa"))
        await lease_expired(s, a)
        b = await lease_of(await s.acquire("lease-a1-peer", target_id=target, ttl_ms=5000, service_instance_id="wb"))
        stale = await s.admin("force-release", a)
        return stale.json()["code"], (await s.renew(b, "lease-a1-peer")).json()["code"]

    honest, planted = await both(run_dir / "admin", valkey.url, "stale-cleanup-deletes-successor", admin_cleanup)
    assert honest == ("lease_lost", "lease_renewed")
    assert planted == ("lease_lost", "lease_lost")


# -- the two that need the store -----------------------------------------------------------------------------


@pytest.fixture
def db_name() -> str:
    return "fl" + uuid.uuid4().hex[:12]


async def read_doc(url: str, db: str, doc: str) -> dict | None:
    async with CouchClient(url) as c:
        return await c.get(db, doc)


async def test_unfenced_commit_lets_a_paused_holders_write_land_after_its_successor(valkey, store, run_dir, db_name):
    async def probe(s, target):
        """A is validated, paused (the commit hook) past its expiry; B acquires and commits; A's write goes on."""
        a = await lease_of(await s.acquire(target_id=target, ttl_ms=150, service_instance_id="wa"))
        entered, go = asyncio.Event(), asyncio.Event()

        async def pause(req):
            if req.request_id == "a-late":
                entered.set()
                await go.wait()

        s.server.commits.hooks["validated"] = pause
        late = asyncio.create_task(s.commit(a, target, {"append": ["a", a["fencing_token"]]}, request_id="a-late",
                                            service_instance_id="wa"))
        await asyncio.wait_for(entered.wait(), 5)
        b = await lease_of(await s.acquire("lease-a1-peer", target_id=target, ttl_ms=5000, wait_ms=3000,
                                           service_instance_id="wb"))
        rb = await s.commit(b, target, {"append": ["b", b["fencing_token"]]}, principal="lease-a1-peer",
                            service_instance_id="wb")
        go.set()
        ra = await late
        doc = await read_doc(store.url, rb.json()["commit"]["db"], target)
        return ra.json()["code"], [e[0] for e in doc["entries"]]

    honest, planted = await both(run_dir, valkey.url, "unfenced-commit", probe, store_url=store.url,
                                 store_db=db_name, min_ttl_ms=50)
    assert honest == ("lease_lost", ["b"])  # the store's token guard refused A's late write
    assert planted == ("commit_accepted", ["b", "a"])  # the older token landed over the newer


async def test_late_unguarded_commit_lands_a_final_tenth_commit_after_its_successor(valkey, store, run_dir, db_name):
    async def probe(s, target):
        """A commits when less than a fifth of its TTL is left; B waits on the key and commits once it holds it."""
        went_late, b_done = asyncio.Event(), asyncio.Event()

        async def late(req):  # only the planted server has a late path: hold A there until B has committed
            went_late.set()
            await asyncio.wait_for(b_done.wait(), 10)

        s.server.commits.hooks["late"] = late
        sent_at = asyncio.get_running_loop().time()
        a = await lease_of(await s.acquire(target_id=target, ttl_ms=2000, service_instance_id="wa"))
        # the expiry is at most 2 s after the acquire was sent: 250 ms before that is in the lease's final fifth
        await asyncio.sleep(max(0.0, sent_at + 1.75 - asyncio.get_running_loop().time()))
        ra = asyncio.create_task(s.commit(a, target, {"append": ["a", a["fencing_token"]]}, service_instance_id="wa"))
        b = await lease_of(await s.acquire("lease-a1-peer", target_id=target, ttl_ms=5000, wait_ms=3000,
                                           service_instance_id="wb"))
        rb = await s.commit(b, target, {"append": ["b", b["fencing_token"]]}, principal="lease-a1-peer",
                            service_instance_id="wb")
        b_done.set()
        ra = await ra
        doc = await read_doc(store.url, rb.json()["commit"]["db"], target)
        return ra.json()["code"], went_late.is_set(), [e[0] for e in doc["entries"]], doc["fence_token"]

    honest, planted = await both(run_dir, valkey.url, "late-unguarded-commit", probe, store_url=store.url,
                                 store_db=db_name)
    assert honest == ("commit_accepted", False, ["a", "b"], 2)  # A's write landed before its lease expired
    assert planted == ("commit_accepted", True, ["b", "a"], 2)  # A's late write landed after B's, past the guard


async def test_counter_from_snapshot_reissues_a_token_after_a_restore(store, run_dir, db_name):
    async def probe(s, target):
        one = await lease_of(await s.acquire(target_id=target, ttl_ms=2000))
        await asyncio.to_thread(snapshot)
        assert (await s.release(one)).status_code == 200
        two = await lease_of(await s.acquire(target_id=target, ttl_ms=10_000))
        await asyncio.to_thread(restore)
        for _ in range(100):  # the recovery rule refuses (503) until its new epoch is established
            r = await s.acquire(target_id=target, ttl_ms=10_000, wait_ms=4000, service_instance_id="w3")
            if r.status_code == 200:
                return one["fencing_token"], two["fencing_token"], r.json()["lease"]["fencing_token"]
            assert r.status_code == 503, r.text
            await asyncio.sleep(0.05)
        raise AssertionError("no acquisition after the restore")

    v = ValkeyProcess(run_dir, name="valkey-restorable", persistence="none").start()
    snap = run_dir / "snap.rdb"

    def snapshot():
        c = redis.Redis.from_url(v.url)
        try:
            c.save()
        finally:
            c.close()
        shutil.copy(v.data_dir / "dump.rdb", snap)

    def restore():
        v.stop()
        shutil.copy(snap, v.data_dir / "dump.rdb")
        v.start()

    try:
        honest, planted = await both(run_dir, v.url, "counter-from-snapshot", probe, store_url=store.url,
                                     store_db=db_name)
    finally:
        v.stop()
    assert honest[:2] == (1, 2) and honest[2] > 2**32  # a new epoch: above every token issued before
    assert planted[:2] == (1, 2) and planted[2] == 2  # token 2, issued twice
