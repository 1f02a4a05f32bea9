"""Throughput of the reference lease server against the raw Valkey scripts it runs.

    .tools/venv/bin/python bench/server_throughput.py [--servers 2] [--duration 10] [--profile]

One run starts its own Valkey and N reference servers (`LeaseServerProcess`),
then measures two phases on the same machine, one after the other:

1. `http_ops_per_s`: acquire + release operations per second through the HTTP
   API. Many concurrent workers (asyncio tasks in separate load-generator
   processes, one keep-alive connection each, spread over the servers) each
   acquire a distinct identity, release it, and repeat; only `ok` completions
   inside the measurement window count.
2. `raw_ops_per_s`: the same acquire and release Lua scripts (the server's
   own, with keys and arguments built as lab/server/service.py builds them)
   called directly with EVALSHA from redis.asyncio (hiredis parser) by the
   same number of processes and tasks, doing the same acquire-then-release
   loop. By default each task pipelines 16 identities per round trip
   (`--pipeline`), so Valkey rather than the Python client is the limit: the
   conservative choice, it makes raw higher and the ratio lower.

It prints `http_ops_per_s=... raw_ops_per_s=... ratio=...`, how the CPU of
each window was split between Valkey, the servers, the load generators and
everything else on the machine (psutil CPU times; 100% = one core), the
CPU microseconds each spent per operation (an operation = one acquire or one
release), which stay comparable when other work shares the machine, and how
many commands Valkey served per read and per write (its INFO stats, inner
script calls included: how well the servers' pipelining shares its I/O).

`figures(quick)` returns issue 13's server rows for `make bench`
(bench/summary.py): Valkey CPU per operation under the HTTP load (target 25
us), HTTP ops/s as measured and as the 2 cores would give them idle (2 x 1e6
us over the CPU per operation of Valkey, servers and generator, measured in
the same window), and the HTTP/raw ratio. `--profile` samples the servers with py-spy during
the HTTP window and prints where their time went. Everything it starts is
stopped on exit, Ctrl-C and SIGTERM included.

The default HTTP load generator is a minimal HTTP/1.1 keep-alive client on
asyncio streams (uvloop when installed), hand-written because on a 2-core
machine the generator shares the cores with the servers, and httpx costs
about ten times its CPU per request (measured: ~35 us vs ~450-650 us here).
`--generator client` drives the same loop through `lab.client.LeaseClient`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import click
import orjson
import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as `python bench/server_throughput.py` from anywhere
    sys.path.insert(0, str(REPO))

try:
    from bench.figures import Figure  # noqa: E402
except ImportError:  # run as a script from bench/
    sys.path.insert(0, str(REPO / "bench"))
    from figures import Figure  # type: ignore[no-redef]  # noqa: E402

ACQUIRE_PATH = "/api/v1/target-leases/acquire"


# -- load generators (run in child processes: `server_throughput.py generate SPEC_JSON`) ---------------

class Tally:
    """Counts of completions inside the measurement window [start, end) (wall-clock seconds)."""

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end
        self.ops = 0
        self.errors: Counter[str] = Counter()

    def record(self, ok: bool, code: str = "") -> None:
        """Count one completion if it landed inside the window."""
        now = time.time()
        if self.start <= now < self.end:
            if ok:
                self.ops += 1
            else:
                self.errors[code] += 1


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length body: (status, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    at = head.lower().find(b"\r\ncontent-length:")
    if at < 0:
        raise RuntimeError(f"response without Content-Length: {head[:200]!r}")
    length = int(head[at + 17:head.index(b"\r\n", at + 2)])
    return status, await reader.readexactly(length)


def request_bytes(method: str, path: str, host: str, api_key: str, body: bytes) -> bytes:
    """A complete keep-alive HTTP/1.1 request."""
    return (f"{method} {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {api_key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


async def raw_http_worker(url: str, api_key: str, identity: dict, spec: dict, tally: Tally) -> None:
    """acquire -> release of one identity, forever until the window ends, over one keep-alive connection."""
    host_port = url.split("//", 1)[1]
    host, port = host_port.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    base = dict(identity, service_instance_id=spec["instance"])
    ttl_ms = spec["ttl_ms"]
    try:
        while time.time() < tally.end:
            deadline = time.time_ns() // 1_000_000 + 5000
            body = orjson.dumps(dict(base, request_id=os.urandom(16).hex(), deadline_at=deadline, ttl_ms=ttl_ms))
            writer.write(request_bytes("POST", ACQUIRE_PATH, host_port, api_key, body))
            status, payload = await read_response(reader)
            reply = orjson.loads(payload)
            tally.record(status == 200, reply.get("code", str(status)))
            if status != 200:
                await asyncio.sleep(0.01)
                continue
            lease = reply["lease"]
            body = orjson.dumps(dict(base, request_id=os.urandom(16).hex(), deadline_at=deadline,
                                     fencing_token=lease["fencing_token"]))
            writer.write(request_bytes("POST", f"/api/v1/target-leases/{lease['lease_id']}/release",
                                       host_port, api_key, body))
            status, payload = await read_response(reader)
            tally.record(status == 200, orjson.loads(payload).get("code", str(status)))
    finally:
        writer.close()


async def client_http_worker(client, identity, spec: dict, tally: Tally) -> None:
    """The same loop through lab.client.LeaseClient."""
    while time.time() < tally.end:
        r = await client.acquire(identity, ttl_ms=spec["ttl_ms"], deadline_s=5.0)
        tally.record(r.ok, r.code)
        if not r.ok:
            await asyncio.sleep(0.01)
            continue
        r = await client.release(r.lease, deadline_s=5.0)
        tally.record(r.ok, r.code)


class RawScripts:
    """The server's acquire and release scripts called directly with EVALSHA, keys and args as the server builds them.

    The KEYS/ARGV layout follows lab/server/service.py (LeaseService.acquire/release) and must be kept in
    step with it; a mismatch shows up as script errors or non-ok codes in the `not_ok` line.
    """

    def __init__(self, spec: dict):
        from lab.server import backend as keys
        from lab.server.identity import normalize_identity
        from lab.server.scripts import load_scripts
        from lab.server.settings import Settings

        self.keys = keys
        self.normalize_identity = normalize_identity
        self.settings = Settings()
        scripts = load_scripts()
        self.acquire_sha, self.release_sha = scripts["acquire"].sha, scripts["release"].sha
        self.principal, self.credential = spec["principal_id"], spec["credential_id"]
        self.instance, self.ttl_ms = spec["instance"], spec["ttl_ms"]
        # (the recovery rule's run_id check is the server's, once per connection: no argument of the scripts)

    def prepare(self, identity: dict) -> tuple:
        """Per-identity constants: canonical JSON, lock key and the keys that do not change per call."""
        ident = self.normalize_identity(identity)
        canonical, lock_key = ident.canonical_json(), ident.lock_key()
        return canonical, lock_key

    def acquire_call(self, prepared: tuple, request_id: str, lease_id: str) -> tuple:
        """(numkeys, *keys, *args) of one acquire, exactly as lab.server.service builds it."""
        canonical, lock_key = prepared
        k, s = self.keys, self.settings
        key_list = (lock_key, k.fence_key(lock_key), k.history_key(lock_key),
                    k.idempotency_key("acquire", lock_key, self.principal, request_id),
                    k.lease_index_key(lease_id), k.ACTIVE_INDEX, k.quota_key(self.principal))
        # ARGV[2] is the idempotency digest: any string serves, since every call has a fresh request_id
        args = (canonical, request_id, lease_id, self.principal, "", self.credential, self.instance, self.ttl_ms,
                s.max_lifetime_ms, "", "", "", request_id, "{}", s.idempotency_ttl_ms, s.fence_max,
                s.active_lease_quota, s.history_max_entries, s.history_retention_ms, s.expired_record_retention_ms,
                0)  # the fencing floor of the recovery epoch (epoch 0)
        return (len(key_list), *key_list, *args)

    def release_call(self, prepared: tuple, request_id: str, lease_id: str, token: int) -> tuple:
        """(numkeys, *keys, *args) of one release."""
        canonical, lock_key = prepared
        k, s = self.keys, self.settings
        key_list = (lock_key, k.idempotency_key("release", lock_key, self.principal, request_id),
                    k.lease_index_key(lease_id), k.history_key(lock_key), k.ACTIVE_INDEX, k.quota_key(self.principal))
        args = (canonical, request_id, lease_id, self.principal, self.instance, token, s.idempotency_ttl_ms,
                s.history_max_entries, s.history_retention_ms)
        return (len(key_list), *key_list, *args)


def token_of(reply: list) -> tuple[str, int] | None:
    """(lease_id, fencing_token) of an acquire script reply, or None when it did not acquire."""
    if reply[0] != b"lease_acquired":
        return None
    flat = orjson.loads(reply[2])  # the scripts return the record as the JSON text they stored
    rec = dict(zip(flat[0::2], flat[1::2]))
    return rec["lease_id"], int(rec["fencing_token"])


async def raw_valkey_worker(redis_client, scripts: RawScripts, identities: list[dict], tally: Tally) -> None:
    """acquire -> release of `identities` by EVALSHA; more than one identity = one pipeline per step."""
    import uuid

    prepared = [scripts.prepare(i) for i in identities]
    while time.time() < tally.end:
        calls = [(p, os.urandom(16).hex(), str(uuid.uuid4())) for p in prepared]
        if len(calls) == 1:
            replies = [await redis_client.evalsha(scripts.acquire_sha, *scripts.acquire_call(*calls[0]))]
        else:
            pipe = redis_client.pipeline(transaction=False)
            for c in calls:
                pipe.evalsha(scripts.acquire_sha, *scripts.acquire_call(*c))
            replies = await pipe.execute()
        held = []
        for c, reply in zip(calls, replies):
            got = token_of(reply)
            tally.record(got is not None, reply[0].decode())
            if got is not None:
                held.append(scripts.release_call(c[0], os.urandom(16).hex(), *got))
        if not held:
            await asyncio.sleep(0.01)
            continue
        if len(held) == 1:
            replies = [await redis_client.evalsha(scripts.release_sha, *held[0])]
        else:
            pipe = redis_client.pipeline(transaction=False)
            for h in held:
                pipe.evalsha(scripts.release_sha, *h)
            replies = await pipe.execute()
        for reply in replies:
            tally.record(reply[0] == b"lease_released", reply[0].decode())


def bench_identity(name: str) -> dict:
    """A distinct identity inside the demo principal lease-a1's scope."""
    return {"tenant_id": "tenant-a", "program_id": "program-1", "target_namespace": "bench", "target_id": name,
            "actor_name": "actor-1", "workflow_name": "throughput", "operation_class": "default"}


