"""`fencelab mutants` and `fencelab test --mutant`: the spec, the table's logic, and the CI subset end to end.

The table's logic runs on a fake `run` (verdicts chosen per seed), so its
rules are checked exactly: a workload row runs every seed (its detection rate),
a scenario row stops at its first invalid run, an unmodified run is shared by
every row with the same Test, and the exit code is 0 only with every mutant
caught on every seed by one of its workload rows and every unmodified run
valid. The last test runs the real CI subset (`fencelab mutants --fast`): each
mutant under a general workload at its defaults, caught; the unmodified server
valid on the same runs.
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
from lab.mutants import (MutantsError, build_test, caught_by, config_key, exit_code, load_spec, parse_spec,
                         render_markdown, render_plain, run_mutants, validate_spec)
from lab.runner import RunError, replay_command, validate
from lab.server.mutants import MUTANTS
from lab.testmap import Test

# the planted bugs the general workloads must catch: those with a `fault` are the per-fault table's (faults.toml)
MUTANT_NAMES = tuple(m for m in MUTANTS if not getattr(MUTANTS[m], "fault", ""))
ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "campaigns" / "mutants.toml"


def spec_data(**mutants) -> dict:
    return {"name": "m", "runs": 2, "defaults": {"servers": 2}, "mutants": mutants}


# -- the shipped spec -----------------------------------------------------------------------------------------


def test_the_shipped_spec_plants_every_mutant_under_the_general_workloads_at_their_defaults():
    full = load_spec(SPEC)
    # every planted bug; those the per-fault table owns (a `fault`: campaigns/faults.toml) may be left out
    assert set(MUTANT_NAMES) <= {e.mutant for e in full.entries} <= set(MUTANTS)
    validate_spec(full)  # every Test, planted and unmodified, passes lab.runner.validate
    general = {"lease", "fenced-append", "idempotency"}
    for m in dict.fromkeys(e.mutant for e in full.entries):
        rows = [e for e in full.entries if e.mutant == m]
        assert {e.workload for e in rows if e.kind == "general"} == general, m
        for e in rows:
            if e.kind == "general":  # at its defaults: only the nemesis may be configured
                assert set(e.options) <= {"nemesis_interval"} and e.runs == 3, (m, e.options)
                t = build_test(full, e, 0, True)
                assert (t.time_limit, t.rate, t.keys, t.ttl_ms, t.concurrency) == (10.0, 50.0, 3, 2000, 5)
    nemeses = {e.mutant: e.nemesis for e in full.entries if e.kind == "general" and e.nemesis}
    # the bugs that need a fault: a Valkey restore, the lease servers' clocks moved (Valkey's never does)
    assert nemeses == {"counter-from-snapshot": ("valkey-restore",), "local-clock": ("server-clock",)}
    fast = load_spec(SPEC, fast=True)
    assert fast.fast and {e.mutant for e in fast.entries} == {e.mutant for e in full.entries}
    assert all(e.runs == 1 and e.kind == "general" for e in fast.entries)
    assert len(fast.entries) == len({e.mutant for e in fast.entries})  # one general workload each under --fast
    only = load_spec(SPEC, only=("volatile-counter",))
    assert [e.exposed_by() for e in only.entries] == [f"{w} workload (defaults)" for w in
                                                      ("lease", "fenced-append", "idempotency")]


def test_a_run_is_the_rows_test_with_the_mutant_planted_and_unmodified_runs_are_shared():
    spec = load_spec(SPEC)
    entry = next(e for e in spec.entries if e.mutant == "nonatomic-acquire" and e.kind == "scenario")
    planted, honest = build_test(spec, entry, 1, True), build_test(spec, entry, 1, False)
    assert planted.name == "mutants/nonatomic-acquire/scenario-concurrent-acquires/planted-s1"
    assert honest.name == "mutants/unmodified/scenario-concurrent-acquires/s1"
    assert planted.mutant == "nonatomic-acquire" and honest.mutant is None
    assert "mutant" not in planted.extra and "mutant" not in honest.extra  # a typed field, nowhere else
    assert planted.scenario == "concurrent-acquires" and planted.concurrency == 8  # the scenario's option
    assert planted.seed == 1 and planted.servers == 2
    assert "--mutant nonatomic-acquire" in replay_command(planted) and "--mutant" not in replay_command(honest)
    lease_rows = [e for e in spec.entries if e.kind == "general" and e.workload == "lease" and not e.nemesis]
    assert len({config_key(build_test(spec, e, 0, False)) for e in lease_rows}) == 1
    assert len({build_test(spec, e, 0, False).name for e in lease_rows}) == 1
    local = [build_test(spec, e, 0, True) for e in spec.entries if e.mutant == "local-clock"]
    assert {t.workload for t in local} == {"lease", "fenced-append", "idempotency"}
    assert all(t.nemesis == ["server-clock"] and t.nemesis_interval == 1.0 and t.ttl_ms == 2000 for t in local)


def test_entry_options_beat_the_scenarios_and_the_scenarios_beat_defaults():
    data = spec_data(**{"renew-revives-expired": {"scenario": "renew-vs-expiry", "time_limit": 2.5}})
    data["defaults"] = {"ttl_ms": 999, "concurrency": 3}
    spec = parse_spec(data)
    t = build_test(spec, spec.entries[0], 0, True)
    assert t.time_limit == 2.5  # the entry's own
    assert t.ttl_ms == 300 and t.concurrency == 1  # the scenario's, over [defaults]
    fast = parse_spec({**data, "fast": {"runs": 1, "time_limit": 1.5}}, fast=True)
    assert build_test(fast, fast.entries[0], 0, True).time_limit == 2.5  # [fast] shortens workload runs only
    data["mutants"]["renew-revives-expired"]["fast"] = {"time_limit": 1.5}
    fast = parse_spec({**data, "fast": {"runs": 1}}, fast=True)
    assert build_test(fast, fast.entries[0], 0, True).time_limit == 1.5  # the entry's own fast options do


def test_general_rows_take_only_the_nemesis_options_and_fast_narrows_them():
    data = {"name": "m", "runs": 2, "workloads": ["lease", "idempotency"], "fast": {"runs": 1, "time_limit": 4.0},
            "mutants": {"counter-from-snapshot": {"nemesis": "valkey-restore", "nemesis_interval": 3.0,
                                                  "scenario": "backup-restore",
                                                  "fast": {"workloads": ["lease"], "scenario": False}}}}
    spec = parse_spec(data)
    assert [(e.kind, e.workload) for e in spec.entries] == [("general", "lease"), ("general", "idempotency"),
                                                            ("scenario", "fenced-append")]
    t = build_test(spec, spec.entries[0], 0, True)
    assert t.nemesis == ["valkey-restore"] and t.nemesis_interval == 3.0 and t.time_limit == 10.0
    assert "nemesis_interval" not in spec.entries[2].options  # a scenario brings its own faults
    fast = parse_spec(data, fast=True)
    assert [(e.kind, e.workload, e.runs) for e in fast.entries] == [("general", "lease", 1)]
    assert build_test(fast, fast.entries[0], 0, True).time_limit == 4.0


@pytest.mark.parametrize("data, message", [
    ({"name": "m", "mutants": {"nope": {"workload": "lease"}}}, "unknown mutant 'nope'; known: unfenced-commit"),
    ({"name": "m", "mutant": {}}, "unknown key 'mutant'"),
    ({"name": "bad name", "mutants": {}}, "name must be"),
    ({"name": "m"}, "no [mutants.<name>] tables"),
    (spec_data(**{"local-clock": {"workload": "lease", "scenario": "renew-vs-expiry"}}), "exactly one of scenario"),
    (spec_data(**{"local-clock": {"workload": "lease", "workloads": ["lease"]}}), "exclude each other"),
    (spec_data(**{"local-clock": {"workloads": ["lease"], "ttl_ms": 100}}), "run at their defaults"),
    (spec_data(**{"local-clock": {"workloads": ["lease"], "nemesis_interval": 2.0}}), "the entry names none"),
    (spec_data(**{"local-clock": {"workloads": ["nope"]}}), "unknown workload 'nope'"),
    (spec_data(**{"local-clock": {}}), "no run exposes it"),
    ({**spec_data(**{"local-clock": {"workload": "lease"}}), "workloads": "lease, x"}, "unknown workload 'lease, x'"),
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
    skipping = dict(spec_data(**{"local-clock": {"workload": "lease", "nemesis": "server-clock"}}),
                    fast={"runs": 1, "skip": ["local-clock"]})
    with pytest.raises(MutantsError, match="--only local-clock: --fast skips it"):
        parse_spec(skipping, "s.toml", fast=True, only=("local-clock",))


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
    return parse_spec({"name": "m", "runs": runs, "workloads": ["lease", "idempotency"], "mutants": {
        "volatile-counter": {}, "no-idempotency": {"workloads": ["idempotency"]},
        "renew-revives-expired": {"scenario": "renew-vs-expiry", "workloads": []}}})


def run_with(verdicts):
    """A fake `run`: verdicts[(mutant or None, workload or scenario, seed)] -> results; records each Test's name."""
    seen = []

    def run(test, store_dir):
        seen.append(test.name)
        test.run_dir = store_dir / test.name
        return verdicts[(test.mutant, test.scenario or test.workload, test.seed)]

    return run, seen


