"""Real campaigns on the local stack: a tiny one end to end, and one resumed after a SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
from click.testing import CliRunner

from lab.cli import main
from lab.stack.local import LocalStack


def write_spec(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_tiny_campaign_end_to_end(tmp_path):
    spec = write_spec(tmp_path, """
        name = "tiny"
        workloads = ["lease"]
        nemeses = ["none", "partition"]
        [defaults]
        time_limit = 2.5
        rate = 60
        keys = 2
        nemesis_interval = 1
    """)
    store = tmp_path / "store"
    res = CliRunner(env={"CI": "true"}).invoke(main, ["campaign", str(spec), "--store-dir", str(store)])
    assert res.exit_code == 0, res.output
    assert "[2/2] lease-partition-default-reference-s0-r0: valid=true" in res.output
    cdir = store / "campaigns" / "tiny"
    state = json.loads((cdir / "campaign.json").read_text())
    assert [e["status"] for e in state["runs"]] == ["done", "done"]
    assert all(e["verdict"] is True and e["ops"] > 20 for e in state["runs"])
    for e in state["runs"]:
        run_dir = store / e["run_dir"]
        assert json.loads((run_dir / "results.json").read_text())["valid"] is True
        assert (run_dir / "report.html").is_file(), "the report worker wrote it before the campaign ended"
        assert isinstance(e["overhead_s"], float) and set(e["phases"]) == {"up", "workload", "down", "judge"}
        assert json.loads((run_dir / "test.json").read_text())["name"] == f"tiny/{e['id']}"
    page = (cdir / "campaign.html").read_text()
    header = re.search(r"<thead><tr><th>workload</th>(.*?)</tr></thead>", page).group(1)
    assert "nemesis: none" in header and "nemesis: partition" in header
    badges = re.findall(r'<a class="run (\w+)" href="([^"]+)"', page)
    assert [c for c, _ in badges] == ["valid", "valid"]
    for _, href in badges:
        target = (cdir / href).resolve()
        assert target.is_file() and target.name in ("report.html", "results.json"), href
        assert target.parent in {(store / e["run_dir"]).resolve() for e in state["runs"]}
    # the partition column saw fault windows: its in/outside-fault split is measured
    row = re.search(r"<tr><td>partition</td>(.*?)</tr>", page, re.S).group(1)
    cells = [c.strip() for c in re.findall(r'<td class="num">([^<]*)', row)]
    assert cells[0] == "1" and int(cells[1]) > 10 and cells[4].endswith("%") and cells[5].endswith("%")


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def test_campaign_resumes_after_sigkill_without_redoing_finished_runs(tmp_path):
    spec = write_spec(tmp_path, """
        name = "killed"
        workloads = ["lease"]
        seeds = 2
        [defaults]
        time_limit = 2
        rate = 100
        keys = 2
    """)
    store = tmp_path / "store"
    state_path = store / "campaigns" / "killed" / "campaign.json"
    first, second = "lease-none-default-reference-s0-r0", "lease-none-default-reference-s1-r0"
    proc = subprocess.Popen([sys.executable, "-m", "lab", "campaign", str(spec), "--store-dir", str(store)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "CI": "true"})
    stack_procs: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            state = json.loads(state_path.read_text()) if state_path.exists() else None
            histories = [h for h in (store / "killed" / second).glob("*/history.jsonl") if not h.parent.is_symlink()]
            if state and state["runs"][0]["status"] == "done" and histories and histories[0].stat().st_size > 2000:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the campaign ended before it could be killed mid-run"
        stack_procs = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    # the run's stack dies with the killed campaign (PR_SET_PDEATHSIG)
    _, alive = psutil.wait_procs(stack_procs, timeout=15)
    assert not alive, f"processes outlived the killed campaign: {alive}"
    killed_dir = histories[0].parent
    LocalStack(name="stack", root=killed_dir / "stack").down()
    state = json.loads(state_path.read_text())
    assert [e["status"] for e in state["runs"]] == ["done", "running"]
    assert not (killed_dir / "results.json").exists()
    finished = store / state["runs"][0]["run_dir"]
    mtime = (finished / "results.json").stat().st_mtime_ns

    res = CliRunner(env={"CI": "true"}).invoke(main, ["campaign", str(spec), "--store-dir", str(store)])
    # the killed run is judged on what it recorded: never invalid (valid, or unknown when a checker had nothing to
    # judge yet); a cut-short run proves nothing about its cell, so the cell is run again, whole (issue 18, item 6)
    partial = json.loads((killed_dir / "results.json").read_text())
    assert partial["valid"] in (True, "unknown") and partial["interrupted"], partial
    assert f"resume: {second}: pending (interrupted mid-run (its partial run" in res.output
    assert res.exit_code == 0, res.output
    state = json.loads(state_path.read_text())
    assert [e["status"] for e in state["runs"]] == ["done", "done"]
    assert store / state["runs"][0]["run_dir"] == finished, "the finished run was not redone"
    assert (finished / "results.json").stat().st_mtime_ns == mtime
    rerun = store / state["runs"][1]["run_dir"]
    assert rerun != killed_dir and rerun.parent == killed_dir.parent, "the killed run was run again"
    results = json.loads((rerun / "results.json").read_text())
    assert results["valid"] is True and results["ops"] == state["runs"][1]["ops"] > 10
    assert not state["runs"][1]["partial"]
    assert "campaign killed: 2/2 done: 2 valid" in res.output
