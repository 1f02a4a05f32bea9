"""The lab's recording overhead, and the highest op rate the interpreter sustains.

Prints, measured in one run (these machines are shared and noisy: CPU time, compared within a run):
  A. interpreter + an instant in-process client (every op completes at once, so the run is the
     interpreter and the recording alone): the process's CPU time per op with history recording
     (HistoryWriter to disk, its default policy: batched, written every 0.2 s by its flush thread,
     whose CPU is counted) and without (a writer that drops ops), rounds alternated, best round of
     each; the recording's cost per op (recorded minus unrecorded CPU per op, an op being an
     invocation and its completion: two records) and the ratio recorded/unrecorded ops/s (ops per
     CPU second; issue 13 target 2: at most 10 us, at least 0.85);
  B. the same two figures for the `lease` workload with 50 processes against a
     real local stack (Valkey + 2 reference lease servers), unthrottled: the
     highest op rate the interpreter sustains on this machine.

    .tools/venv/bin/python bench/recording_overhead.py [--ops 30000] [--rounds 15] [--seconds 8] [--processes 50]

`figures(quick)` returns part A's two figures for `make bench` (bench/summary.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import lab.generator as gen  # noqa: E402
from figures import Figure  # noqa: E402  (bench/ is a directory of scripts, as bench/summary.py imports it)
from lab.history import HistoryWriter  # noqa: E402
from lab.testmap import RunContext  # noqa: E402

MAX_US_PER_OP = 10.0
MIN_RATIO = 0.85


class NullWriter:
    """The HistoryWriter interface without recording: the baseline for the overhead."""

    def __init__(self) -> None:
        self.start_ns = time.monotonic_ns()
        self.count = 0

    def now(self) -> int:
        return time.monotonic_ns() - self.start_ns

    def invoke(self, process, f, value, **extra):
        self.count += 1
        return {"process": process, "f": f, "value": value, "type": "invoke", "time": self.now(), **extra}

    def complete(self, invoke_op, type, value, error=None, **extra):
        self.count += 1
        return {"process": invoke_op["process"], "f": invoke_op["f"], "value": value, "type": type,
                "time": self.now()}

    def close(self) -> None:
        pass


class InstantClient:
    """Completes every op at once: measures the interpreter and the recording alone."""

    async def open(self, test, node):
        return self

    async def invoke(self, test, op):
        return {"type": "ok", "value": op.get("value")}


class _T:
    live = RunContext()  # no node: the instant client runs in-process


async def _instant(writer, ops: int, concurrency: int) -> None:
    await gen.run(_T(), gen.limit(ops, gen.repeat({"f": "noop", "value": 1})), InstantClient(),
                  history_writer=writer, concurrency=concurrency)


class PartA(NamedTuple):
    """Part A's result: CPU seconds and wall seconds per op, best round of each mode."""

    ops: int
    concurrency: int
    rounds: int
    recorded_cpu: float
    unrecorded_cpu: float
    recorded_wall: float
    unrecorded_wall: float
    records: int
    flush_wakeups: int = 0  # the best recorded round's flush thread: how often it woke
    flush_cpu: float = 0.0  # and its CPU seconds per op (part of recorded_cpu)

    @property
    def us_per_op(self) -> float:
        """What recording adds to one op (its invocation and completion), in us of CPU."""
        return (self.recorded_cpu - self.unrecorded_cpu) * 1e6

    @property
    def ratio(self) -> float:
        """Recorded / unrecorded ops per CPU second."""
        return self.unrecorded_cpu / self.recorded_cpu


def measure_a(ops: int = 30000, concurrency: int = 10, rounds: int = 15) -> PartA:
    """Alternate recorded and unrecorded runs; keep each mode's best (least CPU per op) round."""
    best = {"recorded": (float("inf"), float("inf")), "unrecorded": (float("inf"), float("inf"))}
    records = 0
    flush = (0, 0.0)
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(_instant(NullWriter(), min(ops, 2000), concurrency))  # warm up imports and caches
        for i in range(rounds):
            for label in ("unrecorded", "recorded") if i % 2 == 0 else ("recorded", "unrecorded"):
                writer = HistoryWriter(Path(d) / f"h{i}.jsonl") if label == "recorded" else NullWriter()
                c0, w0 = time.process_time(), time.perf_counter()
                asyncio.run(_instant(writer, ops, concurrency))
                writer.close()  # the last batch's write and the fsync are part of the recording's cost
                cpu, wall = (time.process_time() - c0) / ops, (time.perf_counter() - w0) / ops
                if label == "recorded":
                    records = writer.count
                    if (cpu, wall) < best[label]:
                        wakeups, flush_cpu = writer.flush_thread_stats
                        flush = (wakeups, flush_cpu / ops)
                best[label] = min(best[label], (cpu, wall))
    if records != 2 * ops:
        raise RuntimeError(f"the recorded run wrote {records} records for {ops} ops, not {2 * ops}")
    return PartA(ops, concurrency, rounds, best["recorded"][0], best["unrecorded"][0], best["recorded"][1],
                 best["unrecorded"][1], records, *flush)


