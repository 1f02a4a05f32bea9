"""`fencelab serve` (a real server process on a free port) and the reports in a real headless Chromium.

The server is an owned child process (killed by pid at teardown); every
Chromium is started in its own session and its whole process group is killed
by that id afterwards, and the test checks none of its processes is left.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from lab.report import write_report
from lab.report.serve import scan_store
from test_checker_core import LeaseHistory
from test_report import judge, stale_history, write_run

FENCELAB = str(Path(sys.executable).with_name("fencelab"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="chromium is not installed: bash scripts/install.sh chromium")


def judge_leases(ops: list[dict]) -> dict:
    """The checkers that have something to judge in `valid_history` (it has no commit and no retry: the
    stale-commit and idempotency checkers would rightly say unknown)."""
    from checkers.core import compose, get_checker

    return compose({n: get_checker(n) for n in ("fencing", "mutual-exclusion", "lease-state", "availability")}
                   ).check({}, ops, {})


def valid_history() -> list[dict]:
    """Two holders in turn on two keys, a partition in the middle: a valid lease history."""
    h = LeaseHistory()
    for n, key in enumerate(("k1", "k2")):
        h.acquire(0, f"L{n}a", 1, at=100 * n, ttl=1000, key=key)
        h.release(0, f"L{n}a", 1, at=100 * n, key=key)
    h.nemesis("start-partition", None)
    h.nemesis("start-partition", {"fault": "partition", "phase": "start"})
    for n, key in enumerate(("k1", "k2")):
        h.acquire(1, f"L{n}b", 2, at=2000 + 100 * n, ttl=1000, key=key)
        h.call(1, "inspect", None, None, key=key)
    h.nemesis("stop-partition", None)
    h.nemesis("stop-partition", {"fault": "partition", "phase": "end"})
    return h.ops


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store with a valid run and an invalid one (both reported), a run without a report,
    a campaign page, an evidence page, a secret and a hidden file."""
    root = tmp_path_factory.mktemp("serve-store")
    ok = valid_history()
    write_report(write_run(root / "lease" / "20260101T000000.000000Z", ok, judge_leases(ok), name="lease"))
    bad, _ = stale_history()
    write_report(write_run(root / "fenced-append" / "20260102T000000.000000Z", bad, judge(bad), name="fenced-append"))
    write_run(root / "fenced-append" / "20260103T000000.000000Z", bad, judge(bad), name="fenced-append")
    (root / "lease" / "latest").symlink_to("20260101T000000.000000Z")
    (root / "campaigns" / "nightly").mkdir(parents=True)
    (root / "campaigns" / "nightly" / "campaign.html").write_text("<html><body>campaign</body></html>")
    (root / "evidence" / "e1").mkdir(parents=True)
    (root / "evidence" / "e1" / "evidence.html").write_text("<html><body>evidence</body></html>")
    secret = root / "lease" / "20260101T000000.000000Z" / "stack" / "credentials.json"
    secret.write_text('{"token": "s3cret"}')
    (root / "lease" / ".hidden").write_text("hidden")
    return root


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first stdout line of a child process, waiting at most `timeout` seconds."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf and time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    sel.close()
    return buf.decode(errors="replace").split("\n", 1)[0]


