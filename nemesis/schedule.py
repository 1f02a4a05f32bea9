"""The nemesis lane: when each fault starts and stops, as a pure generator (lab.generator).

A `Fault` names the `f`s that open its window (one is drawn per window, e.g.
`bump-clock` or `strobe-clock`) and the `f` that closes it (`reset-clock`).
The lane, for `duration_s` seconds from its first op:

    quiet interval_s -> start of fault A -> hold hold_s -> stop of A -> quiet interval_s -> start of B -> ...

Faults come in seeded shuffled rounds (every fault once per round, in a
random order), so a short run still exercises each one. Start ops carry
`value: null`: each nemesis draws its own targets and parameters from its own
seeded rng, and its completion records exactly what it did. After the lane,
a final stop op for EVERY fault runs (even after a start that was cut off), so
the history shows every window closed and nothing is left injected.

Every window lasts its full `hold_s`: a window that could not last that long
before `duration_s` is not started (the lane ends earlier instead), so the
last window of a run is never healed a few ms after it began.

A short run still gets a window of every fault: when one round (every fault
once: `quiet + hold` each) and one more quiet interval do not fit in
`duration_s`, the interval and the hold are scaled down by one factor so that
they fit exactly (`fit`; the last quiet interval is slack for late ops). With
the hold equal to the interval (the default) that is

    effective interval = min(asked interval, duration_s / (2 x number of faults + 1))

e.g. `--time-limit 5 --nemesis partition,clock,kill` (asked 5 s) gets windows of
0.71 s: quiet, partition, quiet, clock, quiet, kill, quiet. A run where the
round fits (a 60 s run of three faults at 5 s) keeps its schedule as asked.

The ops are scheduled by time (the op's `time`), not by `sleep` ops, so the
lane ends by `duration_s` after it started; its first op is a `log`
marker that pins that start. Use it as the nemesis half of the main phase,
next to (not inside) the clients' `time_limit`:

    nem = nemesis_generator(faults, interval_s=5, duration_s=test.time_limit, seed=test.seed)
    gen.phases(gen.any_of(gen.time_limit(test.time_limit, gen.clients(workload)), nem), final_phase)

Wrapping the lane in another `time_limit` could cut off the final stops.

A replayed schedule (`fencelab test --fault-schedule FILE`, nemesis.fault_schedule) takes the lane's place:
`replay_generator(windows, faults)` emits each recorded `Window`'s start op with its recorded value at its
recorded start and its stop at its recorded end, nothing drawn, then the same final heal. Its times are the
history's (ns since its time 0), which the interpreter's context shares, so no marker is needed to place them.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lab.generator as gen
from lab.generator.core import Generator, secs_to_nanos

__all__ = ["Fault", "MIN_WINDOW_S", "Window", "final_heal", "fit", "lane", "lane_timing", "nemesis_generator", "plan",
           "replay_generator", "replay_steps", "timing_problem"]

# The shortest window a scaled schedule may give a fault: below it a fault op (a Toxiproxy call, a restart) takes
# about as long as the window itself, so a run too short for one window per fault of this length is refused.
MIN_WINDOW_S = 0.1


@dataclass(frozen=True)
class Fault:
    """One fault family as the schedule sees it: the `f`s that open its window and the one that closes it."""

    name: str
    starts: tuple[str, ...]
    stop: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Fault.name must be a non-empty string, got {self.name!r}")
        if isinstance(self.starts, str) or not self.starts or not all(isinstance(f, str) and f for f in self.starts):
            raise ValueError(f"Fault {self.name}: starts must be a non-empty tuple of f names, got {self.starts!r}")
        if not isinstance(self.stop, str) or not self.stop:
            raise ValueError(f"Fault {self.name}: stop must be an f name, got {self.stop!r}")


def _seconds(param: str, value: Any) -> float:
    """A finite number of seconds > 0, or ValueError naming `param`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{param} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _faults(faults: Any) -> tuple[Fault, ...]:
    """A non-empty tuple of Faults with distinct names, or ValueError."""
    if isinstance(faults, Fault):
        faults = (faults,)
    if not isinstance(faults, Sequence) or not faults or not all(isinstance(f, Fault) for f in faults):
        raise ValueError(f"faults must be a non-empty list of nemesis.schedule.Fault, got {faults!r}")
    names = [f.name for f in faults]
    if len(set(names)) != len(names):
        raise ValueError(f"faults must have distinct names, got {names}")
    return tuple(faults)


