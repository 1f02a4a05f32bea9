"""bench/checker/run.py's plumbing: categories, the recorded real runs, and what its figures say (no Go needed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def run():
    sys.path.insert(0, str(BENCH))
    sys.path.insert(0, str(BENCH / "checker"))
    spec = importlib.util.spec_from_file_location("bench_checker_run", BENCH / "checker" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # as bench/summary.py loads it: not registered in sys.modules
    return mod


def test_categories_group_the_four_variants_of_one_shape(run):
    cats = {}
    for s in run.default_specs():
        cats.setdefault(run.category(s), []).append(s.name)
    assert all(len(v) == 4 for v in cats.values()), cats
    assert {"cas-1000", "cas-50000", "hc-5000"} <= set(cats)


def test_recorded_real_runs_are_a_category_and_decompress_to_valid_histories(run):
    items = run.entries([], real=True)
    assert items and {i.category for i in items} == {run.REAL_CATEGORY}
    from checkers.linear import check_history
    from lab.history import read_history

    crashed = 0
    for item in items:
        hist = read_history(item.path)
        keys = {op.get("key") for op in hist if op.get("process") != "nemesis"}
        assert len(keys) >= 100  # many keys
        crashed += sum(1 for op in hist if op["type"] == "info" and op.get("process") != "nemesis")
        assert check_history(hist, "cas-register")["valid"] is True
        assert run.recorded_verdicts()[item.name] == {"valid": True, "digest": item.digest}
    assert crashed >= 10  # clients whose outcome was lost (a pause of Valkey)


def _row(name, cat, ours_cpu, porc_cpu, ours_valid=True, porc_valid=True, porc_from="this run"):
    return {"name": name, "category": cat, "ours": {"cpu_s": ours_cpu, "valid": ours_valid},
            "porc": {"cpu_s": porc_cpu, "valid": porc_valid}, "agree": ours_valid == porc_valid and
            ours_valid != "unknown", "porc_from": porc_from, "porc_timed_out": porc_valid == "unknown"}


def test_figures_hold_each_category_to_one_and_count_agreement(run, monkeypatch):
    rows = [_row("a-1", "a", 0.010, 0.020), _row("a-2", "a", 0.010, 0.020),
            _row("b-1", "b", 0.030, 0.020), _row("b-2", "b", 0.010, 0.020, ours_valid="unknown")]
    monkeypatch.setattr(run, "measure", lambda *a, **k: rows)
    monkeypatch.setattr(run, "BINARY", Path(__file__))  # "built"
    figs = {f.name: f for f in run.figures(quick=True)}
    a, b = figs["ours / Porcupine CPU: a"], figs["ours / Porcupine CPU: b"]
    assert (a.value, a.ok) == (0.5, True)
    assert (b.value, b.ok) == (1.0, True)  # 40 ms vs 40 ms: at the target
    agree = figs["verdicts identical to Porcupine's (none unknown)"]
    assert agree.value == 3 and agree.ok is False and "1 unknown" in agree.note
    rows[2]["ours"]["cpu_s"] = 0.031
    figs = {f.name: f for f in run.figures(quick=True)}
    assert figs["ours / Porcupine CPU: b"].ok is False


def test_verdicts_file_is_keyed_by_digest(run):
    rec = json.loads((BENCH / "checker" / "porcupine-verdicts.json").read_text())
    specs = {s.name: s for s in run.default_specs()}
    for name, v in rec.items():
        if name in specs:
            assert v["digest"] == run.spec_digest(specs[name]), f"{name}: stale recorded verdict"
    assert rec["cas-5000-stale-read"]["valid"] is False  # the one Porcupine needs minutes for


def test_a_harness_older_than_its_source_is_rebuilt(run, monkeypatch, tmp_path):
    """The Go harness is rebuilt when its source changed (e.g. where its timed span starts); a stale one is
    kept only when nothing can rebuild it; a binary elsewhere than the usual place is never rebuilt."""
    import os

    src = tmp_path / "porcupine"
    src.mkdir()
    (src / "main.go").write_text("package main\n")
    binary = tmp_path / "porcupine-bench"
    binary.write_text("old")
    monkeypatch.setattr(run, "HERE", tmp_path)
    monkeypatch.setattr(run, "BINARY", binary)
    os.utime(binary, (1_000, 1_000))
    assert run.porcupine_stale()
    built = []
    monkeypatch.setattr(run, "build_porcupine", lambda: built.append(1) or True)
    assert run.ensure_binary() and built == [1]
    monkeypatch.setattr(run, "build_porcupine", lambda: False)
    assert run.ensure_binary()  # stale, no toolchain: the old one, with a warning
    os.utime(binary, None)
    os.utime(src / "main.go", (1_000, 1_000))
    assert not run.porcupine_stale()
    monkeypatch.setattr(run, "BINARY", tmp_path / "elsewhere")
    assert not run.porcupine_stale() and not run.ensure_binary()
