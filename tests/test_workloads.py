"""Workloads on the real stack: what each one records, and that its checkers accept a correct server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab.history import read_history


def run(tmp_path, *args):
    r = subprocess.run([sys.executable, "-m", "lab", "test", "--store-dir", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=300)
    return r


def test_idempotency_workload_retries_and_conflicts(tmp_path):
    r = run(tmp_path, "--workload", "idempotency", "--time-limit", "3", "--rate", "100")
    assert r.returncode == 0, r.stdout + r.stderr
    hist = read_history(tmp_path / "idempotency" / "latest" / "history.jsonl")
    conflicts = [op for op in hist if op.get("error") == "idempotency_conflict"]
    assert conflicts, "a changed body under a reused request_id must be refused"
    # a same-body retry returned the original lease: two ok acquires share a request_id and a lease_id
    oks = {}
    for op in hist:
        if op["type"] == "ok" and op["f"] == "acquire":
            oks.setdefault(op["value"]["request_id"], set()).add((op["value"]["lease_id"], op["value"]["fencing_token"]))
    assert any(len(v) == 1 for v in oks.values())
    assert all(len(v) == 1 for v in oks.values()), "a replay returned a different lease"
    results = json.loads((tmp_path / "idempotency" / "latest" / "results.json").read_text())
    assert results["results"]["idempotency"]["valid"] is True


def test_fenced_append_commits_land_in_the_store_and_check_valid(tmp_path):
    r = run(tmp_path, "--workload", "fenced-append", "--time-limit", "4", "--rate", "80", "--keys", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    hist = read_history(tmp_path / "fenced-append" / "latest" / "history.jsonl")
    oks = [op for op in hist if op["f"] == "commit" and op["type"] == "ok"]
    assert oks, "no commit was accepted: the fence was not exercised"
    reads = {op["value"]["doc"]: op["value"] for op in hist if op["f"] == "read" and op["type"] == "ok"}
    # every document a commit was sent to is read back: the --keys ones, each burst's and each solo key's
    assert {"doc-k0", "doc-k1"} <= set(reads) and {op["value"]["doc"] for op in oks} <= set(reads)
    landed = {(doc, tuple(e)) for doc, v in reads.items() for e in v["entries"]}
    assert all((op["value"]["doc"], tuple(op["value"]["entry"])) in landed for op in oks), \
        "an acknowledged commit is missing"
    for v in reads.values():  # tokens along each document never go down
        tokens = [e[1] for e in v["entries"]]
        assert tokens == sorted(tokens)
    results = json.loads((tmp_path / "fenced-append" / "latest" / "results.json").read_text())
    assert results["valid"] is True and results["results"]["stale-commit"]["valid"] is True


@pytest.mark.slow
def test_thirty_second_fenced_append_with_ten_processes_round_trips(tmp_path):
    """Issue acceptance: several thousand ops in 30 s with 10 processes, identical in JSONL and EDN."""
    from lab.history import read_edn

    r = run(tmp_path, "--workload", "fenced-append", "--time-limit", "30", "--concurrency", "10", "--rate", "200")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = (tmp_path / "fenced-append" / "latest").resolve()
    jsonl = read_history(run_dir / "history.jsonl")
    assert len(jsonl) > 3000
    assert jsonl == read_edn(run_dir / "history.edn")
