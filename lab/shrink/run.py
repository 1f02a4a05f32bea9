"""`fencelab shrink RUN_DIR`: the search of `lab.shrink.search` driven over real runs (`lab.runner.run_test`).

The target is the original run's first failing checker and its first violation's type (`checkers.shrink.
first_kind`, as `fencelab check --shrink` picks it); a candidate run is convicted when that checker convicts
it of a violation of that type. The original's recorded fault schedule (`fault-schedule.json`) is what the
candidates replay, whole or in part (`--fault-schedule`, nemesis.fault_schedule), so the original configuration
that is measured first is the original Test with its own executed faults replayed, not drawn again.

The out dir (default `RUN_DIR/shrink/`) holds:
    shrink.jsonl   one line per finished candidate run (the first line names the original and the target);
                   the same command again resumes: a run recorded here is never redone
    runs/<label>/<timestamp>/   every candidate run, an ordinary run directory
    schedules/<label>.json      the fault schedule each candidate replays
    shrink.json    the original and its rate, each step, the minimal configuration, its rate and replay command
    shrink.html    the page (lab.shrink.page)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from checkers.shrink import Kind, first_kind, kinds
from lab.exitcodes import EXIT_INTERRUPTED, EXIT_UNKNOWN, EXIT_VALID
from lab.paths import write_text_atomic
from lab.runner import RunError, load_test, run_test, validate
from lab.secrets import redact_tree
from lab.shrink.page import write_page
from lab.shrink.search import (BUDGET, DONE, HOLDER, INTERRUPTED, UNREPRODUCED, Candidate, Outcome, Space, Step,
                               search)
from lab.sut import SutError
from lab.sut.target import Kind as SystemKind, target_of
from lab.testmap import RUN_RECORDS, SUT_OPTS, RunContext, Test
from nemesis import fault_schedule
from nemesis.schedule import Window

__all__ = ["LOG", "RESULT", "STOPPED_WORDS", "Origin", "ShrinkError", "ShrinkReport", "candidate_test", "exit_code",
           "load_origin", "shrink_run"]

LOG, RESULT, FORMAT = "shrink.jsonl", "shrink.json", 1
_SERVER_NAME = re.compile(r"\blease-(\d+)\b")
_CLIENT_NAME = re.compile(r"\bclient-(\d+)\b")  # a client thread as a nemesis names it (client-clock targets)


class ShrinkError(ValueError):
    """A run directory that cannot be shrunk, or options that cannot be used; one line saying why."""


@dataclass(frozen=True)
class Origin:
    """The original run: its directory, Test, target kind, the nemesis names and windows it executed, and
    whether its system has the lab's reference servers (the servers pass applies)."""

    run_dir: Path
    test: Test
    kind: Kind
    names: tuple[str, ...]
    windows: tuple[Window, ...]
    has_servers: bool
    replay: str | None = None

    def candidate(self) -> Candidate:
        t = self.test
        return Candidate(concurrency=t.concurrency, keys=t.keys, servers=t.server_count() if self.has_servers else None,
                         time_limit=float(t.time_limit), rate=float(t.rate), windows=tuple(range(len(self.windows))))

    def space(self) -> Space:
        servers = tuple(max([0, *(int(n) for n in _SERVER_NAME.findall(json.dumps(w.value)))]) for w in self.windows)
        return Space(spans=tuple((w.start_s, w.end_s) for w in self.windows), servers_needed=servers,
                     clients_needed=tuple(_clients_named(w.value) for w in self.windows),
                     client_threads=tuple(_paused_thread(w) for w in self.windows),
                     min_concurrency=min(2, self.test.concurrency))


def _clients_named(value: Any) -> int:
    """How many client threads a window's value needs: a client pause's `thread` t, or a `client-t` target,
    needs t + 1 (0: it names none)."""
    threads = [int(n) for n in _CLIENT_NAME.findall(json.dumps(value))]
    if isinstance(value, dict) and isinstance(value.get("thread"), int) and not isinstance(value["thread"], bool):
        threads.append(value["thread"])
    return max(threads) + 1 if threads else 0


def _paused_thread(w: Window) -> int | None:
    """The thread a client-pause window holds (the one window a shrink may move to another thread), else None."""
    value = w.value
    if w.start_f != "start-client-pause" or not isinstance(value, dict):
        return None
    thread = value.get("thread")
    return thread if isinstance(thread, int) and not isinstance(thread, bool) else None


