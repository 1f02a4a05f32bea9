"""bench/server_throughput.py calls the server's own scripts with the server's KEYS/ARGV layout; keep them in step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import redis

from lab.server.scripts import load_scripts

BENCH = Path(__file__).resolve().parent.parent / "bench" / "server_throughput.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("server_throughput", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["server_throughput"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_raw_phase_acquires_and_releases_with_the_server_scripts(valkey):
    bench = load_bench()
    c = redis.Redis.from_url(valkey.url)
    for s in load_scripts().values():
        c.script_load(s.source)
    raw = bench.RawScripts({"principal_id": "lease-a1", "credential_id": "lease-a1-k1", "instance": "bench",
                            "ttl_ms": 5000})
    prepared = raw.prepare(bench.bench_identity("layout"))
    reply = c.evalsha(raw.acquire_sha, *raw.acquire_call(prepared, "rid-1", "lease-1"))
    got = bench.token_of(reply)
    assert got is not None, f"the bench's acquire no longer matches the server's layout: {reply[:2]}"
    lease_id, token = got
    again = bench.token_of(c.evalsha(raw.acquire_sha, *raw.acquire_call(prepared, "rid-2", "lease-2")))
    assert again is None, "a second acquire of a held identity must not win"
    released = c.evalsha(raw.release_sha, *raw.release_call(prepared, "rid-3", lease_id, token))
    assert released[0] == b"lease_released", released[:2]
    c.close()
