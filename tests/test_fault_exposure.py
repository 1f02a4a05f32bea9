"""Every fault kind proven to expose a bug (campaigns/faults.toml, docs/nemesis.md "Every fault exposes a bug").

For each row of the shipped fault table, on every seed: the fault with its
planted bug is judged invalid, the same run without the fault is valid (the
fault exposes the bug, not the workload), and the fault against the unmodified
server is valid. Real stacks, real faults: root for `netns` (skipped with the
reason otherwise; CI runs as root), libfaketime for the clocks.

The spec's own validation is tested without a stack.
"""

from __future__ import annotations

import os

import pytest

from lab.exposure import (EXPOSED, PLAIN, UNMODIFIED, DEFAULT_SPEC, FaultsError, load_spec, parse_spec,
                              render_markdown, run_faults, unavailable)

SPEC = load_spec(DEFAULT_SPEC)
FAULT_KINDS = ("partition", "netns", "latency", "clock", "kill", "pause", "client-pause", "valkey-crash",
               "valkey-restore")


def test_the_table_has_a_row_for_every_fault_kind_and_only_planted_bugs_that_exist():
    from lab.server.mutants import MUTANTS

    assert [r.fault for r in SPEC.rows] == list(FAULT_KINDS)
    nemeses = {r.fault: r.nemesis for r in SPEC.rows}
    assert nemeses["clock"] == ("server-clock",), "clock skew on the servers only: Valkey's clock never moves"
    assert nemeses["netns"] == ("netns",) and nemeses["partition"] == ("partition",)
    for r in SPEC.rows:
        assert r.mutant in MUTANTS and r.why
    assert SPEC.seeds >= 2


@pytest.mark.parametrize("bad, message", [
    ({"faults": {}}, "no [faults.<fault>] rows"),
    ({"faults": {"x": {"nemesis": "partition", "mutant": "nope", "workload": "lease", "why": "w"}}},
     "unknown mutant 'nope'"),
    ({"faults": {"x": {"nemesis": "chaos", "mutant": "local-clock", "workload": "lease", "why": "w"}}},
     "nemesis must name known nemeses"),
    ({"faults": {"x": {"nemesis": "kill", "mutant": "local-clock", "workload": "lease"}}}, "missing why"),
    ({"faults": {"x": {"nemesis": "kill", "mutant": "local-clock", "workload": "lease", "why": "w", "ttl": 5}}},
     "unknown key 'ttl'"),
    ({"faults": {"x": {"nemesis": "kill", "mutant": "local-clock", "workload": "lease", "why": "w",
                       "keys": "3"}}}, "keys must be an integer"),
    ({"faults": {"x": {"nemesis": "kill", "mutant": "local-clock", "workload": "nope", "why": "w"}}},
     "unknown workload"),
    ({"seeds": 0, "faults": {}}, "seeds must be an integer from 1 to 100"),
    ({"colour": 1}, "unknown key 'colour'"),
])
def test_a_bad_spec_is_one_line_naming_the_problem(bad, message):
    with pytest.raises(FaultsError) as e:
        parse_spec(bad, "faults.toml")
    assert message.lower() in str(e.value).lower() and "\n" not in str(e.value)


def test_a_row_that_cannot_run_here_is_skipped_with_the_reason_and_does_not_hold(monkeypatch, tmp_path):
    import lab.exposure as exposure

    monkeypatch.setattr(exposure, "unavailable", lambda names: "netns nemesis needs root" if "netns" in names else None)
    monkeypatch.setattr(exposure, "_one_run", lambda *a, **k: pytest.fail("a skipped row must not run"))
    spec = parse_spec({"faults": {"netns": {"nemesis": "netns", "mutant": "renew-without-backend",
                                            "workload": "lease", "why": "w"}}}, "t")
    (res,) = run_faults(spec, tmp_path, progress=lambda s: None)
    assert res.skipped == "netns nemesis needs root" and not res.holds
    assert "skipped: netns nemesis needs root" in render_markdown([res])


# -- the planted bugs themselves, one deterministic probe each (default server vs planted) --------------------
@pytest.fixture
def own_valkey(run_dir):
    """A Valkey this test stops (the fault)."""
    from lab.stack.valkey import ValkeyProcess

    v = ValkeyProcess(run_dir, name="valkey-faulted", persistence="none").start()
    try:
        yield v
    finally:
        v.stop()


@pytest.mark.parametrize("planted", [False, True], ids=["default", "planted"])
async def test_renew_without_backend_answers_a_renew_valkey_never_saw(own_valkey, run_dir, planted):
    import asyncio

    from lab.server.testing import in_process_server

    extra = {"allow_mutants": True, "mutant": "renew-without-backend"} if planted else {}
    async with in_process_server(run_dir, own_valkey.url, **extra) as s:
        r = await s.acquire(ttl_ms=1000)
        assert r.status_code == 200, r.text
        lease = r.json()["lease"]
        own_valkey.stop()  # Valkey down: nothing can be renewed
        await asyncio.sleep(0.05)  # the event loop sees the pooled connection close: the renew is refused, not lost
        r = await s.renew(lease)
        if planted:  # assumed success: an expiry Valkey never recorded
            assert r.status_code == 200 and r.json()["code"] == "lease_renewed", r.text
            assert r.json()["lease"]["expires_at_ms"] > lease["expires_at_ms"]
        else:
            assert r.status_code == 503 and r.json()["code"] == "lease_backend_unavailable", r.text


