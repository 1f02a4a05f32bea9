"""Running a campaign: every pending run of the plan, one after the other, resumable at any point.

Before each run its entry is marked `running` (with the time it started) and
campaign.json is rewritten; after it, the verdict (or the error) is recorded
and the file rewritten again, then campaign.html. So a campaign killed at any
moment (Ctrl-C, SIGTERM, SIGKILL) loses nothing it finished, and the next
`fencelab campaign` settles the interrupted run (`state.settle`) and goes on.
A run that raises (the stack does not start, ...) is recorded `failed` with
its error and the campaign goes on; a resume retries it.

Progress is a rich progress bar on a terminal, plain lines otherwise (and
whenever `CI=true`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lab import runner
from lab.campaign.page import PageData, write_page
from lab.campaign.spec import CampaignError, PlannedRun, Spec, validate_plan
from lab.campaign.state import (STATE_FILE, CampaignLock, campaign_dir, counts, find_run_dir, iso_now, load_state,
                                merge_plan, new_state, record_results, save_state, settle, stamp_now)
from lab.exitcodes import sigterm_interrupts
from lab.stack.process import die_with_parent
from lab.testmap import Test

__all__ = ["CampaignOutcome", "check_store_dir", "exit_code", "format_plan", "run_campaign"]

EXIT_INTERRUPTED = 130  # the shell's convention for a SIGINT
# judge a cell while the next one's stack starts, and write its report in a worker at the lowest CPU priority
# (False: one cell wholly after the other, report included, as `fencelab test` does; bench/campaign_overhead.py
# measures both)
PIPELINE = True


@dataclass
class CampaignOutcome:
    """What `run_campaign` leaves: the state file, the page, the exit code and the counts."""

    name: str
    state_path: Path
    page: Path
    exit_code: int
    counts: dict[str, int]
    interrupted: bool = False


def exit_code(runs: list[dict[str, Any]]) -> int:
    """0 every run valid, 1 any invalid, 3 any unknown, failed or unfinished run."""
    if any(e["status"] == "done" and e["verdict"] is False for e in runs):
        return 1
    if all(e["status"] == "done" and e["verdict"] is True for e in runs):
        return 0
    return 3


def format_plan(spec: Spec, plan: list[PlannedRun]) -> list[str]:
    """The lines `--dry-run` prints: one per run with the options that differ from a default Test."""
    default = Test().to_json()
    lines = [f"campaign {spec.name}: {len(plan)} runs ({spec.source})"]
    for r in plan:
        opts = r.test_options()
        shown = {k: v for k, v in opts.items() if k not in ("name", "workload", "seed", "nemesis")
                 and v != default.get(k)}
        lines.append(f"  {r.test_name}  " + " ".join(f"{k}={v}" for k, v in shown.items()))
    return lines


def _fancy() -> bool:
    """A rich progress bar only on a terminal, and never under CI."""
    return Console().is_terminal and os.environ.get("CI", "").lower() not in ("true", "1", "yes")


class _Progress:
    """A rich progress bar, or plain lines."""

    def __init__(self, name: str, total: int, done: int, echo: Callable[[str], Any], fancy: bool):
        self.name, self.total, self.k, self.echo, self.fancy = name, total, done, echo, fancy
        self.started = done  # a cell starts before the previous one is finished (judged while its stack starts)
        self.bar = self.task = None

    def __enter__(self) -> "_Progress":
        if self.fancy:
            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn())
            self.bar.start()
            self.task = self.bar.add_task(self.name, total=self.total, completed=self.k)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()

    def start(self, entry: dict[str, Any]) -> None:
        """A run begins."""
        self.started += 1
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.name}: {entry['id']}")
        else:
            self.echo(f"[{self.started}/{self.total}] {entry['id']} ...")

    def finish(self, entry: dict[str, Any]) -> None:
        """A run ended (done or failed)."""
        self.k += 1
        line = f"[{self.k}/{self.total}] {describe(entry)}"
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False)
            self.bar.update(self.task, completed=self.k)
        else:
            self.echo(line)


def describe(entry: dict[str, Any]) -> str:
    """One line for a finished entry (and the Dask worker that ran it)."""
    where = f" on {entry['worker']}" if entry.get("worker") else ""
    if entry["status"] == "failed":
        return f"{entry['id']}: FAILED{where} ({entry['error']})"
    return (f"{entry['id']}: valid={json.dumps(entry['verdict'])} ops={entry['ops']} "
            f"{entry['elapsed_s'] or 0:.1f}s {entry['run_dir']}{where}")


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:500]


def _report_worker_init() -> None:
    """The report worker: the lowest CPU priority (it takes only what the next cell's run leaves idle); a Ctrl-C
    is the campaign's to handle (it lets the report being written finish, and drops the rest); it dies with the
    campaign, also a SIGKILLed one (as a run's stack does)."""
    die_with_parent()
    os.nice(19)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _render_report(run_dir: str) -> str | None:
    """Write the run's report.html (in the report worker, or in the campaign when not pipelined); the error in
    one line, or None."""
    try:
        from lab.report import write_report  # pandas and the plots: imported by the campaign before the fork

        write_report(run_dir)
    except Exception as e:  # noqa: BLE001 - the report is a convenience: the page links results.json instead
        return _one_line(e)
    return None


class _Reports:
    """report.html of every judged cell, written by one worker process at the lowest CPU priority while the next
    cells run: the verdict (results.json) is written before the next cell starts, the report (matplotlib: about a
    second of CPU a run, a campaign cell's largest cost after its run) only takes idle CPU. `close` waits for them all."""

    def __init__(self) -> None:
        self.pool: ProcessPoolExecutor | None = None
        self.pending: list[tuple[dict[str, Any], Any]] = []

    def submit(self, entry: dict[str, Any], run_dir: Path) -> None:
        """Queue the report of a judged run."""
        if (run_dir / "report.html").exists():
            return
        if self.pool is None:
            # forked (the report's imports are paid once, by the campaign) at a moment no judging thread runs: the
            # first report is handed over between a cell's judging and the next cell's workload
            import lab.report  # noqa: F401 - pandas and matplotlib (~0.5 s): for the worker, before the fork

            self.pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_report_worker_init)
        self.pending.append((entry, self.pool.submit(_render_report, str(run_dir))))

    def collect(self, wait: bool = False) -> bool:
        """Note the reports that failed (on their entries); True when any finished since the last call."""
        finished = [(e, f) for e, f in self.pending if wait or f.done()]
        for entry, future in finished:
            try:
                error = future.result()
            except Exception as e:  # noqa: BLE001 - a worker that died: no report, the run's verdict stands
                error = _one_line(e)
            if error:
                entry["note"] = f"no report.html ({error})"
        self.pending = [(e, f) for e, f in self.pending if all(f is not g for _, g in finished)]
        return bool(finished)

    def close(self, wait: bool = True) -> None:
        """Wait for every queued report (`wait=False`: drop those not started; an interrupted campaign), then
        stop the worker."""
        if self.pool is None:
            return
        if wait:
            self.collect(wait=True)
        self.pool.shutdown(wait=True, cancel_futures=not wait)
        self.pool = None


def _write_report(entry: dict[str, Any], run_dir: Path) -> None:
    """report.html for the run if `fencelab test` did not write one; a report that fails is only noted."""
    if (run_dir / "report.html").exists():
        return
    error = _render_report(str(run_dir))  # the same writing as the report worker's, in this process
    if error:
        entry["note"] = f"no report.html ({error})"


class _Judging(threading.Thread):
    """A finished workload's judging (`runner.run_unjudged`'s judge: stack down, checkers, report), in a thread."""

    def __init__(self, judge: Callable[[], dict[str, Any]]):
        super().__init__(name="fencelab-judging", daemon=True)
        self.judge, self.results, self.error = judge, None, None

    def run(self) -> None:
        try:
            self.results = self.judge()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which records it as the run's error
            self.error = e


class _CampaignFault(Exception):
    """An error of the campaign itself raised in a run's `before_workload` (the run stops, the error goes on)."""


class PendingRun:
    """A cell whose workload ran and whose judging goes on in a thread; `finish()` waits and records it."""

    def __init__(self, entry: dict[str, Any], test: Test, store_dir: Path, t0: float, save: Callable[[], None],
                 judging: _Judging | None, phases: dict[str, float], reports: _Reports | None = None):
        self.entry, self.test, self.store_dir, self.t0, self.save = entry, test, store_dir, t0, save
        self.judging, self.phases, self.reports = judging, phases, reports
        self.done = judging is None

    def finish(self) -> dict[str, Any]:
        """Wait for the judging (a KeyboardInterrupt meanwhile waits on: the stack must come down) and record the
        verdict, or the error, in the entry; saves. Idempotent."""
        if self.done:
            return self.entry
        interrupted = False
        while self.judging.is_alive():
            try:
                self.judging.join()
            except KeyboardInterrupt:  # the thread stops the stack and writes results.json: let it end first
                interrupted = True
        self.done = True
        if self.judging.error is not None:
            if isinstance(self.judging.error, KeyboardInterrupt):
                raise self.judging.error
            self.entry.update(status="failed", run_dir=_where(self.entry, self.test, self.store_dir),
                              error=_one_line(self.judging.error))
        else:
            record_results(self.entry, self.judging.results)
            self.entry["run_dir"] = _where(self.entry, self.test, self.store_dir)
            if self.reports is not None:
                self.reports.submit(self.entry, self.test.run_dir)
            else:
                _write_report(self.entry, self.test.run_dir)
        self.entry.update(elapsed_s=round(time.monotonic() - self.t0, 3), finished=iso_now(),
                          phases={k: round(v, 3) for k, v in self.phases.items()})
        self.save()
        if interrupted:
            raise KeyboardInterrupt
        return self.entry


def _where(entry: dict[str, Any], test: Test, store_dir: Path) -> str | None:
    """The run's directory relative to the store (the test's, else the newest since the entry started)."""
    found = test.run_dir or find_run_dir(store_dir, test.name, entry["started"])
    return os.path.relpath(found, store_dir) if found else None


def start_run(entry: dict[str, Any], run: PlannedRun, store_dir: Path, save: Callable[[], None], *,
              before_workload: Callable[[], Any] | None = None, reports: _Reports | None = None) -> PendingRun:
    """Run one planned test's workload, recording it in `entry` before and after; its judging goes on in a thread
    (`PendingRun.finish` waits for it). `before_workload` is called once its stack is up, before its workload: a
    campaign finishes the previous cell there, so its judging overlaps this stack's start and no workload. A run
    that raises is recorded failed (`before_workload` called first); a KeyboardInterrupt propagates. With
    `reports`, the report is written there (`_Reports`), else in the judging."""
    entry.update(status="running", started=stamp_now(), run_dir=None, verdict=None, ops=None, elapsed_s=None,
                 finished=None, error=None, note=None, unexercised_faults=None, partial=None, overhead_s=None,
                 phases=None)
    save()
    test = run.to_test()
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    called = False

    def hook() -> None:
        nonlocal called
        called = True
        if before_workload is not None:
            try:
                before_workload()
            except Exception as e:  # the campaign's own error (writing its page, its state): not this run's
                raise _CampaignFault() from e

    try:
        judge = runner.run_unjudged(test, store_dir, before_workload=hook, phases=phases, report=reports is None)
    except _CampaignFault as e:
        entry.update(status="pending", run_dir=_where(entry, test, store_dir), note="not run: the campaign stopped")
        raise e.__cause__ from None
    except KeyboardInterrupt:
        entry.update(status="pending", run_dir=_where(entry, test, store_dir), elapsed_s=time.monotonic() - t0,
                     note="interrupted; settled when the campaign resumes")
        save()
        raise
    except Exception as e:  # noqa: BLE001 - one run's failure (stack did not start, ...) must not end the campaign
        if not called:
            hook()
        entry.update(status="failed", run_dir=_where(entry, test, store_dir), error=_one_line(e),
                     elapsed_s=round(time.monotonic() - t0, 3), finished=iso_now(),
                     phases={k: round(v, 3) for k, v in phases.items()})
        save()
        return PendingRun(entry, test, store_dir, t0, save, None, phases)
    judging = _Judging(judge)
    judging.start()
    return PendingRun(entry, test, store_dir, t0, save, judging, phases, reports)


def execute_run(entry: dict[str, Any], run: PlannedRun, store_dir: Path, save: Callable[[], None]) -> None:
    """Run one planned test, recording it in `entry` before and after (KeyboardInterrupt propagates)."""
    start_run(entry, run, store_dir, save).finish()


def _run_cells(todo: list[dict[str, Any]], by_id: dict[str, PlannedRun], store_dir: Path, save: Callable[[], None],
               progress: _Progress, page: Callable[[], Any]) -> None:
    """Run the cells one after the other, each judged while the next one's stack starts (`start_run`), and record
    each one's `overhead_s`: the campaign's wall time from the end of the previous cell's turn to the start of the
    next cell's workload (or, for the last, to its own end), minus its time limit; what the campaign paid for it
    beyond its run (its final phase, its stack's stop, its checkers and report, and the next stack's start as far as
    its judging did not cover it; the first cell also its own stack's start)."""
    pending: PendingRun | None = None
    last: dict[str, Any] | None = None  # the last cell recorded done: the final wait for the reports is its cost
    mark = time.monotonic()
    reports = _Reports() if PIPELINE else None

    def finish_previous() -> None:
        nonlocal pending, mark, last
        if pending is None:
            return
        done, pending = pending, None
        try:
            done.finish()
        finally:
            if done.entry["status"] == "done":
                done.entry["overhead_s"] = round(time.monotonic() - mark - done.test.time_limit, 3)
                done.save()
                last = done.entry
            mark = time.monotonic()
            progress.finish(done.entry)
            if reports is not None and reports.collect():
                save()
            page()

    try:
        for entry in todo:
            progress.start(entry)
            started = start_run(entry, by_id[entry["id"]], store_dir, save, before_workload=finish_previous,
                                reports=reports)
            finish_previous()  # a run that failed before its workload: the previous cell is finished by now
            if started.done:  # it failed: its time is nobody's overhead
                mark = time.monotonic()
                progress.finish(entry)
                page()
            else:
                pending = started
                if not PIPELINE:
                    finish_previous()
    except KeyboardInterrupt:
        finish_previous()
        if reports is not None:
            reports.close(wait=False)
        raise
    finally:
        finish_previous()
        if reports is not None:
            t = time.monotonic()
            reports.close()
            if last is not None and last.get("overhead_s") is not None:  # the campaign waited for them: its cost
                last["overhead_s"] = round(last["overhead_s"] + time.monotonic() - t, 3)
        save()
        page()


def _prepare_state(spec: Spec, plan: list[PlannedRun], store_dir: Path, path: Path, resume: bool,
                   echo: Callable[[str], Any]) -> dict[str, Any]:
    """The state to go on from: the saved one merged with the plan and settled, or a fresh one."""
    if not resume and path.exists():
        aside = path.with_name(f"campaign-{stamp_now()}.json")
        os.replace(path, aside)
        echo(f"campaign {spec.name}: starting over (the previous state is kept as {aside})")
    old = load_state(path) if resume else None
    if old is None:
        return new_state(spec, plan, store_dir)
    state = merge_plan(old, spec, plan, store_dir)
    for entry in state["runs"]:
        before = entry["status"]
        settle(entry, store_dir)
        if entry["status"] != before or (before == "pending" and entry.get("note")):
            echo(f"resume: {entry['id']}: {entry['status']} ({entry.get('note')})")
    return state


def _cannot_create(store_dir: Path, cdir: Path, e: OSError) -> CampaignError:
    """The one line for a campaign directory the OS would not make (the dry run's trial and the run say the same)."""
    return CampaignError(f"--store-dir {store_dir}: cannot create {cdir} ({e.strerror or e})")


def check_store_dir(store_dir: Path | str, name: str) -> None:
    """The store can hold campaign `name`: its directory's nearest existing parent is a directory in which this
    process can make a directory; CampaignError in one line otherwise. It leaves nothing behind (`--dry-run` calls
    it too): the trial directory it makes is removed at once."""
    store_dir = Path(store_dir)
    if store_dir.exists() and not store_dir.is_dir():
        raise CampaignError(f"--store-dir {store_dir} exists and is not a directory")
    cdir = campaign_dir(store_dir, name)
    nearest = cdir.absolute()
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise CampaignError(f"--store-dir {store_dir}: cannot create it, {nearest} is a file")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise CampaignError(f"--store-dir {store_dir}: cannot create it, {nearest} is not writable")
    try:  # the mode bits are not the whole answer (/proc refuses new directories, even to root): ask the OS
        trial = tempfile.mkdtemp(prefix=".fencelab-trial-", dir=nearest)
    except OSError as e:  # the run's own mkdir would fail the same way: say it as the run would
        raise _cannot_create(store_dir, cdir, e) from None
    os.rmdir(trial)


def run_campaign(spec: Spec, store_dir: Path | str = "store", *, resume: bool = True,
                 echo: Callable[[str], Any] = print, fancy: bool | None = None,
                 plan: list[PlannedRun] | None = None, dask: str | None = None) -> CampaignOutcome:
    """Run (or resume) a campaign; writes store/campaigns/<name>/campaign.json and campaign.html.

    `plan` is `validate_plan(spec)` when the caller has it already. `dask` (else the spec's `[run] dask`) is a
    Dask scheduler whose workers run the cells (lab.campaign.dask_cells); it is checked before anything is written.
    """
    store_dir = Path(store_dir)
    check_store_dir(store_dir, spec.name)
    plan = validate_plan(spec) if plan is None else plan
    dask = dask or spec.dask
    if dask is None:
        return _run_campaign(spec, store_dir, resume, echo, fancy, plan, None)
    from lab.campaign.dask_cells import DaskCells  # distributed (about a second to import): only for --dask

    cells = DaskCells.connect(dask)
    try:
        echo(f"campaign {spec.name}: cells run on the Dask cluster {cells.address}: "
             + ", ".join(f"{a} ({w['facts']['host']})" for a, w in sorted(cells.workers.items())))
        return _run_campaign(spec, store_dir, resume, echo, fancy, plan, cells)
    finally:
        cells.close()


def _run_campaign(spec: Spec, store_dir: Path, resume: bool, echo: Callable[[str], Any], fancy: bool | None,
                  plan: list[PlannedRun], cells: Any) -> CampaignOutcome:
    """`run_campaign` once the plan is valid (and the Dask cluster, if any, checked)."""
    by_id = {r.id: r for r in plan}
    cdir = campaign_dir(store_dir, spec.name)
    try:
        cdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # what changed since check_store_dir's trial (a disk filled up, a mount went read-only)
        raise _cannot_create(store_dir, cdir, e) from None
    path = cdir / STATE_FILE
    with CampaignLock(cdir), sigterm_interrupts():
        state = _prepare_state(spec, plan, store_dir, path, resume, echo)
        save_state(path, state)
        data = PageData(store_dir, cdir)
        page = write_page(state, data)
        todo = [e for e in state["runs"] if e["status"] != "done"]
        echo(f"campaign {spec.name}: {len(state['runs'])} runs, {len(state['runs']) - len(todo)} already done; "
             f"state {path}")
        interrupted = False
        with _Progress(spec.name, len(state["runs"]), len(state["runs"]) - len(todo), echo,
                       _fancy() if fancy is None else fancy) as progress:
            try:
                if cells is not None and todo:
                    per_worker = cells.run_cells(todo, by_id, store_dir, lambda: save_state(path, state), progress,
                                                 lambda: write_page(state, data))
                    echo("cells per worker: " + ", ".join(f"{w} {n}" for w, n in sorted(per_worker.items())))
                if cells is None:
                    _run_cells(todo, by_id, store_dir, lambda: save_state(path, state), progress,
                               lambda: write_page(state, data))
            except KeyboardInterrupt:
                interrupted = True
        page = write_page(state, data)
    c = counts(state["runs"])
    tail = " (INTERRUPTED: resume by running the same command)" if interrupted else ""
    echo(f"campaign {spec.name}: {c['done']}/{c['runs']} done: {c['valid']} valid, {c['invalid']} invalid, "
         f"{c['unknown']} unknown; {c['failed']} failed; {c['ops']} ops{tail}")
    echo(f"  page: {page}")
    code = EXIT_INTERRUPTED if interrupted else exit_code(state["runs"])
    return CampaignOutcome(spec.name, path, page, code, c, interrupted)