def _replayed(origin: Origin, cand: Candidate, i: int) -> Window:
    """Window `i` as the candidate replays it: its cut end, and its client pause on the candidate's thread."""
    w = origin.windows[i]
    w = replace(w, end_s=cand.end(i, w.end_s))
    thread = cand.thread(i)
    if thread == HOLDER and isinstance(w.value, dict):  # armed: whichever thread next acts on a held lease
        w = replace(w, value={**{k: v for k, v in w.value.items() if k != "thread"}, "holding": True})
    elif thread is not None and isinstance(w.value, dict):
        w = replace(w, value={**w.value, "thread": thread})
    return w


def load_origin(run_dir: Path) -> Origin:
    """The original run, or ShrinkError (one line) when it is no run, not invalid, or cannot be re-run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ShrinkError(f"{run_dir} is not a directory (give a run directory, STORE/<test>/<timestamp>)")
    missing = [f for f in ("test.json", "results.json") if not (run_dir / f).is_file()]
    if missing:
        raise ShrinkError(f"{run_dir} is not a fencelab run directory: it has no {' or '.join(missing)}")
    try:
        results = json.loads((run_dir / "results.json").read_text())
        test = load_test(run_dir)
    except (OSError, ValueError, RunError) as e:
        raise ShrinkError(f"{run_dir}: cannot read the run: {e}") from None
    if not isinstance(results, dict):
        raise ShrinkError(f"{run_dir}: results.json is not a run's results (an object with its verdict)")
    valid = results.get("valid")
    if valid is True:
        raise ShrinkError(f"{run_dir}: the run was valid; shrink starts from an invalid run")
    if valid is not False:
        why = f" (run failed: {results['run_failed']})" if results.get("run_failed") else ""
        raise ShrinkError(f"{run_dir}: the run's verdict is {json.dumps(valid)}{why}; shrink starts from an invalid "
                          "run")
    kind = first_kind(results)
    if kind is None:
        raise ShrinkError(f"{run_dir}: the run is invalid but no checker names a violation to reproduce")
    if test.scenario:
        raise ShrinkError(f"{run_dir}: a --scenario run scripts its own race and faults; shrink re-runs workload runs "
                          "(shrink its history with `fencelab check FILE --shrink`)")
    names, windows = _schedule_of(run_dir, test)
    try:
        has_servers = target_of(test).kind is SystemKind.REFERENCE and not test.urls
    except SutError as e:
        raise ShrinkError(f"{run_dir}: cannot re-run it: {e}") from None
    try:
        replay = json.loads((run_dir / "test.json").read_text()).get("replay")
    except (OSError, ValueError):
        replay = None
    return Origin(run_dir.resolve(), test, kind, tuple(names), tuple(windows), has_servers, replay)


def _schedule_of(run_dir: Path, test: Test) -> tuple[list[str], list[Window]]:
    """The nemesis names and windows the run executed (its fault-schedule.json); none without a nemesis."""
    if not test.nemesis and not test.fault_schedule:
        return [], []
    path = run_dir / fault_schedule.FILE
    if not path.is_file():
        raise ShrinkError(f"{run_dir}: cannot re-run its faults: it has no {fault_schedule.FILE} (write it with "
                          f"`fencelab analyze {run_dir}`)")
    try:
        return fault_schedule.load(path)
    except fault_schedule.ScheduleError as e:
        raise ShrinkError(f"{run_dir}: cannot replay its faults: {e}") from None


def candidate_test(origin: Origin, cand: Candidate, out: Path) -> Test:
    """The Test of a candidate: the original's options with the candidate's dimensions, a fresh salt and run
    context, and (when it keeps windows) the schedule file of those windows, written under `out/schedules/`."""
    t = origin.test
    extra = {k: v for k, v in t.extra.items() if k not in RUN_RECORDS or k == SUT_OPTS}
    changes: dict[str, Any] = dict(  # a fresh run context: none of the original run's stack, addresses, keys
        run_dir=None, name=cand.label(), concurrency=cand.concurrency, keys=cand.keys, time_limit=cand.time_limit,
        rate=cand.rate, run_salt="", nemesis=[], fault_schedule=None, extra=extra, live=RunContext(),
        sut=t.extra.get("sut_import") or t.sut)
    if origin.has_servers:
        changes["servers"] = cand.servers
    if cand.windows:
        kept = [_replayed(origin, cand, i) for i in cand.windows]
        names = [n for n in origin.names if any(w.nemesis == n for w in kept)]
        path = Path(out) / "schedules" / f"{cand.label()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        fault_schedule.write(path, names, kept)
        changes["fault_schedule"] = str(path.resolve())
    return t.evolve(**changes)


def convicted(results: dict[str, Any], kind: Kind) -> bool:
    """Does this run's result convict it of the target: the same checker, a violation of the same type?"""
    return kind.type in kinds(((results or {}).get("results") or {}).get(kind.checker) or {})


