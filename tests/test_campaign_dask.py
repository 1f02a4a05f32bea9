"""`fencelab campaign --dask`: cells on a real Dask cluster, shipped back into the store as a local run lands them.

The cluster fixture starts a real `distributed` scheduler and two workers
(`fencelab worker`) as processes this module owns by pid. As root (where the
suite's root probe can make network namespaces) each worker lives in its own
network namespace (`lab.stack.netns.NetnsHosts`), the scheduler and this
process on the bridge's outside end, so a worker's cells really run on their own
network stack; elsewhere the workers share loopback, which changes nothing the
tests assert (a worker's cells listen on its own loopback either way).

The scheduler runs with `allowed-failures = 0`, so a worker killed mid-cell
makes that cell fail at once (the test of resume); by default Dask retries it.

A worker "of another version" is a real `fencelab worker` started with a Dask
preload (`--preload FILE`, written by the test) that sets `lab.__version__`:
the version check reads it at call time. A worker "without the lab" is a plain
`dask worker` whose PYTHONPATH puts first a `lab` package that fails to import.

Without `distributed` the module is skipped; with CI=true that skip is a failure.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

try:
    import distributed
except ImportError:  # pragma: no cover - depends on the install
    if os.environ.get("CI") == "true":
        pytest.fail("CI must run the Dask tests: `distributed` is not installed (make install)", pytrace=False)
    pytest.skip("`distributed` is not installed (make install)", allow_module_level=True)

from click.testing import CliRunner
from conftest import SESSION_PIDS, root_probe, wait_until

import lab
from lab.campaign.dask_cells import INCOMING, land_run, pack_run, sweep_incoming
from lab.campaign.spec import CampaignError, expand, parse_spec
from lab.cli import main
from lab.stack.process import ManagedProcess

REPO = Path(lab.__file__).resolve().parent.parent
PY = sys.executable
# 4 short cells (the stack, the checkers and the report dominate a cell's cost on a loaded machine); one key
# and short leases, so even a 2 s run acquires the key many times and the checkers have orders to compare
SPEC = """
    name = "{name}"
    workloads = ["lease"]
    seeds = 4
    [defaults]
    time_limit = {time_limit}
    concurrency = 3
    rate = 30
    keys = 1
    ttl_ms = 500
    servers = 1
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "CI": "true", **extra}


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _spec(tmp_path: Path, name: str, time_limit: float = 2) -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(SPEC.format(name=name, time_limit=time_limit)))
    return p


# -- the spec key, packing and landing (no cluster) ------------------------------------------------


def test_the_spec_names_its_scheduler_in_run_and_a_bad_one_is_one_line():
    base = {"name": "c", "workloads": ["lease"]}
    assert parse_spec({**base, "run": {"dask": "10.0.0.5:8786"}}).dask == "tcp://10.0.0.5:8786"
    assert parse_spec(base).dask is None
    with pytest.raises(CampaignError, match=r"run\.dask: 'nowhere' is not a Dask scheduler address"):
        parse_spec({**base, "run": {"dask": "nowhere"}})
    with pytest.raises(CampaignError, match=r"unknown key 'dsak' \(did you mean 'dask'\?\)"):
        parse_spec({**base, "run": {"dsak": "tcp://h:1"}})


def _fake_run(store: Path, name: str, stamp: str = "20261203T120000.000001Z") -> Path:
    run_dir = store / name / stamp
    (run_dir / "stack" / "logs").mkdir(parents=True)
    (run_dir / "stack" / "credentials.json").write_text('[{"api_key": "SECRET-KEY"}]')
    (run_dir / "stack" / "principals.json").write_text('{"principals": []}')
    (run_dir / "stack" / "logs" / "valkey.log").write_text("ready\n")
    (run_dir / "history.jsonl").write_text("")
    test = {"name": name, "workload": "lease", "run_dir": str(run_dir),
            "credentials_file": str(run_dir / "stack" / "credentials.json"), "replay": "x", "argv": ["w"]}
    (run_dir / "test.json").write_text(json.dumps(test))
    (run_dir / "results.json").write_text(json.dumps({"valid": True, "report": str(run_dir / "report.html")}))
    (run_dir / "report.html").write_text(f"<code>{run_dir}</code> --store-dir {store}")
    return run_dir