def stop(proc: subprocess.Popen) -> None:
    """Stop an owned child by its pid: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.stdout.close()


@pytest.fixture(scope="module")
def server(store):
    """`fencelab serve --port 0` on the store: yields its base URL; stopped by pid at the end."""
    proc = subprocess.Popen([FENCELAB, "serve", "--store-dir", str(store), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        line = read_line(proc, timeout=30)
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
        assert m, f"no URL in the server's first line: {line!r}"
        yield m.group(1)
    finally:
        stop(proc)
    assert proc.returncode is not None


def raw_get(base: str, path: str, host: str | None = None) -> tuple[int, bytes]:
    """GET a path exactly as written (no client-side normalisation of `..` or %2e)."""
    hostport = base.removeprefix("http://")
    conn = http.client.HTTPConnection(hostport, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host or hostport)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- the server


def test_index_lists_runs_campaigns_and_evidence(server, store):
    index = httpx.get(f"{server}/api/index.json", timeout=10).json()
    runs = {r["path"]: r for r in index["runs"]}
    assert set(runs) == {"lease/20260101T000000.000000Z", "fenced-append/20260102T000000.000000Z",
                         "fenced-append/20260103T000000.000000Z"}  # the `latest` symlink is not a second run
    assert [r["path"] for r in index["runs"]][0] == "fenced-append/20260103T000000.000000Z"  # newest first
    assert runs["lease/20260101T000000.000000Z"]["verdict"] == "valid"
    assert runs["fenced-append/20260102T000000.000000Z"]["verdict"] == "invalid"
    assert runs["fenced-append/20260103T000000.000000Z"]["report"] is None
    assert runs["lease/20260101T000000.000000Z"]["ops"] == len(valid_history())
    assert [c["path"] for c in index["campaigns"]] == ["campaigns/nightly/campaign.html"]
    assert [e["path"] for e in index["evidence"]] == ["evidence/e1/evidence.html"]
    assert index == dict(scan_store(store), store=str(store.resolve()))

    html = httpx.get(f"{server}/", timeout=10).text
    for href in ("/files/lease/20260101T000000.000000Z/report.html",
                 "/files/fenced-append/20260102T000000.000000Z/report.html",
                 "/files/campaigns/nightly/campaign.html", "/files/evidence/e1/evidence.html"):
        assert f'href="{href}"' in html
        assert httpx.get(server + href, timeout=10).status_code == 200


def test_files_of_a_run_are_served_and_its_report_links_resolve(server, store):
    run = "lease/20260101T000000.000000Z"
    r = httpx.get(f"{server}/files/{run}/history.jsonl", timeout=10)
    assert r.status_code == 200 and r.content == (store / run / "history.jsonl").read_bytes()
    assert r.headers["content-type"].startswith("text/plain")
    report = httpx.get(f"{server}/files/{run}/report.html", timeout=10).text
    for href in set(re.findall(r'href="([^"#][^"]*)"', report)):
        assert httpx.get(f"{server}/files/{run}/{href}", timeout=10).status_code == 200, href
    listing = httpx.get(f"{server}/files/{run}", timeout=10, follow_redirects=True)
    assert listing.status_code == 200 and 'href="report.html"' in listing.text
    assert "credentials.json" not in httpx.get(f"{server}/files/{run}/stack/", timeout=10).text


@pytest.mark.parametrize("path", [
    "/files/../../../../etc/passwd",
    "/files/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/files/..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/files/lease/..%2f..%2f..%2f..%2f..%2fetc/passwd",
    "/files//etc/passwd",
    "/files/escape/passwd",
    "/files/no-such-file",
])
def test_paths_outside_the_store_are_not_found(server, store, path):
    escape = store / "escape"
    if not escape.is_symlink():
        escape.symlink_to("/etc")  # a symlink inside the store that points out of it
    status, body = raw_get(server, path)
    assert status in (403, 404), (status, body[:200])
    assert b"root:" not in body


@pytest.mark.parametrize("path", ["/files/lease/latest/stack/credentials.json",
                                  "/files/lease/20260101T000000.000000Z/stack/credentials.json",
                                  "/files/lease/.hidden"])
def test_secrets_and_hidden_files_are_refused(server, path):
    status, body = raw_get(server, path)
    assert status == 403 and b"s3cret" not in body and b"hidden\n" != body


def test_foreign_host_headers_are_refused(server):
    assert raw_get(server, "/", host="attacker.example")[0] == 400
    assert raw_get(server, "/", host="localhost")[0] == 200


def test_serve_rejects_bad_options_with_one_line(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        for args, message in ((["--store-dir", str(tmp_path / "none")], "no store directory"),
                              (["--store-dir", str(tmp_path), "--port", "70000"], "--port must be between"),
                              (["--store-dir", str(tmp_path), "--port", str(port)], "cannot listen on 127.0.0.1")):
            proc = subprocess.run([FENCELAB, "serve", *args], capture_output=True, text=True, timeout=30)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    finally:
        busy.close()


# --------------------------------------------------------------------------- in a real browser


def chromium_group_alive(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in the process group `pgid`."""
    alive = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


def chromium(tmp_path: Path, url: str, *args: str) -> str:
    """Run headless Chromium on `url` in its own session; returns stdout. Its process group is killed after."""
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args, url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its zygote/renderer helpers share its process group
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait()
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously: give the group time to go
    while chromium_group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chromium_group_alive(proc.pid) == [], "chromium left processes behind"
    assert proc.returncode == 0 or out, err.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def png_header(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, from its IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", head[16:24])


@needs_chromium
def test_browser_shows_the_index(server, tmp_path):
    dom = chromium(tmp_path, f"{server}/", "--dump-dom")
    assert dom.count('class="run"') == 3
    assert 'class="verdict invalid"' in dom and 'class="verdict valid"' in dom
    assert "campaigns/nightly/campaign.html" in dom and "evidence/e1/evidence.html" in dom


@needs_chromium
@pytest.mark.parametrize("run, verdict", [("lease/20260101T000000.000000Z", "valid"),
                                          ("fenced-append/20260102T000000.000000Z", "invalid")])
def test_browser_renders_the_report_plots_and_verdict(server, store, tmp_path, run, verdict):
    url = f"{server}/files/{run}/report.html"
    dom = chromium(tmp_path, url, "--dump-dom")
    body = re.search(r"<body([^>]*)>", dom).group(1)
    loaded = re.search(r'data-plots-loaded="(\d+)/(\d+)"', body)
    assert loaded, f"the page's load script did not run: {body}"
    decoded, total = map(int, loaded.groups())
    figures = json.loads((store / run / "plots.json").read_text())["figures"]
    assert total == len(figures) >= 3 and decoded == total  # every plot image decoded (naturalWidth > 0)
    assert f'data-verdict="{verdict}"' in body
    assert re.search(rf'id="verdict" class="verdict {verdict}">{verdict.upper()}<', dom)
    assert 'data-windows="1"' in body  # the partition, read from the inlined plot data by the page's script

    shot = tmp_path / "report.png"
    chromium(tmp_path, url, f"--screenshot={shot}", "--window-size=1280,2000", "--hide-scrollbars")
    assert png_header(shot) == (1280, 2000)
    assert shot.stat().st_size > 50_000  # a rendered page with plots, not a blank one


@needs_chromium
def test_browser_draws_the_counterexample_timeline(server, store, tmp_path):
    dom = chromium(tmp_path, f"{server}/files/fenced-append/20260102T000000.000000Z/counterexample-stale-commit.html",
                   "--dump-dom")
    assert re.search(r'class="op t-ok bad', dom), "the failing ops are not drawn"
    assert 'class="win"' in dom  # the partition window shaded
