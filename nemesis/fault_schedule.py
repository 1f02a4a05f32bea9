"""The fault schedule as data: what a run's nemesis did, written down so that another run can do it again.

Every run writes `fault-schedule.json` into its run directory (docs/history-format.md): one entry per fault
window the nemesis executed, derived after the run from the history alone (`executed`), so it can be derived
again from any stored run (`write_for_run`, which `lab.runner.analyze` calls). `fencelab test --fault-schedule
FILE` replays one (`load`, then `nemesis.schedule.replay_generator`): the same start ops with the recorded values
at the recorded times, the stops at the recorded ends, nothing drawn.

    {"format": 1, "time_origin": "history", "nemeses": ["partition", "kill"],
     "windows": [{"nemesis": "partition", "start_f": "start-partition", "stop_f": "stop-partition",
                  "value": {"grudge": "isolate-server", "target": "lease-1", "direction": "both"},
                  "start_s": 0.712004, "end_s": 1.424311}, ...]}

- `nemeses`: the names the run was given (`--nemesis`, in its order), also those that opened no window: a
  replay builds the same nemeses, so its fault coverage (checkers.faults) says the same.
- a window: the start op's invocation that completed with `"phase": "start"`, closed by the next completion of
  its nemesis's stop `f` with `"phase": "end"`; `start_s` and `end_s` are those two invocations' times in
  seconds since the history's time 0 (the `time` of history.jsonl / 1e9, which the generator's clock shares);
  `value` is what the start did, turned by its nemesis's `replay` (nemesis.registry.NEMESES) into the start
  op's value that does it again. A window the run never closed (an interrupted run) is left out; ops that
  changed nothing (`"phase": "none"`, the final heal) are no window.
- a run without a nemesis writes `{"nemeses": [], "windows": []}`; a scenario run (its faults are its script)
  writes none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.history import read_history
from lab.history.ops import NEMESIS, pair
from lab.paths import write_text_atomic
from nemesis import clock, network, process_faults
from nemesis.registry import NEMESES, validate_names
from nemesis.schedule import Window

__all__ = ["FILE", "FORMAT", "STOP_SLACK_S", "ScheduleError", "executed", "load", "names_of", "to_json",
           "write", "write_for_run"]

FILE = "fault-schedule.json"
FORMAT = 1
# how far past --time-limit a window may end: the history's time 0 is taken before the nemeses are set up
# (the lane's own clock starts after that), and a stop waits for its start to complete, so a run's last
# window may end a little after its time limit (the lane's clock started 0.16 s after the history's on the local
# backend, 0.4 s on compose, measured)
STOP_SLACK_S = 2.0
_TOP_KEYS = ("format", "time_origin", "nemeses", "windows")
_WINDOW_KEYS = ("nemesis", "start_f", "stop_f", "value", "start_s", "end_s")


class ScheduleError(ValueError):
    """A fault schedule file that cannot be replayed; the message is one line naming the file and the entry."""


def executed(history: Sequence[dict], names: Sequence[str]) -> list[Window]:
    """The windows the nemeses `names` executed in `history`, in the order they opened (a name this lab no longer
    knows, from an old run, has none)."""
    names = [n for n in names if n in NEMESES]
    by_start = {f: n for n in names for f in NEMESES[n].starts}
    by_stop = {NEMESES[n].stop: n for n in names}
    opened: dict[str, tuple[int, dict, dict]] = {}  # nemesis name -> its start's (position, invocation, completion)
    out: list[tuple[int, Window]] = []
    for inv, done, pos, _ in pair(history, strict=False, nemesis=True).pairs:
        if inv.get("process") != NEMESIS or done is None or not isinstance(done.get("value"), dict):
            continue
        phase, f = done["value"].get("phase"), inv.get("f")
        if phase == "start" and f in by_start and by_start[f] not in opened:
            opened[by_start[f]] = (pos, inv, done["value"])
        elif phase == "end" and by_stop.get(f) in opened:
            name = by_stop[f]
            at, start, record = opened.pop(name)
            replay = NEMESES[name].replay
            out.append((at, Window(
                nemesis=name, start_f=start["f"], stop_f=f, value=replay(record) if replay else None,
                start_s=round(start["time"] / 1e9, 6), end_s=round(inv["time"] / 1e9, 6))))
    return [w for _, w in sorted(out, key=lambda iw: iw[0])]


def to_json(names: Sequence[str], windows: Sequence[Window]) -> dict[str, Any]:
    """The file's object."""
    return {"format": FORMAT, "time_origin": "history", "nemeses": list(names),
            "windows": [{k: getattr(w, k) for k in _WINDOW_KEYS} for w in windows]}


def write(path: Path, names: Sequence[str], windows: Sequence[Window]) -> Path:
    """Write the schedule to `path` (replaced whole: a reader never sees half of one)."""
    return write_text_atomic(Path(path), json.dumps(to_json(names, windows), indent=2) + "\n")


