"""The lab's client path (issue 13, target 1): HTTP client libraries compared, and the recorded-ops figure.

    .tools/venv/bin/python bench/client_path.py [--seconds 4] [--processes 50] [--quick]

One run starts its own Valkey and two reference lease servers, then measures, one after the other:

1. Per-op client CPU of each HTTP client library (`LIBRARIES`): a child process per library runs 50
   asyncio workers, each acquiring a distinct identity and releasing it in a loop over keep-alive
   connections spread over the two servers, and reports its own CPU (`time.process_time`) per completed
   request. The servers run in other processes, so this is the client's CPU alone. Compared: a minimal
   hand-written HTTP/1.1 client on asyncio streams (the floor), httpx (one pool, tuned limits), raw
   httpcore, aiohttp, aiosonic when installed, and `lab.client.LeaseClient` itself (aiohttp underneath,
   plus deadlines, the outcome split and typed results).
2. The lab figure: the `lease` workload through the lab's interpreter (`lab.generator.run`) with 50
   processes (concurrency 50), recorded by `HistoryWriter`, unthrottled, against the same servers: recorded
   ops/s, the lab process's CPU per op (interpreter + recording + client), and the CPU per op of the lease
   servers and Valkey (psutil), so a server-bound figure is told apart from a client-bound one.

The machine is shared and loaded: absolute rates are noisy; compare within one run (per-op CPU is steadier
than wall-clock rates). `figures(quick)` returns the rows of `make bench`'s summary table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as `python bench/client_path.py` from anywhere
    sys.path.insert(0, str(REPO))
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

from figures import Figure  # noqa: E402

if TYPE_CHECKING:
    from lab.stack.base import StackStatus

API = "/api/v1/target-leases"
LIBRARIES = ("minimal", "httpx", "httpcore", "aiohttp", "aiosonic", "LeaseClient[aiohttp]", "LeaseClient")
CLIENT_CPU_TARGET_US = 100.0
RECORDED_TARGET = 3000.0


def identity(name: str) -> dict:
    """A distinct identity inside the demo principal lease-a1's scope."""
    return {"tenant_id": "tenant-a", "program_id": "program-1", "target_namespace": "bench", "target_id": name,
            "actor_name": "actor-1", "workflow_name": "client-path", "operation_class": "default"}


class Count:
    """Completed requests (any status: the client's work is the same) inside the window."""

    def __init__(self, end: float):
        self.end = end
        self.requests = 0
        self.ok = 0


# -- one worker loop per library: acquire -> release of its own identity, until the window ends -------------

