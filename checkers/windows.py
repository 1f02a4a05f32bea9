"""Windows: what the nemesis did in a history, read from its ops (docs/history-format.md).

`Faults(history)` reads the nemesis ops once and answers, each computed on first
use and kept: the fault windows (`windows`: [{fault, start, end, start_index,
end_index, open}]), the moves of the backend's clock (`clock_moves`) and the
borders between which backend times stay comparable (`clock_segments`,
`strobe_windows`), the moments Valkey may have lost its state
(`valkey_losses`), and the history's last time (`end`). A checker reads them
from its `LeaseView` (`view.faults`, built once per composition); the
functions below answer one question of a bare history, for callers outside a
check (the report, the evidence, the timeline page).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from lab.history.ops import NEMESIS

if TYPE_CHECKING:  # for annotations only: the pairing views do not depend on this module, nor this on them
    from checkers.pairs import Pair

__all__ = [
    "NEMESIS",
    "Faults",
    "backend_clock_moves",
    "backend_rules_note",
    "history_end_time",
    "nemesis_ops",
    "nemesis_phase",
    "nemesis_positions",
    "nemesis_windows",
    "segment_of",
]

_PHASES = {"start": "start", "begin": "start", "stop": "end", "end": "end", "heal": "end"}


def history_end_time(history: list[dict]) -> int:
    """The latest `time` in the history (0 when empty): a pass over every op."""
    return max((op.get("time", 0) for op in history), default=0)


def nemesis_positions(history: list[dict]) -> list[tuple[int, dict]]:
    """(position, op) of every nemesis op of the history: a pass over every op (the pairing finds them on
    its way, `checkers.view.lease_view`)."""
    return [(pos, op) for pos, op in enumerate(history) if op.get("process") == NEMESIS]


def nemesis_phase(op: Mapping) -> tuple[str, str] | None:
    """Classify a nemesis op as (fault, "start"|"end"), or None when it marks neither.

    Two conventions are understood: fencelab's `value: {"phase": "start"|"end"}`
    with the fault in `f`, and Jepsen's f names `start-<fault>` / `stop-<fault>`
    (also `<fault>-start` / `<fault>-stop`, and bare `start` / `stop` for the fault "nemesis").
    """
    f = str(op.get("f"))
    value = op.get("value")
    if isinstance(value, dict) and value.get("phase") in _PHASES:
        return str(value.get("fault") or f), _PHASES[value["phase"]]
    if f in _PHASES:
        return NEMESIS, _PHASES[f]
    head, sep, tail = f.partition("-")
    if sep and head in _PHASES and tail:
        return tail, _PHASES[head]
    head, sep, tail = f.rpartition("-")
    if sep and tail in _PHASES and head:
        return head, _PHASES[tail]
    return None


@dataclass(frozen=True, eq=False)
class Faults:
    """The nemesis ops of one history (`nemesis`: their (position, op), found by `nemesis_positions` unless
    given) and what the checkers ask of them, each derived once, on first use: do not mutate what it returns."""

    history: list[dict] = field(repr=False)
    nemesis: list[tuple[int, dict]] = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.nemesis is None:
            object.__setattr__(self, "nemesis", nemesis_positions(self.history))  # frozen: set once, here

    @cached_property
    def end(self) -> int:
        """The latest `time` in the history (`history_end_time`): where a window never closed ends."""
        return history_end_time(self.history)

    @cached_property
    def ops(self) -> list[dict]:
        """The nemesis ops, named by the fault they report and without the operations that changed nothing.

        The nemesis's completions carry the fault in `value.fault` while `f` is the
        operation (`start-partition`): such ops are renamed to their fault, so the
        invocation and the completion of one start mark one window; an operation
        whose completion says
        `"phase": "none"` (a start while already active, a stop with nothing
        active, an error that was rolled back) is dropped with its invocation.
        Ops pair as docs/history-format.md says: one starts, the next one ends.
        """
        out: list[dict] = []
        opened: int | None = None  # position in `out` of the nemesis op that started the open operation
        for _, op in self.nemesis:
            v = op.get("value")
            phase = v.get("phase") if isinstance(v, dict) else None
            if phase in ("start", "end", "none") and v.get("fault"):
                op = dict(op, f=str(v["fault"]))
            if opened is None and op.get("type") in ("invoke", "info"):
                opened = len(out)
                out.append(op)
                continue
            if phase == "none" and opened is not None:
                del out[opened]  # nothing changed: neither op marks a fault window
            else:
                out.append(op)
            opened = None
        return out

    @cached_property
    def windows(self) -> list[dict]:
        """Fault windows marked by the nemesis: [{fault, start, end, start_index, end_index, open}].

        A window opens at the first start op of a fault (its invoke, when the nemesis
        logs invoke + info) and closes at the last op of the matching end (its
        completion). A window never closed ends at the history's last time, `open: True`.
        """
        windows: list[dict] = []
        opened: dict[str, dict] = {}
        closing: dict[str, dict] = {}  # fault -> window whose end op may still get a completion
        for pos, op in enumerate(self.ops):
            if op.get("process") != NEMESIS:
                continue
            cls = nemesis_phase(op)
            if cls is None:
                continue
            fault, phase = cls
            t, idx = op.get("time", 0), op.get("index", pos)
            if phase == "start":
                closing.pop(fault, None)
                if fault not in opened:
                    w = {"fault": fault, "start": t, "end": None, "start_index": idx, "end_index": None,
                         "open": False}
                    opened[fault] = w
                    windows.append(w)
            elif fault in opened:
                w = opened.pop(fault)
                w["end"], w["end_index"] = t, idx
                closing[fault] = w
            elif fault in closing:  # the completion of the end op we already saw
                closing[fault]["end"], closing[fault]["end_index"] = t, idx
        if opened:  # (the history's end only when asked: a pass over every op of the history)
            end = self.end
            for w in opened.values():
                w["end"], w["open"] = end, True
        return windows

    @cached_property
    def clock_moves(self) -> list[int]:
        """Indices of nemesis ops that moved the backend's (Valkey's) clock.

        Backend times come from Valkey's clock. Once a nemesis has moved it,
        backend times of different moments are no longer comparable (a later
        acquisition may carry an earlier `acquired_at_ms`), so rules that order
        ops by backend time would convict a correct server. Checkers skip those
        rules in such a history and say so; their real-time rules still apply.
        """
        moved = []
        for pos, op in self.nemesis:
            v = op.get("value")
            if not isinstance(v, dict) or v.get("fault") != "clock":
                continue
            targets = set(v.get("targets") or ()) | set(v.get("offsets") or ())
            if v.get("phase") == "start" and "valkey" in targets:
                moved.append(op.get("index", pos))
        return moved

    @cached_property
    def clock_segments(self) -> list[int]:
        """Monotonic times of every nemesis op of the clock fault, sorted: the borders of the stretches of a run
        within which backend times stay comparable (the clock moves only while such an op is under way)."""
        bounds = []
        for _, op in self.nemesis:
            v = op.get("value")
            if "clock" in str(op.get("f")) or (isinstance(v, dict) and v.get("fault") == "clock"):
                bounds.append(op.get("time", 0))
        return sorted(bounds)

    @cached_property
    def valkey_losses(self) -> list[tuple[int, int]]:
        """(began, completed) times of the nemesis ops after which Valkey may have lost or rolled back state: a
        crash, a kill of Valkey, a restore from an older snapshot (the contract's backup / restore row)."""
        out, invoked = [], {}
        for _, op in self.nemesis:
            if op.get("type") != "info" or not isinstance(op.get("time"), int):
                continue
            v = op.get("value")
            if not isinstance(v, dict) or "phase" not in v:  # the invocation (its completion carries the phase)
                invoked[op.get("f")] = op["time"]
                continue
            fault, phase = v.get("fault"), v.get("phase")
            killed = fault == "valkey-crash" and phase == "start"
            killed = killed or (fault == "kill" and phase == "start" and "valkey" in (v.get("targets") or ()))
            # a restore that failed after killing Valkey is still a crash (it restarted from its own files)
            restored = fault == "valkey-restore" and phase == "end" and (v.get("restored") is True
                                                                           or v.get("killed_pid") is not None)
            began = invoked.pop(op.get("f"), op["time"])
            if killed or restored:
                out.append((began, op["time"]))
        return out

    @cached_property
    def strobe_windows(self) -> list[tuple[int, int]]:
        """(start, end) monotonic times during which a strobe kept flipping a clock with no op of its own: from a
        `strobe-clock` start to the next reset (or the history's end). No two backend times inside one are
        comparable."""
        windows, start = [], None
        end_of_history = self.end
        for _, op in self.nemesis:
            if op.get("type") != "info":
                continue
            v = op.get("value") if isinstance(op.get("value"), dict) else {}
            if op.get("f") == "strobe-clock" and v.get("phase") == "start" and start is None:
                start = op.get("time", 0)
            elif op.get("f") == "reset-clock" and start is not None and v:
                windows.append((start, op.get("time", 0)))
                start = None
        if start is not None:
            windows.append((start, end_of_history))
        return windows


def nemesis_windows(history: list[dict]) -> list[dict]:
    """Fault windows marked by the nemesis (`Faults.windows`): [{fault, start, end, start_index, end_index, open}]."""
    return Faults(history).windows


def nemesis_ops(history: list[dict]) -> list[dict]:
    """The nemesis ops that changed something, named by their fault (`Faults.ops`)."""
    return Faults(history).ops


def backend_clock_moves(history: list[dict]) -> list[int]:
    """Indices of nemesis ops that moved the backend's (Valkey's) clock (`Faults.clock_moves`)."""
    return Faults(history).clock_moves


def segment_of(pairs: Iterable[Pair], bounds: list[int]) -> int | None:
    """The stretch between two clock borders (an index) that every one of `pairs` lies in, with no border
    inside any of them; None when they straddle a border, or one never completed."""
    seg = None
    for p in pairs:
        if p.t1 is None:
            return None
        a, b = bisect.bisect_right(bounds, p.t0), bisect.bisect_left(bounds, p.t1)
        if a != b or (seg is not None and seg != a):
            return None
        seg = a
    return seg


def backend_rules_note(moved: list[int]) -> str:
    """The result field that says why backend-time rules were skipped."""
    return (f"skipped: the nemesis moved Valkey's clock (ops {moved[:5]}{' ...' if len(moved) > 5 else ''}), "
            "so backend times are not comparable across the run; real-time rules still apply") if moved else "applied"
