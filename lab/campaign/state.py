"""`campaign.json`: the expanded plan and each run's status, rewritten atomically after every change.

The file lives in `store/campaigns/<name>/`. Each entry of `runs` is one
planned run with its Test options and

    status    pending | running | done | failed
    run_dir   the run's directory, relative to the store (store/<campaign>/<id>/<timestamp>)
    verdict   results.json's valid (true, false or "unknown"); ops; elapsed_s; error; note
    worker    the Dask worker that ran it (`--dask`), else null
    overhead_s  the campaign's wall seconds this run cost beyond its time limit (stack start and stop, final
              phase, checkers, report: lab.campaign.execute._run_cells says how it is counted); local runs only
    phases    wall seconds of its phases: up, workload (the time limit and the final phase), down, judge

A campaign killed mid-run leaves its last entry `running`, with the time the
run started. `settle` decides what such an entry is on resume: the run's
results.json exists -> done; its history has ops -> the checkers judge it
(`lab.runner.analyze`): a violation in what it recorded -> done, invalid,
`partial: true`; anything else -> pending again (a cut-short run is no valid
cell: it is run again, whole; its partial directory stays in the store);
otherwise the run is pending again. A run
recorded `done` whose results.json is still there is never redone.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from lab.campaign.spec import CampaignError, PlannedRun, Spec, saved_options
from lab.runner import RunError, analyze
from lab.secrets import redact_tree
from lab.stack.local import LocalStack, StackError

__all__ = ["FORMAT", "STATE_FILE", "CampaignLock", "campaign_dir", "counts", "find_run_dir", "load_state", "merge_plan",
           "new_state", "save_state", "settle", "stamp_now"]

FORMAT = 1
STATE_FILE = "campaign.json"
# what an older lab's settle noted on a cut-short run it judged on its partial history and showed as plain valid
_JUDGED_PARTIAL = "interrupted mid-run; the checkers judged the history it recorded"
INTERRUPTED = "interrupted"  # the key of a cut-short run's results.json that says so (written by `settle`)
STAMP = "%Y%m%dT%H%M%S.%fZ"  # lab.runner.new_run_dir's directory names: they sort by time


def stamp_now() -> str:
    """Now, in the store's run-directory stamp format."""
    return dt.datetime.now(dt.timezone.utc).strftime(STAMP)


def iso_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def campaign_dir(store_dir: Path, name: str) -> Path:
    """Where a campaign's campaign.json and campaign.html live."""
    return Path(store_dir) / "campaigns" / name


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Write campaign.json atomically (temp file, fsync, rename): a kill leaves the old or the new file whole."""
    state["updated"] = iso_now()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_state(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when there is none yet."""
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CampaignError(f"{path} cannot be read ({e}); start over with --no-resume (it is kept aside)") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("runs"), list):
        raise CampaignError(f"{path} is not a campaign state of format {FORMAT}; start over with --no-resume")
    return state


def _entry(run: PlannedRun) -> dict[str, Any]:
    """A fresh pending entry for a planned run."""
    return {"id": run.id, "workload": run.workload, "nemesis": run.nemesis, "scenario": run.scenario,
            "implementation": run.implementation, "seed": run.seed, "rep": run.rep,
            "test": redact_tree(run.test_options()),  # campaign.json keeps no URL user info (docs/cli.md#secrets)
            "status": "pending", "run_dir": None, "verdict": None, "ops": None, "elapsed_s": None,
            "started": None, "finished": None, "error": None, "note": None, "unexercised_faults": None,
            "partial": None, "worker": None, "overhead_s": None, "phases": None}


def new_state(spec: Spec, plan: list[PlannedRun], store_dir: Path) -> dict[str, Any]:
    """The state of a campaign that has not run yet."""
    return {
        "format": FORMAT, "name": spec.name, "description": spec.description, "spec": spec.source,
        "spec_data": spec.raw, "store_dir": str(Path(store_dir).resolve()), "created": iso_now(), "updated": None,
        "axes": {"workloads": spec.workloads, "nemeses": list(spec.nemeses),
                 "scenarios": [s.name for s in spec.scenarios],
                 "implementations": [i.name for i in spec.implementations], "seeds": spec.seeds,
                 "repetitions": spec.repetitions},
        "runs": [_entry(r) for r in plan],
    }


def merge_plan(old: dict[str, Any], spec: Spec, plan: list[PlannedRun], store_dir: Path) -> dict[str, Any]:
    """The new plan, keeping the status of every old run whose id and Test options are unchanged."""
    state = new_state(spec, plan, store_dir)
    state["created"] = old.get("created", state["created"])
    previous = {e.get("id"): e for e in old["runs"] if isinstance(e, dict)}
    for i, entry in enumerate(state["runs"]):
        before = previous.get(entry["id"])
        if before is not None and _same_options(before.get("test"), entry["test"]):
            state["runs"][i] = {**entry, **{k: v for k, v in before.items() if k in entry and k != "test"}}
    dropped = [k for k in previous if k not in {e["id"] for e in state["runs"]}]
    if dropped:
        state["dropped"] = sorted(set(old.get("dropped", [])) | set(dropped))
    return state


def _same_options(before: Any, now: dict[str, Any]) -> bool:
    """Do a run's saved options match the plan's (also those an older lab saved, with its options in `extra`)?"""
    if before == now:
        return True
    if not isinstance(before, dict) or not isinstance(before.get("extra", {}), dict):
        return False
    try:
        return saved_options(before) == now
    except (TypeError, ValueError):  # a damaged entry matches nothing: its run is planned again
        return False


