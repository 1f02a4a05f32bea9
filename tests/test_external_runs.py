"""`--url` as a first-class mode: refused before the run when it would judge nothing; client-side faults work.

The system under test is a stack the lab started for this module and then
treats as someone else's (its URLs, one API key, its store URL): nothing here
touches its processes. Each refusal test reproduces a vacuous pass first seen
by hand (`fencelab test --url http://127.0.0.1:1 ...` was `valid=true` with
every one of its 168 operations failed): now it is exit code 2 and one line,
before any run directory exists.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from conftest import SESSION_PIDS
from lab.cli import main
from lab.testmap import Test


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """Someone else's system: two reference servers and their store (a lab stack, used only through its URLs)."""
    from lab.stack.local import LocalStack, StackOptions
    from workloads.common import pick_credential

    root = tmp_path_factory.mktemp("external-system")
    stack = LocalStack(name="ext", root=root / "stack", die_with_parent=True)
    try:
        status = stack.up(StackOptions(servers=2, store=True))
        pids = {p.pid for p in stack.processes}
        SESSION_PIDS.update(pids)
        creds = json.loads(Path(status.credentials).read_text())
        key = root / "key"
        key.write_text(pick_credential(creds)["api_key"] + "\n")
        other = root / "other-tenant-key"  # a valid key whose scope does not cover the workloads' identities
        other.write_text(next(c["api_key"] for c in creds if c["principal_id"] == "lease-b1") + "\n")
        yield {"urls": list(status.lease_servers), "store": status.store, "key": key, "other_key": other}
    finally:
        stack.down()
        SESSION_PIDS.difference_update({p.pid for p in stack.processes} | locals().get("pids", set()))


def run_cli(tmp_path, *args) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["test", "--store-dir", str(tmp_path / "store"), *args])
    return res.exit_code, res.output


def url_args(ext, *more, key=None) -> list[str]:
    args = []
    for u in ext["urls"]:
        args += ["--url", u]
    return args + ["--api-key-file", str(key or ext["key"]), *more]


def one_error_line(out: str) -> str:
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("fencelab: error: ") and "Traceback" not in out, out
    return lines[0]


# -- refused before the run: the vacuous passes ------------------------------------------------------------


def test_nothing_listening_is_refused_before_the_run(tmp_path):
    key = tmp_path / "k"
    key.write_text("some-key\n")
    code, out = run_cli(tmp_path, "--url", "http://127.0.0.1:1", "--api-key-file", str(key), "--time-limit", "2")
    assert code == 2 and "cannot reach the system under test" in one_error_line(out), out
    assert not (tmp_path / "store").exists(), "no run directory for a run that never started"


def test_a_wrong_key_is_refused_before_the_run(tmp_path, ext):
    bad = tmp_path / "bad-key"
    bad.write_text("not-a-key-of-this-server\n")
    code, out = run_cli(tmp_path, *url_args(ext, "--time-limit", "2", key=bad))
    assert code == 2 and "refused the API key (invalid_credential)" in one_error_line(out), out
    assert "not-a-key-of-this-server" not in out
    assert not (tmp_path / "store").exists()


def test_a_key_whose_scope_misses_the_workload_is_refused(tmp_path, ext):
    code, out = run_cli(tmp_path, *url_args(ext, "--time-limit", "2", key=ext["other_key"]))
    assert code == 2 and "access_denied" in one_error_line(out), out


def test_a_store_the_server_does_not_write_into_is_refused(tmp_path, ext):
    code, out = run_cli(tmp_path, *url_args(ext, "--workload", "fenced-append", "--time-limit", "2",
                                            "--store-url", ext["store"], "--store-db", "no-such-db"))
    assert code == 2 and "has no database 'no-such-db'" in one_error_line(out), out
    code, out = run_cli(tmp_path, *url_args(ext, "--workload", "fenced-append", "--time-limit", "2",
                                            "--store-url", "http://127.0.0.1:1"))
    assert code == 2 and "cannot reach the store" in one_error_line(out), out
    assert not (tmp_path / "store").exists()


