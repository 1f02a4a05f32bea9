"""Benchmark the domain checkers on a large simulated lease history.

`generate_history(n_ops, ...)` simulates a correct lease server (the contract's
acquire / renew / release / commit semantics, backend time, a durable fencing
counter per key, idempotency records, a fenced document per key) driven by
concurrent workers, with timeouts (info ops, retried by request_id), abandoned
leases that must expire, nemesis windows that slow things down, and a final
phase that reads every document. It is seeded and event driven: each op is
invoked, takes effect at one instant (its linearization point) and completes
later, so the history is concurrent yet valid by construction.

    .tools/venv/bin/python bench/checker_domain.py --ops 1000000 --seed 1

prints, per checker, its CPU and wall time and ops/s (CPU time: the machine
may be shared), the same for all of them composed (sharing one view of the
history: its pairing and lease index), and the unsafe windows found; a correct history must be judged
valid by every checker.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import time
from collections.abc import Generator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/figures.py

from checkers.core import DOMAIN_CHECKERS, compose, gc_paused, get_checker, merge_valid  # noqa: E402
from checkers.view import lease_view  # noqa: E402

BASE_MS = 1_700_000_000_000  # backend (Unix ms) time when the simulated test starts
DEADLINE_MS = 1000
TIMEOUT_NS = 300_000_000  # a client gives up (info) after 300 ms


class Server:
    """A correct lease server and fenced document store, one linearization point per call."""

    def __init__(self) -> None:
        self.counter: dict[str, int] = {}
        self.current: dict[str, dict] = {}  # key -> the latest lease record
        self.leases: dict[str, dict] = {}
        self.idem: dict[tuple, tuple[str, tuple]] = {}  # (f, key, request_id) -> (body, outcome)
        self.docs: dict[str, dict] = {}
        self.n = 0

    def call(self, f: str, key: str, value: dict, now_ms: int) -> tuple:
        """Apply one call at backend time now_ms: ("ok", value, None) or ("fail", None, code)."""
        rid = value.get("request_id")
        ikey = (f, key, rid)
        body = repr(sorted(value.items()))
        if rid is not None and ikey in self.idem:
            stored_body, outcome = self.idem[ikey]
            return outcome if stored_body == body else ("fail", None, "idempotency_conflict")
        outcome = getattr(self, "_" + f.replace("-", "_"))(key, value, now_ms)
        if rid is not None and outcome[0] == "ok":
            self.idem[ikey] = (body, outcome)
        return outcome

    def _active(self, key: str, value: dict, now_ms: int) -> dict | None:
        """The caller's lease if it is the key's current, active, unexpired lease with that token."""
        lease = self.leases.get(value.get("lease_id"))
        if (lease is None or self.current.get(key) is not lease or lease["state"] != "active"
                or now_ms >= lease["expires_at_ms"] or lease["fencing_token"] != value.get("fencing_token")):
            return None
        return lease

    def _acquire(self, key: str, value: dict, now_ms: int) -> tuple:
        cur = self.current.get(key)
        if cur is not None and cur["state"] == "active" and now_ms < cur["expires_at_ms"]:
            return ("fail", None, "lease_conflict")
        self.counter[key] = self.counter.get(key, 0) + 1
        self.n += 1
        ttl = value["ttl_ms"]
        lease = {"lease_id": f"L{self.n}", "fencing_token": self.counter[key], "acquired_at_ms": now_ms,
                 "renewed_at_ms": now_ms, "expires_at_ms": now_ms + ttl, "ttl_ms": ttl, "state": "active"}
        self.current[key] = self.leases[lease["lease_id"]] = lease
        return ("ok", dict(lease), None)

    def _renew(self, key: str, value: dict, now_ms: int) -> tuple:
        lease = self._active(key, value, now_ms)
        if lease is None:
            return ("fail", None, "lease_lost")
        lease["renewed_at_ms"], lease["expires_at_ms"] = now_ms, now_ms + lease["ttl_ms"]
        return ("ok", dict(lease), None)

    def _release(self, key: str, value: dict, now_ms: int) -> tuple:
        lease = self._active(key, value, now_ms)
        if lease is None:
            return ("fail", None, "lease_lost")
        lease["state"] = "released"
        return ("ok", dict(lease), None)

    def _commit(self, key: str, value: dict, now_ms: int) -> tuple:
        doc = self.docs.setdefault(value["doc"], {"entries": [], "rev": 0, "token": 0})
        if self._active(key, value, now_ms) is None:
            return ("fail", None, "lease_lost")
        if value["fencing_token"] < doc["token"]:
            return ("fail", None, "stale_token")
        doc["entries"].append(value["entry"])
        doc["rev"] += 1
        doc["token"] = value["fencing_token"]
        return ("ok", {"doc": value["doc"], "rev": doc["rev"], "accepted_token": value["fencing_token"],
                       "validated_at_ms": now_ms}, None)

    def _read(self, key: str, value: dict, now_ms: int) -> tuple:
        doc = self.docs.get(value["doc"], {"entries": [], "token": 0})
        return ("ok", {"doc": value["doc"], "entries": [list(e) for e in doc["entries"]], "token": doc["token"]},
                None)


Result = tuple  # (type, value, error)
Request = tuple  # (f, key, value) or ("sleep", ms)


def worker(rng: random.Random, keys: list[str], weights: list[float], ids: itertools.count,
           process: list[int]) -> Generator[Request, Result, None]:
    """One client thread: acquire a key, renew and commit a few times, release (mostly)."""
    n = 0
    while True:
        key = rng.choices(keys, weights)[0]
        value = {"request_id": f"r{next(ids)}", "ttl_ms": 2000, "deadline_ms": DEADLINE_MS}
        res = yield ("acquire", key, value)
        tries = 0
        while res[0] == "info" and tries < 2:  # outcome unknown: retry by request_id
            tries += 1
            res = yield ("acquire", key, value)
        if res[0] != "ok":
            yield ("sleep", rng.uniform(1, 20))
            continue
        lease = res[1]
        if rng.random() < 0.01:  # replay the answered request (its answer taken as lost): same lease (C17)
            yield ("acquire", key, value)
        if rng.random() < 0.001:  # reuse the request_id with a changed body: idempotency_conflict
            yield ("acquire", key, {**value, "ttl_ms": 3000})
        held = {"lease_id": lease["lease_id"], "fencing_token": lease["fencing_token"], "deadline_ms": DEADLINE_MS}
        lost = False
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.01:  # a long pause (GC, preemption): the lease may expire meanwhile
                yield ("sleep", rng.uniform(1500, 4000))
            if rng.random() < 0.4:
                res = yield ("renew", key, {"request_id": f"r{next(ids)}", **held})
            else:
                n += 1
                entry = [process[0], lease["fencing_token"], n]
                res = yield ("commit", key, {"request_id": f"r{next(ids)}", **held, "doc": f"doc-{key}",
                                             "entry": entry})
            if res[0] != "ok":
                lost = True
                break
        if not lost and rng.random() < 0.97:  # else: abandon the lease and let it expire
            yield ("release", key, {"request_id": f"r{next(ids)}", **held})


class Simulation:
    """Drives workers against the server on a simulated clock, writing the history."""

    def __init__(self, n_ops: int, n_keys: int, n_workers: int, seed: int, server: Server | None = None):
        self.rng = random.Random(seed)
        self.n_ops = n_ops
        self.server = server or Server()
        self.history: list[dict] = []
        self.events: list[tuple] = []
        self.seq = itertools.count()
        self.keys = [f"k{i}" for i in range(n_keys)]
        weights = [1 / (i + 1) ** 0.8 for i in range(n_keys)]  # a few hot keys, a long tail
        ids = itertools.count()
        self.workers = []
        for w in range(n_workers):
            process = [w]
            gen = worker(random.Random(seed * 7919 + w), self.keys, weights, ids, process)
            self.workers.append({"gen": gen, "process": process, "next_process": w + n_workers})
        self.slow_until = 0

    def record(self, t: int, **fields) -> dict:
        """Append one op to the history."""
        op = {"index": len(self.history), "time": t, **fields}
        self.history.append(op)
        return op

    def schedule(self, t: int, action, *args) -> None:
        """Run action(t, *args) at simulated time t."""
        heapq.heappush(self.events, (t, next(self.seq), action, args))

    def run(self) -> list[dict]:
        """Simulate until about n_ops ops were written, then read every document."""
        for w in self.workers:
            self.schedule(self.rng.randrange(1_000_000), self.next_request, w, w["gen"].send(None))
        self.schedule(50_000_000, self.nemesis)
        t = 0
        while self.events:
            t, _, action, args = heapq.heappop(self.events)
            action(t, *args)
        self.final_reads(t + 1_000_000)
        return self.history

    def nemesis(self, t: int) -> None:
        """Mark a fault window (slower ops, more timeouts) every few hundred ms of simulated time."""
        if len(self.history) >= self.n_ops:
            return
        length = self.rng.randrange(50_000_000, 200_000_000)
        self.record(t, type="info", process="nemesis", f="partition", value={"phase": "start"})
        self.slow_until = t + length
        self.schedule(t + length, lambda t2: self.record(t2, type="info", process="nemesis", f="partition",
                                                          value={"phase": "end"}))
        self.schedule(t + length + self.rng.randrange(200_000_000, 600_000_000), self.nemesis)

    def next_request(self, t: int, w: dict, req: Request) -> None:
        """Start the worker's next request (or sleep), unless the op budget is spent."""
        if len(self.history) >= self.n_ops:
            return
        if req[0] == "sleep":
            self.schedule(t + int(req[1] * 1_000_000), self.next_request, w, w["gen"].send(None))
            return
        f, key, value = req
        inv = self.record(t, type="invoke", process=w["process"][0], f=f, key=key, value=value)
        slow = 10 if t < self.slow_until else 1
        lin = t + int(self.rng.expovariate(1 / (400_000 * slow)))
        done = lin + int(self.rng.expovariate(1 / (400_000 * slow)))
        timeout = self.rng.random() < 0.002 * slow or done - t > TIMEOUT_NS
        if timeout and self.rng.random() < 0.5:
            lin = None  # the request was lost before it took effect
        result: list = [None]
        if lin is not None:
            self.schedule(lin, self.linearize, f, key, value, result)
        self.schedule(t + TIMEOUT_NS if timeout else done, self.complete, w, inv, result, timeout)

    def linearize(self, t: int, f: str, key: str, value: dict, result: list) -> None:
        """The call takes effect at backend time t."""
        result[0] = self.server.call(f, key, value, BASE_MS + t // 1_000_000)

    def complete(self, t: int, w: dict, inv: dict, result: list, timeout: bool) -> None:
        """Write the completion and hand the worker its result."""
        if timeout:
            self.record(t, type="info", process=inv["process"], f=inv["f"], key=inv["key"], value=None,
                        error="timeout")
            w["process"][0], w["next_process"] = w["next_process"], w["next_process"] + len(self.workers)
            res = ("info", None, "timeout")
        else:
            typ, value, error = result[0]
            fields = {"error": error} if error else {}
            self.record(t, type=typ, process=inv["process"], f=inv["f"], key=inv["key"], value=value, **fields)
            res = result[0]
        self.schedule(t + self.rng.randrange(10_000, 200_000), self.next_request, w, w["gen"].send(res))

    def final_reads(self, t: int) -> None:
        """The final phase: one reader reads every document."""
        process = max(w["next_process"] for w in self.workers) + 1
        for key in self.keys:
            doc = f"doc-{key}"
            self.record(t, type="invoke", process=process, f="read", key=key, value={"doc": doc})
            t += 100_000
            _, value, _ = self.server.call("read", key, {"doc": doc}, BASE_MS + t // 1_000_000)
            self.record(t, type="ok", process=process, f="read", key=key, value=value)
            t += 100_000


def generate_history(n_ops: int, n_keys: int = 1000, n_workers: int = 64, seed: int = 1,
                     server: Server | None = None) -> list[dict]:
    """A concurrent lease history of about n_ops ops (plus one final read per key); correct with the
    default `Server`, and as wrong as a given (buggy) server makes it."""
    return Simulation(n_ops, n_keys, n_workers, seed, server).run()


TARGET_CPU_S = 5.0  # issue 13 target 4: the 1,000,000-op history composed in under 5 s of CPU on one core


def composed_breakdown(history: list[dict]) -> tuple[dict, dict[str, float], dict[str, float]]:
    """Every domain checker on one view of the history, as `Compose` runs them, with CPU seconds per part: the
    view (pairing, lease index), the checkers on top of it, then releasing the view. Returns (the merged result,
    {part: CPU s}, {checker: CPU s}); the parts add up to the composed run's CPU."""
    parts: dict[str, float] = {}
    each: dict[str, float] = {}
    results = {}
    t = time.process_time()
    with gc_paused():  # as Compose.check: the view released before the GC runs again
        view = lease_view(history)
        parts["pairing (lab.history.pair)"] = time.process_time() - t
        t = time.process_time()
        view.leases, view.starts, view.successors  # noqa: B018 - built here, to be timed apart
        parts["lease index"] = time.process_time() - t
        t = time.process_time()
        for name in DOMAIN_CHECKERS:
            c = time.process_time()
            results[name] = get_checker(name).check_view({}, view, {})
            each[name] = time.process_time() - c
        parts["checkers"] = time.process_time() - t
        t = time.process_time()
        del view
    parts["releasing the view"] = time.process_time() - t
    return {"valid": merge_valid(r["valid"] for r in results.values()), "results": results}, parts, each


def figures(quick: bool = False) -> list:
    """Issue 13 target 4 (domain checkers): CPU seconds to judge a 1,000,000-op lease history with every domain
    checker composed. quick: a 250,000-op history, its CPU scaled to 1M ops (the checkers are O(n log n) at
    worst, linear in practice), and no per-checker breakdown."""
    from figures import Figure  # bench/figures.py (bench/ is on the path when run from summary or as a script)

    n = 250_000 if quick else 1_000_000
    history = generate_history(n, seed=1)
    res, parts, each = composed_breakdown(history)
    cpu = sum(parts.values())
    scaled = cpu * 1_000_000 / len(history)
    verdicts = "every checker valid" if res["valid"] is True else f"composed verdict {res['valid']} (expected True)"
    note = (f"{len(history):,} simulated ops (bench/checker_domain.py, seed 1), process CPU time on one core of a "
            f"shared 2-core machine{', scaled to 1M ops' if quick else ''}; {verdicts}; "
            + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items())
            + "; the checkers on the shared view: " + ", ".join(f"{k} {v:.2f} s" for k, v in each.items()))
    return [Figure("domain checkers", "1M-op lease history, all domain checkers composed", round(scaled, 2), "s CPU",
                   f"< {TARGET_CPU_S:g} s", scaled < TARGET_CPU_S and res["valid"] is True, note)]


def timed(checker, history: list[dict]) -> tuple[dict, float, float]:
    """Run a checker: its result, CPU seconds (what one core spent) and wall seconds."""
    c0, w0 = time.process_time(), time.perf_counter()
    res = checker.check({}, history, {})
    return res, time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    """Generate a history and time every domain checker on it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    history = generate_history(args.ops, args.keys, args.workers, args.seed)
    gen_s = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for op in history:
        counts[op["f"]] = counts.get(op["f"], 0) + 1
    print(f"generated {len(history):,} ops in {gen_s:.1f} s (seed {args.seed}): "
          + ", ".join(f"{f} {n:,}" for f, n in sorted(counts.items())))
    total = 0.0
    print(f"{'checker':18s} {'cpu s':>7s} {'wall s':>7s} {'ops/s (cpu)':>12s}")
    for name in DOMAIN_CHECKERS:
        res, cpu, wall = timed(get_checker(name), history)
        total += cpu
        extra = f" ({res.get('violation_count')} violations)" if res["valid"] is not True else ""
        print(f"{name:18s} {cpu:7.2f} {wall:7.2f} {len(history) / cpu:12,.0f}  valid={res['valid']}{extra}")
    print(f"{'sum of the above':18s} {total:7.2f} {'':7s} {len(history) / total:12,.0f}")
    res, cpu, wall = timed(compose({name: get_checker(name) for name in DOMAIN_CHECKERS}), history)
    print(f"{'composed (shared)':18s} {cpu:7.2f} {wall:7.2f} {len(history) / cpu:12,.0f}  valid={res['valid']}"
          f"  (target < {TARGET_CPU_S:g} s CPU at 1M ops)")
    _, parts, each = composed_breakdown(history)
    print(f"composed, by part ({sum(parts.values()):.2f} s CPU): " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))
    print("the checkers on the shared view: " + ", ".join(f"{k} {v:.2f} s" for k, v in each.items()))
    windows = res["results"]["mutual-exclusion"]["unsafe_windows"]
    print(f"unsafe windows: {windows['count']:,} ({windows['total_ms']:,.0f} ms in all), commits by the older "
          f"holder inside them: {windows['commits_by_older_holder']}")


if __name__ == "__main__":
    main()