OK, BAD = fake_results(True), fake_results(False, ["duplicate-token"])


def honest(runs: int) -> dict:
    return {(None, w, s): OK for w in ("lease", "idempotency", "renew-vs-expiry") for s in range(runs)}


def test_workload_rows_run_every_seed_scenarios_stop_at_detection_and_unmodified_runs_are_shared(tmp_path):
    verdicts = {("volatile-counter", "lease", 0): BAD, ("volatile-counter", "lease", 1): BAD,
                ("volatile-counter", "lease", 2): BAD, ("volatile-counter", "idempotency", 0): OK,
                ("volatile-counter", "idempotency", 1): BAD, ("volatile-counter", "idempotency", 2): OK,
                **{("no-idempotency", "idempotency", s): BAD for s in range(3)},
                ("renew-revives-expired", "renew-vs-expiry", 0): OK,
                ("renew-revives-expired", "renew-vs-expiry", 1): BAD, **honest(3)}
    run, seen = run_with(verdicts)
    lines = []
    report = run_mutants(table_spec(), tmp_path, echo=lines.append, run=run)
    assert seen == [*(f"m/volatile-counter/lease/planted-s{s}" for s in range(3)),
                    *(f"m/unmodified/lease/s{s}" for s in range(3)),
                    *(f"m/volatile-counter/idempotency/planted-s{s}" for s in range(3)),
                    *(f"m/unmodified/idempotency/s{s}" for s in range(3)),
                    *(f"m/no-idempotency/idempotency/planted-s{s}" for s in range(3)),  # its unmodified runs: shared
                    "m/renew-revives-expired/scenario-renew-vs-expiry/planted-s0",
                    "m/renew-revives-expired/scenario-renew-vs-expiry/planted-s1",
                    *(f"m/unmodified/scenario-renew-vs-expiry/s{s}" for s in range(3))]
    assert [(r.caught, len(r.planted)) for r in report.rows] == [(3, 3), (1, 3), (3, 3), (1, 2)]
    assert [r.detected_at for r in report.rows] == [1, 2, 1, 2] and exit_code(report) == 0
    assert report.rows[2].unmodified[0] is report.rows[1].unmodified[0]  # one run, two rows
    assert report.rows[0].caught_by == ["fencing (duplicate-token)"]
    text = render_plain(report)
    assert "3/3 mutants caught on every seed (100% detection); unmodified server valid on 9/9 runs" in text
    md = render_markdown(report)
    assert "| mutant | fault | lease | idempotency | tuned run | scenario (extra evidence) | caught |" in md
    assert "| volatile-counter | - | 3/3 | 1/3 | - | - | yes |" in md
    assert "| renew-revives-expired | - | - | - | - | renew-vs-expiry: run 2 (of up to 3) | yes |" in md
    assert ("| no-idempotency | idempotency workload (defaults) | 3/3 | fencing (duplicate-token) | valid (3 runs) |"
            in md)
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["detected"] == 3 and summary["exit_code"] == 0 and len(lines) == len(seen)
    assert summary["caught"] == {"volatile-counter": True, "no-idempotency": True, "renew-revives-expired": True}