def part_a(ops: int, concurrency: int, rounds: int) -> PartA:
    r = measure_a(ops, concurrency, rounds)
    print(f"A instant-client ops={ops} concurrency={concurrency} best of {rounds} alternated rounds, CPU time")
    print(f"A recorded_cpu_us_per_op={r.recorded_cpu * 1e6:.1f} unrecorded_cpu_us_per_op={r.unrecorded_cpu * 1e6:.1f} "
          f"recording_us_per_op={r.us_per_op:.1f} (target <= {MAX_US_PER_OP:g})")
    print(f"A recorded_ops_per_cpu_s={1 / r.recorded_cpu:.0f} unrecorded_ops_per_cpu_s={1 / r.unrecorded_cpu:.0f} "
          f"ratio={r.ratio:.3f} (target >= {MIN_RATIO}); wall: {1 / r.recorded_wall:.0f} vs "
          f"{1 / r.unrecorded_wall:.0f} ops/s, ratio {r.unrecorded_wall / r.recorded_wall:.3f}")
    print(f"A flush thread (best recorded round): {r.flush_wakeups} wake-ups, {r.flush_cpu * 1e6:.2f} us/op of CPU "
          f"(its writes and wake-ups; counted in recorded_cpu)")
    return r


def figures(quick: bool = False) -> list[Figure]:
    """Issue 13 target 2 (recording): the recording's CPU per op and the recorded/unrecorded ratio."""
    # 15 rounds, not 7: on a loaded machine the best of 7 moved the ratio by +-0.03 from one run to the next
    return to_figures(measure_a(ops=10000 if quick else 30000, rounds=5 if quick else 15))


def to_figures(r: PartA) -> list[Figure]:
    """Part A's two figures, each met exactly when its measurement meets the target."""
    note = (f"instant in-process client, {r.ops} ops x {r.concurrency} workers, best of {r.rounds} alternated "
            f"rounds, process CPU time (flush thread included: {r.flush_cpu * 1e6:.2f} us/op, {r.flush_wakeups} "
            f"wake-ups); unrecorded {r.unrecorded_cpu * 1e6:.1f} us/op")
    return [
        Figure("recording", "recording CPU per op (invoke + completion)", round(r.us_per_op, 2), "us",
               f"<= {MAX_US_PER_OP:g} us", r.us_per_op <= MAX_US_PER_OP, note),
        Figure("recording", "recorded / unrecorded ops per CPU second", round(r.ratio, 3), "ratio",
               f">= {MIN_RATIO}", r.ratio >= MIN_RATIO, note),
    ]


def part_b(seconds: float, processes: int, rounds: int = 2) -> None:
    from lab.stack.local import LocalStack, StackOptions
    from lab.testmap import Test
    from workloads import get_workload

    with tempfile.TemporaryDirectory() as d:
        stack = LocalStack(name="bench", root=Path(d) / "stack", die_with_parent=True)
        try:
            st = stack.up(StackOptions(servers=2, store=False))
            rates: dict[str, float] = {}
            # alternate the two modes and keep each one's best round: the machine's noise hits both alike
            for i, label in enumerate(("unrecorded", "recorded") * rounds):
                test = Test(workload="lease", time_limit=seconds, concurrency=processes, rate=1e6, keys=50,
                            ttl_ms=5000)
                test.live.take_status(stack, st)  # the stack's addresses, in the run context (as lab.runner)
                test.live.nodes = list(st.lease_servers)
                wl = get_workload("lease")(test)
                writer = HistoryWriter(Path(d) / f"{label}-{i}.jsonl") if label == "recorded" else NullWriter()
                t0 = time.perf_counter()
                asyncio.run(gen.run(test, gen.time_limit(seconds, gen.clients(wl.generator)), wl.client,
                                    history_writer=writer, concurrency=processes))
                elapsed = time.perf_counter() - t0
                writer.close()
                n = writer.count
                rates[label] = max(rates.get(label, 0.0), n / 2 / elapsed)  # two records (invoke + completion) per op
            print(f"B lease workload processes={processes} seconds={seconds} servers=2 best of {rounds} rounds")
            print(f"B recorded_ops_per_s={rates['recorded']:.0f} unrecorded_ops_per_s={rates['unrecorded']:.0f} "
                  f"ratio={rates['recorded'] / rates['unrecorded']:.3f}")
        finally:
            stack.down()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=30000)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--processes", type=int, default=50)
    ap.add_argument("--skip-stack", action="store_true", help="only part A")
    a = ap.parse_args()
    part_a(a.ops, a.concurrency, a.rounds)
    if not a.skip_stack:
        part_b(a.seconds, a.processes)


if __name__ == "__main__":
    main()
