"""Named scenarios, run for real: each on a fresh local stack (a few seconds), and how the CLI and campaigns take them.

The runs are short (time_limit 1 s: each scenario's minimum number of rounds).
The checkers' sensitivity is shown in test_scenario_checkers.py; here the
point is that the scripts really provoke their races against the reference
server and the required result holds (valid True, not "unknown").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.cli import main
from lab.runner import RunError, analyze, run_test, validate
from lab.scenarios import SCENARIOS, ScenarioError, apply_scenario, get_scenario
from lab.testmap import Test


def scenario_test(name: str, **extra) -> Test:
    """The Test `fencelab test --scenario NAME --time-limit 1` would run."""
    test = Test(extra={"servers": 2, "scenario": name, **extra})
    test = apply_scenario(test, {"time_limit"})
    test.time_limit = 1.0
    return test


def scenario_result(results: dict, name: str) -> dict:
    return results["results"][f"scenario:{name}"]


# extra evidence some scenarios must show on the reference server, beyond "judged, and valid"
EXPECTED = {
    "older-holder-commit": lambda mine: set(mine["enforcement_points"]) >= {"lease-validation", "store-guard"},
    "commit-after-expiry": lambda mine: mine["commits_after_expiry"] >= 2,
    "changed-body-same-request-id": lambda mine: mine["idempotency_conflicts"] > 0,
    "identity-probe": lambda mine: mine["spellings_same_lease"] > 0 and mine["distinct_acquired"] == 8,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_runs_live_and_the_reference_server_holds(tmp_path, name):
    """Every registered race and probe, on its own fresh stack (its faults need one), at the shortest depth.

    The scenario's own checker must have judged its row (valid True: the race was hit, not "unknown") and no
    checker may find a violation; a domain checker the scenario gives nothing to compare may say "unknown" in
    its own result (the run's verdict is the row's: test_a_scenario_run_is_judged_by_its_row).
    Before this test 12 of the 23 never ran live in CI, and two of those were wrong on the unmodified server
    (backend-unavailable convicted the recovery rule's revocation; counter-near-limit never reached the limit).
    """
    results = run_test(scenario_test(name), tmp_path / "store")
    mine = scenario_result(results, name)
    verdicts = {k: (v["valid"], v.get("violations", [])[:2], v.get("not_exercised") or v.get("reason"))
                for k, v in results["results"].items()}
    assert mine["valid"] is True and "not_exercised" not in mine, verdicts
    assert not [k for k, v in results["results"].items() if v["valid"] is False], verdicts
    assert mine["tagged_ops"] > 0 and results["valid"] is True, verdicts
    if name in EXPECTED:
        assert EXPECTED[name](mine), mine
    assert Path(results["report"]).exists()


def test_a_scenario_run_is_judged_by_its_row():
    """A domain checker with nothing to compare does not make the row's verdict unknown; anything else does."""
    from lab.scenarios.scenario import ScenarioCompose

    class Fixed:
        def __init__(self, res):
            self.res = res

        def check(self, test, history, opts):
            return dict(self.res)

    history = [{"type": "invoke", "process": 0, "f": "acquire", "key": "k0", "value": {}, "time": 1, "index": 0},
               {"type": "ok", "process": 0, "f": "acquire", "key": "k0", "value": {}, "time": 2, "index": 1}]

    def verdict(row, domain):
        return ScenarioCompose({"scenario:x": Fixed(row), "fencing": Fixed(domain)}, "scenario:x").check(
            {}, history, {})

    idle = verdict({"valid": True}, {"valid": "unknown", "reason": "no key was acquired twice"})
    assert idle["valid"] is True and idle["nothing_to_compare"] == ["fencing"]
    assert verdict({"valid": True}, {"valid": False})["valid"] is False
    assert verdict({"valid": False}, {"valid": "unknown"})["valid"] is False
    assert verdict({"valid": "unknown"}, {"valid": True})["valid"] == "unknown"
    assert verdict({"valid": True}, {"valid": "unknown", "error": "KeyError: x"})["valid"] == "unknown"
    assert ScenarioCompose({"scenario:x": Fixed({"valid": True})}, "scenario:x").check({}, [], {})["valid"] == \
        "unknown", "an empty history is never a pass"


def test_analyze_rejudges_a_scenario_run_with_its_own_checker(tmp_path):
    results = run_test(scenario_test("changed-body-same-request-id"), tmp_path / "store")
    run_dir = Path(results["report"]).parent
    again = analyze(run_dir)
    assert again["valid"] is True and "scenario:changed-body-same-request-id" in again["results"]
    saved = json.loads((run_dir / "test.json").read_text())
    assert saved["scenario"] == "changed-body-same-request-id" and saved["extra"]["key_nonce"]
    assert "--scenario changed-body-same-request-id" in saved["replay"]


def test_the_cli_runs_a_scenario_and_prints_a_replay_with_it(tmp_path):
    res = CliRunner().invoke(main, ["test", "--scenario", "concurrent-acquires", "--time-limit", "1",
                                    "--store-dir", str(tmp_path / "store")])
    assert res.exit_code == 0, res.output
    assert "scenario-concurrent-acquires" in res.output and "--scenario concurrent-acquires" in res.output
    test = json.loads(next((tmp_path / "store" / "scenario-concurrent-acquires").glob("2*/test.json")).read_text())
    assert test["concurrency"] == 8 and test["time_limit"] == 1.0  # the scenario's option; the user's time limit


@pytest.mark.parametrize("args, message", [
    (["--scenario", "no-such-race"], "unknown scenario 'no-such-race'; known: concurrent-acquires"),
    (["--scenario", "concurrent-acquires", "--nemesis", "kill"], "brings its own faults"),
    (["--scenario", "renew-vs-release", "--concurrency", "1"], "--concurrency must be >= 2"),
    (["--scenario", "server-crash-after-commit", "--servers", "1"], "needs 2 lease servers"),
    (["--scenario", "commit-after-expiry", "--workload", "lease"], "runs on the 'fenced-append' workload"),
    (["--scenario", "malformed-record", "--url", "http://127.0.0.1:9"],
     "not applicable to an external system: it writes corrupt records"),
])
def test_the_cli_refuses_a_scenario_that_cannot_run_here(tmp_path, args, message):
    res = CliRunner().invoke(main, ["test", *args, "--store-dir", str(tmp_path / "store")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "store").exists()


def test_every_scenario_validates_on_the_local_stack():
    for name in SCENARIOS:
        validate(scenario_test(name))


def test_a_scenario_against_an_external_server(tmp_path):
    """The lab's own stack, used as an external system: the scenario runs without touching its processes."""
    from lab.stack.local import LocalStack, StackOptions
    from workloads.common import pick_credential

    stack = LocalStack(name="ext", root=tmp_path / "ext", die_with_parent=True)
    try:
        status = stack.up(StackOptions(servers=1, store=False))
        key = tmp_path / "key"
        key.write_text(pick_credential(json.loads(Path(status.credentials).read_text()))["api_key"])
        test = scenario_test("changed-body-same-request-id", urls=[status.lease_servers[0]], api_key_file=str(key))
        results = run_test(test, tmp_path / "store")
        assert results["valid"] is True and scenario_result(results, "changed-body-same-request-id")[
            "idempotency_conflicts"] > 0
        assert test.nemesis == [] and not (test.run_dir / "stack").exists()
        with pytest.raises(RunError, match="not applicable to an external system"):
            validate(scenario_test("counter-near-limit", urls=[status.lease_servers[0]], api_key_file=str(key)))
    finally:
        stack.down()


def test_campaign_specs_take_scenario_options(tmp_path):
    from lab.campaign import load_spec, validate_plan

    spec = tmp_path / "c.toml"
    spec.write_text('name = "c"\nworkloads = ["lease"]\n[scenarios.race]\nscenario = "renew-vs-expiry"\n'
                    '[scenarios.race2]\nscenario = "concurrent-acquires"\nconcurrency = 3\n')
    runs = validate_plan(load_spec(spec))
    tests = {r.scenario: r.to_test() for r in runs}
    assert tests["race"].ttl_ms == 300 and tests["race"].scenario == "renew-vs-expiry"
    assert tests["race2"].concurrency == 3  # the table overrides the named scenario


def test_scenario_registry_is_complete_and_documented():
    races = [s for s in SCENARIOS.values() if not s.race.startswith("matrix")]
    assert len(races) == 17
    from lab.scenarios.docs import render

    docs = (Path(__file__).resolve().parent.parent / "docs" / "scenarios.md").read_text()
    assert docs == render(), "docs/scenarios.md is stale: python -m lab.scenarios.docs > docs/scenarios.md"
    for name, sc in SCENARIOS.items():
        assert f"### `{name}`" in docs and sc.rules and sc.requires and sc.setup and sc.checks
    with pytest.raises(ScenarioError, match="unknown scenario"):
        get_scenario("nope")


@pytest.mark.parametrize("name, settings, kind", [
    ("backup-restore", {"recovery": "off"}, "token-regressed"),
    ("older-holder-commit", {"commit_mode": "unfenced"}, "older-holder-committed"),
])
def test_scenarios_catch_the_servers_planted_bugs(tmp_path, monkeypatch, name, settings, kind):
    """Against a mutant server (docs/server.md: planted bugs) the scenario's checker says invalid."""
    import lab.stack.local
    from lab.stack.leaseserver import LeaseServerProcess

    class MutantServer(LeaseServerProcess):
        def __init__(self, run_dir, **kw):
            config = Path(run_dir) / "mutant.json"
            config.write_text(json.dumps(settings))
            super().__init__(run_dir, config_file=config, extra_args=["--allow-mutants"], **kw)

    monkeypatch.setattr(lab.stack.local, "LeaseServerProcess", MutantServer)
    results = run_test(scenario_test(name), tmp_path / "store")
    mine = scenario_result(results, name)
    assert results["valid"] is False and kind in mine["violation_counts"], mine