async def generate(spec: dict) -> dict:
    """Run one load-generator process's workers until the window ends; return its tally."""
    tally = Tally(spec["start_at"], spec["start_at"] + spec["duration"])
    gen, workers = spec["index"], spec["workers"]
    names = [f"{spec['phase']}-{gen}-{w}" for w in range(workers)]
    if spec["phase"] == "http" and spec["generator"] == "raw":
        urls = spec["urls"]
        tasks = [raw_http_worker(urls[w % len(urls)], spec["api_key"], bench_identity(n), spec, tally)
                 for w, n in enumerate(names)]
        await asyncio.gather(*tasks)
    elif spec["phase"] == "http":
        from lab.client import Identity, LeaseClient

        clients = [LeaseClient(u, spec["api_key"], service_instance_id=spec["instance"], max_connections=workers)
                   for u in spec["urls"]]
        try:
            await asyncio.gather(*(client_http_worker(clients[w % len(clients)], Identity(**bench_identity(n)),
                                                      spec, tally) for w, n in enumerate(names)))
        finally:
            for c in clients:
                await c.aclose()
    else:
        import redis.asyncio as aioredis

        scripts = RawScripts(spec)
        pool = aioredis.BlockingConnectionPool.from_url(spec["valkey_url"], max_connections=workers, timeout=10)
        client = aioredis.Redis(connection_pool=pool)
        batch = spec["pipeline"]
        try:
            await asyncio.gather(*(raw_valkey_worker(client, scripts, [bench_identity(f"{n}-{b}") for b in range(batch)],
                                                     tally) for n in names))
        finally:
            await client.aclose()
            await pool.disconnect()
    return {"ops": tally.ops, "errors": dict(tally.errors)}