def test_a_mutant_caught_on_some_seeds_only_or_an_invalid_unmodified_run_fails(tmp_path):
    spec = table_spec(2)
    sometimes = {("volatile-counter", "lease", 0): BAD, ("volatile-counter", "lease", 1): OK,
                 ("volatile-counter", "idempotency", 0): OK, ("volatile-counter", "idempotency", 1): BAD,
                 **{("no-idempotency", "idempotency", s): BAD for s in range(2)},
                 ("renew-revives-expired", "renew-vs-expiry", 0): BAD, **honest(2)}
    report = run_mutants(spec, tmp_path, echo=lambda _: None, run=run_with(sometimes)[0])
    assert not report.is_caught("volatile-counter") and exit_code(report) == 1  # 1/2 and 1/2: no row on every seed
    assert "2/3 mutants caught on every seed (67% detection)" in render_plain(report)
    assert "| volatile-counter | - | 1/2 | 1/2 | - | - | NO |" in render_markdown(report)
    never = {**sometimes, ("renew-revives-expired", "renew-vs-expiry", 0): OK,
             ("renew-revives-expired", "renew-vs-expiry", 1): OK, ("volatile-counter", "lease", 1): BAD}
    report = run_mutants(spec, tmp_path, echo=lambda _: None, run=run_with(never)[0])
    assert report.is_caught("volatile-counter") and not report.is_caught("renew-revives-expired")
    assert "NOT CAUGHT in 2 runs" in render_plain(report) and exit_code(report) == 1
    false_alarm = {**sometimes, ("volatile-counter", "lease", 1): BAD, (None, "idempotency", 1): BAD}
    report = run_mutants(spec, tmp_path, echo=lambda _: None, run=run_with(false_alarm)[0])
    assert all(report.is_caught(m) for m in report.mutants()) and exit_code(report) == 1
    assert [r.unmodified_verdict for r in report.rows] == [True, False, False, True]
    assert "INVALID (2 runs): fencing (duplicate-token)" in render_plain(report)


