"""Helpers for testing linearizability checkers: a history builder and a concurrent simulator.

`HistoryBuilder` writes op records (docs/history-format.md) one event at a
time. `simulate` runs a sequential model concurrently: each op gets a real-time
interval and a linearization point inside it, the model executes ops in
linearization-point order, and the events are emitted in time order -- so the
history is linearizable by construction. Crashed ops (`info`) take effect or
not at random, and their process is retired. `mutate` then changes one result,
which usually makes the history non-linearizable.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

__all__ = ["EXECUTORS", "HistoryBuilder", "PlannedOp", "mutate", "simulate"]


class HistoryBuilder:
    """Build a history line by line: `b.invoke(0, "write", 1); b.ok(0)`."""

    def __init__(self) -> None:
        self.ops: list[dict] = []
        self._open: dict[Any, dict] = {}

    def _add(self, **op: Any) -> HistoryBuilder:
        """Append one op record with the next index and time."""
        op = {"index": len(self.ops), "time": len(self.ops) * 1000, **op}
        self.ops.append({k: v for k, v in op.items() if v is not None or k == "value"})
        return self

    def invoke(self, process: Any, f: str, value: Any = None, key: Any = None) -> HistoryBuilder:
        """An invocation by `process`."""
        self._open[process] = {"f": f, "key": key}
        return self._add(type="invoke", process=process, f=f, value=value, key=key)

    def _complete(self, typ: str, process: Any, value: Any, error: Any = None) -> HistoryBuilder:
        """Complete the open op of `process`."""
        inv = self._open.pop(process)
        return self._add(type=typ, process=process, f=inv["f"], value=value, key=inv["key"], error=error)

    def ok(self, process: Any, value: Any = None) -> HistoryBuilder:
        """An ok completion with its result."""
        return self._complete("ok", process, value)

    def fail(self, process: Any, error: str = "failed") -> HistoryBuilder:
        """A fail completion (it did not happen)."""
        return self._complete("fail", process, None, error)

    def info(self, process: Any, error: str = "timeout") -> HistoryBuilder:
        """An info completion (it may or may not have happened)."""
        return self._complete("info", process, None, error)

    def nemesis(self, f: str = "start", value: Any = None) -> HistoryBuilder:
        """A nemesis op (ignored by models)."""
        return self._add(type="info", process="nemesis", f=f, value=value)


# An executor runs one op on a sequential object: (state, f, value) -> (type, result, new_state)
Executor = Callable[[Any, str, Any], tuple[str, Any, Any]]


def _register_exec(state: Any, f: str, value: Any) -> tuple[str, Any, Any]:
    """A register with cas: reads return the value; cas fails unless it matches."""
    if f == "read":
        return "ok", state, state
    if f == "write":
        return "ok", value, value
    old, new = value
    return ("ok", value, new) if state == old else ("fail", value, state)


def _mutex_exec(state: Any, f: str, value: Any) -> tuple[str, Any, Any]:
    """A mutex whose acquire fails when held and whose release fails when free."""
    if f == "acquire":
        return ("fail", None, state) if state else ("ok", None, True)
    return ("ok", None, False) if state else ("fail", None, state)


def _kv_exec(state: Any, f: str, value: Any) -> tuple[str, Any, Any]:
    """One key of Porcupine's kv store."""
    if f == "get":
        return "ok", state, state
    if f == "put":
        return "ok", value, value
    return "ok", value, state + value


def _fenced_exec(state: Any, f: str, value: Any) -> tuple[str, Any, Any]:
    """A fenced register: a write is accepted iff its token >= the stored one."""
    v, t = state
    if f == "read":
        return "ok", {"value": v, "token": t}, state
    if t is None or value["token"] >= t:
        return "ok", {"accepted": True}, (value["value"], value["token"])
    return "ok", {"accepted": False}, state


EXECUTORS: dict[str, tuple[Executor, Any, Callable[[random.Random], tuple[str, Any]]]] = {
    "register": (_register_exec, None,
                 lambda r: ("read", None) if r.random() < 0.5 else ("write", r.randrange(3))),
    "cas-register": (_register_exec, None,
                     lambda r: r.choice([("read", None), ("write", r.randrange(3)),
                                         ("cas", [r.randrange(3), r.randrange(3)])])),
    "mutex": (_mutex_exec, False, lambda r: (r.choice(["acquire", "release"]), None)),
    "kv": (_kv_exec, "", lambda r: r.choice([("get", None), ("put", r.choice("xy")), ("append", r.choice("xy"))])),
    "fenced-register": (_fenced_exec, (None, None),
                        lambda r: ("read", None) if r.random() < 0.4 else
                        ("write", {"value": r.randrange(3), "token": r.randrange(4)})),
}


class PlannedOp:
    """One op of a simulated run: who, what, when, and whether a crash loses its outcome."""

    __slots__ = ("process", "f", "value", "invoke", "lin", "done", "crash", "applied", "type", "result", "key")

    def __init__(self, process: Any, f: str, value: Any, invoke: int, lin: int, done: int,
                 crash: bool = False, applied: bool = True, key: Any = None):
        self.process, self.f, self.value, self.key = process, f, value, key
        self.invoke, self.lin, self.done = invoke, lin, done
        self.crash, self.applied = crash, applied
        self.type: str = "ok"
        self.result: Any = None