def run_generator(spec_json: str) -> None:
    """Entry point of a load-generator child: run and print its tally as one JSON line."""
    spec = json.loads(spec_json)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is optional
        runner = asyncio.run
    result = runner(generate(spec))
    print(json.dumps(result), flush=True)


# -- orchestration (the parent process) ------------------------------------------------------------

def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User+system CPU seconds so far of each named process (and its children)."""
    out = {}
    for name, pid in pids.items():
        try:
            p = psutil.Process(pid)
            total = sum(p.cpu_times()[:2])
            for child in p.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += sum(child.cpu_times()[:2])
            out[name] = total
        except psutil.Error:
            out[name] = 0.0
    return out


def valkey_io(url: str) -> dict[str, int]:
    """Valkey's counters of commands, reads and writes (INFO stats): how well calls share its I/O."""
    if not url:
        return {}
    import redis

    c = redis.Redis.from_url(url, socket_timeout=5)
    try:
        stats = c.info("stats")
        return {k: int(stats[k]) for k in ("total_commands_processed", "total_reads_processed",
                                           "total_writes_processed")}
    except redis.RedisError:
        return {}
    finally:
        c.close()


def io_line(io: dict[str, int]) -> str:
    """Commands per read and per write Valkey processed (1.0 = one round trip per command)."""
    if not io.get("total_reads_processed") or not io.get("total_writes_processed"):
        return "n/a"
    cmds = io["total_commands_processed"]
    return f"{cmds / io['total_reads_processed']:.1f} commands per read, {cmds / io['total_writes_processed']:.1f} per write"


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle (other helpers' load included)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class Phase:
    """One measured phase: generator children started, timed window, CPU split, summed tallies."""

    def __init__(self, name: str, specs: list[dict], watched: dict[str, int], duration: float, on_window=None,
                 valkey_url: str = ""):
        self.name, self.specs, self.watched, self.duration = name, specs, watched, duration
        self.valkey_url = valkey_url  # for Valkey's own I/O counters over the window
        self.io: dict[str, int] = {}
        self.on_window = on_window  # called when the measurement window opens (profilers)
        self.children: list[subprocess.Popen] = []

    def run(self) -> tuple[float, dict[str, float], Counter]:
        """(ops per second, CPU % per process group and 'other', error counts)."""
        for spec in self.specs:
            self.children.append(subprocess.Popen(
                [sys.executable, __file__, "generate", json.dumps(spec)], stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(REPO)))
        watched = dict(self.watched)
        watched.update({f"generator-{i}": c.pid for i, c in enumerate(self.children)})
        start_at = self.specs[0]["start_at"]
        time.sleep(max(0.0, start_at - time.time()))
        if self.on_window is not None:
            self.on_window()
        io0 = valkey_io(self.valkey_url)
        cpu0, busy0, t0 = cpu_seconds(watched), machine_busy_seconds(), time.monotonic()
        time.sleep(self.duration)
        cpu1, busy1, elapsed = cpu_seconds(watched), machine_busy_seconds(), time.monotonic() - t0
        io1 = valkey_io(self.valkey_url)
        self.io = {k: io1[k] - io0[k] for k in io0.keys() & io1.keys()}
        ops, errors = 0, Counter()
        for child in self.children:
            out, _ = child.communicate(timeout=60)
            if child.returncode != 0 or not out.strip():
                raise click.ClickException(f"{self.name} load generator (pid {child.pid}) failed with exit "
                                           f"{child.returncode}")
            tally = json.loads(out.strip().splitlines()[-1])
            ops += tally["ops"]
            errors.update(tally["errors"])
        shares = {name: 100 * (cpu1[name] - cpu0[name]) / elapsed for name in watched}
        ours = sum(cpu1[n] - cpu0[n] for n in watched)
        shares["other"] = max(0.0, 100 * ((busy1 - busy0) - ours) / elapsed)
        return ops / self.duration, shares, errors

    def stop(self) -> None:
        """Kill any generator child still running (by pid, its own session)."""
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait(5)


def grouped(shares: dict[str, float]) -> dict[str, float]:
    """CPU shares summed per kind of process (lease-1 + lease-2 -> lease)."""
    groups: dict[str, float] = {}
    for name, pct in shares.items():
        group = name.rsplit("-", 1)[0] if name[-1].isdigit() else name
        groups[group] = groups.get(group, 0.0) + pct
    return groups


def split(shares: dict[str, float]) -> str:
    """The CPU split as one line: groups first, then each process."""
    detail = " ".join(f"{n}={p:.0f}%" for n, p in shares.items() if n != "other")
    groups = " ".join(f"{g}={p:.0f}%" for g, p in grouped(shares).items())
    return f"{groups} ({detail}; 100% = one core of {psutil.cpu_count()}; other = processes not started here)"


def per_op(shares: dict[str, float], rate: float) -> str:
    """CPU microseconds each kind of process spent per counted operation (robust to a busy machine)."""
    if not rate:
        return "n/a"
    return " ".join(f"{g}={pct / 100 * 1e6 / rate:.0f}" for g, pct in grouped(shares).items() if g != "other")


def specs_for(phase: str, generators: int, workers: int, start_at: float, duration: float, **common) -> list[dict]:
    """One spec per generator process, the workers split evenly between them."""
    per, extra = divmod(workers, generators)
    return [dict(common, phase=phase, index=i, workers=per + (i < extra), start_at=start_at, duration=duration)
            for i in range(generators)]


_KINDS = (("uvicorn/", "uvicorn"), ("starlette/", "starlette"), ("redis/", "redis-py"), ("hiredis", "redis-py"),
          ("lab/server/", "lab.server"), ("asyncio/", "event loop"), ("uvloop", "event loop"))


def frame_kind(frame: str) -> str:
    """The layer a py-spy frame belongs to, from its file path."""
    for needle, kind in _KINDS:
        if needle in frame:
            return kind
    return "stdlib/other"


class Profilers:
    """py-spy sampling profiles of the server processes during the HTTP window (`--profile`)."""

    def __init__(self, run_dir: Path, duration: float):
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            raise click.UsageError("--profile needs py-spy (pip install py-spy)")
        self.exe, self.run_dir, self.duration = exe, run_dir, duration
        self.running: list[tuple[Path, subprocess.Popen]] = []

    def start(self, pids: dict[str, int]) -> None:
        """Record each server for the window, as collapsed stacks."""
        for name, pid in pids.items():
            out = self.run_dir / f"profile-{name}.txt"
            cmd = [self.exe, "record", "-p", str(pid), "-d", str(max(1, int(self.duration))), "-r", "200",
                   "-f", "raw", "--nonblocking", "-o", str(out)]
            self.running.append((out, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                       start_new_session=True)))

    def summary(self, top: int = 15) -> str:
        """Top self-time and inclusive frames over every recorded server."""
        own, incl, total = Counter(), Counter(), 0
        for out, proc in self.running:
            proc.wait(self.duration + 30)
            if not out.exists():
                continue
            for line in out.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
                total += int(n)
                own[frames[-1]] += int(n)
                for f in set(frames):
                    incl[f] += int(n)
        if not total:
            return "profile: no samples"
        kinds = Counter()
        for f, n in own.items():
            kinds[frame_kind(f)] += n
        lines = [f"profile: {total} samples; files {self.run_dir}/profile-*.txt",
                 "  self time by layer: " + " ".join(f"{k}={100 * n / total:.0f}%" for k, n in kinds.most_common())]
        lines.append("  self time, top frames:")
        lines += [f"    {100 * n / total:5.1f}% {f}" for f, n in own.most_common(top)]
        lines.append("  inclusive, lab/server frames:")
        lines += [f"    {100 * n / total:5.1f}% {f}" for f, n in incl.most_common()
                  if "(lab/server/" in f and "__main__" not in f][:top]
        return "\n".join(lines)

    def stop(self) -> None:
        for _, proc in self.running:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class Measured:
    """One run's results: the two rates, the CPU split of each window, errors, the profile text."""

    def __init__(self, http_rate: float, raw_rate: float, http_cpu: dict[str, float], raw_cpu: dict[str, float],
                 http_errors: Counter, raw_errors: Counter, profile_text: str, run_dir: Path):
        self.http_rate, self.raw_rate = http_rate, raw_rate
        self.http_cpu, self.raw_cpu = http_cpu, raw_cpu
        self.http_errors, self.raw_errors = http_errors, raw_errors
        self.profile_text, self.run_dir = profile_text, run_dir
        self.http_io: dict[str, int] = {}
        self.raw_io: dict[str, int] = {}

    @property
    def ratio(self) -> float:
        return self.http_rate / self.raw_rate if self.raw_rate else float("nan")

    def us_per_op(self, phase: str, group: str) -> float:
        """CPU microseconds `group` (valkey, lease, generator) spent per counted op of `phase`."""
        shares, rate = (self.http_cpu, self.http_rate) if phase == "http" else (self.raw_cpu, self.raw_rate)
        pct = grouped(shares).get(group)
        return pct / 100 * 1e6 / rate if rate and pct is not None else float("nan")

    def other_load(self) -> float:
        """CPU % (100 = one core) of processes not started here during the HTTP window."""
        return self.http_cpu.get("other", 0.0)