def write_for_run(run_dir: Path, history: Sequence[dict] | None = None, names: Sequence[str] | None = None
                  ) -> Path:
    """`run_dir/fault-schedule.json` from the run's history (read from history.jsonl unless given) and its
    nemesis names (test.json's unless given)."""
    run_dir = Path(run_dir)
    if names is None:
        names = json.loads((run_dir / "test.json").read_text()).get("nemesis") or []
    if history is None:
        history = read_history(run_dir / "history.jsonl")
    return write(run_dir / FILE, names, executed(history, names))


def names_of(path: Any) -> list[str]:
    """The nemesis names a schedule file was recorded with (ScheduleError: not a schedule)."""
    return _read(path)[0]


def load(path: Any, *, time_limit: float | None = None) -> tuple[list[str], list[Window]]:
    """(nemesis names, windows) of a schedule file, every entry checked: ScheduleError, one line, naming the file
    and the entry. With `time_limit`, a window must start before it and end by it + STOP_SLACK_S."""
    names, windows = _read(path)
    if time_limit is not None:
        for i, w in enumerate(windows):
            if w.start_s >= time_limit or w.end_s > time_limit + STOP_SLACK_S:
                raise ScheduleError(f"--fault-schedule {path}: window {i} ({w.nemesis}, {w.start_s:g}-{w.end_s:g} "
                                    f"s) is past --time-limit {time_limit:g} (a window must start before it and "
                                    f"end by {STOP_SLACK_S:g} s after it)")
    return names, windows