def _bodies(ident: dict, lease: dict | None) -> bytes:
    body = dict(ident, service_instance_id="bench", request_id=os.urandom(16).hex(),
                deadline_at=time.time_ns() // 1_000_000 + 5000)
    if lease is None:
        body["ttl_ms"] = 30_000
    else:
        body["fencing_token"] = lease["fencing_token"]
    return orjson.dumps(body)


async def _loop(post, ident: dict, count: Count) -> None:
    """The shared loop; `post(path, body) -> (status, payload bytes)` is the library under test."""
    while time.monotonic() < count.end:
        status, payload = await post(API + "/acquire", _bodies(ident, None))
        count.requests += 1
        reply = orjson.loads(payload)
        if status != 200:
            await asyncio.sleep(0.01)
            continue
        lease = reply["lease"]
        status, payload = await post(f"{API}/{lease['lease_id']}/release", _bodies(ident, lease))
        count.requests += 1
        count.ok += status == 200


async def minimal_worker(url: str, key: str, ident: dict, count: Count) -> None:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams (Content-Length replies only): the floor."""
    host_port = url.split("//", 1)[1]
    host, port = host_port.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"host: {host_port}\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\n"

    async def post(path: str, body: bytes) -> tuple[int, bytes]:
        writer.write(f"POST {path} HTTP/1.1\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        reply_head = await reader.readuntil(b"\r\n\r\n")
        at = reply_head.lower().find(b"\r\ncontent-length:")
        length = int(reply_head[at + 17:reply_head.index(b"\r\n", at + 2)])
        return int(reply_head[9:12]), await reader.readexactly(length)

    try:
        await _loop(post, ident, count)
    finally:
        writer.close()


def _headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json", "accept": "application/json"}


async def run_library(lib: str, urls: list[str], key: str, workers: int, seconds: float) -> dict:
    """Run `workers` loops through `lib` for `seconds`; this process's CPU per request."""
    count = Count(time.monotonic() + seconds)
    idents = [identity(f"{lib}-{os.getpid()}-{w}") for w in range(workers)]
    cleanup = []
    if lib == "minimal":
        coros = [minimal_worker(urls[w % len(urls)], key, i, count) for w, i in enumerate(idents)]
    elif lib == "httpx":
        import httpx

        http = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=workers,
                                                                   max_keepalive_connections=workers))
        headers = _headers(key)
        cleanup.append(http.aclose)

        def poster(base):
            async def post(path, body):
                r = await http.post(base + path, content=body, headers=headers)
                return r.status_code, r.content
            return post
        coros = [_loop(poster(urls[w % len(urls)]), i, count) for w, i in enumerate(idents)]
    elif lib == "httpcore":
        import httpcore

        pool = httpcore.AsyncConnectionPool(max_connections=workers, max_keepalive_connections=workers)
        headers = list(_headers(key).items())
        cleanup.append(pool.aclose)

        def poster(base):
            async def post(path, body):
                r = await pool.request("POST", base + path, headers=headers, content=body)
                return r.status, r.content
            return post
        coros = [_loop(poster(urls[w % len(urls)]), i, count) for w, i in enumerate(idents)]
    elif lib == "aiohttp":
        import aiohttp

        from yarl import URL

        # tuned: no cookie jar, no auto-decompression, no default User-Agent/Accept-Encoding, URLs pre-encoded
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=workers), headers=_headers(key),
                                        cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
                                        skip_auto_headers=("User-Agent", "Accept-Encoding"))
        cleanup.append(session.close)

        def poster(base):
            async def post(path, body):
                async with session.post(URL(base + path, encoded=True), data=body) as r:
                    return r.status, await r.read()
            return post
        coros = [_loop(poster(urls[w % len(urls)]), i, count) for w, i in enumerate(idents)]
    elif lib == "aiosonic":
        import aiosonic

        from aiosonic.pools import PoolConfig

        connector = aiosonic.TCPConnector(pool_configs={":default": PoolConfig(size=workers, max_conn_requests=None)})
        client = aiosonic.HTTPClient(connector=connector)
        headers = _headers(key)
        cleanup.append(connector.cleanup)

        def poster(base):
            async def post(path, body):
                r = await client.post(base + path, data=body, headers=headers)
                return r.status_code, await r.content()
            return post
        coros = [_loop(poster(urls[w % len(urls)]), i, count) for w, i in enumerate(idents)]
    elif lib in ("LeaseClient", "LeaseClient[aiohttp]"):
        from lab.client import Identity, LeaseClient

        transport = "aiohttp" if lib.endswith("[aiohttp]") else "auto"  # auto: http11 on plain http://
        clients = [LeaseClient(u, key, service_instance_id="bench", max_connections=workers, transport=transport)
                   for u in urls]
        cleanup.extend(c.aclose for c in clients)

        async def lease_loop(client, ident):
            ident = Identity(**ident)
            while time.monotonic() < count.end:
                r = await client.acquire(ident, ttl_ms=30_000, deadline_s=5.0)
                count.requests += 1
                if not r.ok:
                    await asyncio.sleep(0.01)
                    continue
                r = await client.release(r.lease, deadline_s=5.0)
                count.requests += 1
                count.ok += r.ok
        coros = [lease_loop(clients[w % len(clients)], i) for w, i in enumerate(idents)]
    else:
        raise ValueError(f"unknown library {lib!r}")
    cpu0, t0 = time.process_time(), time.monotonic()
    try:
        await asyncio.gather(*coros)
    finally:
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - t0
        for close in cleanup:
            with contextlib.suppress(Exception):
                await close()
    n = max(count.requests, 1)
    return {"lib": lib, "requests": count.requests, "ok_pairs": count.ok, "cpu_us_per_request": cpu / n * 1e6,
            "requests_per_s": count.requests / wall}


