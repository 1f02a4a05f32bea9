"""`check_history` and the `Linearizable` checker: pair, partition, search each partition.

Partitions (per key by default, P-compositionality: a history is linearizable
iff each partition is) are searched smallest first; the first illegal one
ends the check. A time budget shared by all partitions, and a cache budget per
partition, turn a search that would run too long or too big into "unknown".
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from checkers.core import gc_paused
from checkers.linear.engine import prepare_partition, search
from checkers.linear.history import Op, pair_partitions
from checkers.models import ILLEGAL, LEASE_FS, Model, get_model, unmodelled_fs

__all__ = ["LEASE_TIME_LIMIT_S", "Linearizable", "check_history", "lease_linearizable"]

# The search budget of the lease-linearizability checker a workload composes: beyond it the verdict is
# "unknown" (a run's lease history takes milliseconds; the budget bounds a pathological one).
LEASE_TIME_LIMIT_S = 60.0


def _resolve(model: Model | str) -> Model:
    """A Model from a model or a registered model name."""
    if isinstance(model, Model):
        return model
    if isinstance(model, str):
        return get_model(model)
    raise TypeError(f"model must be a checkers.models.Model or a model name, got {type(model).__name__}")


def check_history(history: list[dict], model: Model | str, *, time_limit: float | None = None,
                  max_cache_entries: int | None = None) -> dict:
    """Check a history for linearizability against `model`.

    Returns `{"valid": True|False|"unknown", "partitions", "ops", "elapsed_s"}`,
    plus `"counterexample"` when invalid and `"reason"` when unknown.
    """
    with gc_paused():  # the search allocates millions of acyclic objects (checkers.core.gc_paused says why)
        return _check(history, _resolve(model), time_limit, max_cache_entries)


def _check(history: list[dict], model: Model, time_limit: float | None, max_cache_entries: int | None) -> dict:
    """check_history's body (with the GC paused)."""
    t0 = time.monotonic()
    if time_limit is not None and time_limit < 0:
        raise ValueError(f"time_limit must be >= 0 seconds, got {time_limit}")
    if max_cache_entries is not None and max_cache_entries < 1:
        raise ValueError(f"max_cache_entries must be >= 1, got {max_cache_entries}")
    deadline = None if time_limit is None else t0 + time_limit
    n_ops, parts = pair_partitions(model.faults(history), model)
    parts.sort(key=lambda kp: len(kp[1]))
    result: dict[str, Any] = {"valid": True, "partitions": len(parts), "ops": n_ops}
    unknown: list[str] = []
    memo: dict = {}  # compiled ops, shared by the partitions
    # Smallest first, each partition released as soon as it is judged: its ops are freed while the search
    # has them in the CPU's cache (freeing 40,000 cold ops at the end cost 10 ms, as much as a tenth of it).
    parts.reverse()
    while parts:
        key, part = parts.pop()
        if deadline is not None and time.monotonic() > deadline:
            unknown.append("time limit")
            break
        si = prepare_partition(part, model, memo)
        del part
        res = search(si, deadline=deadline, max_cache_entries=max_cache_entries)
        del si
        if res.valid is False:
            result["valid"] = False
            result["counterexample"] = _counterexample(key, model, res)
            break
        if res.valid != True:  # noqa: E712 - "unknown" is truthy
            unknown.append(f"partition {key!r}: {res.reason}")
            if res.reason == "time limit":
                break
    if result["valid"] is True and unknown:
        result["valid"] = "unknown"
        result["reason"] = "; ".join(unknown)
    result["elapsed_s"] = time.monotonic() - t0
    return result


def _describe_op(model: Model, op: Op) -> dict:
    """An op of a counterexample: its index, process and a one-line description."""
    d = {"index": op.index, "process": op.process, "op": model.describe_operation(op.input, op.output)}
    if op.merged:
        d["merged"] = list(op.merged)
    return d


def _counterexample(key: Any, model: Model, res: Any) -> dict:
    """Partition key, longest linearizable prefix with the states it reaches, and the blocking window."""
    state = model.init()
    states = [model.describe_state(state)]
    for op in res.prefix:
        fn = model.compile(op.input, op.output)
        new = fn(state) if fn is not None else state
        if new is not ILLEGAL:  # replaying the search's own steps: always legal
            state = new
        states.append(model.describe_state(state))
    return {
        "key": key,
        "window": [op.index for op in res.window],
        "window_ops": [_describe_op(model, op) for op in res.window],
        "prefix": [op.index for op in res.prefix],
        "prefix_ops": [_describe_op(model, op) for op in res.prefix],
        "states": states,
        "final_state": states[-1],
    }


class Linearizable:
    """Jepsen's linearizable checker: `check(test, history, opts)` over one model.

    An exception inside the check (a malformed history, an op the model cannot
    read) becomes `{"valid": "unknown", "error": ...}`, never a crashed analysis.
    """

    def __init__(self, model: Model | str, time_limit: float | None = None, *,
                 max_cache_entries: int | None = None, only_fs: Collection[str] | None = None):
        self.model = _resolve(model)
        self.time_limit = time_limit
        self.max_cache_entries = max_cache_entries
        # Client ops whose f is outside `only_fs` are left out (a workload's observations that are no
        # operation of the model); None: every op is the model's, and an f it does not know is an error.
        self.only_fs = None if only_fs is None else frozenset(only_fs)

    def check(self, test: Mapping[str, Any] | None, history: list[dict], opts: Mapping[str, Any] | None) -> dict:
        """Check `history`; the result is `check_history`'s, plus `model`."""
        if self.only_fs is not None:
            fs = self.only_fs
            history = [op for op in history if op.get("process") == "nemesis" or op.get("f") in fs]
        elif unmodelled := unmodelled_fs(self.model, history):  # never a verdict from ops the model cannot read
            return {"valid": "unknown", "model": self.model.name,
                    "error": f"model {self.model.name!r} does not model {', '.join(unmodelled)}"}
        try:
            res = check_history(history, self.model, time_limit=self.time_limit,
                                max_cache_entries=self.max_cache_entries)
        except Exception as e:  # noqa: BLE001 - Jepsen's check-safe: a checker never crashes the analysis
            return {"valid": "unknown", "error": f"{type(e).__name__}: {e}", "model": self.model.name}
        res["model"] = self.model.name
        reason = _nothing_answered(history)
        if res["valid"] is True and reason:
            res["valid"], res["reason"] = "unknown", reason
        return res


def lease_linearizable(time_limit: float | None = LEASE_TIME_LIMIT_S) -> Linearizable:
    """The lease-linearizability checker the lease and fenced-append workloads compose beside the domain
    checkers: the `lease` model over the history's lease operations (`LEASE_FS`; a workload's other ops,
    observations, are left out), per lock identity, judged with the backend times the server reported;
    unanswered ops are indeterminate. Past `time_limit` seconds the verdict is "unknown", never "valid"."""
    return Linearizable("lease", time_limit, only_fs=LEASE_FS)


def _nothing_answered(history: list[dict]) -> str | None:
    """Why a history gives the search nothing to judge: no client op, or none that succeeded (None otherwise).

    Failed ops are dropped and unanswered ones need never take effect, so without an `ok` every
    history is linearizable: a verdict about nothing.
    """
    types = [op.get("type") for op in history if op.get("process") != "nemesis"]
    if not types:
        return "no operations"
    if "ok" in types:
        return None
    done = [t for t in types if t != "invoke"]
    if done and all(t == "fail" for t in done):
        return "every operation failed"
    return "no operation succeeded"
