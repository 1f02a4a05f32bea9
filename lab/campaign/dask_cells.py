"""Campaign cells on a Dask cluster (`fencelab campaign SPEC --dask ADDRESS`): one task per cell, runs shipped back.

The cluster is Dask's (PyPI `distributed`): a `dask scheduler` started from the
lab's environment and `fencelab worker ADDRESS` on each machine that has `make
install`. Every cell of the plan becomes one task with `resources={"fencelab":
1}`, so a worker (which offers `fencelab=1`) runs one cell at a time.

Worker side (`run_cell`): the cell's Test runs with `lab.runner.run_test`, as a
local campaign runs it, into a scratch store under the worker's own directory;
the task returns the exit code (the exit-code table's) and the run directory as
a tar.gz. What a run directory holds that is a secret never goes into the tar
(`lab.secrets.SECRET_FILES`: the stack's credentials.json with the demo API
keys, principals.json with the key hashes, keys and certificates).

Client side (`DaskCells`): before the first cell, the scheduler and every
worker report their fencelab version and installed parts (`facts`); one line
names any that differ from this client. Each finished cell is unpacked into a
hidden `.incoming-*` directory beside where a local run would land
(`store/<campaign>/<id>/<timestamp>`), its paths (test.json's run_dir, the
replay command, the report's links) rewritten to the new place, then renamed
into place in one step: a client killed mid-unpack leaves only a hidden
directory, which the next `--dask` run of the campaign removes. A worker that
dies mid-cell loses that cell only: Dask runs it again elsewhere (the
scheduler's `allowed-failures`), or it is recorded `failed` and a resume runs
it again. See docs/beyond-one-machine.md.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Callable

import distributed

import lab
from lab import paths, runner
from lab.campaign.spec import CampaignError, PlannedRun, check_dask_address
from lab.campaign.state import iso_now, record_results, stamp_now
from lab.exitcodes import EXIT_UNKNOWN, verdict_exit
from lab.secrets import SECRET_FILES

__all__ = ["CONNECT_TIMEOUT_S", "INCOMING", "RESOURCE", "DaskCells", "facts", "land_run", "pack_run", "run_cell",
           "sweep_incoming", "worker_argv"]

RESOURCE = "fencelab"  # the worker resource one cell takes
CONNECT_TIMEOUT_S = 5.0  # an unreachable scheduler is one line after this long
INCOMING = ".incoming-"  # the hidden directory a shipped run is unpacked into before its rename
STAMP_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z$")  # lab.runner.new_run_dir's directory names
PLAIN_PATH = re.compile(r"^[A-Za-z0-9/._+-]+$")  # a path that reads the same escaped in JSON, HTML and a shell
# the parts a cell's stack runs: each worker must have them, at the versions this client has
PARTS: dict[str, Callable[[], Path]] = {"valkey-server": paths.valkey_server, "toxiproxy": paths.toxiproxy_server,
                                        "pouchdb-server": paths.pouchdb_server}


# -- what a machine has: compared before the first cell ------------------------------------------


def _part_version(name: str, path: Path) -> str:
    """The version a part reports (its --version line, or pouchdb-server's package.json)."""
    if name == "pouchdb-server":
        pkg = path.resolve().parent.parent / "package.json"
        return str(json.loads(pkg.read_text()).get("version"))
    flag = "-version" if name == "toxiproxy" else "--version"
    out = subprocess.run([str(path), flag], capture_output=True, text=True, timeout=20).stdout
    line = out.strip().splitlines()[0] if out.strip() else "?"
    m = re.search(r"v=(\S+)", line)  # valkey-server: "Valkey server v=9.1.2 sha=... build=<per-build id>"
    return m.group(1) if m else line


def facts() -> dict[str, Any]:
    """This machine's fencelab version and installed parts (run on the client, the scheduler and each worker)."""
    parts = {}
    for name, lookup in PARTS.items():
        try:
            parts[name] = _part_version(name, lookup())
        except (paths.MissingTool, OSError, ValueError, subprocess.SubprocessError) as e:
            parts[name] = f"missing ({' '.join(str(e).split())})"
    # read at call time (a test's worker preload may stand in another version: tests/test_campaign_dask.py)
    return {"fencelab": lab.__version__, "python": platform.python_version(), "host": socket.gethostname(),
            "parts": parts}


def _differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """How a machine's facts differ from this client's (a part missing there, or at another version)."""
    out = []
    if theirs.get("fencelab") != mine["fencelab"]:
        out.append(f"fencelab {theirs.get('fencelab')} (this client: {mine['fencelab']})")
    for name, version in (theirs.get("parts") or {}).items():
        if str(version).startswith("missing"):
            out.append(f"{name} {version}")
        elif not str(mine["parts"].get(name, "")).startswith("missing") and version != mine["parts"].get(name):
            out.append(f"{name} {version} (this client: {mine['parts'].get(name)})")
    return out


# -- the worker's side ----------------------------------------------------------------------------


def _secret(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in SECRET_FILES)


def pack_run(run_dir: Path) -> bytes:
    """The run directory as a tar.gz (its own name at the top), without the secrets it holds."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if _secret(Path(info.name).name) else info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tf:
        tf.add(run_dir, arcname=Path(run_dir).name, filter=keep)
    return buf.getvalue()


def run_cell(run: PlannedRun) -> dict[str, Any]:
    """One cell on this worker: run its Test into a scratch store, return the exit code and the run as a tar.gz.

    Runs in the worker's task thread (Dask runs one per `fencelab` resource): the
    stack's processes die with it if the worker dies (PR_SET_PDEATHSIG).
    """
    worker = distributed.get_worker()
    scratch = Path(tempfile.mkdtemp(prefix="fencelab-cell-", dir=worker.local_directory))
    test = run.to_test()
    t0 = time.monotonic()
    out: dict[str, Any] = {"worker": worker.address, "host": socket.gethostname(), "error": None, "tar": None,
                           "run_name": None, "scratch_store": str(scratch), "scratch_run_dir": None}
    try:
        try:
            results = runner.run_test(test, scratch)
            out["exit_code"] = verdict_exit(results.get("valid"))
        except Exception as e:  # noqa: BLE001 - one cell's failure is recorded, as a local campaign records it
            out["exit_code"] = EXIT_UNKNOWN
            out["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:500]
        if test.run_dir is not None and Path(test.run_dir).is_dir():
            out.update(tar=pack_run(Path(test.run_dir)), run_name=Path(test.run_dir).name,
                       scratch_run_dir=str(test.run_dir))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out["elapsed_s"] = round(time.monotonic() - t0, 3)
    return out


# -- the client's side: landing a shipped run -----------------------------------------------------


def _rewrite(value: Any, old: list[tuple[str, str]]) -> Any:
    """A JSON tree with every old path prefix replaced by its new one."""
    if isinstance(value, str):
        for a, b in old:
            value = value.replace(a, b)
        return value
    if isinstance(value, dict):
        return {k: _rewrite(v, old) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, old) for v in value]
    return value


def _relocate(run_dir: Path, final: Path, old_run_dir: str, old_store: str, store_dir: Path) -> bool:
    """Point test.json, results.json (and the report, junit.xml) at `final`; False when the report must be redone."""
    pairs = [(old_run_dir, str(final)), (old_store, str(store_dir))]
    test_json = run_dir / "test.json"
    if test_json.exists():
        d = _rewrite(json.loads(test_json.read_text()), pairs)
        d["run_dir"] = str(final)
        d["credentials_file"] = None  # the credentials stayed on the worker (and died with its stack)
        d["argv"] = list(sys.argv)  # the command that ran the campaign, as a local cell records it
        test = runner.load_test(run_dir)
        test.run_dir = final
        d["replay"] = runner.replay_command(test)  # its --store-dir is this store, quoted as a shell needs
        test_json.write_text(json.dumps(d, indent=2, default=str))
    results_json = run_dir / "results.json"
    if results_json.exists():
        d = _rewrite(json.loads(results_json.read_text()), pairs)
        if test_json.exists():
            d["replay"] = json.loads(test_json.read_text())["replay"]
        results_json.write_text(json.dumps(d, indent=2, default=str))
    plain = all(PLAIN_PATH.match(p) for pair in pairs for p in pair)
    for name in ("report.html", "junit.xml"):
        f = run_dir / name
        if f.exists() and plain:  # the same bytes in JSON, HTML and shell quoting: a text replace is exact
            f.write_text(_rewrite(f.read_text(), pairs))
    return plain or not (run_dir / "report.html").exists()


def land_run(tar: bytes, store_dir: Path, test_name: str, run_name: str, old_run_dir: str, old_store: str) -> Path:
    """Unpack a shipped run to `store/<test_name>/<run_name>` (hidden dir, paths rewritten, one rename)."""
    if not STAMP_RE.match(str(run_name)):
        raise ValueError(f"a shipped run's directory name must be a run stamp, not {run_name!r}")
    store_dir = Path(store_dir).resolve()
    parent = store_dir / test_name
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=INCOMING, dir=parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(tar), mode="r:gz") as tf:
            tf.extractall(tmp, filter="data")  # nothing lands outside tmp (no absolute paths, links or ..)
        src = tmp / run_name
        if not src.is_dir():
            raise ValueError(f"the shipped tar holds no directory {run_name}")
        final = parent / run_name
        if final.exists():  # a run of this name is there already (a retried cell in the same microsecond)
            final = parent / stamp_now()
        redo_report = not _relocate(src, final, old_run_dir, old_store, store_dir)
        if redo_report:  # its paths are the worker's: never landed stale
            (src / "report.html").unlink()
        os.rename(src, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if redo_report:
        from lab.report import write_report  # pandas and the plots: only for a store path the text replace cannot

        try:
            write_report(final)
        except Exception:  # noqa: BLE001 - the report is a convenience: the page links results.json instead
            pass
    return final


def sweep_incoming(store_dir: Path, plan: list[PlannedRun]) -> list[Path]:
    """Remove the hidden unpack directories a killed client left under the plan's run directories."""
    gone = []
    for run in plan:
        parent = Path(store_dir) / run.test_name
        if parent.is_dir():
            for p in parent.glob(f"{INCOMING}*"):
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
    return gone


# -- the client's side: the cluster ---------------------------------------------------------------


class DaskCells:
    """A connection to a Dask scheduler that runs campaign cells (see the module docstring)."""

    def __init__(self, client: "distributed.Client", address: str, workers: dict[str, dict[str, Any]]):
        self.client, self.address, self.workers = client, address, workers

    @classmethod
    def connect(cls, address: str, *, timeout_s: float = CONNECT_TIMEOUT_S, wait_workers_s: float = 30.0
                ) -> "DaskCells":
        """Connect and check the scheduler and every worker; a CampaignError (one line) when they cannot run cells."""
        address = check_dask_address(address)
        try:
            client = distributed.Client(address, timeout=f"{timeout_s}s", set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise CampaignError(f"cannot reach the Dask scheduler at {address} within {timeout_s:g} s "
                                f"({type(e).__name__}); start one with `dask scheduler` from the lab's environment"
                                ) from None
        try:
            return cls(client, address, cls._check(client, address, wait_workers_s))
        except BaseException:
            client.close()
            raise

    @staticmethod
    def _check(client: "distributed.Client", address: str, wait_s: float) -> dict[str, dict[str, Any]]:
        """The workers that offer the `fencelab` resource, each checked against this client's facts."""
        mine = facts()
        deadline = time.monotonic() + wait_s
        while True:
            info = client.scheduler_info(n_workers=-1)["workers"]
            ours = {a: w for a, w in info.items() if (w.get("resources") or {}).get(RESOURCE, 0) >= 1}
            if ours or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not ours:
            others = f" ({len(info)} without the {RESOURCE!r} resource)" if info else ""
            raise CampaignError(f"the Dask scheduler at {address} has no fencelab worker{others} after {wait_s:g} s: "
                                f"start one with `fencelab worker {address}` on a machine with `make install`")
        try:
            sched = client.run_on_scheduler(facts)
        except Exception as e:  # noqa: BLE001 - whatever it raised, the scheduler cannot load the lab
            raise CampaignError(f"the Dask scheduler at {address} cannot load the lab ({_short(e)}): start it with "
                                "`dask scheduler` from the lab's environment (it reads each cell's task)") from None
        problems = [f"scheduler {address}: " + "; ".join(d) for d in [_differences(mine, sched)] if d]
        found = client.run(facts, workers=list(ours), on_error="return")
        for addr in sorted(ours):
            got = found.get(addr)
            if isinstance(got, BaseException) or not isinstance(got, dict):
                problems.append(f"worker {addr} cannot load the lab ({_short(got)}): run `make install` there and "
                                f"start it with `fencelab worker {address}`")
                continue
            diff = _differences(mine, got)
            if diff:
                problems.append(f"worker {addr} ({got.get('host')}) differs: " + "; ".join(diff))
        if problems:
            raise CampaignError("Dask cluster not usable: " + " | ".join(problems))
        return {a: {**ours[a], "facts": found[a]} for a in ours}

    def close(self) -> None:
        self.client.close()

    def slots(self) -> int:
        """How many cells the cluster's workers run at once now (their `fencelab` resources)."""
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        return int(sum((w.get("resources") or {}).get(RESOURCE, 0) for w in workers))

    def run_cells(self, todo: list[dict[str, Any]], by_id: dict[str, PlannedRun], store_dir: Path,
                  save: Callable[[], None], progress: Any, landed: Callable[[], None]) -> Counter:
        """Run every pending entry as one task, landing each as it finishes; the cells each worker ran.

        Only as many tasks as the workers have `fencelab` slots are on the
        cluster at a time (the next is submitted when one lands): Dask places a
        task with resources on a worker when it is submitted, so queueing them
        all would fix the order per worker up front, and a worker that frees up
        early would sit idle. KeyboardInterrupt cancels the tasks in flight (one
        already running finishes on its worker and is dropped); their entries
        stay pending.
        """
        sweep_incoming(store_dir, [by_id[e["id"]] for e in todo])
        queue, futures, per_worker = list(todo), {}, Counter()
        for entry in queue:
            entry.update(status="pending", note=f"waiting for a worker of the Dask cluster {self.address}")

        def submit() -> list["distributed.Future"]:
            new = []
            while queue and len(futures) < max(1, self.slots()):
                entry = queue.pop(0)
                entry.update(started=stamp_now(), run_dir=None, verdict=None, ops=None, elapsed_s=None, finished=None,
                             error=None, worker=None, note=f"submitted to the Dask cluster {self.address}")
                fut = self.client.submit(run_cell, by_id[entry["id"]], resources={RESOURCE: 1}, pure=False,
                                         key=f"fencelab-cell-{entry['id']}-{uuid.uuid4().hex[:8]}")
                futures[fut] = entry
                new.append(fut)
            save()
            return new

        pending = distributed.as_completed(submit(), loop=self.client.loop)
        try:
            for fut in pending:
                entry = futures.pop(fut)
                self._land(entry, by_id[entry["id"]], fut, store_dir)
                if entry.get("worker"):
                    per_worker[entry["worker"]] += 1
                save()
                progress.finish(entry)
                landed()
                for new in submit():
                    pending.add(new)
        except KeyboardInterrupt:
            self.client.cancel(list(futures))
            for entry in futures.values():
                entry.update(started=None, note="interrupted while on the Dask cluster: run again")
            save()
            raise
        return per_worker

    def _land(self, entry: dict[str, Any], run: PlannedRun, fut: "distributed.Future", store_dir: Path) -> None:
        """Record a finished task: its run unpacked into the store, its verdict; or why it failed."""
        try:
            out = fut.result()
        except Exception as e:  # noqa: BLE001 - KilledWorker (its worker died mid-cell), a lost connection...
            why = "its worker died mid-cell" if type(e).__name__ == "KilledWorker" else "the task failed"
            entry.update(status="failed", error=f"{why} ({_short(e)})", finished=iso_now(), note=None)
            return
        entry.update(worker=out["worker"], elapsed_s=out.get("elapsed_s"), finished=iso_now(), note=None)
        run_dir = None
        if out.get("tar") is not None:
            try:
                run_dir = land_run(out["tar"], store_dir, run.test_name, out["run_name"], out["scratch_run_dir"],
                                   out["scratch_store"])
            except (OSError, ValueError, tarfile.TarError, runner.RunError) as e:  # a test.json this lab cannot read
                entry.update(status="failed", error=f"the shipped run could not be unpacked ({_short(e)})")
                return
            entry["run_dir"] = os.path.relpath(run_dir, Path(store_dir).resolve())
        if out.get("error") or run_dir is None or not (run_dir / "results.json").exists():
            entry.update(status="failed", error=out.get("error") or "the run left no results.json")
            return
        record_results(entry, json.loads((run_dir / "results.json").read_text()))
        runner.link_latest(run_dir, Path(store_dir), run.test_name)


def _short(e: Any) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300] if isinstance(e, BaseException) else repr(e)[:300]


# -- `fencelab worker` ----------------------------------------------------------------------------


def worker_argv(scheduler: str, cells: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The `dask worker` command for this machine, once the scheduler answers and the lab's parts are here."""
    address = check_dask_address(scheduler)
    if cells < 1:
        raise CampaignError(f"--cells must be >= 1, not {cells}")
    missing = [f"{name} ({v})" for name, v in facts()["parts"].items() if str(v).startswith("missing")]
    if missing:
        raise CampaignError(f"this machine cannot run cells: {', '.join(missing)}; run `make install` first")
    host, port = address.split("://", 1)[1].rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise CampaignError(f"cannot reach the Dask scheduler at {address} within {CONNECT_TIMEOUT_S:g} s "
                            f"({e.strerror or type(e).__name__})") from None
    return [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", str(cells),
            "--resources", f"{RESOURCE}={cells}", *extra]
