"""Workloads through the SUT registry and the interpreter: the fake StarIntel server and the in-memory example.

Each run is the lease workload exactly as `fencelab test` drives it (its
generator, its client via `workloads.common.lease_client`, the interpreter,
the history on disk, the lease checkers), against a system plugged in
through `lab.sut` instead of the local stack.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import lab.generator as gen
from checkers.core import safe_check
from lab.couch import FENCE_VALIDATE
from lab.history import HistoryWriter, read_history
from lab.sut import SutError, get_sut, load_findings, register_sut, unregister_sut
from lab.testmap import RunContext, Test
from test_starintel_fake import FakeCluster
from workloads import get_workload, needs_of
from workloads.common import lease_client

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "inmemory_sut.py"


def load_example():
    """The example module, loaded from its file (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("inmemory_sut", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def run_workload(test: Test) -> tuple[dict, list[dict]]:
    """The test's workload through the interpreter; returns the checkers' results and the history."""
    wl = get_workload(test.workload)(test)
    test.live.nodes = test.live.nodes or wl.nodes(test)
    writer = HistoryWriter(test.run_dir / "history.jsonl")
    try:
        await gen.run(test, gen.time_limit(test.time_limit, gen.clients(wl.generator)), wl.client,
                      history_writer=writer, concurrency=test.concurrency, seed=test.seed)
    finally:
        writer.close()
    history = read_history(test.run_dir / "history.jsonl")
    return safe_check(wl.checker, test.to_json(), history, {}), history


def completions(history: list[dict], f: str, type_: str) -> list[dict]:
    return [op for op in history if op["f"] == f and op["type"] == type_]


async def test_lease_workload_against_fake_starintel_is_valid(tmp_path):
    with FakeCluster(2) as cluster:
        key_file = tmp_path / "api-key"
        key_file.write_text(cluster.store.add_credential("lab-worker") + "\n")
        test = Test(name="starintel", workload="lease", time_limit=2.0, concurrency=4, rate=60.0, keys=2,
                    ttl_ms=1000, seed=3, live=RunContext(lease_servers=list(cluster.urls)), run_dir=tmp_path,
                    extra={"sut": "starintel", "api_key_file": str(key_file)})
        results, history = await run_workload(test)
    assert results["valid"] is True, results
    assert completions(history, "acquire", "ok") and completions(history, "release", "ok")
    assert completions(history, "acquire", "fail"), "conflicts between workers are the point of the workload"
    assert all(op.get("error") in (None, "lease_conflict", "lease_lost", "not_held") for op in history
               if op["type"] == "fail"), "dialect codes must reach the history as contract codes"
    leases = {op["value"]["lease_id"]: (op["key"], op["value"]["fencing_token"])  # a retried acquire: same lease
              for op in completions(history, "acquire", "ok")}
    assert len(set(leases.values())) == len(leases), "every lease of a key (two servers, one store) has its own token"
    observed = {r["id"]: r for r in load_findings(tmp_path)}
    assert {"code.acquired", "codes.bare", "record.shape", "record.times", "route.release",
            "envelope.retry"} <= observed.keys()
    assert all(r["observed"] for r in observed.values())


async def test_inmemory_example_runs_the_lease_workload_valid(tmp_path):
    module = load_example()
    register_sut("inmemory-example", module.InMemoryLeaseSystem)
    try:
        test = Test(name="inmemory", workload="lease", time_limit=1.5, concurrency=5, rate=100.0, keys=2,
                    ttl_ms=500, seed=11, live=RunContext(nodes=["in-process"]), run_dir=tmp_path,
                    extra={"sut": "inmemory-example"})
        results, history = await run_workload(test)
    finally:
        unregister_sut("inmemory-example")
    assert results["valid"] is True, results
    for name in ("fencing", "mutual-exclusion", "lease-state", "idempotency"):
        assert results["results"][name]["valid"] is True, name
    assert completions(history, "renew", "ok") and completions(history, "acquire", "fail")
    assert test.live["inmemory_table"].counters, "every worker shared the run's one table"


async def test_inmemory_example_semantics():
    module = load_example()
    from lab.client import Identity

    clock = [1_000_000]
    test = Test(workload="lease")
    test.live["inmemory_table"] = module.LeaseTable(clock_ms=lambda: clock[0])
    a = module.InMemoryLeaseSystem(test, None, "w-1")
    b = module.InMemoryLeaseSystem(test, None, "w-2")
    ident = Identity("t", "p", "ns", "k", "a", "wf")
    first = (await a.acquire(ident, ttl_ms=100, request_id="r1")).lease
    assert (await a.acquire(ident, ttl_ms=100, request_id="r1")).lease.lease_id == first.lease_id
    assert (await a.acquire(ident, ttl_ms=200, request_id="r1")).code == "idempotency_conflict"
    assert (await b.acquire(ident, ttl_ms=100)).code == "lease_conflict"
    assert (await b.renew(first)).code == "lease_lost", "another worker does not own it"
    clock[0] += 100
    assert (await a.renew(first)).code == "lease_lost", "an expired lease is never revived"
    second = (await b.acquire(ident, ttl_ms=100)).lease
    assert second.fencing_token == first.fencing_token + 1
    assert (await a.release(first)).code == "lease_lost", "a stale release never touches the successor"
    assert (await a.revoke(second, "incident")).lease.state == "revoked"
    assert (await b.inspect(ident)).code == "lease_not_found"


async def test_a_workload_needing_commit_is_refused_for_starintel(tmp_path):
    test = Test(workload="fenced-append", live=RunContext(lease_servers=["http://127.0.0.1:1"]),
                extra={"sut": "starintel"})
    with pytest.raises(SutError, match="fenced-append.*needs commit.*starintel.*lease, idempotency.*reference"):
        lease_client(test, "http://127.0.0.1:1", needs=needs_of(test.workload))
    assert get_sut("reference").capabilities >= {"commit"}


def test_the_doc_shows_the_example_file_verbatim():
    doc = (EXAMPLE.parents[1] / "docs" / "plugging-in-a-system.md").read_text()
    marker = "<!-- example: examples/inmemory_sut.py -->\n```python\n"
    assert marker in doc
    shown = doc.split(marker, 1)[1].split("```\n", 1)[0]
    assert shown == EXAMPLE.read_text(), "docs/plugging-in-a-system.md must show examples/inmemory_sut.py as it is"


def test_the_doc_shows_the_labs_own_store_guard():
    """The store guard a plug-in is shown is the one the built-in systems install (issue 18 item 8)."""
    doc = (EXAMPLE.parents[1] / "docs" / "plugging-in-a-system.md").read_text()
    marker = "<!-- the store guard: lab.couch.FENCE_VALIDATE -->\n```js\n"
    assert marker in doc
    assert doc.split(marker, 1)[1].split("```\n", 1)[0] == FENCE_VALIDATE + "\n"
