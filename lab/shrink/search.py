"""The run-level shrink search: greedy passes over a configuration, each candidate re-run N times for its rate.

Pure: nothing here runs a test. `search(original, trial, space, ...)` is handed `trial(candidate, rep) -> bool`
(is repetition `rep` of this candidate convicted of the target violation?); `lab.shrink.run` hands it one that
runs `lab.runner.run_test`, the tests hand it a fake. A `Candidate` is the part of a Test the search changes:
clients, keys, servers, seconds, rate, and which of the original run's recorded fault windows are replayed.

1. The original is measured first: N runs, its reproduction rate. The acceptance threshold is the asked one, or
   the original's rate when that is lower (a rate-0 original stops the search: `unreproduced`).
2. Passes in a fixed order (`PASSES`), repeated until a whole round makes no progress: `faults` (no fault at
   all, then ddmin over the kept windows, `lab.ddmin`), `keys` (toward 1), `concurrency` (halving toward 2, and
   the client threads the kept windows name; when it shrinks, `keys` runs again at once, in the same round),
   `time_limit` (halving, not below the end of the last kept window), `servers` (toward 1, where the system
   has them), `rate` (halving), `cut` (each kept window's length halved: its start stays, its end comes
   earlier). After a half that does not reproduce, the midpoint
   between it and the best is tried (bisection, while the gap is over a quarter of the value). Every
   candidate differs from the best so far in one dimension, and is smaller in it.
3. A candidate runs up to N times; it is accepted when convicted / N >= the threshold. Its runs stop early
   once the threshold is out of reach (a rejected candidate's rate is over the runs it made). One that
   passes with the fewest convictions that pass, below the best's rate (a drop to the edge), runs N more
   times and is judged on all 2N, when the budget has room for one more candidate after (`_Search._at_the_edge`).
4. Budget: `max_runs` counts every trial, also those a resumed shrink answers from its log (so the same
   command ends where it ended before); `time_budget_s` the seconds of this call. Out of budget, or Ctrl-C
   (KeyboardInterrupt inside `trial`), the search returns the best accepted so far, saying why it stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from lab.ddmin import ddmin

__all__ = ["BUDGET", "DONE", "HOLDER", "INTERRUPTED", "PASSES", "UNREPRODUCED", "Candidate", "Outcome", "Space", "Step",
           "search"]

DONE, BUDGET, INTERRUPTED, UNREPRODUCED = "done", "budget", "interrupted", "unreproduced"
# a client pause "moved" to HOLDER is replayed armed (`"holding": true`): it stops whichever thread next acts on a
# lease it holds (nemesis.process_faults.ClientPauses.arm), not a thread named in advance
HOLDER = -1
# `cut` last: a window cut near the edge of what reproduces leaves a rate at the threshold, and every later pass
# then fails (measured: counter-from-snapshot with cut second ended at 5 clients, 2 keys, 6.2 s in 45 runs; the
# same budget without it reached 2 clients, 1 key, 1 server, 5 s, 1 op/s)
# `keys` before `concurrency`: one key makes every client contend, so fewer clients still collide (measured:
# stale-cleanup-deletes-successor with clients first rejected 3 clients on 3 keys and ended at 4 on the budget)
# the dimensions a reader counts first (faults, keys, clients) before `time_limit`: each is then judged on runs as
# long as the original's, where the bug has the most chances to show; a shorter run saves seconds, not runs of the
# budget (measured: nonatomic-acquire with the time first went 10 -> 1 s in 20 runs, then 5 -> 2 clients
# reproduced 1/4 and 5 -> 3 0/3 at 1 s, and the budget ended at 4 clients)
PASSES = ("faults", "keys", "concurrency", "time_limit", "servers", "rate", "cut")
_EPS = 1e-9


@dataclass(frozen=True)
class Candidate:
    """The dimensions a shrink changes. `servers` is None for a system without the lab's reference servers;
    `windows` are positions in the original run's recorded fault schedule (in order)."""

    concurrency: int
    keys: int
    servers: int | None
    time_limit: float
    rate: float
    windows: tuple[int, ...] = ()
    cuts: tuple[tuple[int, float], ...] = ()  # (window, its new end_s): a kept window cut short, by position
    threads: tuple[tuple[int, int], ...] = ()  # (window, client thread): a client pause replayed on another thread

    def thread(self, i: int, recorded: int | None = None) -> int | None:
        """The client thread window `i` holds in this candidate: its new one, else `recorded`."""
        return dict(self.threads).get(i, recorded)

    def end(self, i: int, recorded: float = math.inf) -> float:
        """Where window `i` ends in this candidate: its cut, else `recorded` (its recorded end)."""
        return dict(self.cuts).get(i, recorded)

    def label(self) -> str:
        """A stable, path-safe name of this candidate (its runs' test name and its key in the log)."""
        ends = dict(self.cuts)
        if not self.windows:
            wins = "none"
        elif len(self.windows) <= 8:
            moved = dict(self.threads)
            wins = "_".join(f"{i}" + (f"e{ends[i]:g}" if i in ends else "") + _moved_label(moved.get(i))
                            for i in self.windows)
        else:  # a long subset: its count and a digest of its positions (hash() of ints and floats is stable)
            wins = f"{len(self.windows)}x{hash((self.windows, self.cuts, self.threads)) % 10**8:08d}"
        servers = "" if self.servers is None else f"-s{self.servers}"
        return f"c{self.concurrency}-k{self.keys}{servers}-t{self.time_limit:g}-r{self.rate:g}-w{wins}"

    def dims(self) -> dict[str, float]:
        """Each dimension as a number (faults: how many windows), for comparing sizes."""
        out = {"concurrency": self.concurrency, "keys": self.keys, "time_limit": self.time_limit, "rate": self.rate,
               "faults": len(self.windows)}
        if self.servers is not None:
            out["servers"] = self.servers
        return out

    def no_larger_than(self, other: "Candidate") -> bool:
        """Is every dimension at most `other`'s (its windows a subset of other's, none of them longer)?"""
        mine, theirs = self.dims(), other.dims()
        return (all(mine[k] <= theirs[k] + _EPS for k in mine) and set(self.windows) <= set(other.windows)
                and all(self.end(i) <= other.end(i) + _EPS for i in self.windows))

    def smaller_than(self, other: "Candidate") -> bool:
        """No larger in any dimension, and strictly smaller in one."""
        return self.no_larger_than(other) and self != other

    def rank(self) -> tuple[float, ...]:
        """The order a trade is judged by (`_Search.trade`), most telling first: clients, keys, servers, faults,
        seconds, rate. A reader of the minimal case's timeline counts clients and keys first: two clients and
        one pause tell a shorter story than three clients and none."""
        return (self.concurrency, self.keys, self.servers or 0, len(self.windows), self.time_limit, self.rate)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["windows"] = list(self.windows)
        d["cuts"] = [list(c) for c in self.cuts]
        d["threads"] = [list(t) for t in self.threads]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Candidate":
        return cls(**{**d, "windows": tuple(d.get("windows") or ()),
                      "cuts": tuple((int(i), float(e)) for i, e in d.get("cuts") or ()),
                      "threads": tuple((int(i), int(t)) for i, t in d.get("threads") or ())})

    def cut(self, i: int, end_s: float) -> "Candidate":
        """This candidate with window `i` ending at `end_s`."""
        return replace(self, cuts=tuple(sorted({**dict(self.cuts), i: end_s}.items())))

    def moving(self, i: int, thread: int) -> "Candidate":
        """This candidate with window `i` (a client pause) replayed on client `thread`."""
        return replace(self, threads=tuple(sorted({**dict(self.threads), i: thread}.items())))

    def keeping(self, windows: tuple[int, ...]) -> "Candidate":
        """This candidate with only `windows` (their cuts and moved threads kept)."""
        return replace(self, windows=windows, cuts=tuple(c for c in self.cuts if c[0] in windows),
                       threads=tuple(t for t in self.threads if t[0] in windows))


