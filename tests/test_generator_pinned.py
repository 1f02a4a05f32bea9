"""The seeded op sequence, pinned: the first 10,000 ops the interpreter hands the client, per thread, in order.

`lab.generator.run` runs the `lease` workload's main phase (as bench/generator_cost.py does: 50 threads,
unthrottled) and a smaller mixed one (10 threads, paced, some `info` and `fail` completions, so processes
retire and stalls and bursts happen) on an event loop whose clock is virtual: it moves only when every task
waits for a timer, and then jumps to that timer. So a run is a function of the seed alone, and every op the
client receives (process, f, key, value, time, extras) is pinned by the data in
tests/data/generator-pinned.json, recorded from the code before the generator and interpreter were sped up
(issue 20): a hash per thread, a hash per 500 ops of the whole sequence, and some ops written out, so a
failure says where the sequences part. A change that alters the sequence on purpose re-records it with
`.tools/venv/bin/python tests/test_generator_pinned.py --record` and says why in its commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import selectors
import sys
from pathlib import Path

import lab.generator as gen
from lab.testmap import Test

DATA = Path(__file__).parent / "data" / "generator-pinned.json"
OPS = 10_000
CHUNK = 500
LITERAL = (0, 1, 2, 3, 4, 5, 49, 50, 51, 999, 5000, 9999)  # ops written out in the data file


class _VirtualSelector(selectors.DefaultSelector):
    """A selector that never sleeps: a wait for a timer moves the loop's virtual clock to that timer instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None

    def select(self, timeout=None):
        if timeout is None:
            raise RuntimeError("the run waits for nothing that can happen (no timer, no ready task)")
        if timeout > 0:
            # exactly the earliest timer's time (now + timeout could be off by a rounding)
            scheduled = self.loop._scheduled  # noqa: SLF001  (asyncio's timer heap: no public way to read it)
            self.now = max(self.now, scheduled[0]._when) if scheduled else self.now + timeout
        return super().select(0)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time() is virtual (written for this test: asyncio has no virtual-time loop)."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)
        self._virtual.loop = self

    def time(self) -> float:
        return self._virtual.now


class VirtualWriter:
    """The HistoryWriter interface on the loop's virtual clock, keeping nothing."""

    def now(self) -> int:
        return round(asyncio.get_running_loop().time() * 1e9)

    def invoke(self, process, f, value, **extra):
        return {"process": process, "f": f, "value": value, "type": "invoke", "time": self.now(), **extra}

    def complete(self, invoke_op, type, value, error=None, **extra):
        return {"process": invoke_op["process"], "f": invoke_op["f"], "value": value, "type": type,
                "time": self.now(), **({"error": error} if error is not None else {})}


class RecordingClient:
    """Records every op it is handed; completes at once: ok, or every `info_every`-th op info and every
    `fail_every`-th fail (0: never)."""

    def __init__(self, seen: list, info_every: int = 0, fail_every: int = 0) -> None:
        self.seen, self.info_every, self.fail_every = seen, info_every, fail_every

    async def open(self, test, node):
        return self

    async def invoke(self, test, op):
        self.seen.append(op)
        n = len(self.seen)
        if self.info_every and n % self.info_every == 0:
            return {"type": "info", "error": {"code": "timeout"}}
        if self.fail_every and n % self.fail_every == 0:
            return {"type": "fail", "error": {"code": "conflict"}}
        return {"type": "ok", "value": op.get("value")}


class _StoppingClient(RecordingClient):
    """Cancels the run once it has been handed OPS ops."""

    task: asyncio.Task | None = None

    async def invoke(self, test, op):
        r = await super().invoke(test, op)
        if len(self.seen) == OPS:
            self.task.cancel()
        return r


CASES = {
    # bench/generator_cost.py's figure: the lease main phase, 50 threads, unthrottled
    "lease-50-unthrottled": dict(concurrency=50, rate=1e6, ttl_ms=5000, info_every=0, fail_every=0, seed=0),
    # paced, with crashes (info: the process retires) and failures, stalls and bursts within the 10,000 ops
    "lease-10-paced-mixed": dict(concurrency=10, rate=2000, ttl_ms=300, info_every=97, fail_every=13, seed=7),
}


def run_case(concurrency, rate, ttl_ms, info_every, fail_every, seed) -> list[dict]:
    """The first OPS ops the client is handed, in order."""
    from workloads import get_workload

    test = Test(workload="lease", time_limit=600, concurrency=concurrency, rate=rate, keys=50, ttl_ms=ttl_ms)
    test.live.nodes = ["instant"]
    wl = get_workload("lease")(test)
    seen: list[dict] = []
    client = _StoppingClient(seen, info_every, fail_every)

    async def main():
        client.task = asyncio.current_task()
        await gen.run(test, gen.time_limit(600, gen.clients(wl.generator)), client, history_writer=VirtualWriter(),
                      concurrency=concurrency, seed=seed)

    loop = VirtualClockLoop()
    try:
        loop.run_until_complete(main())
    except asyncio.CancelledError:
        pass
    finally:
        loop.close()
    assert len(seen) >= OPS, f"the run ended after {len(seen)} ops"
    return seen[:OPS]


def _line(o: dict, concurrency: int) -> str:
    """One op as pinned: its thread, then every field, as canonical JSON."""
    thread = o["process"] % concurrency if isinstance(o["process"], int) else o["process"]
    return json.dumps({"thread": thread, **o}, sort_keys=True, default=repr)


def digest(ops: list[dict], concurrency: int) -> dict:
    """Per-thread hashes, per-chunk hashes of the whole sequence, and some ops written out."""
    lines = [_line(o, concurrency) for o in ops]
    per_thread: dict[str, hashlib._Hash] = {}
    counts: dict[str, int] = {}
    for line, o in zip(lines, ops):
        t = str(json.loads(line)["thread"])
        per_thread.setdefault(t, hashlib.sha256()).update(line.encode() + b"\n")
        counts[t] = counts.get(t, 0) + 1
    chunks = [hashlib.sha256("\n".join(lines[i:i + CHUNK]).encode()).hexdigest()[:16] for i in range(0, OPS, CHUNK)]
    return {
        "ops": len(ops),
        "all": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
        "chunks": chunks,
        "threads": {t: {"ops": counts[t], "sha256": h.hexdigest()[:16]} for t, h in sorted(per_thread.items())},
        "literal": {str(i): json.loads(lines[i]) for i in LITERAL},
    }


def _case(name: str) -> None:
    spec = CASES[name]
    got = digest(run_case(**spec), spec["concurrency"])
    want = json.loads(DATA.read_text())[name]
    for i in LITERAL:  # readable first: the ops themselves
        assert got["literal"][str(i)] == want["literal"][str(i)], f"{name}: op {i} differs"
    first_bad = next((i for i, (a, b) in enumerate(zip(got["chunks"], want["chunks"])) if a != b), None)
    assert first_bad is None, f"{name}: the sequences part in ops {first_bad * CHUNK}-{first_bad * CHUNK + CHUNK - 1}"
    bad_threads = [t for t in want["threads"] if got["threads"].get(t) != want["threads"][t]]
    assert not bad_threads, f"{name}: threads {bad_threads} were handed other ops"
    assert got == want


def test_lease_50_threads_unthrottled_sequence_is_pinned():
    _case("lease-50-unthrottled")


def test_lease_10_threads_paced_with_crashes_sequence_is_pinned():
    _case("lease-10-paced-mixed")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: tests/test_generator_pinned.py --record   (re-records the pinned sequences)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    data = {name: digest(run_case(**spec), spec["concurrency"]) for name, spec in CASES.items()}
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DATA}")
