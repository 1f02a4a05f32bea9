"""The lab's recording overhead, and the highest op rate the interpreter sustains.

Prints, measured in one run (these machines are noisy, so compare within a run):
  A. interpreter + an instant in-process client: ops/s with history recording
     (HistoryWriter to disk, flush per op) and without (a writer that drops ops),
     and their ratio;
  B. the same two figures for the `lease` workload with 50 processes against a
     real local stack (Valkey + 2 reference lease servers), unthrottled: the
     highest op rate the interpreter sustains on this machine.

    .tools/venv/bin/python bench/recording_overhead.py [--ops 20000] [--seconds 8] [--processes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import lab.generator as gen
from lab.history import HistoryWriter


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
    nodes: list = []


async def _instant(writer, ops: int, concurrency: int) -> float:
    t0 = time.perf_counter()
    await gen.run(_T(), gen.limit(ops, gen.repeat({"f": "noop", "value": 1})), InstantClient(),
                  history_writer=writer, concurrency=concurrency)
    return ops / (time.perf_counter() - t0)


def part_a(ops: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        w = HistoryWriter(Path(d) / "h.jsonl")
        with_rec = asyncio.run(_instant(w, ops, concurrency))
        w.close()
    without = asyncio.run(_instant(NullWriter(), ops, concurrency))
    print(f"A instant-client ops={ops} concurrency={concurrency}")
    print(f"A recorded_ops_per_s={with_rec:.0f} unrecorded_ops_per_s={without:.0f} ratio={with_rec / without:.3f}")


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
                            ttl_ms=5000, lease_servers=st["lease_servers"], valkey=st["valkey"],
                            credentials_file=st["credentials"])
                test.nodes = st["lease_servers"]
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
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--processes", type=int, default=50)
    ap.add_argument("--skip-stack", action="store_true", help="only part A")
    a = ap.parse_args()
    part_a(a.ops, a.concurrency)
    if not a.skip_stack:
        part_b(a.seconds, a.processes)


if __name__ == "__main__":
    main()