def _fit_ns(n: int, interval: int, hold: int, end: int) -> tuple[int, int]:
    """(interval, hold) in ns: as given when one round of `n` windows and a last quiet interval fit in `end`, else
    both scaled by one factor (floored, so they still fit). The last quiet interval is the slack a late op (a
    slow restart) may use without dropping the round's last window."""
    cycle = n * (interval + hold) + interval
    if cycle <= end:
        return interval, hold
    return interval * end // cycle, hold * end // cycle


def fit(n_faults: int, *, interval_s: float, hold_s: float | None = None,
        duration_s: float) -> tuple[float, float]:
    """The (interval, hold) in seconds the lane uses for `n_faults` faults in `duration_s` (see the module doc)."""
    if isinstance(n_faults, bool) or not isinstance(n_faults, int) or n_faults < 1:
        raise ValueError(f"n_faults must be an int >= 1, got {n_faults!r}")
    interval = secs_to_nanos(_seconds("interval_s", interval_s))
    hold = secs_to_nanos(_seconds("hold_s", hold_s if hold_s is not None else interval_s))
    i, h = _fit_ns(n_faults, interval, hold, secs_to_nanos(_seconds("duration_s", duration_s)))
    return i / 1e9, h / 1e9


def lane_timing(n_faults: int, *, interval_s: float, time_limit: float) -> dict[str, Any]:
    """What the lane of `n_faults` faults uses in a run of `time_limit` s (`fit`, the hold equal to the interval):
    the interval it was asked for and the one it gets (scaled down when a window of each does not fit)."""
    interval, hold = fit(n_faults, interval_s=interval_s, duration_s=time_limit)
    return {"faults": n_faults, "asked_interval_s": float(interval_s), "interval_s": round(interval, 6),
            "hold_s": round(hold, 6), "scaled": interval < float(interval_s)}


