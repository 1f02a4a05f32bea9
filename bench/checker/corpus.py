"""Seeded cas-register histories for the checker benchmark (bench/checker/run.py).

A history is produced by simulating clients against a linearizable register
per key: every op gets an invocation time, a latency, and a linearization point
inside its interval; the register applies ops in linearization-point order, so
the results are linearizable by construction. Like a Jepsen test it has many
client threads, many keys, crashed clients (an op whose outcome is lost is
completed `info`, took effect or not at random, and the thread continues under
a new process id), cas ops that `fail` when the old value does not match,
invocations left open at the end, and nemesis ops. Values are drawn from a
small range (0-4, as in Jepsen's cas-register test), which is what makes
checking hard.

An invalid history gets one injected anomaly on one key: a stale read (a read
returns a value the register held a few writes earlier), a lost write (an
acknowledged write that never took effect) or a phantom cas (a cas reported ok
although it did not match). The intended label is recorded, but the verdict
that matters is the checkers' (an anomaly can happen to be explainable).
"""

from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Spec", "generate", "write_history", "default_specs"]


@dataclass(frozen=True)
class Spec:
    """Parameters of one generated history."""

    name: str
    seed: int
    ops: int  # client operations (invocations)
    threads: int  # concurrent client threads
    keys: int
    crash: float = 0.02  # probability an op's outcome is lost (info)
    values: int = 5
    bug: str | None = None  # None, "stale-read", "lost-write" or "phantom-cas"
    mean_latency_ns: int = 2_000_000
    mean_gap_ns: int = 1_000_000


def _planned_ops(rng: random.Random, spec: Spec) -> list[dict]:
    """Every op of every thread: times, key, f, value, and whether its outcome is lost."""
    per_thread = [spec.ops // spec.threads + (1 if t < spec.ops % spec.threads else 0) for t in range(spec.threads)]
    planned = []
    for t in range(spec.threads):
        clock = rng.randrange(spec.mean_gap_ns)
        proc = t
        for _ in range(per_thread[t]):
            clock += 1 + int(rng.expovariate(1 / spec.mean_gap_ns))
            lat = 1 + int(rng.expovariate(1 / spec.mean_latency_ns))
            lost = rng.random() < spec.crash
            r = rng.random()
            f = "read" if r < 0.4 else "write" if r < 0.7 else "cas"
            value = (None if f == "read" else rng.randrange(spec.values) if f == "write"
                     else [rng.randrange(spec.values), rng.randrange(spec.values)])
            done = clock + (lat * 5 if lost else lat)  # a lost op times out later than a normal answer
            planned.append({"proc": proc, "key": rng.randrange(spec.keys), "f": f, "value": value,
                            "inv": clock, "done": done, "lin": clock + rng.randrange(lat),
                            "lost": lost, "applied": not lost or rng.random() < 0.5})
            clock = done
            if lost:
                proc += spec.threads  # a crashed process is retired; the thread goes on as a new one
    return planned


def _apply(rng: random.Random, spec: Spec, planned: list[dict]) -> None:
    """Run the register in linearization-point order and fill each op's result (or inject the bug)."""
    regs: dict[int, list] = {}  # key -> history of values (last = current)
    order = sorted(planned, key=lambda o: o["lin"])
    bug_at = rng.randrange(len(order) // 3, 2 * len(order) // 3) if spec.bug else -1
    injected = False
    for i, o in enumerate(order):
        vals = regs.setdefault(o["key"], [None])
        cur = vals[-1]
        want_bug = spec.bug is not None and not injected and i >= bug_at and not o["lost"]
        if o["f"] == "read":
            o["type"], o["result"] = "ok", cur
            if want_bug and spec.bug == "stale-read" and len(set(vals[-4:])) > 1:
                o["result"] = next(v for v in reversed(vals[:-1]) if v != cur)
                injected = True
        elif o["f"] == "write":
            o["type"], o["result"] = "ok", o["value"]
            if want_bug and spec.bug == "lost-write" and o["value"] != cur:
                injected = True  # acknowledged, never applied
            elif o["applied"]:
                vals.append(o["value"])
        else:
            old, new = o["value"]
            if cur == old:
                o["type"], o["result"] = "ok", o["value"]
                if o["applied"]:
                    vals.append(new)
            elif want_bug and spec.bug == "phantom-cas":
                o["type"], o["result"] = "ok", o["value"]
                vals.append(new)
                injected = True
            else:
                o["type"], o["result"] = "fail", o["value"]
        if o["lost"]:
            o["type"] = "info"


def generate(spec: Spec) -> list[dict]:
    """The history (op records per docs/history-format.md) for one spec."""
    rng = random.Random(spec.seed)
    planned = _planned_ops(rng, spec)
    _apply(rng, spec, planned)
    horizon = max(o["done"] for o in planned)
    cut = horizon - spec.mean_latency_ns  # ops still running at the end stay open
    events: list[tuple[int, int, dict]] = []
    seq = 0
    for o in planned:
        base = {"process": o["proc"], "f": o["f"], "key": f"k{o['key']}"}
        events.append((o["inv"], seq, {**base, "type": "invoke", "value": o["value"]}))
        seq += 1
        if o["done"] <= cut or o["type"] != "info":
            comp = {**base, "type": o["type"], "value": o["result"] if o["type"] != "info" else o["value"]}
            if o["type"] == "info":
                comp["error"] = "timeout"
            events.append((o["done"], seq, comp))
            seq += 1
    for t in range(0, horizon, max(1, horizon // 6)):  # nemesis start/stop markers, ignored by checkers
        events.append((t, seq, {"process": "nemesis", "type": "info", "f": "start" if (t // max(1, horizon // 6)) % 2 == 0
                                else "stop", "value": None}))
        seq += 1
    heapq.heapify(events)
    out = []
    while events:
        t, _, rec = heapq.heappop(events)
        out.append({"index": len(out), "time": t, **rec})
    return out


def write_history(path: Path, history: list[dict]) -> None:
    """Write a history as JSONL."""
    with path.open("w") as fh:
        for op in history:
            fh.write(json.dumps(op, separators=(",", ":")) + "\n")


def default_specs() -> list[Spec]:
    """The benchmark corpus: 32 histories, 1,000 to 50,000 ops, valid and invalid, with crashes.

    Every history here is one Porcupine decides within the runner's budget, so
    that verdicts can be compared; no seed was dropped for that reason so far.
    """
    specs = []
    seed = 1000
    shapes = [  # (ops, threads, keys, crash)
        (1_000, 10, 1, 0.01), (2_000, 20, 2, 0.02), (5_000, 30, 5, 0.02), (10_000, 50, 10, 0.03),
        (20_000, 50, 20, 0.02), (50_000, 100, 50, 0.02),
    ]
    for ops, threads, keys, crash in shapes:
        for bug in (None, "stale-read", "lost-write", "phantom-cas"):
            seed += 1
            specs.append(Spec(f"cas-{ops}-{bug or 'valid'}", seed, ops, threads, keys, crash, bug=bug))
    # High per-key concurrency (20 clients on one key, 40 on two), as in a Jepsen test with few keys.
    seed = 2000
    for ops, threads, keys, crash in [(2_000, 20, 1, 0.02), (5_000, 40, 2, 0.02)]:
        for bug in (None, "stale-read", "lost-write", "phantom-cas"):
            seed += 1
            specs.append(Spec(f"hc-{ops}-{bug or 'valid'}", seed, ops, threads, keys, crash, bug=bug))
    return specs