def test_a_shipped_run_lands_whole_with_its_paths_moved_and_no_secrets(tmp_path):
    worker_run = _fake_run(tmp_path / "scratch", "c/cell")
    tar = pack_run(worker_run)
    names = tarfile.open(fileobj=io.BytesIO(tar)).getnames()
    assert not [n for n in names if "credentials" in n or "principals" in n], names
    assert f"{worker_run.name}/stack/logs/valkey.log" in names

    store = tmp_path / "store"
    final = land_run(tar, store, "c/cell", worker_run.name, str(worker_run), str(tmp_path / "scratch"))
    assert final == (store / "c" / "cell" / worker_run.name).resolve()
    test = json.loads((final / "test.json").read_text())
    assert test["run_dir"] == str(final) and test["credentials_file"] is None
    assert f"--store-dir {store.resolve()}" in test["replay"] and test["argv"] == sys.argv
    assert json.loads((final / "results.json").read_text())["report"] == str(final / "report.html")
    assert str(tmp_path / "scratch") not in (final / "report.html").read_text()
    assert not (final / "stack" / "credentials.json").exists()
    assert [p.name for p in final.parent.iterdir()] == [worker_run.name]  # no hidden unpack directory left


def test_a_store_path_a_text_replace_cannot_carry_gets_no_stale_report(tmp_path):
    worker_run = _fake_run(tmp_path / "scratch", "c/cell")
    store = tmp_path / "my store"  # quoted by the shell, escaped in HTML: the report is redone, never left stale
    final = land_run(pack_run(worker_run), store, "c/cell", worker_run.name, str(worker_run),
                     str(tmp_path / "scratch"))
    assert f"--store-dir '{store.resolve()}'" in json.loads((final / "test.json").read_text())["replay"]
    report = final / "report.html"
    assert not report.exists() or str(tmp_path / "scratch") not in report.read_text()


def test_a_bad_shipment_leaves_nothing_and_a_killed_clients_leftovers_are_swept(tmp_path):
    worker_run = _fake_run(tmp_path / "scratch", "c/cell")
    store = tmp_path / "store"
    with pytest.raises(ValueError, match="run stamp"):
        land_run(pack_run(worker_run), store, "c/cell", "../escape", str(worker_run), str(tmp_path / "scratch"))
    with pytest.raises(ValueError, match="holds no directory"):
        land_run(pack_run(worker_run), store, "c/cell", "20261203T120000.000002Z", "", "")
    assert list((store / "c" / "cell").iterdir()) == []
    plan = expand(parse_spec({"name": "c", "workloads": ["lease"]}))
    leftover = store / plan[0].test_name / f"{INCOMING}abc" / "20261203T120000.000001Z"
    leftover.mkdir(parents=True)
    assert sweep_incoming(store, plan) == [leftover.parent]
    assert not leftover.parent.exists()


# -- bad input: one line, exit 2 --------------------------------------------------------------------


def _one_line_exit_2(argv: list[str], tmp_path: Path, **env: str) -> str:
    r = subprocess.run([PY, "-m", "lab", *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=_env(**env))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencelab: error: "), r.stderr
    return lines[0]


def test_an_unreachable_scheduler_is_one_line_and_nothing_is_written(tmp_path):
    port = _free_port("127.0.0.1")  # nothing listens there
    line = _one_line_exit_2(["campaign", str(_spec(tmp_path, "c")), "--store-dir", "store", "--dask",
                             f"tcp://127.0.0.1:{port}"], tmp_path)
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port} within 5 s" in line
    assert not (tmp_path / "store").exists()
    spec = _spec(tmp_path, "r")  # the spec's [run] dask, without --dask, goes to the same scheduler
    spec.write_text(spec.read_text() + f'\n[run]\ndask = "127.0.0.1:{port}"\n')
    line = _one_line_exit_2(["campaign", str(spec), "--store-dir", "store"], tmp_path)
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in line
    line = _one_line_exit_2(["worker", f"127.0.0.1:{port}"], tmp_path)
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in line


def test_fencelab_worker_refuses_a_machine_without_the_labs_parts(tmp_path):
    line = _one_line_exit_2(["worker", "tcp://127.0.0.1:1"], tmp_path, FENCELAB_TOXIPROXY_SERVER="/nonexistent")
    assert "this machine cannot run cells: toxiproxy (missing" in line and "make install" in line


# -- a real cluster ---------------------------------------------------------------------------------


