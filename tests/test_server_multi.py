"""Several real server processes (`python -m lab.server`) sharing one Valkey.

- 100 concurrent acquires spread over 3 instances: exactly one winner and one
  counter increment (C11, section 8 "concurrent acquires");
- a lease acquired through one instance is renewed and released through others
  (the owner is the principal + the worker's service instance, not the server);
- expiry then reacquire through another instance gives a strictly greater
  token, and the stale holder's renew/release never touch the successor;
- an idempotent retry through another instance returns the original lease;
- the command line refuses bad arguments with one line and exit status 2.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import httpx
import pytest
import redis

from lab.server import backend as keys
from lab.server.auth import provision_demo_principals, write_principals_file
from lab.server.identity import normalize_identity
from lab.server.testing import body, identity
from lab.stack.leaseserver import LeaseServerProcess

from conftest import lease_expired

P = "/api/v1/target-leases"


@pytest.fixture(scope="module")
def cluster(valkey_process, tmp_path_factory):
    """Three server instances on the session Valkey, with demo principals."""
    run_dir = tmp_path_factory.mktemp("lease-cluster")
    records, credentials = provision_demo_principals()
    principals = write_principals_file(records, run_dir / "principals.json")
    config = run_dir / "server.json"
    config.write_text(json.dumps({"min_ttl_ms": 50}))
    servers = []
    try:
        for i in range(3):
            servers.append(LeaseServerProcess(run_dir, valkey_url=valkey_process.url, principals_file=principals,
                                              name=f"lease-{i + 1}", config_file=config).start())
        yield servers, {c["principal_id"]: c["api_key"] for c in credentials}, run_dir
    finally:
        for s in servers:
            s.stop()


def auth(keys_by_principal, principal="lease-a1") -> dict[str, str]:
    return {"authorization": f"Bearer {keys_by_principal[principal]}"}


def on_lease(lease: dict, **fields) -> dict:
    b = body(ttl_ms=None, **{k: lease[k] for k in identity()})
    b.update(fencing_token=lease["fencing_token"], service_instance_id=lease["service_instance_id"], **fields)
    return b


async def test_100_concurrent_acquires_across_3_instances_have_one_winner(cluster, valkey):
    servers, api_keys, _ = cluster
    ident = identity(target_id=f"contended-{uuid.uuid4().hex[:8]}")
    limits = httpx.Limits(max_connections=120)
    async with httpx.AsyncClient(limits=limits, timeout=10.0) as client:
        async def one(i: int) -> httpx.Response:
            b = {**body(deadline_in_ms=8000), **ident, "service_instance_id": f"worker-{i}"}
            return await client.post(servers[i % 3].url + P + "/acquire", json=b, headers=auth(api_keys))
        responses = await asyncio.gather(*(one(i) for i in range(100)))
    codes = [r.json()["code"] for r in responses]
    assert codes.count("lease_acquired") == 1, codes
    assert codes.count("lease_conflict") == 99
    lock_key = normalize_identity(ident).lock_key()
    vk = redis.Redis.from_url(valkey.url, decode_responses=True)
    try:
        assert vk.get(keys.fence_key(lock_key)) == "1"
        winner = next(r.json()["lease"] for r in responses if r.status_code == 200)
        assert vk.hget(lock_key, "lease_id") == winner["lease_id"] and winner["fencing_token"] == 1
    finally:
        vk.close()


async def test_a_lease_moves_between_instances_with_its_worker(cluster, valkey):
    servers, api_keys, run_dir = cluster
    async with httpx.AsyncClient(timeout=10.0) as client:
        r = await client.post(servers[0].url + P + "/acquire", json=body(service_instance_id="worker-x"),
                              headers=auth(api_keys))
        lease = r.json()["lease"]
        assert lease["service_instance_id"] == "worker-x"
        r = await client.post(f"{servers[1].url}{P}/{lease['lease_id']}/renew", json=on_lease(lease),
                              headers=auth(api_keys))
        assert r.status_code == 200 and r.json()["code"] == "lease_renewed"
        r = await client.get(f"{servers[2].url}{P}/{lease['lease_id']}", headers=auth(api_keys))
        assert r.json()["lease"]["state"] == "active"
        r = await client.post(f"{servers[2].url}{P}/{lease['lease_id']}/release", json=on_lease(lease),
                              headers=auth(api_keys))
        assert r.status_code == 200 and r.json()["lease"]["state"] == "released"
    # each instance audits what it served, under its own instance id
    for i, server in enumerate(servers):
        lines = [json.loads(x) for x in (run_dir / "audit" / f"lease-{i + 1}.jsonl").read_text().splitlines()]
        assert lines and {x["server_instance_id"] for x in lines} == {f"lease-{i + 1}"}


async def test_expiry_then_reacquire_through_another_instance_gives_a_greater_token(cluster, valkey):
    servers, api_keys, _ = cluster
    async with httpx.AsyncClient(timeout=10.0) as client:
        old = (await client.post(servers[0].url + P + "/acquire", json=body(ttl_ms=150),
                                 headers=auth(api_keys))).json()["lease"]
        await lease_expired(valkey.url, old)
        new = (await client.post(servers[1].url + P + "/acquire", json=body(service_instance_id="worker-2"),
                                 headers=auth(api_keys, "lease-a1-peer"))).json()["lease"]
        assert new["fencing_token"] > old["fencing_token"]
        for op in ("renew", "release"):
            r = await client.post(f"{servers[2].url}{P}/{old['lease_id']}/{op}", json=on_lease(old),
                                  headers=auth(api_keys))
            assert r.status_code == 409 and r.json()["code"] == "lease_lost"
        r = await client.get(servers[2].url + P, params=identity(), headers=auth(api_keys))
        assert r.json()["lease"]["lease_id"] == new["lease_id"] and r.json()["lease"]["state"] == "active"


async def test_idempotent_retry_through_another_instance(cluster, valkey):
    servers, api_keys, _ = cluster
    b = body()
    async with httpx.AsyncClient(timeout=10.0) as client:
        first = (await client.post(servers[0].url + P + "/acquire", json=b, headers=auth(api_keys))).json()
        again = (await client.post(servers[2].url + P + "/acquire", json=b, headers=auth(api_keys))).json()
    assert again["replayed"] is True
    assert (again["lease"]["lease_id"], again["lease"]["fencing_token"]) == \
        (first["lease"]["lease_id"], first["lease"]["fencing_token"])


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab.server", *args], capture_output=True, text=True, timeout=60)


def test_command_line_refuses_bad_arguments_with_one_line_and_status_2(tmp_path):
    records, _ = provision_demo_principals()
    principals = write_principals_file(records, tmp_path / "principals.json")
    good = ["--host", "127.0.0.1", "--port", "18080", "--valkey-url", "redis://127.0.0.1:1/0",
            "--principals", str(principals), "--instance-id", "lease-1", "--audit-log", str(tmp_path / "a.jsonl")]
    bad_config = tmp_path / "bad.json"
    bad_config.write_text(json.dumps({"min_ttl_ms": -1}))
    broken_principals = tmp_path / "broken.json"
    broken_principals.write_text(json.dumps({"version": 1, "principals": [{"principal_id": "x"}]}))
    cases = [
        (["--port", "99999"], "--port"),
        (["--port", "http"], "--port"),
        (["--instance-id", "has space"], "--instance-id"),
        (["--principals", str(tmp_path / "missing.json")], "--principals"),
        (["--principals", str(broken_principals)], "principals[0]"),
        (["--config", str(bad_config)], "min_ttl_ms"),
        (["--valkey-url", "http://nope"], "valkey_url"),
    ]
    for change, mention in cases:
        args = list(good)
        for flag, value in zip(change[0::2], change[1::2]):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        done = run_cli(*args)
        assert done.returncode == 2, (change, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lab.server: error:") and mention in lines[0], done.stderr
    missing = run_cli(*good[:-2])
    assert missing.returncode == 2 and "--audit-log" in missing.stderr