def child_main(spec_json: str) -> None:
    """`client_path.py library SPEC_JSON`: run one library in this process and print its JSON line."""
    spec = json.loads(spec_json)
    runner = asyncio.run
    if spec.get("loop") == "uvloop":
        import uvloop

        runner = uvloop.run
    try:
        out = runner(run_library(spec["lib"], spec["urls"], spec["key"], spec["workers"], spec["seconds"]))
    except ImportError as e:
        out = {"lib": spec["lib"], "skipped": f"not installed ({e.name})"}
    print(json.dumps(out), flush=True)


def measure_library(lib: str, urls: list[str], key: str, workers: int, seconds: float, loop: str = "asyncio") -> dict:
    """One library in its own child process (its CPU is then the library's alone), on `loop` (asyncio or uvloop)."""
    spec = json.dumps({"lib": lib, "urls": urls, "key": key, "workers": workers, "seconds": seconds, "loop": loop})
    proc = subprocess.run([sys.executable, __file__, "library", spec], capture_output=True, text=True,
                          cwd=str(REPO), timeout=seconds * 10 + 60)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not lines:
        return {"lib": lib, "skipped": f"failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}"}
    return json.loads(lines[-1])


# -- the lab figure: the lease workload, 50 processes, recorded ------------------------------------------