@dataclass(frozen=True)
class Space:
    """What bounds the search: each recorded window's (start_s, end_s) and the floors of the numeric dimensions."""

    spans: tuple[tuple[float, float], ...] = ()
    servers_needed: tuple[int, ...] = ()  # per window: the lease servers it names (`lease-3` needs 3), else 0
    clients_needed: tuple[int, ...] = ()  # per window: the client threads it names (thread 4 needs 5), else 0
    client_threads: tuple[int | None, ...] = ()  # per window: the one thread a client pause holds (it may move)
    min_concurrency: int = 2
    min_keys: int = 1
    min_servers: int = 1
    min_time_limit: float = 1.0
    min_rate: float = 1.0
    min_window_s: float = 0.1  # the shortest a window is cut to

    def time_floor(self, cand: Candidate) -> float:
        """The shortest time limit (0.1 s steps) that replays the candidate's windows whole, each (as cut) ending
        by it. Only `cut` shortens a window: a limit that ended one early would cut it without saying so, the
        clients gone before its end (measured: local-clock's skew window 3-4 s kept, 5 -> 3.2 s accepted at 4/5,
        then 3 -> 1 keys 0/3 there where at 4.1 s it reproduced 4/5). (A replayed schedule may end up to
        `nemesis.fault_schedule.STOP_SLACK_S` past the limit; the search does not use that room.)"""
        need = self.min_time_limit
        for i in cand.windows:
            start, end = self.spans[i]
            need = max(need, start + 0.1, cand.end(i, end))
        return math.ceil(need * 10 - _EPS) / 10

    def movable(self, i: int) -> bool:
        """Can window `i` be replayed on another client thread (a client pause: it names one thread only)?"""
        return i < len(self.client_threads) and self.client_threads[i] is not None

    def clients_floor(self, windows: tuple[int, ...]) -> int:
        """The fewest clients that still replay `windows` (a client-clock window naming client-4 needs five; a
        client pause moves to a thread that exists, `with_clients`)."""
        return max([self.min_concurrency, *(self.clients_needed[i] for i in windows
                                            if i < len(self.clients_needed) and not self.movable(i))])

    def with_clients(self, cand: Candidate, n: int) -> Candidate:
        """`cand` with `n` clients; a kept client pause on a thread that would not exist is armed for the next
        holder instead (HOLDER): what made the original's stale holder is a thread paused with a lease in hand,
        and which thread of a smaller run holds one at that moment is chance (measured on the Redis lock: moved
        to the last thread, 3 -> 2 clients reproduced in 0 of 3 runs, twice)."""
        cand = replace(cand, concurrency=n)
        for i in cand.windows:
            if self.movable(i) and cand.thread(i, self.client_threads[i]) >= n:
                cand = cand.moving(i, HOLDER)
        return cand

    def servers_floor(self, windows: tuple[int, ...]) -> int:
        """The fewest lease servers that still replay `windows` (a window that names `lease-2` needs two)."""
        return max([self.min_servers, *(self.servers_needed[i] for i in windows if i < len(self.servers_needed))])


