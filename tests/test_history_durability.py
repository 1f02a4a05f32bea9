"""A lab process SIGKILLed mid-run leaves a readable history holding everything older than ~1 s.

The child writes ops from its main thread and from a "nemesis" thread with the same HistoryWriter:
first a fast burst (big lines, so a kill may tear one), then a quiet phase of a few small ops per
second, like a long partition, where nothing but the flush policy gets lines out of Python's 8 KiB
buffer. The child announces the quiet phase on its stdout; the parent kills it 2 s into that phase
and reads what is left. Op times share the
parent's monotonic clock (CLOCK_MONOTONIC is system-wide), so "written more than 1 s before the
kill" is decidable: the last op that survived must be younger than that. This bound (1 s against a
flush every op, or every 0.1 s when batched) is the durability contract, not a performance
measurement.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.history import read_history_report

from conftest import wait_until

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, threading, time
from lab.history import HistoryWriter

path, start_ns, flush = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# "default": what the runner uses (HistoryWriter's own flush policy and interval)
w = HistoryWriter(path, start_ns=start_ns, **({} if flush == "default" else {"flush": flush, "flush_interval": 0.1}))

def nemesis():
    while True:
        op = w.invoke("nemesis", "start-partition", None)
        time.sleep(0.05)
        w.complete(op, "info", {"isolated": ["n1"]})
        time.sleep(0.25)

threading.Thread(target=nemesis, daemon=True).start()
burst_until = time.monotonic() + 0.3
i, announced = 0, False
while True:
    quiet = time.monotonic() > burst_until
    if quiet and not announced:  # tell the parent, on an unbuffered pipe, when the quiet phase began
        print(time.monotonic_ns(), flush=True)
        announced = True
    inv = w.invoke(i % 5, "acquire", None if quiet else {"request_id": f"r{i}", "body": "x" * 300})
    w.complete(inv, "ok", i)
    i += 1
    time.sleep(0.1 if quiet else 0.0001)
"""


@pytest.mark.parametrize("flush", ["each", "batched", "default"])
def test_sigkilled_writer_leaves_a_readable_durable_history(tmp_path, flush):
    path = tmp_path / "history.jsonl"
    start_ns = time.monotonic_ns()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(start_ns), flush], env=env, cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        quiet_since = int(child.stdout.readline() or 0)  # blocks until the child's quiet phase begins
        assert quiet_since, f"the writer child exited early with {child.poll()}"
        # kill once the quiet phase has lasted 2 s: far longer than the 1 s bound, with small lines
        # that would sit in Python's buffer all that time if nothing flushed them
        wait_until(lambda: time.monotonic_ns() >= quiet_since + 2_000_000_000, what="2 s of quiet phase")
        killed_at = time.monotonic_ns() - start_ns
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    ops, problems = read_history_report(path)  # raises on anything but a torn last line
    assert all("torn last line" in p for p in problems)
    assert len(ops) > 100
    assert {o["process"] for o in ops} >= {0, 1, 2, 3, 4, "nemesis"}
    # Everything written more than ~1 s before the kill is on disk: the file is a dense prefix
    # of what was written, so it suffices that its last op is younger than that.
    assert ops[-1]["time"] >= killed_at - 1_000_000_000, (
        f"the last surviving op is {(killed_at - ops[-1]['time']) / 1e9:.2f} s older than the kill"
    )
