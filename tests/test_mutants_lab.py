"""`fencelab mutants` and `fencelab test --mutant`: the spec, the table's logic, and the CI subset end to end.

The table's logic runs on a fake `run` (verdicts chosen per seed), so its
rules are checked exactly: a mutant stops at its first invalid run, the
unmodified server runs every seed, and the exit code is 0 only with every
mutant caught and every unmodified run valid. The last test runs the real CI
subset (`fencelab mutants --fast`): every deterministic mutant caught on its
first run, the unmodified server valid on the same runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.cli import main
from lab.mutants import (MutantsError, build_test, caught_by, exit_code, load_spec, parse_spec, render_markdown,
                         render_plain, run_mutants, validate_spec)
from lab.runner import RunError, replay_command, validate
from lab.server.mutants import MUTANT_NAMES
from lab.testmap import Test

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "campaigns" / "mutants.toml"


def spec_data(**mutants) -> dict:
    return {"name": "m", "runs": 2, "defaults": {"servers": 2}, "mutants": mutants}


# -- the shipped spec -----------------------------------------------------------------------------------------


def test_the_shipped_spec_plants_every_mutant_and_every_run_is_valid_to_start():
    full = load_spec(SPEC)
    assert [e.mutant for e in full.entries] == list(MUTANT_NAMES)
    validate_spec(full)  # every Test, planted and unmodified, passes lab.runner.validate
    fast = load_spec(SPEC, fast=True)
    assert fast.fast and {e.mutant for e in fast.entries} == set(MUTANT_NAMES) - {"local-clock"}
    assert all(e.runs == 1 for e in fast.entries)
    assert {e.mutant: e.runs for e in full.entries}["local-clock"] == 8
    only = load_spec(SPEC, only=("volatile-counter",))
    assert [e.exposed_by() for e in only.entries] == ["lease workload"]


def test_a_run_is_the_scenarios_test_with_the_mutant_planted():
    spec = load_spec(SPEC)
    entry = next(e for e in spec.entries if e.mutant == "nonatomic-acquire")
    planted, honest = build_test(spec, entry, 1, True), build_test(spec, entry, 1, False)
    assert planted.name == "mutants/nonatomic-acquire/planted-s1" and honest.name == "mutants/nonatomic-acquire/unmodified-s1"
    assert planted.extra["mutant"] == "nonatomic-acquire" and "mutant" not in honest.extra
    assert planted.extra["scenario"] == "concurrent-acquires" and planted.concurrency == 8  # the scenario's option
    assert planted.seed == 1 and planted.extra["servers"] == 2
    assert "--mutant nonatomic-acquire" in replay_command(planted) and "--mutant" not in replay_command(honest)
    local = next(e for e in spec.entries if e.mutant == "local-clock")
    t = build_test(spec, local, 0, True)
    assert t.nemesis == ["slicer"] and t.ttl_ms == 300 and t.workload == "lease"


def test_entry_options_beat_the_scenarios_and_the_scenarios_beat_defaults():
    data = spec_data(**{"renew-revives-expired": {"scenario": "renew-vs-expiry", "time_limit": 2.5}})
    data["defaults"] = {"ttl_ms": 999, "concurrency": 3}
    spec = parse_spec(data)
    t = build_test(spec, spec.entries[0], 0, True)
    assert t.time_limit == 2.5  # the entry's own
    assert t.ttl_ms == 300 and t.concurrency == 1  # the scenario's, over [defaults]
    fast = parse_spec({**data, "fast": {"runs": 1, "time_limit": 1.5}}, fast=True)
    assert build_test(fast, fast.entries[0], 0, True).time_limit == 1.5


@pytest.mark.parametrize("data, message", [
    ({"name": "m", "mutants": {"nope": {"workload": "lease"}}}, "unknown mutant 'nope'; known: unfenced-commit"),
    ({"name": "m", "mutant": {}}, "unknown key 'mutant'"),
    ({"name": "bad name", "mutants": {}}, "name must be"),
    ({"name": "m"}, "no [mutants.<name>] tables"),
    (spec_data(**{"local-clock": {"workload": "lease", "scenario": "renew-vs-expiry"}}), "exactly one of scenario"),
    (spec_data(**{"local-clock": {"workload": "nope"}}), "unknown workload 'nope'"),
    (spec_data(**{"local-clock": {"scenario": "nope"}}), "unknown scenario 'nope'"),
    (spec_data(**{"local-clock": {"scenario": "renew-vs-expiry", "nemesis": "clock"}}), "remove nemesis"),
    (spec_data(**{"local-clock": {"workload": "lease", "ttl_ms": "short"}}), "ttl_ms must be an integer"),
    (spec_data(**{"local-clock": {"workload": "lease", "time-limit": 3}}), "unknown key 'time-limit'"),
    (spec_data(**{"local-clock": {"workload": "lease", "extra": {"mutant": "x"}}}), "extra.mutant is set by the runner"),
    (spec_data(**{"local-clock": {"workload": "lease", "runs": 0}}), "runs must be an integer between 1 and 100"),
    ({**spec_data(**{"local-clock": {"workload": "lease"}}), "fast": {"skip": ["nope"]}}, "skip: 'nope' is not one"),
])
def test_a_bad_spec_is_one_line_naming_the_key(data, message):
    with pytest.raises(MutantsError) as e:
        parse_spec(data, "s.toml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_run_the_runner_refuses_fails_the_spec_before_anything_runs():
    spec = parse_spec(spec_data(**{"local-clock": {"workload": "lease", "nemesis": "no-such-fault"}}), "s.toml")
    with pytest.raises(MutantsError, match=r"s.toml: \[mutants.local-clock\]: .*no-such-fault"):
        validate_spec(spec)
    with pytest.raises(MutantsError, match="--only nope: not a mutant"):
        load_spec(SPEC, only=("nope",))
    with pytest.raises(MutantsError, match="--only local-clock: --fast skips it"):
        load_spec(SPEC, fast=True, only=("local-clock",))


def test_the_runner_refuses_an_unknown_mutant_and_a_mutant_of_an_external_system():
    with pytest.raises(RunError, match="--mutant: unknown mutant 'nope'"):
        validate(Test(extra={"mutant": "nope"}))
    with pytest.raises(RunError, match="cannot apply to an external system"):
        validate(Test(extra={"mutant": "local-clock", "urls": ["http://127.0.0.1:9"]}))
    validate(Test(extra={"mutant": "local-clock"}))


def test_fencelab_test_mutant_is_validated_before_anything_starts(tmp_path):
    r = CliRunner().invoke(main, ["test", "--mutant", "nope", "--store-dir", str(tmp_path)])
    assert r.exit_code == 2 and "unknown mutant 'nope'" in r.output and not any(tmp_path.iterdir())
    r = CliRunner().invoke(main, ["mutants", "--spec", str(tmp_path / "none.toml")])
    assert r.exit_code == 2 and "no such spec file" in r.output


# -- the table's logic on a fake run --------------------------------------------------------------------------


def fake_results(valid, kinds=()) -> dict:
    sub = {"fencing": {"valid": valid if kinds else True, "violation_counts": {k: 1 for k in kinds}},
           "availability": {"valid": True}}
    return {"valid": valid, "results": sub}


def table_spec(runs: int = 3):
    return parse_spec({"name": "m", "runs": runs, "mutants": {
        "volatile-counter": {"workload": "lease"}, "no-idempotency": {"workload": "idempotency"}}})


def run_with(verdicts):
    """A fake `run`: verdicts[(mutant or None, seed)] -> results; records each Test it was given."""
    seen = []

    def run(test, store_dir):
        seen.append(test.name)
        test.run_dir = store_dir / test.name
        return verdicts[(test.extra.get("mutant"), test.seed)]

    return run, seen


def test_a_mutant_stops_at_its_first_detection_and_the_unmodified_server_runs_every_seed(tmp_path):
    ok, bad = fake_results(True), fake_results(False, ["duplicate-token"])
    verdicts = {("volatile-counter", 0): ok, ("volatile-counter", 1): bad,
                ("no-idempotency", 0): bad, **{(None, s): ok for s in range(3)}}
    run, seen = run_with(verdicts)
    lines = []
    report = run_mutants(table_spec(), tmp_path, echo=lines.append, run=run)
    assert seen == ["m/volatile-counter/planted-s0", "m/volatile-counter/planted-s1",
                    *(f"m/volatile-counter/unmodified-s{s}" for s in range(3)),
                    "m/no-idempotency/planted-s0", *(f"m/no-idempotency/unmodified-s{s}" for s in range(3))]
    assert [r.detected_at for r in report.rows] == [2, 1] and exit_code(report) == 0
    assert report.rows[0].caught_by == ["fencing (duplicate-token)"]
    text = render_plain(report)
    assert "run 2 (of up to 3)" in text and "run 1 (of up to 3)" in text and "valid (3 runs)" in text
    assert "2/2 mutants caught (100% detection); unmodified server valid on 2/2 scenarios" in text
    assert "| volatile-counter | lease workload | fencing (duplicate-token) | run 2 (of up to 3) |" in render_markdown(report)
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["detected"] == 2 and summary["exit_code"] == 0 and len(lines) == 9


def test_a_surviving_mutant_or_an_invalid_unmodified_run_fails(tmp_path):
    ok, bad = fake_results(True), fake_results(False, ["overlap"])
    survivor = {**{("volatile-counter", s): ok for s in range(2)}, ("no-idempotency", 0): bad,
                **{(None, s): ok for s in range(2)}}
    report = run_mutants(table_spec(2), tmp_path, echo=lambda _: None, run=run_with(survivor)[0])
    assert report.rows[0].detected_at is None and exit_code(report) == 1
    assert "NOT CAUGHT in 2 runs" in render_plain(report) and "1/2 mutants caught (50% detection)" in render_plain(report)
    false_alarm = {("volatile-counter", 0): bad, ("no-idempotency", 0): bad, (None, 0): ok, (None, 1): bad}
    report = run_mutants(table_spec(2), tmp_path, echo=lambda _: None, run=run_with(false_alarm)[0])
    assert [r.unmodified_verdict for r in report.rows] == [False, False] and exit_code(report) == 1
    assert "INVALID (2 runs): fencing (overlap)" in render_plain(report)


def test_a_run_that_raises_is_recorded_and_the_table_goes_on(tmp_path):
    def run(test, store_dir):
        if test.extra.get("mutant") == "volatile-counter":
            raise RuntimeError("the stack did not start")
        if test.extra.get("mutant") is None:
            return fake_results(True)
        return fake_results(False, ["x"])

    report = run_mutants(table_spec(1), tmp_path, echo=lambda _: None, run=run)
    first = report.rows[0].planted[0]
    assert first.valid is None and first.error == "RuntimeError: the stack did not start"
    assert report.rows[1].detected_at == 1 and exit_code(report) == 1


def test_caught_by_names_each_invalid_checker_with_its_most_frequent_violations():
    res = {"valid": False, "results": {
        "scenario:x": {"valid": False, "violation_counts": {"a": 1, "b": 5, "c": 2, "d": 1}},
        "fencing": {"valid": True}, "deadlines": {"valid": "unknown"}}}
    assert caught_by(res) == ["scenario:x (b, c, a)"]
    assert caught_by({"valid": False}) == ["(the checker)"] and caught_by({"valid": True}) == []


# -- the CI subset, for real ------------------------------------------------------------------------------


def test_the_fast_subset_catches_every_mutant_and_the_unmodified_server_passes(tmp_path):
    env = dict(os.environ, CI="true")
    proc = subprocess.run([sys.executable, "-m", "lab", "mutants", "--fast", "--store-dir", str(tmp_path / "store")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fast = load_spec(SPEC, fast=True)
    n = len(fast.entries)
    assert f"{n}/{n} mutants caught (100% detection); unmodified server valid on {n}/{n} scenarios" in proc.stdout
    summary = json.loads((tmp_path / "store" / "mutants" / "summary-fast.json").read_text())
    assert [r["mutant"] for r in summary["rows"]] == [e.mutant for e in fast.entries]
    for row in summary["rows"]:
        assert row["detected_at"] == 1 and row["caught_by"] and row["unmodified"] is True, row
        planted = Path(row["planted_runs"][0]["run_dir"])
        test_json = json.loads((planted / "test.json").read_text())
        assert test_json["extra"]["mutant"] == row["mutant"] and f"--mutant {row['mutant']}" in test_json["replay"]
        assert f"PLANTED BUG: mutant {row['mutant']} is active" in (planted / "stack" / "logs" / "lease-1.log").read_text()
        honest = Path(row["unmodified_runs"][0]["run_dir"])
        assert "PLANTED BUG" not in (honest / "stack" / "logs" / "lease-1.log").read_text()