def _read(path: Any) -> tuple[list[str], list[Window]]:
    where = f"--fault-schedule {path}"
    try:
        d = json.loads(Path(path).read_text())
    except OSError as e:
        raise ScheduleError(f"{where}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:
        raise ScheduleError(f"{where}: not JSON ({e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("windows"), list) or not isinstance(d.get("nemeses"), list):
        raise ScheduleError(f"{where}: not a fault schedule (an object with nemeses and windows, as a run's "
                            f"{FILE})")
    unknown = sorted(set(d) - set(_TOP_KEYS))
    if unknown:
        raise ScheduleError(f"{where}: unknown key {unknown[0]!r}; a schedule has {', '.join(_TOP_KEYS)}")
    if d.get("format", FORMAT) != FORMAT or d.get("time_origin", "history") != "history":
        raise ScheduleError(f"{where}: format {d.get('format')!r} with time origin {d.get('time_origin')!r} is not "
                            f"this lab's (format {FORMAT}, time origin history)")
    try:
        names = validate_names(d["nemeses"]) if d["nemeses"] else []
    except ValueError as e:
        raise ScheduleError(f"{where}: {e}") from None
    unplayable = [n for n in names if NEMESES[n].replay is None]
    if unplayable:
        raise ScheduleError(f"{where}: {', '.join(unplayable)} cannot replay a recorded start (its nemesis has no "
                            "replay value); run it with --nemesis instead")
    windows = [_window(where, i, w, names) for i, w in enumerate(d["windows"])]
    last_end: dict[str, float] = {}
    for i, w in sorted(enumerate(windows), key=lambda iw: iw[1].start_s):
        if w.start_s < last_end.get(w.nemesis, -1.0):
            raise ScheduleError(f"{where}: window {i} ({w.nemesis}) starts at {w.start_s:g} s, before its "
                                f"nemesis's previous window ends ({last_end[w.nemesis]:g} s)")
        last_end[w.nemesis] = w.end_s
    return names, windows


def check_start_value(name: str, start_f: str, value: dict[str, Any] | None) -> None:
    """ValueError naming the problem unless `value` is a start value nemesis `name`'s `start_f` can take: its
    keys and the type and range of each, what can be judged before a stack exists (the nemesis checks again at
    the start, with the names only the stack knows: targets, links, threads, grudges that apply)."""
    v = value or {}
    if name in ("partition", "netns"):
        _keys(v, network.PartitionNemesis.choice_keys, start_f)
        if "grudge" in v and v["grudge"] not in network.GRUDGES:
            raise ValueError(f"grudge must be one of {', '.join(network.GRUDGES)}, got {v['grudge']!r}")
        if "sides" in v and not (isinstance(v["sides"], list) and len(v["sides"]) == 2
                                 and all(_names(s) for s in v["sides"])):
            raise ValueError(f"sides must be two lists of endpoints, got {v['sides']!r}")
    elif name in network.TOXIC_PARAMS:
        params = network.TOXIC_PARAMS[name]
        _keys(v, network.ToxicNemesis.choice_keys | set(params), start_f)
        for k in set(v) & set(params):
            network._int_param(k, v[k], params[k])
        if "scope" in v and v["scope"] not in network.SCOPES:
            raise ValueError(f"scope must be one of {', '.join(network.SCOPES)}, got {v['scope']!r}")
    elif start_f in ("bump-clock", "strobe-clock"):
        strobe = start_f == "strobe-clock"
        _keys(v, {"targets", "delta_s"} | ({"period_ms", "duration_s"} if strobe else set()), start_f)
        if "delta_s" in v:
            clock._delta("delta_s", v["delta_s"])
        if "period_ms" in v:
            clock._number("period_ms", v["period_ms"], clock.MIN_STROBE_PERIOD_MS, 3_600_000)
        if "duration_s" in v:
            clock._number("duration_s", v["duration_s"], 0.0, 3600.0, lo_open=True)
    elif name in ("kill", "pause", "leader-pause"):
        keys = (process_faults.KillNemesis if name == "kill" else process_faults.PauseNemesis).value_keys
        _keys(v, keys, start_f)
        if "restart_after_s" in v:
            process_faults._seconds("restart_after_s", v["restart_after_s"], allow_none=True)
    elif name == "client-pause":
        _keys(v, {"thread", "duration_s", "holding", "wait_s"}, start_f)
        if not isinstance(v.get("holding", False), bool):
            raise ValueError(f"holding must be true or false, got {v['holding']!r}")
        if "thread" in v and (isinstance(v["thread"], bool) or not isinstance(v["thread"], int) or v["thread"] < 0):
            raise ValueError(f"thread must be a client thread number (an int >= 0), got {v['thread']!r}")
        for k in ("duration_s", "wait_s"):
            if k in v:
                process_faults._seconds(k, v[k], allow_none=k == "duration_s",
                                        maximum=process_faults.MAX_CLIENT_PAUSE_S)
    elif name == "valkey-crash":
        _keys(v, {"restart_after_s"}, start_f)
        if "restart_after_s" in v:
            process_faults._seconds("restart_after_s", v["restart_after_s"], allow_none=True)
    elif name == "valkey-restore" and v:
        raise ValueError(f"{start_f} takes no value (it snapshots whatever Valkey holds then), got {value!r}")
    if v.get("target") is not None and not isinstance(v["target"], str):
        raise ValueError(f"target must be a name or null, got {v['target']!r}")
    if "targets" in v and not _names(v["targets"]):
        raise ValueError(f"targets must be a non-empty list of names, got {v['targets']!r}")
    if "links" in v and not _names(v["links"]):
        raise ValueError(f"links must be a non-empty list of link names, got {v['links']!r}")
    if "direction" in v and v["direction"] not in network.DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(network.DIRECTIONS)}, got {v['direction']!r}")


def _keys(value: dict[str, Any], known: Any, start_f: str) -> None:
    """ValueError naming the first key of `value` not in `known`."""
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{start_f}: unknown value key {unknown[0]!r}; known: {', '.join(sorted(known))}")


def _names(v: Any) -> bool:
    """Is `v` a non-empty list of strings?"""
    return isinstance(v, list) and bool(v) and all(isinstance(n, str) for n in v)


def _window(where: str, i: int, w: Any, names: list[str]) -> Window:
    """Entry `i` of the windows, checked."""
    at = f"{where}: window {i}"
    if not isinstance(w, dict):
        raise ScheduleError(f"{at} is not an object")
    missing = [k for k in _WINDOW_KEYS if k not in w]
    extra = sorted(set(w) - set(_WINDOW_KEYS))
    if missing or extra:
        what = f"lacks {', '.join(missing)}" if missing else f"has unknown key {extra[0]!r}"
        raise ScheduleError(f"{at} {what}; a window has {', '.join(_WINDOW_KEYS)}")
    name = w["nemesis"]
    if name not in NEMESES:
        raise ScheduleError(f"{at}: unknown nemesis {name!r}; known: {', '.join(NEMESES)}")
    if name not in names:
        raise ScheduleError(f"{at}: nemesis {name} is not one of the schedule's nemeses ({', '.join(names) or 'none'})")
    spec = NEMESES[name]
    if w["start_f"] not in spec.starts or w["stop_f"] != spec.stop:
        raise ScheduleError(f"{at}: {name} opens with {' or '.join(spec.starts)} and closes with {spec.stop}, not "
                            f"{w['start_f']!r} / {w['stop_f']!r}")
    if w["value"] is not None and not isinstance(w["value"], dict):
        raise ScheduleError(f"{at}: value must be an object or null, not {w['value']!r}")
    try:
        check_start_value(name, w["start_f"], w["value"])
    except ValueError as e:
        raise ScheduleError(f"{at} ({name}): {e}") from None
    for k in ("start_s", "end_s"):
        v = w[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ScheduleError(f"{at}: {k} must be a number of seconds >= 0, not {v!r}")
    if w["end_s"] <= w["start_s"]:
        raise ScheduleError(f"{at}: ends at {w['end_s']:g} s, not after it starts ({w['start_s']:g} s)")
    return Window(name, w["start_f"], w["stop_f"], w["value"], float(w["start_s"]), float(w["end_s"]))