@dataclass
class Step:
    """One measured candidate: which pass made it, what it changed, its runs and convictions, accepted or not."""

    pass_name: str
    change: str
    candidate: Candidate
    runs: int
    convicted: int
    accepted: bool

    @property
    def rate(self) -> float:
        return self.convicted / self.runs if self.runs else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"pass": self.pass_name, "change": self.change, "candidate": self.candidate.to_json(),
                "label": self.candidate.label(), "runs": self.runs, "convicted": self.convicted,
                "rate": round(self.rate, 4), "accepted": self.accepted}


@dataclass
class Outcome:
    """Where the search ended: the original and its rate, the threshold it used, the best accepted candidate
    and its rate, every step, the trials it made (`runs_used`) and why it stopped."""

    original: Candidate
    original_step: Step | None
    threshold: float
    best: Candidate
    best_step: Step | None
    steps: list[Step] = field(default_factory=list)
    runs_used: int = 0
    stopped: str = DONE

    @property
    def shrunk(self) -> bool:
        return self.best != self.original


class _OutOfBudget(Exception):
    """The search has used its runs or its seconds."""


class _Search:
    """The state of one search (the best so far lives here, so a budget or Ctrl-C keeps it)."""

    def __init__(self, original: Candidate, trial: Callable[[Candidate, int], bool], space: Space, *, runs: int,
                 threshold: float, max_runs: int | None, time_budget_s: float | None,
                 clock: Callable[[], float], feasible: Callable[[Candidate], bool] | None,
                 on_step: Callable[[Step], None] | None) -> None:
        self.trial, self.space, self.runs = trial, space, runs
        self.threshold, self.max_runs, self.time_budget_s = threshold, max_runs, time_budget_s
        self.clock, self.t0 = clock, clock()
        self.feasible = feasible or (lambda c: True)
        self.on_step = on_step or (lambda s: None)
        self.outcome = Outcome(original, None, threshold, original, None)
        self.seen: dict[Candidate, Step] = {}

    @property
    def best(self) -> Candidate:
        return self.outcome.best

    def _run(self, cand: Candidate, rep: int) -> bool:
        if self.max_runs is not None and self.outcome.runs_used >= self.max_runs:
            raise _OutOfBudget
        if self.time_budget_s is not None and self.clock() - self.t0 >= self.time_budget_s:
            raise _OutOfBudget
        self.outcome.runs_used += 1
        return bool(self.trial(cand, rep))

    def measure_original(self) -> Step:
        cand = self.outcome.original
        convicted = sum(self._run(cand, rep) for rep in range(self.runs))
        step = Step("original", "the original configuration", cand, self.runs, convicted, convicted > 0)
        self.outcome.original_step = step
        self.outcome.threshold = min(self.threshold, step.rate)
        if step.accepted:
            self.outcome.best_step = step
        self.seen[cand] = step
        self.on_step(step)
        return step

    def attempt(self, pass_name: str, change: str, cand: Candidate) -> bool:
        """Measure `cand` (one dimension smaller than the best, or a trade: lower in `rank`) and make it the best
        when it reproduces."""
        assert cand.smaller_than(self.best) or (pass_name == "trade" and cand.rank() < self.best.rank()), \
            (cand, self.best)
        if cand in self.seen:
            return False  # measured already, and not accepted then (an accepted one is the best, or larger)
        if not self.feasible(cand):
            return False
        total = self.runs
        need = self._need(total)
        done = convicted = 0
        step = Step(pass_name, change, cand, 0, 0, False)
        try:
            while done < total:
                convicted += self._run(cand, done)
                done += 1
                if convicted + (total - done) < need:
                    break  # out of reach: no need to run the rest
                if done == self.runs == total and self._at_the_edge(convicted):
                    total, need = 2 * self.runs, self._need(2 * self.runs)  # measured again: see _at_the_edge
        finally:  # a budget or Ctrl-C mid-candidate still records the runs it made (not accepted)
            step.runs, step.convicted = done, convicted
            step.accepted = done == total and convicted >= need
            if done:
                self.seen[cand] = step
                self.outcome.steps.append(step)
                self.on_step(step)
        if step.accepted:
            self.outcome.best, self.outcome.best_step = cand, step
        return step.accepted

    def _need(self, runs: int) -> int:
        """The fewest convicted runs of `runs` that meet the threshold."""
        return max(1, math.ceil(self.outcome.threshold * runs - _EPS))

    def _at_the_edge(self, convicted: int) -> bool:
        """Did a candidate pass its N runs with the fewest convictions that pass, below the best's rate? Such a
        candidate is measured N more times and accepted on all 2N: one that passed at exactly the threshold is
        often one whose true rate is below it (its convicted runs were the lucky ones), and every later
        candidate is then judged against a case that barely reproduces (measured: local-clock's ddmin kept
        one window at 3/5 where two had reproduced 5/5, every pass after it failed, and the budget ran out at
        4 clients and 3 keys)."""
        best = self.outcome.best_step
        # with no runs left for a candidate after it, measuring again could only lose the shrink it made
        room = self.max_runs is None or self.max_runs - self.outcome.runs_used >= 2 * self.runs
        return (room and convicted == self._need(self.runs) < self.runs and best is not None
                and convicted / self.runs < best.rate - _EPS)

    # -- the passes ------------------------------------------------------------------------------------------

    def faults(self) -> bool:
        windows = self.best.windows
        if not windows:
            return False
        if self.attempt("faults", f"no fault (was {len(windows)} windows)", self.best.keeping(())):
            return True
        if len(windows) < 2:
            return False
        before = self.best

        def fails(kept: list[int]) -> bool:
            return self.attempt("faults", f"keep windows {kept} of {list(self.best.windows)}",
                                self.best.keeping(tuple(kept)))

        result = ddmin(list(windows), fails, known_failing=True, max_tests=10**6)
        if result.stopped == "interrupted":
            raise KeyboardInterrupt
        return self.best != before

    def halve(self, name: str, floor: float, *, integer: bool,
              get: Callable[[Candidate], float | None] | None = None,
              make: Callable[[Candidate, float], Candidate] | None = None, what: str | None = None) -> bool:
        """Halve one dimension toward `floor` while the halves reproduce; after a half that does not, try the
        midpoint between it and the best (bisection) while the gap is over a quarter of the best's value.
        `get` / `make` read and set the dimension (default: the field `name`)."""
        get = get or (lambda c: getattr(c, name))
        make = make or (lambda c, v: replace(c, **{name: v}))
        progressed = False
        rejected: float | None = None
        while True:
            v = get(self.best)
            if v is None:
                return progressed
            if rejected is None:
                nv: float = max(floor, v // 2) if integer else max(floor, _round2(v / 2))
            else:
                nv = (rejected + v) // 2 if integer else _round2((rejected + v) / 2)
                if nv <= rejected + _EPS or v - rejected <= max(v / 4, 1 if integer else 0.1):
                    return progressed
            if nv >= v - _EPS:
                return progressed
            if self.attempt(name, f"{what or name} {v:g} -> {nv:g}", make(self.best, nv)):
                progressed = True
            else:
                rejected = nv

    def cut_windows(self) -> bool:
        """Halve each kept window's length (its start stays, its end comes earlier) toward `min_window_s`."""
        progressed = False
        for i in self.best.windows:
            start, end = self.space.spans[i]
            progressed = self.halve(
                "cut", self.space.min_window_s, integer=False, what=f"window {i} length",
                get=lambda c, i=i, start=start, end=end: round(c.end(i, end) - start, 6),
                make=lambda c, v, i=i, start=start: c.cut(i, round(start + v, 6))) or progressed
        return progressed

    def trade(self) -> bool:
        """At a fixpoint with clients above their floor: each fault window the search dropped, back, with the
        clients at their floor (a client pause moved to a thread that exists). A fault can stand in for a
        client: a workload's third client can make the stale holder that a pause of the second makes, and the
        passes, dropping faults first, never try that. Accepted on the rank order (`Candidate.rank`)."""
        best, s = self.best, self.space
        dropped = [i for i in range(len(s.spans)) if i not in best.windows]
        dropped.sort(key=lambda i: not s.movable(i))  # client pauses first: they stand in for a client
        for i in dropped:
            windows = tuple(sorted((*best.windows, i)))
            floor = s.clients_floor(windows)
            if floor >= best.concurrency:
                continue
            # at the original's rate and time limit: a pause must meet a held lock (the busier, the likelier) and
            # the run must go on past it (a successor acquires after the TTL, the holder resumes and commits; a
            # limit just long enough to replay the window measured 0/2 on the Redis lock); the passes shrink both
            # again from there
            orig = self.outcome.original
            cand = s.with_clients(replace(best, windows=windows, rate=orig.rate, time_limit=orig.time_limit), floor)
            if not cand.rank() < best.rank():
                continue
            # which thread holds the lock when a pause begins decides whether it makes a stale holder (measured on
            # the Redis lock: thread 1 of 2 was paused waiting in an acquire, while thread 0 held, 0/2 on either
            # thread): first the pause armed for the next holder, then on each thread of the smaller run (the last
            # first)
            threads = [HOLDER, *range(floor - 1, -1, -1)] if s.movable(i) else [None]
            for t in threads:
                change = f"window {i} back, concurrency {best.concurrency} -> {floor}"
                if t == HOLDER:
                    change += " (its client pause armed for the next holder)"
                elif t is not None:
                    change += f" (its client pause on thread {t})"
                if self.attempt("trade", change, cand if t is None else cand.moving(i, t)):
                    return True
        return False

    def pass_(self, name: str) -> bool:
        s = self.space
        if name == "faults":
            return self.faults()
        if name == "cut":
            return self.cut_windows()
        if name == "time_limit":
            return self.halve("time_limit", s.time_floor(self.best), integer=False)
        if name == "concurrency":
            return self.halve("concurrency", s.clients_floor(self.best.windows), integer=True,
                              make=lambda c, v: s.with_clients(c, int(v)))
        if name == "keys":
            return self.halve("keys", s.min_keys, integer=True)
        if name == "servers":
            return self.halve("servers", s.servers_floor(self.best.windows), integer=True)
        if name == "rate":
            return self.halve("rate", s.min_rate, integer=False)
        raise ValueError(f"unknown pass {name!r}")


def _moved_label(thread: int | None) -> str:
    """A moved client pause in a label: `t1` on thread 1, `h` armed for the next holder, nothing if not moved."""
    if thread is None:
        return ""
    return "h" if thread == HOLDER else f"t{thread}"


def _round2(x: float) -> float:
    """`x` to two significant digits (halved seconds and rates stay readable: 2.5, not 2.4999)."""
    if x <= 0:
        return x
    return round(x, 1 - int(math.floor(math.log10(x))))


def search(original: Candidate, trial: Callable[[Candidate, int], bool], space: Space, *, runs: int = 5,
           threshold: float = 0.6, max_runs: int | None = None, time_budget_s: float | None = None,
           clock: Callable[[], float] = time.monotonic, feasible: Callable[[Candidate], bool] | None = None,
           on_step: Callable[[Step], None] | None = None, passes: tuple[str, ...] = PASSES,
           trade: bool = True) -> Outcome:
    """The smallest candidate found that reproduces at the threshold (the module's docstring has the method).

    `feasible(candidate)`, when given, says whether a candidate can be run at all (one that cannot is skipped,
    at no cost); `on_step(step)` is told of every measured candidate, the original first.
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    s = _Search(original, trial, space, runs=runs, threshold=threshold, max_runs=max_runs,
                time_budget_s=time_budget_s, clock=clock, feasible=feasible, on_step=on_step)
    try:
        if not s.measure_original().accepted:
            s.outcome.stopped = UNREPRODUCED
            return s.outcome
        while True:
            progressed = False
            for name in passes:
                moved = s.pass_(name)
                progressed = moved or progressed
                if moved and name == "concurrency" and "keys" in passes:
                    # `keys` again, in the same round: a key count rejected at more clients can reproduce at
                    # fewer, and with fault windows the budget often ends before the next round (measured:
                    # local-clock rejected 3 -> 2 keys at 5 clients, 2/5, accepted 5 -> 2 clients at 5/5, and
                    # its 60 runs ended in the `cut` pass at 2 clients and 3 keys, before `keys` came round)
                    s.pass_("keys")
            if not progressed and not (trade and s.trade()):
                break
    except _OutOfBudget:
        s.outcome.stopped = BUDGET
    except KeyboardInterrupt:
        s.outcome.stopped = INTERRUPTED
    return s.outcome