def measure(servers: int = 2, duration: float = 10.0, warmup: float = 2.0, workers: int = 64, generators: int = 1,
            generator_kind: str = "raw", pipeline: int = 16, ttl_ms: int = 30_000, run_dir: Path | None = None,
            profile: bool = False) -> Measured:
    """Start Valkey and the servers, run the HTTP then the raw phase, stop everything; the results."""
    from lab.server.testing import demo_principals
    from lab.stack.leaseserver import LeaseServerProcess
    from lab.stack.valkey import ValkeyProcess

    own_tmp = run_dir is None
    run_dir = Path(tempfile.mkdtemp(prefix="fencelab-bench-")) if own_tmp else run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    profilers = Profilers(run_dir, duration) if profile else None
    started: list = []
    phases: list[Phase] = []
    try:
        valkey = ValkeyProcess(run_dir).start()
        started.append(valkey)
        principals, keys = demo_principals(run_dir)
        procs = []
        for i in range(servers):
            proc = LeaseServerProcess(run_dir, valkey_url=valkey.url, principals_file=principals, name=f"lease-{i + 1}")
            started.append(proc)
            procs.append(proc.start())
        common = dict(ttl_ms=ttl_ms, instance="bench", generator=generator_kind, pipeline=pipeline,
                      urls=[p.url for p in procs], api_key=keys["lease-a1"], valkey_url=valkey.url,
                      principal_id="lease-a1", credential_id="lease-a1-k1")
        server_pids = {p.name: p.pid for p in procs}
        http = Phase("http", specs_for("http", generators, workers, time.time() + warmup + 1, duration, **common),
                     {"valkey": valkey.pid, **server_pids}, duration,
                     on_window=(lambda: profilers.start(server_pids)) if profilers else None, valkey_url=valkey.url)
        phases.append(http)
        http_rate, http_cpu, http_errors = http.run()
        profile_text = profilers.summary() if profilers else ""
        for p in procs:  # idle servers would only blur the raw phase's CPU split
            p.stop()
        raw = Phase("raw", specs_for("raw", generators, workers, time.time() + warmup + 1, duration, **common),
                    {"valkey": valkey.pid}, duration, valkey_url=valkey.url)
        phases.append(raw)
        raw_rate, raw_cpu, raw_errors = raw.run()
    finally:
        if profilers:
            profilers.stop()
        for phase in phases:
            phase.stop()
        for proc in reversed(started):
            proc.stop()
    if own_tmp and not profile:
        shutil.rmtree(run_dir, ignore_errors=True)
    m = Measured(http_rate, raw_rate, http_cpu, raw_cpu, http_errors, raw_errors, profile_text, run_dir)
    m.http_io, m.raw_io = http.io, raw.io
    return m