def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle (other engineers' load included)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += sum(psutil.Process(pid).cpu_times()[:2])
    return total


def lab_figure(stack_info: "StackStatus", server_pids: list[int], valkey_pid: int, seconds: float, processes: int,
               run_dir: Path) -> dict:
    """Recorded ops/s of the lease workload, and CPU per op of the lab process, the servers and Valkey."""
    import lab.generator as gen
    from lab.history import HistoryWriter
    from lab.testmap import RunContext, Test
    from workloads import get_workload

    test = Test(workload="lease", time_limit=seconds, concurrency=processes, rate=1e6, keys=50, ttl_ms=5000,
                live=RunContext(lease_servers=list(stack_info.lease_servers), valkey=stack_info.valkey,
                                credentials_file=stack_info.credentials, nodes=list(stack_info.lease_servers)))
    from lab.client import LeaseClient

    wl = get_workload("lease")(test)
    writer = HistoryWriter(run_dir / "lab-history.jsonl")
    sent = [0]
    original = LeaseClient._send

    async def counting_send(self, call, deadline_at_ms):  # HTTP requests of the run (a counter: ~0.1 us each)
        sent[0] += 1
        return await original(self, call, deadline_at_ms)
    LeaseClient._send = counting_send
    me = psutil.Process()
    lab0, srv0, vk0 = sum(me.cpu_times()[:2]), cpu_of(server_pids), cpu_of([valkey_pid])
    busy0 = machine_busy_seconds()
    t0 = time.perf_counter()
    try:
        asyncio.run(gen.run(test, gen.time_limit(seconds, gen.clients(wl.generator)), wl.client,
                            history_writer=writer, concurrency=processes))
    finally:
        LeaseClient._send = original
    elapsed = time.perf_counter() - t0
    lab_cpu = sum(me.cpu_times()[:2]) - lab0
    srv_cpu, vk_cpu = cpu_of(server_pids) - srv0, cpu_of([valkey_pid]) - vk0
    other = max(0.0, machine_busy_seconds() - busy0 - lab_cpu - srv_cpu - vk_cpu)
    writer.close()
    ops, kinds = 0, Counter()
    with open(run_dir / "lab-history.jsonl", "rb") as f:
        for line in f:
            op = orjson.loads(line)
            if op.get("type") in ("ok", "fail", "info"):
                ops += 1
                kinds[f"{op.get('f')} {op['type']}" + (f" {op['error']}" if op.get("error") else "")] += 1
    n = max(ops, 1)
    return {"ops": ops, "completions": dict(kinds.most_common(8)), "seconds": elapsed, "ops_per_s": ops / elapsed,
            "lab_cpu_us_per_op": lab_cpu / n * 1e6, "server_cpu_us_per_op": srv_cpu / n * 1e6,
            "valkey_cpu_us_per_op": vk_cpu / n * 1e6, "other_cores": other / elapsed, "requests": sent[0],
            "cores": psutil.cpu_count() or 1}


# -- orchestration ----------------------------------------------------------------------------------------

def measure(seconds: float = 4.0, processes: int = 50, libraries=LIBRARIES) -> dict:
    """Start a stack, run every library and the lab figure, stop the stack."""
    from lab.stack.local import LocalStack, StackOptions

    out: dict = {"libraries": [], "lab": None}
    with tempfile.TemporaryDirectory(prefix="fencelab-client-path-") as d:
        stack = LocalStack(name="client-path", root=Path(d) / "stack", die_with_parent=True)
        try:
            st = stack.up(StackOptions(servers=2, store=False))
            creds = json.loads(Path(st.credentials).read_text())
            key = _key_of(creds, "lease-a1")
            urls = list(st.lease_servers)
            server_pids = [p.pid for p in stack.processes if "lease" in p.name]
            valkey_pid = next(p.pid for p in stack.processes if "valkey" in p.name)
            for lib in libraries:
                out["libraries"].append(measure_library(lib, urls, key, processes, seconds))
            out["lab"] = lab_figure(st, server_pids, valkey_pid, seconds, processes, Path(d))
        finally:
            stack.down()
    return out


def _key_of(creds, principal: str) -> str:
    """The API key of `principal` in a stack's credentials.json."""
    items = creds if isinstance(creds, list) else creds.get("principals", creds.get("credentials", []))
    for c in items:
        if c.get("principal_id", c.get("principal")) == principal:
            return c["api_key"]
    raise SystemExit(f"no credentials for {principal} in the stack's credentials file")


def figures(quick: bool = False) -> list[Figure]:
    """The client path's rows of `make bench`'s summary table (quick: shorter windows, fewer libraries)."""
    seconds = 2.0 if quick else 4.0
    libs = ("minimal", "aiohttp", "LeaseClient") if quick else LIBRARIES
    res = measure(seconds, 50, libs)
    return to_figures(res, seconds)


def to_figures(res: dict, seconds: float) -> list[Figure]:
    by = {x["lib"]: x for x in res["libraries"] if "skipped" not in x}
    minimal = by.get("minimal", {}).get("cpu_us_per_request")
    out = []
    lease = by.get("LeaseClient")
    if lease:
        out.append(Figure("client", "LeaseClient CPU per request", round(lease["cpu_us_per_request"], 1), "us",
                          f"<= {CLIENT_CPU_TARGET_US:.0f} us", lease["cpu_us_per_request"] <= CLIENT_CPU_TARGET_US,
                          f"50 workers, acquire+release, client process CPU only; minimal client "
                          f"{minimal:.0f} us in the same run" if minimal else "50 workers, acquire+release"))
    if minimal and lease:
        libs = {k: v["cpu_us_per_request"] / minimal for k, v in by.items()
                if k != "minimal" and not k.startswith("LeaseClient")}
        ratio = lease["cpu_us_per_request"] / minimal
        out.append(Figure("client", "LeaseClient CPU / minimal client", round(ratio, 2), "x", "<= 2.0", ratio <= 2.0,
                          "libraries per request vs the minimal client: "
                          + (", ".join(f"{k} {v:.1f}x" for k, v in sorted(libs.items(), key=lambda kv: kv[1]))
                             or "none measured")
                          + ("; none within 2x, hence LeaseClient's own http11 transport on httptools"
                             if libs and min(libs.values()) > 2.0 else "")))
    lab = res.get("lab")
    if lab and lease and lab.get("ops"):
        per_op = lease["cpu_us_per_request"] * lab["requests"] / lab["ops"]
        out.append(Figure("client", "client CPU per recorded op (lab run)", round(per_op, 1), "us",
                          f"<= {CLIENT_CPU_TARGET_US:.0f} us", per_op <= CLIENT_CPU_TARGET_US,
                          f"{lab['requests']} HTTP requests for {lab['ops']} recorded ops (some ops send nothing: "
                          f"a renew/release with no lease held) x LeaseClient's CPU per request above"))
    if lab:
        total = lab["lab_cpu_us_per_op"] + lab["server_cpu_us_per_op"] + lab["valkey_cpu_us_per_op"]
        # what these per-op CPU costs allow on 2 idle cores: all three share them, the lab process is one thread
        ceiling = min(2e6 / total, 1e6 / lab["lab_cpu_us_per_op"]) if total else 0.0
        out.append(Figure("client", "recorded lease ops/s, 50 processes", round(lab["ops_per_s"]), "ops/s",
                          f">= {RECORDED_TARGET:.0f}", lab["ops_per_s"] >= RECORDED_TARGET,
                          f"{seconds:g} s lease workload, 2 servers; CPU per op: lab process "
                          f"{lab['lab_cpu_us_per_op']:.0f} us (interpreter+recording+client), servers "
                          f"{lab['server_cpu_us_per_op']:.0f} us, Valkey {lab['valkey_cpu_us_per_op']:.0f} us; "
                          f"other processes used {lab.get('other_cores', 0):.2f} of {lab.get('cores', 2)} cores; "
                          f"CPU-bound ceiling on 2 idle cores {ceiling:.0f} ops/s"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--processes", type=int, default=50)
    ap.add_argument("--libraries", default=",".join(LIBRARIES))
    ap.add_argument("--json", action="store_true", help="print the raw measurements as JSON")
    a = ap.parse_args()
    res = measure(a.seconds, a.processes, tuple(a.libraries.split(",")))
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"{'library':<20} {'CPU us/request':>15} {'x minimal':>10} {'requests/s':>11}")
    minimal = next((x["cpu_us_per_request"] for x in res["libraries"]
                    if x["lib"] == "minimal" and "requests" in x), None)
    for x in res["libraries"]:
        if "skipped" in x:
            print(f"{x['lib']:<20} {x['skipped']}")
            continue
        ratio = f"{x['cpu_us_per_request'] / minimal:.2f}" if minimal else "-"
        print(f"{x['lib']:<20} {x['cpu_us_per_request']:>15.0f} {ratio:>10} {x['requests_per_s']:>11.0f}")
    lab = res["lab"]
    print(f"lab: lease workload, {a.processes} processes, recorded: {lab['ops_per_s']:.0f} ops/s "
          f"({lab['ops']} ops, {lab['requests']} HTTP requests, in {lab['seconds']:.1f} s); "
          f"CPU us per op: lab process {lab['lab_cpu_us_per_op']:.0f}, "
          f"servers {lab['server_cpu_us_per_op']:.0f}, Valkey {lab['valkey_cpu_us_per_op']:.0f}; "
          f"other processes {lab['other_cores']:.2f} of {lab['cores']} cores")
    print("completions:", ", ".join(f"{k} {v}" for k, v in lab["completions"].items()))
    for f in to_figures(res, a.seconds):
        print(f"FIGURE {f.name}: {f.value} {f.unit} (target {f.target}: {'met' if f.ok else 'NOT met'})")
        print(f"       {f.note}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "library":
        child_main(sys.argv[2])
    else:
        main()
