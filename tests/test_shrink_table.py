"""The per-mutant shrink table (issue 21): every planted bug of `fencelab mutants`, a default-run failure shrunk
within the default budget to at most 3 clients, 2 keys and 2 faults reproducing at >= 0.6 (lab.shrink_table).

The whole table is slow (a default run and up to 60 shrink runs per mutant: 4-9 minutes each on 2 cores, 68
minutes for the ten, measured): `make test-slow`. The bounds and the table's text are checked here on rows made by hand.
"""

from __future__ import annotations

import json

import pytest

from lab.shrink_table import SMALL, TABLE, main, render_markdown, row_problems


def row(concurrency=2, keys=1, windows=(0,), rate=0.8, **over):
    cfg = {"concurrency": concurrency, "keys": keys, "servers": 1, "time_limit": 5.0, "rate": 20.0,
           "windows": list(windows)}
    orig = {**cfg, "concurrency": 5, "keys": 3, "servers": 2, "time_limit": 10.0, "rate": 50.0}
    shrink = {"target": {"checker": "fencing", "type": "duplicate-token"}, "original": {"config": orig},
              "minimal": {"config": cfg, "rate": rate, "runs": 5, "convicted": round(rate * 5)},
              "runs_used": 41, "stopped": "done"}
    return {"mutant": "volatile-counter", "workload": "lease", "nemesis": [], "seed": 0, "run_dir": "/x",
            "shrink": shrink, "error": None, "seconds": 300.0, **over}


def test_a_row_meets_the_bounds_or_says_which_it_misses():
    assert row_problems(row()) == []
    assert row_problems(row(concurrency=SMALL["concurrency"], keys=SMALL["keys"], windows=(0, 1))) == []
    assert row_problems(row(concurrency=4)) == ["4 clients"]
    assert row_problems(row(keys=3, windows=(0, 1, 2))) == ["3 keys", "3 faults"]
    assert row_problems(row(rate=0.4)) == ["reproduces at 0.4"]
    assert row_problems(row(shrink=None)) == ["no default run failed: nothing to shrink"]
    assert row_problems(row(shrink=None, error="cannot re-run it")) == ["cannot re-run it"]


def test_the_markdown_table_has_a_line_per_mutant_with_both_configurations():
    text = render_markdown([row(), row(mutant="local-clock", nemesis=["server-clock"], shrink=None, seed=None)])
    lines = text.splitlines()
    assert len(lines) == 4
    assert "| volatile-counter | lease, seed 0 | fencing: duplicate-token | 5 clients, 3 keys, 2 servers, 10 s" in lines[2]
    assert "2 clients, 1 keys, 1 servers, 5 s, 20 ops/s, 1 faults | 4/5 | 41, 300 s | done |" in lines[2]
    assert lines[3].startswith("| local-clock | lease + server-clock |") and "no seed failed" in lines[3]


def test_a_finished_row_is_not_redone_and_a_missed_bound_is_exit_1(tmp_path, capsys):
    (tmp_path / TABLE).write_text(json.dumps({"volatile-counter": row(concurrency=4)}))
    assert main(["--store-dir", str(tmp_path), "--only", "volatile-counter"]) == 1
    out = capsys.readouterr().out
    assert "volatile-counter: 4 clients" in out and "0/1 planted bugs" in out
    assert main(["--store-dir", str(tmp_path), "--only", "no-such-mutant"]) == 2


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_every_planted_bug_shrinks_to_a_small_reproduction_within_the_default_budget(tmp_path, capsys):
    code = main(["--store-dir", str(tmp_path), "--markdown"])
    table = json.loads((tmp_path / TABLE).read_text())
    missed = {m: row_problems(r) for m, r in table.items() if row_problems(r)}
    assert code == 0 and not missed, (missed, capsys.readouterr().out)


def test_an_unreadable_table_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / TABLE).write_text("{")
    assert main(["--store-dir", str(tmp_path), "--only", "volatile-counter"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / TABLE) in err and "Traceback" not in err


def test_ctrl_c_in_a_row_s_shrink_stops_the_table_and_leaves_that_row_unfinished(tmp_path, monkeypatch):
    # `fencelab shrink` keeps its best so far on Ctrl-C and returns; the table must not take that for a finished
    # row and go on to the next mutant
    from types import SimpleNamespace

    made = []

    def default_run(test, store):
        made.append(test.name)
        return {"valid": False}

    monkeypatch.setattr("lab.shrink_table.run_test", default_run)
    monkeypatch.setattr("lab.shrink_table.shrink_run",
                        lambda *a, **k: SimpleNamespace(data={**row()["shrink"], "stopped": "interrupted"}))
    assert main(["--store-dir", str(tmp_path), "--only", "volatile-counter", "no-idempotency"]) == 130
    assert len(made) == 1 and not (tmp_path / TABLE).exists()