# issue 13, target 3
MAX_VALKEY_US_PER_OP = 25.0
MIN_HTTP_OPS_PER_S = 5000.0
CORES = 2
BASELINE_RATIO = 0.30  # HTTP / raw when issue 13 was filed (3,495 vs 11,607 ops/s)


def to_figures(m: Measured, duration: float) -> list[Figure]:
    """The server's rows of `make bench`'s table (an op = one acquire or one release, as the bench counts)."""
    valkey_us = m.us_per_op("http", "valkey")
    ours = sum(m.us_per_op("http", g) for g in ("valkey", "lease", "generator"))
    capacity = CORES * 1e6 / ours if ours == ours and ours > 0 else float("nan")
    load = f"other processes used {m.other_load():.0f}% CPU (100% = one core) during the window"
    errors = f"; not ok: {dict(m.http_errors)}" if m.http_errors else ""
    return [
        Figure("server", "Valkey CPU per acquire/release op (HTTP load)", round(valkey_us, 1), "us",
               f"<= {MAX_VALKEY_US_PER_OP:g} us", valkey_us <= MAX_VALKEY_US_PER_OP,
               f"psutil CPU of valkey-server over a {duration:g} s window / ops counted; raw script calls "
               f"(pipelined): {m.us_per_op('raw', 'valkey'):.1f} us; {load}"),
        Figure("server", "HTTP acquire+release ops/s, 2 servers, 64 connections", round(m.http_rate), "ops/s",
               f">= {MIN_HTTP_OPS_PER_S:g} ops/s on {CORES} cores", m.http_rate >= MIN_HTTP_OPS_PER_S,
               f"measured on a shared machine: {load}{errors}"),
        Figure("server", "HTTP ops/s the 2 cores give when idle (CPU per op of valkey + servers + generator)",
               round(capacity), "ops/s", f">= {MIN_HTTP_OPS_PER_S:g} ops/s on {CORES} cores",
               capacity >= MIN_HTTP_OPS_PER_S,
               f"{CORES} x 1e6 us / {ours:.0f} us (valkey {valkey_us:.0f} + servers "
               f"{m.us_per_op('http', 'lease'):.0f} + generator {m.us_per_op('http', 'generator'):.0f}) per op, "
               "CPU measured in the same window (less sensitive to other load than the rate, though inflated by it)"),
        Figure("server", "HTTP / raw script calls (ops/s, same run)", round(m.ratio, 3), "ratio",
               f"> {BASELINE_RATIO:g} (issue 13's baseline)", m.ratio > BASELINE_RATIO,
               f"http {m.http_rate:.0f} vs raw {m.raw_rate:.0f} ops/s (raw: EVALSHA from redis.asyncio, "
               "16 identities pipelined per task)"),
    ]