def test_a_store_that_refuses_the_credentials_is_refused_without_showing_them(tmp_path, ext):
    from lab.stack.store import PouchDBProcess

    store = PouchDBProcess(tmp_path / "theirs", in_memory=True).start()
    try:
        assert httpx.put(store.url + "/_config/admins/admin", content='"right-pw"',
                         headers={"Content-Type": "application/json"}, timeout=5).status_code == 200
        wrong = store.url.replace("http://", "http://admin:wrong-pw@")
        code, out = run_cli(tmp_path, *url_args(ext, "--workload", "fenced-append", "--time-limit", "2",
                                                "--store-url", wrong))
        line = one_error_line(out)
        assert code == 2 and "refused the credentials (HTTP 401)" in line and "admin:***@" in line, out
        assert "wrong-pw" not in out
    finally:
        store.stop()


@pytest.mark.parametrize("args, message", [
    (["--workload", "fenced-append"], "needs --store-url"),
    (["--servers", "3"], "drop --servers"),
    (["--nemesis", "kill"], "it needs its processes, to SIGKILL and restart"),
    (["--nemesis", "valkey-crash"], "its Valkey process"),
    (["--nemesis", "clock"], "use client-clock"),
    (["--nemesis", "partition"], "add --proxy-urls"),
    (["--nemesis", "reset-peer"], "add --proxy-urls"),
    (["--lab-owns-store"], "give --store-url"),
])
def test_what_cannot_apply_to_an_external_system_is_refused_naming_it(tmp_path, ext, args, message):
    code, out = run_cli(tmp_path, *url_args(ext, "--time-limit", "2", *args))
    line = one_error_line(out)
    assert code == 2 and message in line, out
    if "--nemesis" in args:
        assert ext["urls"][0] in line, "the refusal names the system"
    assert not (tmp_path / "store").exists()


def test_network_faults_need_a_url_to_proxy(tmp_path):
    from lab.runner import RunError, validate
    from lab.sut import register_sut, unregister_sut

    register_sut("inproc-x", lambda test, node, instance: None, capabilities=())
    try:
        with pytest.raises(RunError, match="in-process SUT 'inproc-x' has no network link"):
            validate(Test(nemesis=["latency"], extra={"sut": "inproc-x"}))
        with pytest.raises(RunError, match="no settable client clock"):
            validate(Test(nemesis=["client-clock"], extra={"sut": "inproc-x"}))
        with pytest.raises(RunError, match="--proxy-urls puts the lab's Toxiproxy in front of the --url servers"):
            validate(Test(extra={"sut": "inproc-x", "proxy_urls": True}))
    finally:
        unregister_sut("inproc-x")
    with pytest.raises(RunError, match="is not plain http://"):
        validate(Test(extra={"urls": ["https://lease.example"], "api_key_file": __file__, "proxy_urls": True}))
    from nemesis.registry import validate_names

    with pytest.raises(ValueError, match="give clock or client-clock, not both"):
        validate_names("clock,client-clock")


# -- client-side faults against an external system --------------------------------------------------------


def results_of(tmp_path, name: str) -> tuple[dict, list[dict], dict]:
    run = (tmp_path / "store" / name / "latest").resolve()
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines() if x.strip()]
    return json.loads((run / "results.json").read_text()), history, json.loads((run / "test.json").read_text())


def windows(history: list[dict]) -> set[str]:
    return {op["value"]["fault"] for op in history if op.get("process") == "nemesis"
            and isinstance(op.get("value"), dict) and op["value"].get("phase") == "start"}


def test_client_pause_and_client_clock_act_on_an_external_system(tmp_path, ext):
    code, out = run_cli(tmp_path, *url_args(ext, "--time-limit", "5", "--nemesis", "client-pause,client-clock",
                                            "--nemesis-interval", "0.5", "--concurrency", "3", "--name", "cc"))
    assert code in (0, 3), out  # never invalid: the reference server is correct under client faults
    results, history, test = results_of(tmp_path, "cc")
    assert {"client-pause", "clock"} <= windows(history), windows(history)
    moved = [op["value"] for op in history if op.get("process") == "nemesis" and isinstance(op.get("value"), dict)
             and op["value"].get("fault") == "clock" and op["value"].get("phase") == "start"]
    assert all(set(v["targets"]) <= {"client-0", "client-1", "client-2"} for v in moved), moved
    assert sum(1 for op in history if op.get("type") == "ok" and op.get("f") == "acquire") > 0
    assert all(v["valid"] is not False for v in results["results"].values()), results["results"]
    assert "--nemesis client-pause,client-clock" in test["replay"]


