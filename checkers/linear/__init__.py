"""Linearizability checking: Wing-Gong-Lowe search with per-key partitioning (Porcupine-like).

`check_history(history, model)` pairs op records (docs/history-format.md),
partitions them by key, and searches each partition (`engine.search`) for a
linearization under a model from `checkers.models`. `Linearizable(model)` is
the same as a Jepsen checker. See `engine` for the algorithm and the pruning
rules with their proofs.
"""

from checkers.linear.checker import Linearizable, check_history, lease_linearizable
from checkers.linear.history import HistoryError, Op, pair_history

__all__ = ["HistoryError", "Linearizable", "Op", "check_history", "lease_linearizable", "pair_history"]