def figures(quick: bool = False) -> list[Figure]:
    """The server's figures for `make bench` (bench/summary.py): about 40 s, 20 s with `quick`."""
    duration = 4.0 if quick else 10.0
    return to_figures(measure(duration=duration, warmup=1.0 if quick else 2.0), duration)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--servers", default=2, show_default=True, type=click.IntRange(1, 16), help="Reference server instances.")
@click.option("--duration", default=10.0, show_default=True, type=click.FloatRange(1, 600), help="Seconds measured per phase.")
@click.option("--warmup", default=2.0, show_default=True, type=click.FloatRange(0.5, 60), help="Seconds before each window.")
@click.option("--workers", default=64, show_default=True, type=click.IntRange(1, 5000),
              help="Concurrent acquire/release loops (HTTP connections, Valkey tasks) per phase.")
@click.option("--generators", default=1, show_default=True, type=click.IntRange(1, 16), help="Load-generator processes.")
@click.option("--generator", "generator_kind", default="raw", show_default=True, type=click.Choice(["raw", "client"]),
              help="HTTP load: minimal asyncio HTTP/1.1 client, or lab.client.LeaseClient (httpx).")
@click.option("--pipeline", default=16, show_default=True, type=click.IntRange(1, 256),
              help="Raw phase: identities per task, their EVALSHAs pipelined (1 = one command in flight per task).")
