"""The lab process's CPU per op spent choosing ops: the generator, and the generator with the interpreter.

    .tools/venv/bin/python bench/generator_cost.py [--seconds 3] [--processes 50] [--quick]

Measured in one run, process CPU time (`time.process_time`) per completed op, for the real workloads' main-phase
generators (`lease`, `fenced-append`, `idempotency`, as `fencelab test` builds them: `time_limit(clients(...))`)
with 50 threads, unthrottled (rate 1e6 ops/s, as bench/client_path.py's lab figure):

1. generator alone: `lab.generator.simulate` (simulated time, each op completing 2 ms after it starts, so about
   50 x 500 ops per simulated second), i.e. the generator's `op`/`update` and the context bookkeeping only;
2. generator + interpreter: `lab.generator.run` on asyncio with an instant in-process client (every op completes
   at once) and a writer that keeps nothing (recording is bench/recording_overhead.py's figure), for the lease
   workload: the interpreter's loop, its worker tasks and the generator, which is what the lab process spends
   per op besides the HTTP client and the recording.

The machine is shared and loaded: CPU time per op is steadier than wall time; each figure is the best of a
few rounds. `figures(quick)` returns the rows of `make bench`'s summary table.

What the profile shows: an op costs one ask of the generator tree, and each `each_thread` in it asks the
generator of every free thread (Jepsen's semantics: the soonest op wins, ties drawn from ctx.rng, the losers'
draws included), so the cost grows with the threads free at once. In figure 2 the instant client frees all 47
burst-lane threads together every round (about 25 thread asks per op, the worst case); a real run against the
reference stack has about 14 per op. Figure 1 has about one free thread per ask. A free thread whose next op is
a plain dict of its session is not asked (it draws nothing: it is counted at ctx.time and its op built only if
it wins); a thread at the start of a session must be asked, and its session is drawn and built each time (about
5 per op here, 30-35 us of the op's CPU: with those calls made free the figure drops to about 55 us).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import lab.generator as gen  # noqa: E402
from figures import Figure  # noqa: E402  (bench/ is a directory of scripts, as bench/summary.py imports it)

WORKLOADS = ("lease", "fenced-append", "idempotency")
# The budget: at issue 13 target 1's 3,000 ops/s, 50 us/op is 0.15 of one core for choosing ops, leaving the
# rest of the lab process's share of 2 cores to the HTTP client (<= 100 us, target 1) and the recording (<= 10).
TARGET_US = 50.0


def _test_and_generator(workload: str, seconds: float, processes: int):
    """The workload's main phase as `fencelab test` runs it (lab/runner.py), at bench/client_path.py's settings."""
    from lab.testmap import Test
    from workloads import get_workload

    test = Test(workload=workload, time_limit=seconds, concurrency=processes, rate=1e6, keys=50, ttl_ms=5000)
    test.live.nodes = ["instant"]
    wl = get_workload(workload)(test)
    return test, gen.time_limit(seconds, gen.clients(wl.generator))


def generator_alone(workload: str, seconds: float, processes: int) -> tuple[int, float]:
    """(completed ops, CPU s) of the generator in simulate(), `seconds` of simulated time."""
    test, g = _test_and_generator(workload, seconds, processes)
    c0 = time.process_time()
    history = gen.simulate(g, concurrency=processes, latency=2_000_000, test=test, max_ops=10**8)
    cpu = time.process_time() - c0
    return sum(1 for o in history if o["type"] != "invoke"), cpu


class NullWriter:
    """The HistoryWriter interface, keeping nothing (the recording is measured elsewhere)."""

    def __init__(self) -> None:
        self.start_ns = time.monotonic_ns()
        self.completions = 0

    def now(self) -> int:
        return time.monotonic_ns() - self.start_ns

    def invoke(self, process, f, value, **extra):
        return {"process": process, "f": f, "value": value, "type": "invoke", "time": self.now(), **extra}

    def complete(self, invoke_op, type, value, error=None, **extra):
        self.completions += 1
        return {"process": invoke_op["process"], "f": invoke_op["f"], "value": value, "type": type,
                "time": self.now()}


class InstantClient:
    """Completes every op at once, ok with its own value."""

    async def open(self, test, node):
        return self

    async def invoke(self, test, op):
        return {"type": "ok", "value": op.get("value")}


def with_interpreter(workload: str, seconds: float, processes: int) -> tuple[int, float]:
    """(completed ops, CPU s) of `lab.generator.run` with an instant client for `seconds` of wall time."""
    test, g = _test_and_generator(workload, seconds, processes)
    writer = NullWriter()
    c0 = time.process_time()
    asyncio.run(gen.run(test, g, InstantClient(), history_writer=writer, concurrency=processes))
    return writer.completions, time.process_time() - c0


def best_us(fn, workload: str, seconds: float, processes: int, rounds: int) -> tuple[float, int]:
    """The least CPU us per op over `rounds` rounds, and that round's op count."""
    best = (float("inf"), 0)
    for _ in range(rounds):
        ops, cpu = fn(workload, seconds, processes)
        if ops == 0:
            raise RuntimeError(f"{workload}: no op completed in {seconds} s")
        best = min(best, (cpu / ops * 1e6, ops))
    return best


def measure(seconds: float = 3.0, processes: int = 50, rounds: int = 3, workloads=WORKLOADS) -> dict:
    out = {}
    for w in workloads:
        out[("generator", w)] = best_us(generator_alone, w, seconds / 2, processes, rounds)
    out[("interpreter", "lease")] = best_us(with_interpreter, "lease", seconds, processes, rounds)
    return out


def figures(quick: bool = False) -> list[Figure]:
    """Issue 13 target 1's lab side: CPU per op of choosing ops (generator, and generator + interpreter)."""
    seconds, rounds = (1.5, 2) if quick else (3.0, 3)
    res = measure(seconds=seconds, rounds=rounds)
    figs = []
    for (kind, w), (us, ops) in res.items():
        if kind == "generator":
            name = f"generator CPU per op, {w}, 50 threads (simulated)"
            note = f"simulate(), {ops} ops in {seconds / 2:g} s simulated, best of {rounds}, process CPU time"
        else:
            name = f"generator + interpreter CPU per op, {w}, 50 threads (instant client)"
            note = (f"lab.generator.run, instant in-process client, nothing recorded, {ops} ops in {seconds:g} s, "
                    f"best of {rounds}, process CPU time")
        figs.append(Figure("generator", name, round(us, 1), "us", f"<= {TARGET_US:g} us", us <= TARGET_US, note))
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--processes", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="shorter rounds (as figures(quick=True))")
    a = ap.parse_args()
    if a.quick:
        a.seconds, a.rounds = 1.5, 2
    res = measure(a.seconds, a.processes, a.rounds)
    print(f"CPU us per completed op, {a.processes} threads, best of {a.rounds} (target <= {TARGET_US:g} us)")
    for (kind, w), (us, ops) in res.items():
        print(f"  {kind:<12} {w:<14} {us:8.1f} us/op  ({ops} ops)")


if __name__ == "__main__":
    main()
