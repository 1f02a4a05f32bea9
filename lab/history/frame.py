"""`to_frame`: one pandas row per operation (an invocation joined with its completion).

Completion columns of an invocation that never completed are missing (pandas
NA in nullable Int64 columns) and its type is `info`, as the record's semantics
say. Nemesis operations get their own rows, always of type `info`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from lab.history.ops import NEMESIS, pair_ops

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["to_frame", "FRAME_COLUMNS"]

FRAME_COLUMNS = [
    "process", "f", "key", "node",
    "invoke_index", "complete_index", "invoke_time", "complete_time", "latency_ns",
    "type", "value_in", "value_out", "error",
]  # fmt: skip
_INT_COLUMNS = ["invoke_index", "complete_index", "invoke_time", "complete_time", "latency_ns"]


def _row(inv: dict, comp: dict | None) -> tuple:
    """One frame row for an (invocation, completion-or-None) pair."""
    either = comp or {}
    if comp is None:
        ci = ct = lat = None
        type_, value_out, error = "info", None, None
    else:
        ci, ct, lat = comp["index"], comp["time"], comp["time"] - inv["time"]
        type_ = "info" if inv["process"] == NEMESIS else comp["type"]
        value_out, error = comp["value"], comp.get("error")
    return (
        inv["process"], inv["f"], inv.get("key", either.get("key")), inv.get("node", either.get("node")),
        inv["index"], ci, inv["time"], ct, lat,
        type_, inv["value"], value_out, error,
    )  # fmt: skip


def to_frame(ops: Iterable[dict], *, strict: bool = True) -> "pd.DataFrame":
    """A DataFrame with one row per operation, sorted by invocation index. strict=False pairs a malformed
    history by `pair`'s lenient rules (each problem a HistoryWarning) instead of raising HistoryError."""
    import pandas as pd  # imported here: the writer's users (every lab process) need not load pandas

    rows = [_row(inv, comp) for inv, comp in pair_ops(ops, strict=strict)]
    rows.sort(key=lambda r: r[4])
    frame = pd.DataFrame.from_records(rows, columns=FRAME_COLUMNS)
    for col in _INT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    return frame
