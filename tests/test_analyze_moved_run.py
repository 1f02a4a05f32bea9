"""A run directory copied out of its store (to /tmp, into a bug report) is still analyzed, with no traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lab.runner import analyze, replay_command
from lab.testmap import Test

DATA = Path(__file__).parent / "data" / "lease-run-history.jsonl"


def test_a_moved_run_is_analyzed_and_its_replay_names_no_wrong_store(tmp_path):
    store = tmp_path / "store"
    original = store / "mutants" / "unmodified" / "lease" / "s0" / "20261201T000000.000000Z"
    original.mkdir(parents=True)
    test = Test(name="mutants/unmodified/lease/s0", workload="lease", run_dir=original)
    (original / "test.json").write_text(json.dumps(test.to_json()))
    shutil.copy(DATA, original / "history.jsonl")
    assert "--store-dir" in replay_command(test) and str(store) in replay_command(test)

    moved = Path(shutil.copytree(original, tmp_path / "x"))  # a shallower path than the name's depth
    res = analyze(moved)
    assert res["valid"] in (True, False, "unknown") and res["entries"] > 0
    assert "--store-dir" not in res["replay"], res["replay"]