async def test_client_clock_moves_only_the_labs_client_clock(ext):
    """A client clock 30 s behind sends deadlines already past: the external server refuses them (408), and
    once the clock is reset the same client works again. No stack: the nemesis needs none."""
    import secrets

    from lab.client import LeaseClient
    from nemesis import registry
    from nemesis.core import invocation
    from workloads.common import identity_for

    test = Test(concurrency=2, time_limit=5, extra={"urls": ext["urls"]})
    nemesis, _ = registry.build(test, ["client-clock"], interval_s=1, seed=1)
    await nemesis.setup(test)
    client = LeaseClient(ext["urls"][0], ext["key"].read_text().strip(), service_instance_id="client-clock-probe")
    client.clock_ms = test.live["client_clocks"].clock_for(0)  # what the workload clients do before each op
    try:
        ident = identity_for(f"cc-{secrets.token_hex(4)}")
        before = await client.inspect(ident, deadline_s=2)
        assert before.code == "lease_not_found", before
        moved = await nemesis.invoke(test, invocation("bump-clock", {"targets": ["client-0"], "delta_s": -30}))
        assert moved["value"]["offsets"] == {"client-0": -30.0}, moved
        behind = await client.acquire(ident, ttl_ms=2000, deadline_s=2)
        assert (behind.outcome, behind.code, behind.http_status) == ("fail", "deadline_exceeded", 408), behind
        other = test.live["client_clocks"].clock_for(1)()  # the other thread's clock did not move
        assert abs(other - time.time() * 1000) < 5_000
        await nemesis.invoke(test, invocation("reset-clock"))
        after = await client.acquire(ident, ttl_ms=2000, deadline_s=2)
        assert after.ok, after
        await client.release(after.lease, identity=ident, deadline_s=2)
    finally:
        await nemesis.teardown(test)
        await client.aclose()


def test_a_partition_through_proxied_urls_cuts_the_client_link_and_heals(tmp_path, ext):
    """Through ProxiedUrls the lab's partition blackholes exactly the client -> server link it names."""
    import asyncio

    from lab.sut.proxy import ProxiedUrls
    from nemesis.core import invocation
    from nemesis.registry import build

    px = ProxiedUrls(ext["urls"], tmp_path / "px")
    status = px.up()
    procs = list(px.processes)
    try:
        assert status.lease_servers == tuple(ext["urls"]) and status.client_nodes == tuple(px.client_nodes)
        assert status.backend == "external" and status.up and status.toxiproxy == px.info["toxiproxy"]
        state = json.loads((tmp_path / "px" / "state.json").read_text())  # recorded: a later down finds it
        assert [p["name"] for p in state["processes"]] == ["toxiproxy"] and state["client_nodes"] == px.client_nodes
        assert len(px.client_nodes) == 2 * len(ext["urls"]) and sorted(px.info["topology"]) == sorted(
            f"c{g}_lease-{i}" for g in (1, 2) for i in range(1, len(ext["urls"]) + 1))
        c1_lease1, c2_lease1 = px.client_nodes[0], px.client_nodes[len(ext["urls"])]
        test = Test(concurrency=2, time_limit=5, nemesis=["partition"], extra={"urls": ext["urls"]})
        test.live["stack"] = px

        def healthy(url: str) -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        async def scenario() -> tuple[bool, bool, bool]:
            nemesis, _ = build(test, ["partition"], interval_s=1, seed=1)
            await nemesis.setup(test)
            try:
                await nemesis.invoke(test, invocation("start-partition", {"links": ["c1_lease-1"]}))
                cut, other = await asyncio.gather(asyncio.to_thread(healthy, c1_lease1),
                                                  asyncio.to_thread(healthy, c2_lease1))
                await nemesis.invoke(test, invocation("stop-partition"))
                healed = await asyncio.to_thread(healthy, c1_lease1)
            finally:
                await nemesis.teardown(test)
            return cut, other, healed

        assert healthy(c1_lease1) and healthy(ext["urls"][0])
        cut, other, healed = asyncio.run(scenario())
        assert (cut, other, healed) == (False, True, True), "only c1 -> lease-1 was cut, and it healed"
    finally:
        assert px.down() == ["toxiproxy"] and not (tmp_path / "px" / "state.json").exists()
    assert procs and not any(p.alive() for p in procs), "the run's Toxiproxy is stopped by pid"