def simulate(model_name: str, rng: random.Random, n_ops: int, n_procs: int, *,
             crash: float = 0.15, open_end: float = 0.1, keys: int = 1) -> list[dict]:
    """A linearizable-by-construction history of `model_name` with crashes and open ops."""
    exe, init, gen_op = EXECUTORS[model_name]
    planned = _plan(rng, n_ops, n_procs, crash, gen_op,
                    (lambda r, t: r.randrange(keys)) if keys > 1 else (lambda r, t: None))
    states: dict[Any, Any] = {}
    for op in sorted(planned, key=lambda o: (o.lin, rng.random())):
        st = states.get(op.key, init)
        typ, res, new = exe(st, op.f, op.value)
        op.type, op.result = typ, res
        if op.applied:
            states[op.key] = new
        if op.crash:
            op.type = "info"

    def base(op: PlannedOp) -> dict:
        return {"process": op.process, "f": op.f, **({"key": op.key} if op.key is not None else {})}

    return _emit(planned, rng, base, lambda op: {"type": op.type, "value": None if op.type == "info" else op.result},
                 open_end)


def _plan(rng: random.Random, n_ops: int, n_procs: int, crash: float,
          draw_op: Callable[[random.Random], tuple[str, Any]] | None,
          draw_key: Callable[[random.Random, int], Any]) -> list[PlannedOp]:
    """The one planner of this module's simulators: `n_procs` client threads, each op an invocation, a
    linearization point inside its interval and a completion; a crashed op (`info`, applied or not at random)
    retires its process (the thread goes on as process + n_procs, as docs/history-format.md says).
    `draw_op(rng)` gives (f, value) now, or None to decide at execution time; `draw_key(rng, thread)` the key."""
    planned: list[PlannedOp] = []
    clocks = [0] * n_procs
    procs = list(range(n_procs))
    for _ in range(n_ops):
        t = rng.randrange(n_procs)
        start = clocks[t] + rng.randrange(3)
        lat = 1 + rng.randrange(6)
        f, value = draw_op(rng) if draw_op is not None else ("", None)
        op = PlannedOp(procs[t], f, value, start, start + rng.randrange(lat + 1), start + lat,
                       crash=rng.random() < crash)
        op.key = draw_key(rng, t)
        op.applied = not op.crash or rng.random() < 0.5
        planned.append(op)
        clocks[t] = start + lat + 1
        if op.crash:
            procs[t] += n_procs  # the crashed process is retired
    return planned


def _emit(planned: list[PlannedOp], rng: random.Random, base: Callable[[PlannedOp], dict],
          completion: Callable[[PlannedOp], dict], open_end: float | None = None) -> list[dict]:
    """The history of planned ops, events in time order (invocations before completions at equal times:
    closed intervals overlap); with `open_end`, that share of crashed ops never completes."""
    events: list[tuple[float, float, dict]] = []
    for op in planned:
        b = base(op)
        events.append((op.invoke, rng.random() * 0.5, {**b, "type": "invoke", "value": op.value}))
        if open_end is not None and op.type == "info" and rng.random() < open_end:
            continue  # never completed
        events.append((op.done, 0.5 + rng.random() * 0.5, {**b, **completion(op)}))
    events.sort(key=lambda e: (e[0], e[1]))
    return [{"index": i, "time": int(t * 1000), **rec} for i, (t, _, rec) in enumerate(events)]


def mutate(history: list[dict], rng: random.Random) -> list[dict]:
    """Change one ok result (or make one fail ok), which usually breaks linearizability."""
    h = [dict(op) for op in history]
    cands = [i for i, op in enumerate(h) if op["type"] in ("ok", "fail") and op["process"] != "nemesis"]
    if not cands:
        return h
    i = rng.choice(cands)
    op = h[i]
    if op["type"] == "fail":
        op["type"] = "ok"
        op["value"] = _invoke_value(h, i)
    elif op["f"] in ("read", "get"):
        v = op["value"]
        if isinstance(v, dict):  # fenced read
            op["value"] = {"value": rng.randrange(3), "token": v.get("token")}
        elif isinstance(v, str):
            op["value"] = v + rng.choice("xy")
        else:
            op["value"] = rng.choice([x for x in (None, 0, 1, 2) if x != v])
    elif op["f"] == "write" and isinstance(op["value"], dict):
        op["value"] = {"accepted": not op["value"].get("accepted")}
    else:
        # a write/put/append/cas/acquire/release that succeeded is reported as not having happened: drop it
        op["type"] = "fail"
    return h


def _invoke_value(h: list[dict], i: int) -> Any:
    """The invoke value of the op completed at line i."""
    proc = h[i]["process"]
    for j in range(i - 1, -1, -1):
        if h[j]["process"] == proc and h[j]["type"] == "invoke":
            return h[j]["value"]
    return None