def test_a_run_that_raises_is_recorded_and_the_table_goes_on(tmp_path):
    def run(test, store_dir):
        if test.mutant == "volatile-counter" and test.workload == "lease":
            raise RuntimeError("the stack did not start")
        if test.mutant is None:
            return fake_results(True)
        return fake_results(False, ["x"])

    report = run_mutants(table_spec(1), tmp_path, echo=lambda _: None, run=run)
    first = report.rows[0].planted[0]
    assert first.valid is None and first.error == "RuntimeError: the stack did not start"
    assert report.rows[1].detected_at == 1 and report.is_caught("volatile-counter")  # its idempotency row
    assert exit_code(report) == 0
    report = run_mutants(parse_spec({"name": "m", "runs": 1, "workloads": ["lease"],
                                     "mutants": {"volatile-counter": {}}}), tmp_path, echo=lambda _: None, run=run)
    assert not report.is_caught("volatile-counter") and exit_code(report) == 1


def test_caught_by_names_each_invalid_checker_with_its_most_frequent_violations():
    res = {"valid": False, "results": {
        "scenario:x": {"valid": False, "violation_counts": {"a": 1, "b": 5, "c": 2, "d": 1}},
        "fencing": {"valid": True}, "deadlines": {"valid": "unknown"}}}
    assert caught_by(res) == ["scenario:x (b, c, a)"]
    assert caught_by({"valid": False}) == ["(the checker)"] and caught_by({"valid": True}) == []


# -- the CI subset, for real ------------------------------------------------------------------------------


RETRIES = 2  # more runs of a mutant the fast subset missed (its catch is a race: docs/mutants.md, the CI subset)


def _fast(store: Path, *only: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, CI="true")
    proc = subprocess.run([sys.executable, "-m", "lab", "mutants", "--fast", "--store-dir", str(store),
                           *(a for m in only for a in ("--only", m))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((store / "mutants" / "summary-fast.json").read_text())


@pytest.mark.timeout(1800)  # its `fencelab mutants --fast` child alone may take 900 s under load, then retries
def test_the_fast_subset_catches_every_mutant_and_the_unmodified_server_passes(tmp_path):
    proc, summary = _fast(tmp_path / "store")
    fast = load_spec(SPEC, fast=True)
    assert [r["mutant"] for r in summary["rows"]] == [e.mutant for e in fast.entries]
    # the unmodified server is valid on every run, first time: never retried
    assert all(r["unmodified"] is True for r in summary["rows"]), proc.stdout[-3000:]
    rows = {r["mutant"]: r for r in summary["rows"]}
    # a catch that is a race (a burst's collision, a clock window meeting a handoff) may miss one run on a loaded
    # machine: the test waits for it, running a missed mutant again up to RETRIES times, each run a whole row
    # (planted and unmodified); `fencelab mutants` itself still says NO for the run that missed
    missed = [m for m, r in rows.items() if r["caught_runs"] != r["planted"]]
    for m in missed:
        for k in range(RETRIES):
            _, again = _fast(tmp_path / f"retry-{m}-{k}", m)
            (row,) = again["rows"]
            assert row["unmodified"] is True, row
            if row["caught_runs"] == row["planted"]:
                rows[m] = row
                break
        else:
            pytest.fail(f"{m} not caught in {1 + RETRIES} fast runs: {proc.stdout[-3000:]}")
    n = len(fast.entries)
    if not missed:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"{n}/{n} mutants caught on every seed (100% detection); unmodified server valid on" in proc.stdout
    for row in rows.values():
        assert row["kind"] == "general" and not row["scenario"], row  # a general workload at its defaults
        assert row["caught_runs"] == row["planted"] == 1 and row["caught_by"] and row["unmodified"] is True, row
        planted = Path(row["planted_runs"][0]["run_dir"])
        test_json = json.loads((planted / "test.json").read_text())
        assert test_json["mutant"] == row["mutant"] and f"--mutant {row['mutant']}" in test_json["replay"]
        assert f"PLANTED BUG: mutant {row['mutant']} is active" in (planted / "stack" / "logs" / "lease-1.log").read_text()
        honest = Path(row["unmodified_runs"][0]["run_dir"])
        assert "PLANTED BUG" not in (honest / "stack" / "logs" / "lease-1.log").read_text()