def test_proxy_urls_put_the_labs_toxiproxy_between_clients_and_the_servers(tmp_path, ext):
    code, out = run_cli(tmp_path, *url_args(ext, "--time-limit", "6", "--nemesis", "partition,latency",
                                            "--nemesis-interval", "1", "--proxy-urls", "--name", "px"))
    assert code in (0, 3), out
    results, history, test = results_of(tmp_path, "px")
    ports = {u.rsplit(":", 1)[1] for u in ext["urls"]}
    assert test["client_nodes"] and not {n.rsplit(":", 1)[1] for n in test["client_nodes"]} & ports, \
        "the clients dial the lab's proxies, not the servers"
    assert {"partition", "latency"} & windows(history), windows(history)
    cut = [op["value"] for op in history if op.get("process") == "nemesis" and isinstance(op.get("value"), dict)
           and op["value"].get("fault") == "partition" and op["value"].get("phase") == "start"]
    assert all(all(link.startswith("c") and "_lease-" in link for link in v.get("links", [])) for v in cut), cut
    assert all(v["valid"] is not False for v in results["results"].values()), results["results"]
    assert "--proxy-urls" in test["replay"]
    assert all(httpx.get(u + "/healthz", timeout=3).status_code == 200 for u in ext["urls"]), "the system is healed"


# -- the store: the lab installs nothing into it, and reads honour --store-url ---------------------------


async def test_the_lab_installs_its_fence_guard_only_in_a_store_it_owns(store):
    """fenced-append and the commit scenarios set up the store only when it is the lab's (or the user says so)."""
    from lab.couch import CouchClient
    from lab.scenarios.driver import ScenarioDriver, Shared
    from workloads import needs_of
    from workloads.fenced_append import FencedAppendDriver

    async with CouchClient(store.url) as couch:
        for db in ("theirs", "scratch"):
            await couch.http.put(f"{store.url}/{db}")
        for client in (FencedAppendDriver(), ScenarioDriver(Shared({}), needs_of("fenced-append"), needs_store=True)):
            theirs = Test(extra={"urls": ["http://127.0.0.1:9"], "store_url": store.url, "store_db": "theirs"})
            theirs.live["store_url"] = store.url
            await client.setup(theirs)
            assert await couch.get("theirs", "_design/fence") is None, f"{type(client).__name__} installed its guard"
            scratch = Test(extra={"urls": ["http://127.0.0.1:9"], "store_url": store.url, "store_db": "scratch",
                                  "lab_owns_store": True})
            scratch.live["store_url"] = store.url
            await client.setup(scratch)
            assert (await couch.get("scratch", "_design/fence"))["validate_doc_update"]
            await couch.http.delete(f"{store.url}/scratch/_design/fence",
                                    params={"rev": (await couch.get("scratch", "_design/fence"))["_rev"]})


def test_fenced_append_against_an_external_server_and_its_store(tmp_path, ext):
    code, out = run_cli(tmp_path, *url_args(ext, "--workload", "fenced-append", "--time-limit", "4",
                                            "--store-url", ext["store"], "--name", "fa"))
    assert code in (0, 3), out
    results, history, test = results_of(tmp_path, "fa")
    reads = [op for op in history if op.get("f") == "read" and op.get("type") != "invoke"]
    assert reads and all(op["type"] == "ok" for op in reads), reads[:3]
    assert any(op["value"]["entries"] for op in reads), "the final reads saw the commits in the system's store"
    assert results["results"]["commits-exercised"]["valid"] is True
    assert test["extra"]["probe"]["store"]["db"] == "fencelab"


def commit_scenario(tmp_path, ext, *more) -> dict:
    code, out = run_cli(tmp_path, *url_args(ext, "--scenario", "commit-after-expiry", "--time-limit", "2.5",
                                            "--name", "cae", *more))
    assert code in (0, 1, 3), out
    return results_of(tmp_path, "cae")[0]["results"]["scenario:commit-after-expiry"]


def test_commit_scenarios_read_the_documents_from_store_url(tmp_path, ext):
    mine = commit_scenario(tmp_path, ext, "--store-url", ext["store"])
    assert mine["valid"] is True and "documents_unread" not in mine, mine
    assert mine["commits_after_expiry"] >= 1 and mine["holder_commits_accepted"] >= 1, mine


def test_commit_scenarios_without_a_store_say_unknown_and_why(tmp_path, ext):
    """Before: the final reads failed with no_store and the check skipped them silently (valid: true)."""
    mine = commit_scenario(tmp_path, ext)
    assert mine["valid"] == "unknown" and mine["documents_unread"], mine
    assert "--store-url" in mine["documents_unread"][0] and "final read" in mine["not_exercised"], mine
