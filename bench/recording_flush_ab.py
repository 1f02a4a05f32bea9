"""Why recording costs more on a quiet two-core machine: the flush thread's GIL convoy (docs/performance.md, 4a).

Runs part A of bench/recording_overhead.py (the interpreter with an instant in-process client) three ways,
rounds alternated, best round of each, and prints CPU per op, the ratio to the unrecorded run, the recording
thread's own CPU, and the context switches per round:
  unrecorded  a writer that drops ops;
  default     HistoryWriter as the lab uses it (its flush thread writes every 0.2 s, or at once past 1 MiB);
  no-wake     the same writer with its flush thread never woken during the round (everything written at close()).

    .tools/venv/bin/python bench/recording_flush_ab.py [--ops 30000] [--rounds 12]

Run it as is and under `taskset -c 0`: on one core the three come out alike.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import lab.history.writer as writer_module  # noqa: E402
from lab.history import HistoryWriter  # noqa: E402
from recording_overhead import NullWriter, _instant  # noqa: E402

MODES = ("unrecorded", "default", "no-wake")


def _switches() -> int:
    """Context switches of the whole process so far (every thread, ended ones included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw + r.ru_nivcsw


def _writer(mode: str, path: Path):
    if mode == "unrecorded":
        return NullWriter()
    if mode == "default":
        return HistoryWriter(path)
    return HistoryWriter(path, flush_interval=3600.0)  # no tick in the round; the 1 MiB wake is lifted below


def measure(ops: int = 30000, rounds: int = 12) -> dict[str, tuple[float, float, int]]:
    """Each mode's best round: (process CPU s per op, the recording thread's CPU s per op, context switches)."""
    best: dict[str, tuple[float, float, int]] = {m: (float("inf"), 0.0, 0) for m in MODES}
    batch_bytes = writer_module._BATCH_BYTES
    try:
        with tempfile.TemporaryDirectory() as d:
            asyncio.run(_instant(NullWriter(), min(ops, 2000), 10))  # warm up imports and caches
            for i in range(rounds):
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    writer_module._BATCH_BYTES = 1 << 40 if mode == "no-wake" else batch_bytes
                    w = _writer(mode, Path(d) / f"{mode}-{i}.jsonl")
                    s0, c0, t0 = _switches(), time.process_time(), time.thread_time()
                    asyncio.run(_instant(w, ops, 10))
                    t1 = time.thread_time()
                    w.close()
                    cpu = (time.process_time() - c0) / ops
                    if w.count != 2 * ops:
                        raise RuntimeError(f"{mode}: {w.count} records for {ops} ops, not {2 * ops}")
                    if cpu < best[mode][0]:
                        best[mode] = (cpu, (t1 - t0) / ops, _switches() - s0)
    finally:
        writer_module._BATCH_BYTES = batch_bytes
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=30000)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    best = measure(a.ops, a.rounds)
    base = best["unrecorded"][0]
    print(f"recording with and without the flush thread's wake-ups: {a.ops} ops x 10 workers, best of {a.rounds} "
          f"alternated rounds, process CPU time")
    for mode in MODES:
        cpu, own, switches = best[mode]
        print(f"{mode:10s} {cpu * 1e6:6.2f} us/op  ratio {base / cpu:.3f}  recording thread {own * 1e6:6.2f} us/op  "
              f"context switches {switches}")


if __name__ == "__main__":
    main()
