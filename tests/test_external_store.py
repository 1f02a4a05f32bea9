"""`--store-url`: a CouchDB-API store the user runs (with a password), through the lab's proxies, never written down."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from lab.secrets import redact_url
from lab.stack.store import PouchDBProcess


def test_redact_url_hides_only_the_password():
    assert redact_url("http://admin:s3cret@db:5984/x") == "http://admin:***@db:5984/x"
    assert redact_url("http://db:5984") == "http://db:5984"
    assert redact_url(None) is None


def test_fenced_append_against_a_password_protected_store(tmp_path):
    store = PouchDBProcess(tmp_path / "ext", in_memory=True).start()
    try:
        r = httpx.put(store.url + "/_config/admins/admin", content='"s3cret-pw"',
                      headers={"Content-Type": "application/json"}, timeout=5)
        assert r.status_code == 200
        url = store.url.replace("http://", "http://admin:s3cret-pw@")
        res = subprocess.run([sys.executable, "-m", "lab", "test", "--workload", "fenced-append", "--time-limit", "3",
                              "--store-url", url, "--nemesis", "partition", "--store-dir", str(tmp_path / "st")],
                             capture_output=True, text=True, timeout=300)
        # 0 valid, or 3: a 3 s run may leave a checker unknown (no retry to judge); never invalid, never an error
        assert res.returncode in (0, 3), res.stdout + res.stderr
        run = (tmp_path / "st" / "fenced-append" / "latest").resolve()
        results = json.loads((run / "results.json").read_text())
        assert results["valid"] in (True, "unknown"), {k: v.get("valid") for k, v in results["results"].items()}
        assert results["results"]["commits-exercised"]["accepted_commits"] > 0
        assert not (run / "stack" / "store").exists(), "no pouchdb-server is started when a store URL is given"
        leaked = [str(p) for p in run.rglob("*") if p.is_file() and "s3cret-pw" in p.read_text(errors="ignore")]
        assert not leaked, f"the store password was written to {leaked}"
        docs = httpx.get(url + "/fencelab/_all_docs", timeout=5).json()
        assert any(row["id"].startswith("doc-") for row in docs["rows"]), "the commits landed in the user's store"
    finally:
        store.stop()


def test_bad_store_url_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "lab", "test", "--store-url", "ftp://x", "--store-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--store-url must be an http(s) URL" in res.stderr
