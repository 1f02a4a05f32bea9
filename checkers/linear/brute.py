"""A brute-force linearizability checker: the reference the engine is tested against.

It tries every order of every subset of indeterminate ops together with all
determinate ops, checking real-time order and the model's `step` directly
(remembering only which (placed ops, state) pairs already failed) --
no cache, no pruning (the model's `prune` is not run; its `prepare`, which
is the model's reading of the history, is), no compiled steps. Exponential: meant for
histories of a handful of ops (tests use <= 12).
"""

from __future__ import annotations

from typing import Any

from checkers.linear.history import Op, pair_history, partition_ops
from checkers.models import Model

__all__ = ["brute_force_linearizable"]


def brute_force_linearizable(history: list[dict], model: Model) -> bool:
    """Whether `history` is linearizable, by exhaustive search per partition."""
    ops = pair_history(history)
    return all(_partition_ok(model.prepare(part), model) for _key, part in partition_ops(ops, model))


def _partition_ok(ops: list[Op], model: Model) -> bool:
    """Exhaustive search over the orders of one partition's ops (failed (placed, state) pairs memoized)."""
    required = frozenset(i for i, op in enumerate(ops) if op.ret is not None)
    inf = float("inf")
    failed: set = set()

    def ret(op: Op) -> float:
        return inf if op.ret is None else op.ret

    def extend(done: frozenset, state: Any) -> bool:
        if required <= done:
            return True
        try:
            memo = (done, state)
            if memo in failed:
                return False
        except TypeError:  # an unhashable state: no memo
            memo = None
        for i, op in enumerate(ops):
            if i in done:
                continue
            # real-time order: every op that returned before `op` was invoked must already be placed
            if any(j not in done and ret(o) < op.call for j, o in enumerate(ops) if j in required):
                continue
            ok, new = model.step(state, op.input, op.output)
            if ok and extend(done | {i}, new):
                return True
        if memo is not None:
            failed.add(memo)
        return False

    return extend(frozenset(), model.init())