def timing_problem(n_faults: int, *, interval_s: float, time_limit: float) -> str | None:
    """Why `n_faults` faults cannot each get a window in `time_limit` (None: they can, scaled or not).

    The interval is scaled down to fit rather than refused (the default 5 s and a value given on purpose are the
    same field, and a campaign sweeping time limits must not lose its short cells); only a run too short for a
    window of `MIN_WINDOW_S` per fault (a quiet interval and a window each, and a last quiet interval) is refused.
    """
    for option, value in (("--time-limit", time_limit), ("--nemesis-interval", interval_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            return f"{option} must be a finite number of seconds > 0, not {value}"
    timing = lane_timing(n_faults, interval_s=interval_s, time_limit=time_limit)
    if timing["interval_s"] >= min(MIN_WINDOW_S, float(interval_s)):
        return None
    n = n_faults
    return (f"--time-limit {time_limit:g} is too short for {n} nemes{'es' if n > 1 else 'is'}: each needs a quiet "
            f"interval and a window of at least {MIN_WINDOW_S:g} s, and one more quiet interval ends the round "
            f"({(2 * n + 1) * MIN_WINDOW_S:g} s in all); give a longer --time-limit or fewer nemeses")


def plan(faults: Sequence[Fault], *, interval_s: float, hold_s: float | None = None, duration_s: float,
         seed: int) -> tuple[tuple[int, str], ...]:
    """The lane's ops as (ns after the lane's start, f): full windows only, every one over by `duration_s`."""
    faults = _faults(faults)
    interval = secs_to_nanos(_seconds("interval_s", interval_s))
    hold = secs_to_nanos(_seconds("hold_s", hold_s if hold_s is not None else interval_s))
    end = secs_to_nanos(_seconds("duration_s", duration_s))
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    interval, hold = _fit_ns(len(faults), interval, hold, end)
    if interval <= 0 or hold <= 0:  # a duration of a few ns: nothing fits
        return ()
    rng = random.Random(seed)
    steps: list[tuple[int, str]] = []
    t, deck = 0, []
    while True:
        if not deck:
            deck = list(faults)
            rng.shuffle(deck)
        fault = deck.pop()
        t += interval
        if t + hold > end:  # the window could not last its hold before the time limit: not started
            break
        steps.append((t, rng.choice(fault.starts)))
        t += hold
        steps.append((t, fault.stop))
    return tuple(steps)


class _Lane(Generator):
    """The planned ops at their times, measured from the lane's first op (a log marker).

    Nemesis ops run one at a time, so one that overruns (a restart after a kill) makes the next ones late; a late
    start still gets its whole hold (its stop is moved after it), and a start that could no longer last its hold
    before `end` is not made: the lane ends there (the final heal follows), and the run says which fault
    never fired (checkers.faults).
    """

    __slots__ = ("steps", "i", "start", "end", "opened")

    def __init__(self, steps: tuple[tuple[int, str], ...], i: int, start: int | None, end: int,
                 opened: int | None = None) -> None:
        self.steps, self.i, self.start, self.end, self.opened = steps, i, start, end, opened

    def op(self, test, ctx):
        if self.start is None:  # the marker's time becomes the lane's start once it is dispatched
            o = gen.op(gen.log(f"nemesis lane: {len(self.steps)} ops planned"), test, ctx)
            if o is None or o is gen.PENDING:
                return o
            return o[0], _Lane(self.steps, 0, o[0]["time"], self.end)
        if self.i >= len(self.steps):
            return None
        offset, f = self.steps[self.i]
        r = gen.op({"f": f, "value": None}, test, ctx)
        if r is None or r is gen.PENDING:
            return r
        t = max(r[0]["time"], self.start + offset)
        if self.i % 2 == 0:  # a start (plan: start, stop, start, ...): its window must fit before the end
            if t + self.steps[self.i + 1][0] - offset > self.start + self.end:
                return None
            return {**r[0], "time": t}, _Lane(self.steps, self.i + 1, self.start, self.end, t)
        t = max(t, self.opened + offset - self.steps[self.i - 1][0])  # a late start's stop: its whole hold later
        return {**r[0], "time": t}, _Lane(self.steps, self.i + 1, self.start, self.end)


def lane(faults: Sequence[Fault], *, interval_s: float, hold_s: float | None = None, duration_s: float,
         seed: int) -> Generator:
    """The timed start/stop ops of `plan(...)` (no final heal; see `nemesis_generator`)."""
    steps = plan(faults, interval_s=interval_s, hold_s=hold_s, duration_s=duration_s, seed=seed)
    return _Lane(steps, 0, None, secs_to_nanos(duration_s))


def final_heal(faults: Sequence[Fault]) -> list[dict]:
    """One stop op per fault, in order: every window closed, whatever the lane did."""
    return [{"f": f.stop, "value": None} for f in _faults(faults)]


def nemesis_generator(faults: Sequence[Fault], *, interval_s: float, hold_s: float | None = None,
                      duration_s: float, seed: int) -> Any:
    """The whole nemesis lane for the nemesis thread: the timed faults, then the final heal."""
    faults = _faults(faults)
    return gen.nemesis(gen.concat(lane(faults, interval_s=interval_s, hold_s=hold_s, duration_s=duration_s,
                                       seed=seed), final_heal(faults)))


# -- a replayed schedule ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One fault window of a schedule: nemesis `nemesis` (as given to --nemesis) opened by `start_f` with
    `value` (what the start did, as a value that does it again: JSON, or None) at `start_s` and closed by
    `stop_f` at `end_s`, both in seconds since the history's time 0."""

    nemesis: str
    start_f: str
    stop_f: str
    value: Any
    start_s: float
    end_s: float


def replay_steps(windows: Sequence[Window]) -> tuple[tuple[int, str, Any], ...]:
    """The ops of `windows` as (ns since the history's time 0, f, value), in time order (at one time a stop
    before a start, so back-to-back windows of one fault never overlap)."""
    events = []
    for i, w in enumerate(windows):
        events.append((secs_to_nanos(w.start_s), 1, i, w.start_f, w.value))
        events.append((secs_to_nanos(w.end_s), 0, i, w.stop_f, None))
    return tuple((t, f, value) for t, _, _, f, value in sorted(events, key=lambda e: e[:3]))


class _Replay(Generator):
    """The recorded ops at their recorded times; one that comes late (the op before it overran) is made at once."""

    __slots__ = ("steps", "i")

    def __init__(self, steps: tuple[tuple[int, str, Any], ...], i: int) -> None:
        self.steps, self.i = steps, i

    def op(self, test, ctx):
        if self.i < 0:
            o = gen.op(gen.log(f"nemesis lane: replaying {len(self.steps) // 2} recorded windows"), test, ctx)
            return o if o is None or o is gen.PENDING else (o[0], _Replay(self.steps, 0))
        if self.i >= len(self.steps):
            return None
        at, f, value = self.steps[self.i]
        r = gen.op({"f": f, "value": copy.deepcopy(value)}, test, ctx)  # a copy: a nemesis may keep what it gets
        if r is None or r is gen.PENDING:
            return r
        return {**r[0], "time": max(r[0]["time"], at)}, _Replay(self.steps, self.i + 1)


def replay_generator(windows: Sequence[Window], faults: Sequence[Fault]) -> Any:
    """The nemesis lane of a replayed schedule: `windows` as recorded, then the final heal of `faults`."""
    return gen.nemesis(gen.concat(_Replay(replay_steps(windows), -1), final_heal(faults)))