@click.option("--ttl-ms", default=30_000, show_default=True, type=click.IntRange(100, 300_000))
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), help="Logs and data (default: a temp dir).")
@click.option("--profile", is_flag=True, help="Sample the servers with py-spy during the HTTP window (perturbs the figures).")
@click.pass_context
def main(ctx, servers, duration, warmup, workers, generators, generator_kind, pipeline, ttl_ms, run_dir, profile):
    """Acquire+release ops/s through N reference servers vs. the same scripts straight on Valkey."""
    if ctx.invoked_subcommand is not None:
        return
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        m = measure(servers, duration, warmup, workers, generators, generator_kind, pipeline, ttl_ms, run_dir, profile)
    except KeyboardInterrupt:
        click.echo("interrupted: stopping everything started", err=True)
        sys.exit(130)
    click.echo(f"http_ops_per_s={m.http_rate:.0f} raw_ops_per_s={m.raw_rate:.0f} ratio={m.ratio:.3f}")
    click.echo(f"config: servers={servers} workers={workers} generators={generators} generator={generator_kind} "
               f"pipeline={pipeline} duration={duration:g}s")
    click.echo(f"cpu_http: {split(m.http_cpu)}")
    click.echo(f"cpu_raw: {split(m.raw_cpu)}")
    click.echo(f"cpu_us_per_op: http: {per_op(m.http_cpu, m.http_rate)}; raw: {per_op(m.raw_cpu, m.raw_rate)}")
    click.echo(f"valkey_io: http: {io_line(m.http_io)}; raw: {io_line(m.raw_io)}")
    if m.http_errors or m.raw_errors:
        click.echo(f"not_ok: http={dict(m.http_errors)} raw={dict(m.raw_errors)}")
    if m.profile_text:
        click.echo(m.profile_text)
    if servers == 2 and workers == 64:
        click.echo("figures (make bench):")
        for f in to_figures(m, duration):
            click.echo(f"  {f.name}: {f.value:g} {f.unit} (target {f.target}: {'met' if f.ok else 'NOT met'}) {f.note}")
    if run_dir is not None or profile:
        click.echo(f"logs: {m.run_dir}")


@main.command("generate", hidden=True)
@click.argument("spec_json")
def generate_command(spec_json):
    """(internal) one load-generator process."""
    run_generator(spec_json)


if __name__ == "__main__":
    main()
