"""The history store: the one op record of docs/history-format.md, on disk as the run goes.

- `HistoryWriter` appends ops to `history.jsonl` (dense `index`, monotonic `time`).
- `read_history` / `read_history_report` / `iter_jsonl` read JSONL or Jepsen EDN,
  skipping and reporting a torn last line.
- `read_edn` / `write_edn` import and export Jepsen's `history.edn`.
- `pair` (the one pairing: strict or lenient, the caller's choice), `pair_ops` and
  `to_frame` join invocations with their completions; `HistoryError`,
  `HistoryWarning` and `NEMESIS` come from `lab.history.ops`.
Ops are plain dicts; `validate_op` checks one and names where it came from.
"""

from lab.history.edn import read_edn, read_edn_report, write_edn
from lab.history.files import (
    detect_format,
    iter_jsonl,
    read_history,
    read_history_report,
    write_jsonl,
)
from lab.history.frame import FRAME_COLUMNS, to_frame
from lab.history.ops import (
    COMPLETION_TYPES,
    NEMESIS,
    OP_TYPES,
    HistoryError,
    HistoryWarning,
    Pairing,
    is_client_process,
    pair,
    pair_ops,
    validate_op,
)
from lab.history.writer import HistoryWriter

__all__ = [
    "COMPLETION_TYPES",
    "FRAME_COLUMNS",
    "NEMESIS",
    "OP_TYPES",
    "Pairing",
    "HistoryError",
    "HistoryWarning",
    "HistoryWriter",
    "detect_format",
    "is_client_process",
    "iter_jsonl",
    "pair",
    "pair_ops",
    "read_edn",
    "read_edn_report",
    "read_history",
    "read_history_report",
    "to_frame",
    "validate_op",
    "write_edn",
    "write_jsonl",
]