def find_run_dir(store_dir: Path, test_name: str, started: str | None) -> Path | None:
    """The newest run directory of `test_name` created at or after `started` (a stamp), if any."""
    parent = Path(store_dir) / test_name
    if not started or not parent.is_dir():
        return None
    found = sorted(p for p in parent.iterdir() if p.is_dir() and not p.is_symlink() and p.name >= started)
    return found[-1] if found else None


def _has_ops(history: Path) -> bool:
    """The history holds at least one op (a line with content)."""
    try:
        with open(history, "rb") as f:
            return any(line.strip() for line in f)
    except OSError:
        return False


def _stop_leftover_stack(run_dir: Path) -> None:
    """Stop whatever the killed run's own stack left (normally nothing: it dies with its parent)."""
    if not (run_dir / "stack" / "state.json").exists():
        return
    try:
        LocalStack(name="stack", root=run_dir / "stack").down()
    except (StackError, OSError):
        pass  # a stale state file whose pids are gone: nothing left to stop


def record_results(entry: dict[str, Any], results: dict[str, Any]) -> None:
    """Copy a finished run's verdict and op count into its entry (and the faults it asked for and never injected)."""
    entry.update(status="done", verdict=results.get("valid", "unknown"), ops=results.get("ops"), error=None,
                 unexercised_faults=list(results.get("unexercised_faults") or []) or None, partial=None)


def settle(entry: dict[str, Any], store_dir: Path) -> None:
    """Decide, on resume, what an entry really is (see the module docstring); done runs are left alone."""
    store_dir = Path(store_dir)
    if entry["status"] == "done":
        if (entry.get("verdict") is not False and not entry.get("partial")
                and str(entry.get("note") or "").startswith(_JUDGED_PARTIAL)):  # an older lab's plain badge
            entry.update(status="pending", started=None, run_dir=None,
                         note="cut short and judged on its partial history by an older lab: run again")
            return
        if entry.get("run_dir") and (store_dir / entry["run_dir"] / "results.json").exists():
            return
        entry.update(status="pending", note="results.json of the finished run is gone: run again")
        return
    if entry["status"] == "failed":
        entry.update(status="pending", started=None, run_dir=None,
                     note=f"failed before ({entry.get('error')}; its directory stays in the store): retried")
        return
    if entry["status"] != "running" and not entry.get("started"):
        return
    run_dir = store_dir / entry["run_dir"] if entry.get("run_dir") else find_run_dir(
        store_dir, entry["test"]["name"], entry.get("started"))
    if run_dir is None:
        entry.update(status="pending", note="interrupted before its run directory existed: run again")
        return
    entry["run_dir"] = os.path.relpath(run_dir, store_dir)
    _stop_leftover_stack(run_dir)
    results_path = run_dir / "results.json"
    if results_path.exists():
        try:
            results = json.loads(results_path.read_text())
            if not results.get(INTERRUPTED):
                record_results(entry, results)
                entry["note"] = "finished before the interruption"
                return
        except (OSError, ValueError, AttributeError):
            results = None  # a torn results.json: judge the history again below
        if results is not None:
            _settle_partial(entry, results)
            return
    if not _has_ops(run_dir / "history.jsonl"):
        entry.update(status="pending", note="interrupted before its history had ops: run again")
        return

    try:
        results = analyze(run_dir)
    except (RunError, OSError, ValueError) as e:
        entry.update(status="pending", note=f"interrupted; its history could not be analyzed ({e}): run again")
        return
    results[INTERRUPTED] = "the campaign running it was interrupted: the checkers judged the partial history"
    results_path.write_text(json.dumps(redact_tree(results), indent=2, default=str))  # its results say so
    _settle_partial(entry, results)


def _settle_partial(entry: dict[str, Any], results: dict[str, Any]) -> None:
    """A cut-short run: a violation in what it recorded is kept (done, invalid, `partial`); anything else proves
    nothing about the cell, which is run again, whole (the partial directory stays in the store)."""
    if results.get("valid") is not False:
        entry.update(status="pending", started=None,
                     note=f"interrupted mid-run (its partial run {entry['run_dir']} stays in the store, "
                          f"valid={json.dumps(results.get('valid'))} over what it recorded): run again")
        entry["run_dir"] = None
        return
    record_results(entry, results)
    entry.update(partial=True, note="interrupted mid-run; the history it recorded already shows a violation "
                                    "(fencelab analyze)")


def counts(runs: list[dict[str, Any]]) -> dict[str, int]:
    """Runs by status and done runs by verdict, and the total op count."""
    done = [e for e in runs if e["status"] == "done"]
    return {"runs": len(runs), "done": len(done), "failed": sum(e["status"] == "failed" for e in runs),
            "pending": sum(e["status"] in ("pending", "running") for e in runs),
            "valid": sum(e["verdict"] is True for e in done), "invalid": sum(e["verdict"] is False for e in done),
            "unknown": sum(e["verdict"] not in (True, False) for e in done),
            "ops": sum(e.get("ops") or 0 for e in runs)}


class CampaignLock:
    """An exclusive flock on the campaign's directory: one process runs a campaign at a time."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> "CampaignLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            self.fd = None
            raise CampaignError(f"campaign {self.path.parent.name!r} is being run by pid {holder}; "
                                "wait for it or stop it first") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock (the kernel also does on SIGKILL)
            self.fd = None