class _LeaseServer:
    """A sequential lease server following the contract, with backend time given per op."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.counter = 0
        self.high_water: int | None = None
        self.next_id = 0

    def _live(self, now: int) -> bool:
        """Whether the current lease is active and unexpired at `now`."""
        return self.lease is not None and self.lease["state"] == "active" and now < self.lease["expires_at_ms"]

    def _owned(self, ref: dict, now: int) -> bool:
        """Whether `ref` names the live current lease."""
        return (self._live(now) and self.lease["lease_id"] == ref["lease_id"]
                and self.lease["fencing_token"] == ref["fencing_token"])

    def run(self, f: str, value: dict, now: int) -> tuple[str, Any]:
        """Execute one op at backend time `now`: ("ok", result) or ("fail", error code)."""
        if f == "acquire":
            if self._live(now):
                return "fail", "lease_conflict"
            self.counter += 1
            self.next_id += 1
            ttl = value["ttl_ms"]
            self.lease = {"lease_id": f"L{self.next_id}", "fencing_token": self.counter, "acquired_at_ms": now,
                          "renewed_at_ms": now, "expires_at_ms": now + ttl, "ttl_ms": ttl, "state": "active"}
            return "ok", dict(self.lease)
        if f == "inspect":
            return "ok", dict(self.lease) if self._live(now) else None
        if not self._owned(value, now):
            return "fail", "lease_lost"
        if f == "renew":
            self.lease.update(renewed_at_ms=now, expires_at_ms=now + self.lease["ttl_ms"])
            return "ok", dict(self.lease)
        if f == "release":
            self.lease["state"] = "released"
            return "ok", dict(self.lease)
        # commit
        if self.high_water is not None and value["fencing_token"] < self.high_water:
            return "fail", "stale_token"
        self.high_water = value["fencing_token"]
        return "ok", {"doc": "d", "rev": 1, "accepted_token": value["fencing_token"], "validated_at_ms": now}


def simulate_lease(rng: random.Random, n_ops: int, n_procs: int, *, crash: float = 0.15) -> list[dict]:
    """A linearizable-by-construction lease history: clients acquire, renew, commit, release, inspect.

    Clients act on the lease they last acquired (learned from an ok acquire);
    backend time is the op's linearization point (in ms), TTLs are short so
    leases expire mid-run, and crashed ops take effect or not at random.
    """
    planned = _plan(rng, n_ops, n_procs, crash, None, lambda r, t: t)  # key: the thread, to decide its op later
    server = _LeaseServer()
    held: dict[int, dict] = {}  # thread -> the lease it believes it holds
    rid = 0
    for op in sorted(planned, key=lambda o: (o.lin, rng.random())):
        mine = held.get(op.key)
        rid += 1
        if mine is None:
            op.f = rng.choice(["acquire", "acquire", "inspect"])
            op.value = {"request_id": f"r{rid}", "ttl_ms": rng.choice([3, 5, 8])} if op.f == "acquire" else {}
        else:
            op.f = rng.choice(["renew", "commit", "commit", "release"])
            op.value = {"request_id": f"r{rid}", "lease_id": mine["lease_id"], "fencing_token": mine["fencing_token"]}
        if op.applied:
            typ, res = server.run(op.f, op.value, op.lin)
        else:
            typ, res = "ok", None  # lost before reaching the server
        op.type, op.result = typ, res
        if op.crash:
            op.type = "info"
        elif op.f == "acquire" and typ == "ok":
            held[op.key] = res
        elif op.f == "release" or typ == "fail":
            held.pop(op.key, None)
        if op.crash:
            held.pop(op.key, None)  # the retired process's successor starts afresh

    def completion(op: PlannedOp) -> dict:
        comp = {"type": op.type, "value": op.result if op.type == "ok" else None}
        if op.type == "fail":
            comp["error"] = op.result
        return comp

    return _emit(planned, rng, lambda op: {"process": op.process, "f": op.f, "key": "k"}, completion)


def mutate_lease(history: list[dict], rng: random.Random) -> list[dict]:
    """Perturb one answered lease op (a token, a backend time), or turn a refused acquire into a grant."""
    h = [dict(op) for op in history]
    oks = [i for i, op in enumerate(h) if op["type"] == "ok" and isinstance(op.get("value"), dict)]
    fails = [i for i, op in enumerate(h) if op["type"] == "fail" and op["f"] == "acquire"]
    if fails and (not oks or rng.random() < 0.3):
        i = rng.choice(fails)
        at = rng.randrange(40)
        h[i].update(type="ok", value={"lease_id": f"X{i}", "fencing_token": rng.randrange(1, 6), "acquired_at_ms": at,
                                       "renewed_at_ms": at, "expires_at_ms": at + 5, "ttl_ms": 5, "state": "active"})
        h[i].pop("error", None)
        return h
    if not oks:
        return h
    i = rng.choice(oks)
    v = dict(h[i]["value"])
    field = rng.choice([k for k in ("fencing_token", "acquired_at_ms", "expires_at_ms", "renewed_at_ms",
                                    "validated_at_ms", "accepted_token") if k in v])
    v[field] += rng.choice([-3, -1, 1, 3])
    h[i]["value"] = v
    return h
