"""Run identity: request ids and service instances are unique across runs (a per-run salt in test.json).

A second identical run against the same external server must not receive the
first run's stored replies (issue 10: a correct server was convicted of fencing,
lease-state and idempotency violations on the second run).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.common import pick_credential


def fencelab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def external(make_stack, tmp_path):
    """A running reference stack (as `fencelab up` makes) and a key file for it, as a user would write one."""
    st = make_stack(servers=1, store=False).status()
    key = pick_credential(json.loads(Path(st.credentials).read_text()))["api_key"]
    key_file = tmp_path / "key.txt"
    key_file.write_text(key + "\n")
    return st.lease_servers[0], key_file


@pytest.mark.parametrize("workload", ["lease", "idempotency"])
def test_the_same_run_twice_against_one_server_is_valid_both_times(external, tmp_path, workload):
    url, key_file = external
    args = ["test", "--workload", workload, "--url", url, "--api-key-file", str(key_file), "--time-limit", "4",
            "-c", "2", "--store-dir", str(tmp_path / "store")]
    runs, ids = [], []
    for attempt in (1, 2):
        r = fencelab(*args)
        assert r.returncode == 0, f"run {attempt}: {r.stdout}{r.stderr}"
        run = (tmp_path / "store" / "latest").resolve()  # named after the system: 127.0.0.1-<port>-<workload>
        runs.append(json.loads((run / "test.json").read_text()))
        assert json.loads((run / "results.json").read_text())["valid"] is True
        history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
        ids.append([op["value"]["request_id"] for op in history
                    if op["type"] == "invoke" and isinstance(op.get("value"), dict) and "request_id" in op["value"]])
    salts = [t["run_salt"] for t in runs]
    assert all(salts) and salts[0] != salts[1], salts
    assert all(i.startswith(f"{salt}-") for salt, run_ids in zip(salts, ids) for i in run_ids)
    assert not set(ids[0]) & set(ids[1]), "no request id of the first run is sent again"
    # the seed still fixes the generator's choices: the same ids once the salt is taken off (in an order the
    # threads' timing decides)
    unsalted = [[i.split("-", 1)[1] for i in run_ids] for run_ids in ids]
    assert unsalted[0] and set(unsalted[0][:5]) <= set(unsalted[1])


def test_an_explicit_run_salt_is_kept_and_a_bad_one_refused(tmp_path):
    from click.testing import CliRunner

    from lab.cli import main

    res = CliRunner().invoke(main, ["test", "--run-salt", "no-dashes!", "--store-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--run-salt" in res.output and not any(tmp_path.iterdir())