@pytest.mark.parametrize("planted", [False, True], ids=["default", "planted"])
async def test_idle_holder_refenced_changes_the_token_of_a_holder_back_from_a_pause(valkey, run_dir, planted):
    import asyncio

    from lab.server.testing import in_process_server

    extra = {"allow_mutants": True, "mutant": "idle-holder-refenced"} if planted else {}
    async with in_process_server(run_dir, valkey.url, **extra) as s:
        r = await s.acquire(ttl_ms=20_000)
        assert r.status_code == 200, r.text
        held = r.json()["lease"]
        prompt = await s.renew(held)  # a holder that calls without a pause: nothing happens
        assert prompt.status_code == 200 and prompt.json()["lease"]["fencing_token"] == held["fencing_token"]
        await asyncio.sleep(1.2)  # the holder is silent (the fault itself: a paused client); its lease lives 20 s
        r = await s.renew(held)
        assert r.status_code == 200, r.text
        if planted:  # one lease, two tokens
            assert r.json()["lease"]["lease_id"] == held["lease_id"]
            assert r.json()["lease"]["fencing_token"] != held["fencing_token"]
        else:
            assert r.json()["lease"]["fencing_token"] == held["fencing_token"]


@pytest.mark.parametrize("planted", [False, True], ids=["default", "planted"])
async def test_restart_drops_leases_frees_a_held_identity_when_a_server_restarts(valkey, run_dir, planted):
    from lab.server.testing import in_process_server

    extra = {"allow_mutants": True, "mutant": "restart-drops-leases"} if planted else {}
    async with in_process_server(run_dir / "before", valkey.url, **extra) as s:
        r = await s.acquire(ttl_ms=20_000)
        assert r.status_code == 200, r.text
        held = r.json()["lease"]
    async with in_process_server(run_dir / "after", valkey.url, **extra) as s:  # the same server, restarted
        r = await s.acquire(ttl_ms=20_000, service_instance_id="worker-2")
        if planted:  # a second holder while the first still holds a 20 s lease
            assert r.status_code == 200, r.text
            assert (await s.renew(held)).json()["code"] == "lease_lost"
        else:
            assert r.status_code == 409 and r.json()["code"] == "lease_conflict", r.text
            assert (await s.renew(held)).status_code == 200


JOBS = 2  # runs at once, each in its own process: the table's 44 runs in about 5 minutes on 2 cores


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Every row of the shipped table, run once (plain runs shared between rows), rows by fault."""
    results = run_faults(SPEC, tmp_path_factory.mktemp("faults"), jobs=JOBS, progress=lambda s: None)
    return {r.row.fault: r for r in results}


@pytest.mark.timeout(900)  # the first one runs the whole table (its fixture): about 5 minutes on 2 cores
# the clock row's assertion runs under `make test-slow`. The stored misses with the old draw were exposed runs that
# stayed valid (seed 0: three weak windows, +0.1 s on one server, -0.076 s and -1.062 s on both). server-clock now
# skews one server by TTL-sized steps (8/8 seeds caught, plain and unmodified runs 8/8 valid, 2026-12-04), yet
# about one window in three still meets no handoff of a key between the servers at TTL 500 ms, and a run can
# convict by load alone: the mutant reads its clock before its script runs, so a burst's second acquire,
# stamped a few ms before the first holder's renew and release, lands after them (one exposed run convicted
# only that way, at 0.13 s, before any window). Neither half is certain on a loaded CI machine.
@pytest.mark.parametrize("fault", [pytest.param(f, marks=pytest.mark.slow) if f == "clock" else f for f in FAULT_KINDS])
def test_the_fault_exposes_its_planted_bug_on_every_seed_and_only_the_fault_does(fault, table):
    res = table[fault]
    if res.skipped:
        if os.environ.get("CI") and os.geteuid() == 0:
            pytest.fail(f"{fault}: cannot run in CI as root: {res.skipped}")
        pytest.skip(f"{fault}: {res.skipped}")
    where = {k: [(v["valid"], v["failed"], v["run_dir"], *([v["error"]] if "error" in v else []))
                 for v in res.runs[k]] for k in (EXPOSED, PLAIN, UNMODIFIED)}  # a run that raised: why
    assert len(res.runs[EXPOSED]) == len(res.runs[PLAIN]) == len(res.runs[UNMODIFIED]) == SPEC.seeds
    assert all(v["valid"] is False for v in res.runs[EXPOSED]), f"not caught on every seed: {where[EXPOSED]}"
    assert all(v["failed"] for v in res.runs[EXPOSED]), where[EXPOSED]  # invalid because a checker convicted it
    assert all(v["valid"] is True for v in res.runs[PLAIN]), f"the run without the fault exposes it: {where[PLAIN]}"
    assert all(v["valid"] is True for v in res.runs[UNMODIFIED]), \
        f"the unmodified server is not valid under {fault}: {where[UNMODIFIED]}"
    assert res.holds