class RunLog:
    """shrink.jsonl: the first line names the original and the target; then one line per finished run, read
    back on resume (a run cut short is not in it, and is run again)."""

    def __init__(self, path: Path, origin: Origin) -> None:
        self.path = path
        self.entries: dict[tuple[str, int], dict[str, Any]] = {}
        head = {"original": str(origin.run_dir), "target": {"checker": origin.kind.checker, "type": origin.kind.type},
                "format": FORMAT}
        if path.exists():
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            if not lines or {k: lines[0].get(k) for k in head} != head:
                raise ShrinkError(f"{path} belongs to another shrink (not of {origin.run_dir} for {origin.kind}): "
                                  "give another --out")
            for e in lines[1:]:
                self.entries[(e["label"], int(e["rep"]))] = e
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append(head)

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(redact_tree(entry), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def get(self, label: str, rep: int) -> dict[str, Any] | None:
        return self.entries.get((label, rep))

    def add(self, entry: dict[str, Any]) -> None:
        self.entries[(entry["label"], int(entry["rep"]))] = entry
        self._append(entry)


@dataclass
class ShrinkReport:
    """What `shrink_run` ended with: the outcome of the search, the data of shrink.json, where it wrote."""

    outcome: Outcome
    data: dict[str, Any]
    out: Path
    new_runs: int = 0
    written: list[Path] = field(default_factory=list)


def shrink_run(run_dir: Path, *, runs: int = 5, threshold: float = 0.6, max_runs: int | None = 60,
               time_budget_s: float | None = None, out: Path | None = None,
               echo: Callable[[str], None] = lambda s: None,
               runner: Callable[[Test, Path], dict[str, Any]] | None = None,
               runs_output: TextIO | None = None) -> ShrinkReport:
    """Shrink the run at `run_dir` (module docstring); `runner` runs one Test into a store (default
    `lab.runner.run_test`; the tests' fake); `runs_output`: where the runs' own progress lines go (default:
    stdout; `--json` sends them to stderr, so stdout is the JSON alone)."""
    with contextlib.redirect_stdout(runs_output or sys.stdout):
        return _shrink(run_dir, runs=runs, threshold=threshold, max_runs=max_runs, time_budget_s=time_budget_s,
                       out=out, echo=echo, runner=runner or run_test)


def _shrink(run_dir: Path, *, runs: int, threshold: float, max_runs: int | None, time_budget_s: float | None,
            out: Path | None, echo: Callable[[str], None],
            runner: Callable[[Test, Path], dict[str, Any]]) -> ShrinkReport:
    origin = load_origin(run_dir)
    out = Path(out) if out is not None else origin.run_dir / "shrink"
    try:
        validate(candidate_test(origin, origin.candidate(), out))
    except RunError as e:
        raise ShrinkError(f"{origin.run_dir}: cannot re-run it: {e}") from None
    log = RunLog(out / LOG, origin)
    store = out / "runs"
    new_runs = 0
    feasible_cache: dict[Candidate, bool] = {}
    t0 = time.monotonic()

    def feasible(cand: Candidate) -> bool:
        if cand not in feasible_cache:
            try:
                validate(candidate_test(origin, cand, out))
                feasible_cache[cand] = True
            except RunError as e:
                echo(f"  skipped {cand.label()}: {e}")
                feasible_cache[cand] = False
        return feasible_cache[cand]

    def trial(cand: Candidate, rep: int) -> bool:
        nonlocal new_runs
        label = cand.label()
        done = log.get(label, rep)
        if done is not None:
            return bool(done["convicted"])
        test = candidate_test(origin, cand, out)
        started = time.monotonic()
        error = None
        try:
            results = runner(test, store)
        except RunError as e:  # this candidate cannot run here: it reproduces nothing
            results, error = {}, str(e)
        new_runs += 1
        hit = convicted(results, origin.kind)
        run = test.run_dir
        log.add({"label": label, "rep": rep, "candidate": cand.to_json(), "convicted": hit,
                 "valid": results.get("valid"), "run_dir": os.path.relpath(run, out) if run else None,
                 "error": error, "elapsed_s": round(time.monotonic() - started, 2)})
        echo(f"    run {rep + 1} of {label}: {'convicted' if hit else 'not convicted'}"
             + (f" ({error})" if error else ""))
        return hit

    def on_step(step: Step) -> None:
        verdict = "accepted" if step.accepted else "rejected"
        if step.pass_name == "original":
            verdict = "measured"
        echo(f"  [{step.pass_name}] {step.change}: {step.convicted}/{step.runs} convicted "
             f"(rate {step.rate:.2f}) {verdict}")

    options = {"runs": runs, "threshold": threshold, "max_runs": max_runs, "time_budget_s": time_budget_s}
    outcome = search(origin.candidate(), trial, origin.space(), runs=runs, threshold=threshold, max_runs=max_runs,
                     time_budget_s=time_budget_s, feasible=feasible, on_step=on_step)
    data = write_result(out, origin, log, outcome, options, time.monotonic() - t0)
    written = [out / RESULT, write_page(out, data)]
    return ShrinkReport(outcome, data, out, new_runs, written)


def _runs_of(log: RunLog, out: Path, cand: Candidate, n: int) -> list[dict[str, Any]]:
    """The recorded runs of a candidate (rep 0..n-1 that finished): run dir (relative to out) and verdict."""
    label = cand.label()
    return [{"rep": rep, "run_dir": e.get("run_dir"), "convicted": e.get("convicted"), "valid": e.get("valid")}
            for rep in range(n) if (e := log.get(label, rep)) is not None]


def _config(origin: Origin, cand: Candidate) -> dict[str, Any]:
    """A candidate as shrink.json shows it: its dimensions, its faults (nemesis, times) and its label."""
    faults = [{"window": i, "nemesis": w.nemesis, "start_s": w.start_s, "end_s": w.end_s,
               "recorded_end_s": origin.windows[i].end_s, "value": w.value}
              for i in cand.windows for w in [_replayed(origin, cand, i)]]
    return {**cand.to_json(), "label": cand.label(), "faults": faults}


def _replay(out: Path, run: dict[str, Any] | None) -> str | None:
    """The replay command a candidate run recorded in its test.json (`fencelab test ... --fault-schedule ...`)."""
    if not run or not run.get("run_dir"):
        return None
    try:
        return json.loads((out / run["run_dir"] / "test.json").read_text()).get("replay")
    except (OSError, ValueError):
        return None


def write_result(out: Path, origin: Origin, log: RunLog, outcome: Outcome, options: dict[str, Any],
                 elapsed_s: float) -> dict[str, Any]:
    """shrink.json (replaced whole): the original, each step, the minimal configuration; returns its data."""
    n = options["runs"]
    orig_step = outcome.original_step
    best_step = outcome.best_step
    best_runs = _runs_of(log, out, outcome.best, n)
    shown = next((r for r in best_runs if r["convicted"]), None)
    changed = [k for k, v in outcome.best.dims().items() if v < outcome.original.dims()[k]]
    if outcome.best.cuts:
        changed.append("fault windows cut")
    data = {
        "format": FORMAT,
        "run_dir": str(origin.run_dir),
        "target": {"checker": origin.kind.checker, "type": origin.kind.type},
        "options": options,
        "system": {"workload": origin.test.workload, "sut": origin.test.sut_name(), "mutant": origin.test.mutant,
                   "backend": origin.test.backend, "seed": origin.test.seed, "ttl_ms": origin.test.ttl_ms},
        "original": {"config": _config(origin, outcome.original), "replay": origin.replay,
                     "runs": orig_step.runs if orig_step else 0, "convicted": orig_step.convicted if orig_step else 0,
                     "rate": round(orig_step.rate, 4) if orig_step else None,
                     "run_dirs": _runs_of(log, out, outcome.original, n)},
        "threshold": round(outcome.threshold, 4),
        "steps": [s.to_json() | {"run_dirs": _runs_of(log, out, s.candidate, s.runs)} for s in outcome.steps],
        "minimal": {"config": _config(origin, outcome.best), "changed": changed, "shrunk": outcome.shrunk,
                    "runs": best_step.runs if best_step else 0, "convicted": best_step.convicted if best_step else 0,
                    "rate": round(best_step.rate, 4) if best_step else None, "run_dirs": best_runs,
                    "run_dir": shown["run_dir"] if shown else None,
                    "report": f"{shown['run_dir']}/report.html" if shown else None,
                    "replay": _replay(out, shown)},
        "stopped": outcome.stopped,
        "runs_used": outcome.runs_used,
        "elapsed_s": round(elapsed_s, 1),
    }
    write_text_atomic(out / RESULT, json.dumps(redact_tree(data), indent=2, default=str) + "\n")
    return data


STOPPED_WORDS = {DONE: "done: no pass made progress", BUDGET: "the budget ran out (not minimal)",
                 INTERRUPTED: "interrupted (not minimal): the best so far is kept",
                 UNREPRODUCED: "the original configuration did not reproduce in its runs: nothing to shrink"}


def exit_code(outcome: Outcome) -> int:
    """`fencelab shrink`'s exit code: 0 a result (minimal, or the best within the budget), 3 the original did not
    reproduce (unknown), 130 interrupted (the best so far was written)."""
    return {INTERRUPTED: EXIT_INTERRUPTED, UNREPRODUCED: EXIT_UNKNOWN}.get(outcome.stopped, EXIT_VALID)
