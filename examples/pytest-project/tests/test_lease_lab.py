"""This project's lease evidence: a lab run of the lease workload, and a direct check against the session stack."""

import asyncio
import json

import pytest

from lab.client import Identity, LeaseClient


def test_lease_workload_holds_the_contract(lab_run):
    run = lab_run("lease", time_limit=2, rate=80, keys=2, concurrency=4)
    assert run.valid is True, run.results
    for checker in ("fencing", "mutual-exclusion", "lease-state"):
        assert run.results["results"][checker]["valid"] is True, checker
    assert (run.run_dir / "history.jsonl").exists()
    assert run.replay.startswith("fencelab test --workload lease")


def test_one_holder_at_a_time_across_servers(lab_stack):
    status = lab_stack.status()
    key = json.loads(open(status.credentials).read())[0]["api_key"]
    identity = Identity("tenant-a", "program-1", "pytest", "door", "actor-1", "wf")

    async def scenario():
        first, second = status.lease_servers[:2]
        async with LeaseClient(first, key, service_instance_id="a") as a, \
                LeaseClient(second, key, service_instance_id="b") as b:
            held = await a.acquire(identity, ttl_ms=5000)
            rival = await b.acquire(identity, ttl_ms=5000)
            await a.release(held.lease)
            return held, rival

    held, rival = asyncio.run(scenario())
    assert held.ok and (rival.outcome, rival.code) == ("fail", "lease_conflict")


@pytest.mark.lab_slow
def test_long_campaign_with_faults(lab_run):
    run = lab_run("lease", time_limit=120, nemesis="partition", rate=200)
    assert run.valid is True, run.results