class Cluster:
    """A scheduler and two `fencelab worker`s (in their own namespaces as root), owned by pid."""

    def __init__(self, root: Path):
        self.root, self.hosts, self.procs, self.extra = root, None, {}, []
        if root_probe() is None:
            from lab.stack.netns import NetnsHosts, free_subnet

            self.hosts = NetnsHosts(["w1", "w2"], subnet=free_subnet(), outside="client").create()
        self.ip = self.hosts.address("client") if self.hosts else "127.0.0.1"
        self.address = f"tcp://{self.ip}:{_free_port(self.ip)}"

    def start(self) -> "Cluster":
        port = self.address.rsplit(":", 1)[1]
        self._spawn("scheduler", [PY, "-m", "distributed.cli.dask_scheduler", "--host", self.ip, "--port", port,
                                  "--no-dashboard"], env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"})
        wait_until(lambda: _accepts(self.ip, int(port)), 60, "the scheduler to listen")
        for w in ("w1", "w2"):
            argv = [PY, "-m", "lab", "worker", self.address, "--name", w, "--no-dashboard",
                    "--local-directory", str(self.root / w)]
            self._spawn(w, self.hosts.exec_argv(w, argv) if self.hosts else argv)
        self.client = distributed.Client(self.address, timeout="30s", set_as_default=False)
        self.client.wait_for_workers(2, timeout=120)
        return self

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        p = ManagedProcess(name=name, argv=argv, log_path=self.root / f"{name}.log", env=_env(**(env or {})),
                           die_with_parent=True)
        p.start(wait=False)
        self.procs[name] = p
        return p

    def start_extra(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> ManagedProcess:
        """One more worker on this host (a test's odd one), run in `cwd` (`python -m` puts it first on sys.path,
        before PYTHONPATH: never the checkout's root); the test stops it."""
        p = ManagedProcess(name=name, argv=argv, log_path=self.root / f"{name}.log", env={**_env(), **env},
                           cwd=cwd, die_with_parent=True)
        p.start(wait=False)
        wait_until(lambda: name in self.names() or not p.alive(), 120, f"worker {name} to join")
        return p

    def names(self) -> dict[str, str]:
        """Worker name -> address."""
        return {w["name"]: a for a, w in self.client.scheduler_info(n_workers=-1)["workers"].items()}

    def own(self) -> None:
        """Every process under ours (a nanny's worker, a restarted one) belongs to this fixture, not to a test."""
        import psutil

        for p in self.procs.values():
            if p.alive():
                SESSION_PIDS.add(p.pid)
                SESSION_PIDS.update(c.pid for c in psutil.Process(p.pid).children(recursive=True))

    def stop(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        for name in ("w1", "w2", "scheduler"):
            if name in self.procs:
                self.procs[name].stop(timeout=20)
        if self.hosts is not None:
            for attempt in range(50):  # a killed cell's processes leave the namespaces a moment after the worker
                try:
                    self.hosts.destroy()
                    break
                except RuntimeError:
                    if attempt == 49:
                        raise
                    time.sleep(0.2)


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dask"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def dask(cluster):
    """The module's cluster, with whatever it runs by the end of this test counted as its own."""
    cluster.own()
    yield cluster
    cluster.own()


def _campaign(args: list[str]):
    return CliRunner(env={"CI": "true"}).invoke(main, ["campaign", *args])


def _runs(store: Path, name: str) -> dict[str, dict]:
    """Cell id -> (run dirs, verdict of each) of a campaign's store."""
    out = {}
    for cell in sorted((store / name).iterdir()):
        dirs = sorted(p for p in cell.iterdir() if not p.is_symlink())
        out[cell.name] = {"dirs": [p.name for p in dirs],
                          "valid": [json.loads((p / "results.json").read_text())["valid"] for p in dirs]}
    return out


def _files(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.timeout(600)
def test_a_campaign_on_dask_lands_as_a_local_one_does(dask, tmp_path):
    spec = _spec(tmp_path, "c4")
    local, remote = tmp_path / "local", tmp_path / "remote"
    res = _campaign([str(spec), "--store-dir", str(local)])
    assert res.exit_code == 0, res.output
    res = _campaign([str(spec), "--store-dir", str(remote), "--dask", dask.address])
    assert res.exit_code == 0, res.output
    assert "cells per worker: " in res.output

    mine, theirs = _runs(local, "c4"), _runs(remote, "c4")
    assert sorted(mine) == sorted(theirs) and len(mine) == 4
    assert all(len(r["dirs"]) == 1 for r in theirs.values()), theirs
    assert {k: r["valid"] for k, r in mine.items()} == {k: r["valid"] for k, r in theirs.items()}
    assert all(r["valid"] == [True] for r in theirs.values()), theirs
    for store in (local, remote):
        assert (store / "campaigns" / "c4" / "campaign.html").is_file()
    a, b = (json.loads((s / "campaigns" / "c4" / "campaign.json").read_text())["runs"] for s in (local, remote))
    assert [(e["id"], e["status"], e["verdict"]) for e in a] == [(e["id"], e["status"], e["verdict"]) for e in b]
    assert {e["worker"] for e in b} == set(dask.names().values())  # both workers ran cells
    assert all(e["worker"] is None for e in a)

    for e in b:
        run_dir = remote / e["run_dir"]
        twin = local / next(x["run_dir"] for x in a if x["id"] == e["id"])
        secrets = {"stack/credentials.json", "stack/principals.json"}
        assert _files(twin) - secrets == _files(run_dir), e["id"]  # the same files, less the secrets
        test = json.loads((run_dir / "test.json").read_text())
        assert test["run_dir"] == str(run_dir.resolve()) and test["credentials_file"] is None
        assert f"--store-dir {remote.resolve()}" in test["replay"]
        assert (remote / "c4" / e["id"] / "latest").resolve() == run_dir.resolve()
    assert not list(dask.root.rglob("fencelab-cell-*"))  # the workers' scratch stores are gone

    one = remote / b[0]["run_dir"]
    r = CliRunner().invoke(main, ["analyze", str(one)])
    assert r.exit_code == 0 and "valid=true" in r.output, r.output
    r = CliRunner().invoke(main, ["report", str(one)])
    assert r.exit_code == 0, r.output


def _cell_running(root: Path) -> str | None:
    """The worker (w1, w2) whose scratch store holds a run that has recorded ops, if any."""
    for h in root.glob("w*/**/fencelab-cell-*/*/*/*/history.jsonl"):
        try:
            if h.stat().st_size > 0:
                return h.relative_to(root).parts[0]
        except OSError:
            continue
    return None


@pytest.mark.timeout(600)
def test_a_worker_killed_mid_cell_loses_that_cell_only_and_the_same_command_resumes(dask, tmp_path):
    spec, store = _spec(tmp_path, "k4", time_limit=4), tmp_path / "store"  # time to see a cell mid-run
    argv = [PY, "-m", "lab", "campaign", str(spec), "--store-dir", str(store), "--dask", dask.address]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        victim = wait_until(lambda: _cell_running(dask.root), 180, "a cell to record ops on a worker")
        addr = dask.names()[victim]
        pid = dask.client.run(os.getpid, workers=[addr])[addr]
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, out  # one cell failed
    state = json.loads((store / "campaigns" / "k4" / "campaign.json").read_text())
    failed = [e for e in state["runs"] if e["status"] == "failed"]
    assert len(failed) == 1 and "its worker died mid-cell" in failed[0]["error"], out
    done = {e["id"]: e["run_dir"] for e in state["runs"] if e["status"] == "done"}
    assert len(done) == 3

    def whole() -> None:  # every run in the store is complete; nothing half-unpacked
        for cell in (store / "k4").iterdir():
            for p in cell.iterdir():
                assert not p.name.startswith("."), p
                assert p.is_symlink() or (p / "results.json").is_file(), p

    whole()
    assert not (store / "k4" / failed[0]["id"]).exists() or not any(
        p for p in (store / "k4" / failed[0]["id"]).iterdir() if not p.is_symlink())

    dask.client.wait_for_workers(2, timeout=120)  # the nanny brings the killed worker back
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode in (0, 3), r.stdout + r.stderr  # complete (a verdict may be unknown on a loaded machine)
    assert "3 already done" in r.stdout
    state = json.loads((store / "campaigns" / "k4" / "campaign.json").read_text())
    assert [e["status"] for e in state["runs"]] == ["done"] * 4
    assert {e["id"]: e["run_dir"] for e in state["runs"] if e["id"] in done} == done  # finished cells not redone
    whole()


def _refused_because_of(dask, tmp_path: Path, name: str, argv: list[str], env: dict[str, str]) -> tuple[str, str]:
    """Start one odd worker, run a campaign on the cluster (refused: exit 2, one line), stop the worker;
    (the odd worker's address, the line)."""
    odd = dask.start_extra(name, argv, env, tmp_path)
    try:
        addr = dask.names()[name]
        return addr, _one_line_exit_2(["campaign", str(_spec(tmp_path, name)), "--store-dir", "store", "--dask",
                                       dask.address], tmp_path)
    finally:
        odd.stop(timeout=20)


def test_a_worker_of_another_version_is_named_before_any_cell(dask, tmp_path):
    preload = tmp_path / "other_version.py"
    preload.write_text("import lab\nlab.__version__ = '0.0.0-test'\n")
    addr, line = _refused_because_of(dask, tmp_path, "odd", [
        PY, "-m", "lab", "worker", dask.address, "--name", "odd", "--no-dashboard",
        "--local-directory", str(tmp_path / "odd"), "--preload", str(preload)], {})
    assert f"worker {addr} " in line and "fencelab 0.0.0-test (this client: " in line, line
    assert not any(a in line for n, a in dask.names().items() if n != "odd"), line
    assert not (tmp_path / "store").exists()


def test_a_worker_without_the_lab_is_named_before_any_cell(dask, tmp_path):
    shadow = tmp_path / "shadow" / "lab"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no lab on this machine')\n")
    addr, line = _refused_because_of(dask, tmp_path, "nolab", [
        PY, "-m", "distributed.cli.dask_worker", dask.address, "--name", "nolab", "--nthreads", "1",
        "--resources", "fencelab=1", "--no-dashboard", "--local-directory", str(tmp_path / "nolab")],
        {"PYTHONPATH": str(shadow.parent)})
    assert f"worker {addr} cannot load the lab (" in line and "no lab on this machine" in line, line
    assert "make install" in line
