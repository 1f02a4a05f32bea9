"""The typed test (lab.testmap): first-class options are fields, one validate(), old test.json still loads."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.cli import main
from lab.runner import RunError, analyze, load_test, replay_command, validate
from lab.testmap import (FIRST_CLASS, OPTIONS, OptionError, RunContext, Test, check_options, field_problem,
                         merge_options, servers_problem)

DATA = Path(__file__).parent / "data" / "lease-run-history.jsonl"

# a test.json as the lab wrote it before the typed fields: every first-class option a key of `extra`
# (`servers` always, `ttl_ms` there too, beside the field; the run's own records: the probe, a SUT's import path)
OLD_TEST_JSON = {
    "name": "old/lease", "workload": "lease", "time_limit": 3.0, "concurrency": 2, "rate": 20.0, "keys": 2,
    "seed": 7, "run_salt": "0a1b2c3d", "ttl_ms": 2000, "nemesis": ["partition"], "nemesis_interval": 1.5,
    "backend": "local", "run_dir": "/somewhere/else", "nodes": ["http://127.0.0.1:1"],
    "client_nodes": ["http://127.0.0.1:1"], "lease_servers": ["http://127.0.0.1:1"], "valkey": None, "store": None,
    "credentials_file": None,
    "extra": {"servers": 3, "mutant": "release-any-owner", "deadline_s": 1.5, "ttl_ms": 500, "store_db": "docs",
              "hold": 1},
    "versions": {"fencelab": "0.1.0"}, "replay": "fencelab test ...", "argv": ["fencelab", "test"],
}


def old_run_dir(tmp_path: Path, test_json: dict) -> Path:
    run_dir = tmp_path / "store" / "old" / "lease" / "20261101T000000.000000Z"
    run_dir.mkdir(parents=True)
    (run_dir / "test.json").write_text(json.dumps(test_json))
    shutil.copy(DATA, run_dir / "history.jsonl")
    return run_dir


def test_an_old_shape_test_json_loads_onto_the_typed_fields_and_is_analyzed_reported_and_replayed(tmp_path):
    run_dir = old_run_dir(tmp_path, OLD_TEST_JSON)
    test = load_test(run_dir)
    assert (test.servers, test.mutant, test.deadline_s, test.store_db) == (3, "release-any-owner", 1.5, "docs")
    assert test.ttl_ms == 500, "the old lease workload read extra's ttl_ms over the field's: the run had 500"
    assert test.extra == {"hold": 1}, "every first-class option left extra; the rest stays"
    assert test.run_dir == run_dir and test.nemesis == ["partition"] and test.seed == 7
    assert field_problem(test) is None, "every loaded field holds its declared type"
    replay = shlex.split(replay_command(test))
    for flag, value in (("--servers", "3"), ("--mutant", "release-any-owner"), ("--ttl-ms", "500"),
                        ("--store-db", "docs"), ("--seed", "7"), ("--nemesis", "partition")):
        assert replay[replay.index(flag) + 1] == value, (flag, replay)

    res = CliRunner().invoke(main, ["analyze", str(run_dir)])  # the checkers rebuilt from the old test.json
    assert res.exit_code in (0, 1, 3) and "Traceback" not in res.output, res.output
    results = json.loads((run_dir / "results.json").read_text())
    assert results["entries"] > 0 and "--mutant release-any-owner" in results["replay"]
    (run_dir / "report.html").unlink(missing_ok=True)
    res = CliRunner().invoke(main, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert (run_dir / "report.html").is_file()


def test_an_old_external_run_drops_the_servers_the_old_cli_always_wrote(tmp_path):
    old = dict(OLD_TEST_JSON, extra={"servers": 2, "urls": ["http://127.0.0.1:9"], "sut": "starintel",
                                     "api_key_file": "/k.txt", "store_url": "http://***@db:5984",
                                     "proxy_urls": True, "sut_import": "m:F", "probe": {"urls": []}})
    test = load_test(old_run_dir(tmp_path, old))
    assert (test.urls, test.sut, test.api_key_file, test.proxy_urls) == (["http://127.0.0.1:9"], "starintel",
                                                                         "/k.txt", True)
    assert test.servers is None, "the old CLI wrote servers=2 beside --url, where it meant nothing"
    assert test.store_url == "http://***@db:5984"
    assert test.extra == {"sut_import": "m:F", "probe": {"urls": []}}  # what the run recorded about itself
    replay = replay_command(test)
    assert "--url http://127.0.0.1:9" in replay and "--servers" not in replay and "--proxy-urls" in replay


def test_a_new_test_json_round_trips_with_no_option_in_extra(tmp_path):
    test = Test(name="n", servers=4, mutant="release-any-owner", scenario=None, deadline_s=0.5, extra={"hold": 1})
    d = json.loads(json.dumps(test.to_json()))
    assert not set(d["extra"]) & set(FIRST_CLASS)
    again = Test.from_json(d)
    assert again.to_json() == test.to_json()


@pytest.mark.parametrize("kw, message", [
    ({"urls": ["http://127.0.0.1:9"], "servers": 3}, "with --url the system under test is external: drop --servers"),
    ({"servers": 17}, "--servers must be between 1 and 16, not 17"),
    ({"servers": 0}, "--servers must be between 1 and 16, not 0"),
    ({"servers": "3"}, "servers must be an integer, not '3'"),
    ({"servers": True}, "servers must be an integer, not True"),
    ({"time_limit": True}, "time_limit must be a number, not True"),
    ({"urls": "http://127.0.0.1:9"}, "urls must be a list, not 'http://127.0.0.1:9'"),
    ({"urls": ["http://127.0.0.1:9", 3]}, "urls[1] must be a string, not 3"),
    ({"deadline_s": 0.0}, "deadline_s must be > 0 seconds, not 0.0"),
    ({"commit_mode": "sometimes"}, "--commit-mode must be one of fenced, unfenced, not 'sometimes'"),
    ({"mutant": "no-such-bug"}, "--mutant: unknown mutant 'no-such-bug'"),
    ({"scenario": "no-such-race"}, "--scenario: unknown scenario 'no-such-race'"),
])
def test_validate_names_the_bad_field_in_one_line(kw, message):
    with pytest.raises(RunError) as e:
        validate(Test(**kw))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_first_class_option_set_in_extra_after_construction_is_refused_not_ignored():
    test = Test()
    test.extra["mutant"] = "release-any-owner"  # the old way: the runner would never see it now
    with pytest.raises(RunError, match=r"extra\['mutant'\]: mutant is a Test field; set test.mutant instead"):
        validate(test)
    # at construction an old-shape extra still works: the option moves to its field
    assert Test(extra={"mutant": "release-any-owner"}).mutant == "release-any-owner"


def test_the_servers_range_is_one_check_shared_by_the_test_and_the_stacks():
    from lab.stack.local import StackError, StackOptions

    assert servers_problem(2) is None and servers_problem(16) is None
    assert servers_problem(17) == "--servers must be between 1 and 16, not 17"
    with pytest.raises(StackError) as e:
        StackOptions(servers=17).validate()
    assert str(e.value) == servers_problem(17)
    with pytest.raises(RunError) as e:
        validate(Test(servers=17))
    assert str(e.value) == servers_problem(17)


def test_option_tables_are_typed_by_one_schema():
    assert check_options({"time_limit": 2, "servers": 3, "deadline_s": 1.0, "commit_mode": "fenced"}) == \
        {"time_limit": 2, "servers": 3, "deadline_s": 1.0, "commit_mode": "fenced"}
    for table, message in (({"concurrency": True}, "concurrency must be an integer number of client processes, "
                                                   "not True"),
                           ({"rate": "fast"}, "rate must be a number of ops/s over all clients, not 'fast'"),
                           ({"servers": 2.0}, "servers must be an integer number of reference lease servers"),
                           ({"backend": "ssh"}, "backend must be local or compose"),
                           ({"commit_mode": "maybe"}, 'commit_mode must be "fenced" or "unfenced", not \'maybe\''),
                           ({"ttl": 3}, "unknown key 'ttl' (did you mean 'ttl_ms'?); known Test options:"),
                           ({"extra": {"deadline_s": "x"}}, "extra.deadline_s must be a number of seconds"),
                           ({"extra": {"scenario": "x"}}, "extra.scenario is set by the runner")):
        with pytest.raises(OptionError) as e:
            check_options(table)
        assert message in str(e.value) and "\n" not in str(e.value), (table, str(e.value))
    # an old spec's `extra = {deadline_s = ...}` lands on the field; free keys stay in extra
    assert check_options({"extra": {"deadline_s": 1.5, "hold": 1}}) == {"extra": {"hold": 1}, "deadline_s": 1.5}
    assert check_options({"extra": {"mutant": "release-any-owner"}}) == {"mutant": "release-any-owner"}
    assert check_options({"time_limit": 2}, allowed=("time_limit",)) == {"time_limit": 2}
    with pytest.raises(OptionError, match="unknown key 'rate'"):
        check_options({"rate": 2}, allowed=("time_limit",))
    assert set(OPTIONS) >= {"time_limit", "servers", "deadline_s", "extra"}


def test_one_merger_later_layers_win_and_extra_tables_merge():
    from lab.campaign import spec as campaign_spec
    import lab.mutants as mutants

    assert merge_options({"rate": 1, "extra": {"a": 1, "b": 1}}, {"rate": 2, "extra": {"b": 2}}) == \
        {"rate": 2, "extra": {"a": 1, "b": 2}}
    assert campaign_spec._merge_options is merge_options and mutants.merge_options is merge_options
    assert not hasattr(mutants, "_merge")


def test_field_problem_accepts_every_default_test():
    assert field_problem(Test()) is None


def test_a_campaign_json_of_an_older_lab_still_matches_its_runs(tmp_path):
    from lab.campaign.spec import parse_spec, validate_plan
    from lab.campaign.state import merge_plan, new_state

    spec = parse_spec({"name": "c", "workloads": ["lease"], "defaults": {"time_limit": 2, "servers": 3},
                       "implementations": {"reference": {}}})
    plan = validate_plan(spec)
    old = new_state(spec, plan, tmp_path)
    entry = old["runs"][0]
    saved = entry["test"]
    # the older lab saved these keys only, with servers in extra
    entry["test"] = {**{k: saved[k] for k in ("name", "workload", "time_limit", "concurrency", "rate", "keys",
                                              "seed", "ttl_ms", "nemesis", "nemesis_interval", "backend")},
                     "extra": {"servers": 3}}
    entry["status"], entry["verdict"] = "done", True
    merged = merge_plan(old, spec, plan, tmp_path)
    assert merged["runs"][0]["status"] == "done" and merged["runs"][0]["verdict"] is True
    entry["test"]["extra"] = {"servers": 4}  # a run of other options is planned again
    assert merge_plan(old, spec, plan, tmp_path)["runs"][0]["status"] == "pending"


def test_the_float_options_are_finite_and_bounded_in_one_check():
    """inf, nan and 1e308 once crashed a run after its stack had started (the generator's ns clock, the fault
    schedule); one check refuses them for every caller of `validate`."""
    from lab.testmap import numbers_problem

    assert numbers_problem(Test()) is None and numbers_problem(Test(deadline_s=None)) is None
    cases = {("time_limit", float("inf")): "--time-limit must be a finite number of seconds, not inf",
             ("time_limit", 0.0): "--time-limit must be > 0 seconds, not 0.0",
             ("time_limit", 1e308): "--time-limit must be between 0 and 604800 seconds, not 1e+308",
             ("rate", float("nan")): "--rate must be a finite number of ops/s, not nan",
             ("rate", 1e-9): "--rate must be between 0.001 and 1000000 ops/s, not 1e-09",
             ("nemesis_interval", float("-inf")): "--nemesis-interval must be a finite number of seconds, not -inf",
             ("deadline_s", float("inf")): "deadline_s must be a finite number of seconds, not inf"}
    for (field, value), message in cases.items():
        test = Test(**{field: value})
        assert numbers_problem(test) == message
        with pytest.raises(RunError) as e:
            validate(test)
        assert str(e.value) == message


def test_a_url_that_is_no_url_is_named_as_such():
    """`--url not-a-url` once reached the probe and read as "cannot reach the system under test"."""
    from lab.testmap import urls_problem

    assert urls_problem(Test(urls=["http://127.0.0.1:9000", "https://lease.example/api"])) is None
    for bad in ("not-a-url", "ftp://host", "http://:80", "http://host:99999"):
        assert urls_problem(Test(urls=[bad])) == (f"--url {bad!r} is not a URL: give the server's base URL, "
                                                 "e.g. http://127.0.0.1:8080")
    assert "user:***@" in urls_problem(Test(urls=["http://user:pw@host:x"])) and "pw" not in urls_problem(
        Test(urls=["http://user:pw@host:x"]))


# -- a validated spec is frozen: what a run adds to it makes a new one (issue 17 item 4) --------------------------

def test_resolve_makes_a_new_sealed_spec_and_leaves_the_given_test_as_it_was():
    from lab.runner import resolve
    from lab.testmap import SpecFrozen

    given = Test(nemesis=[" partition , kill"], time_limit=2.0)
    before = given.to_json()
    validate(given)
    assert given.to_json() == before  # validate checks, it writes nothing (it used to normalise test.nemesis)
    spec, _target = resolve(given)
    assert spec is not given and spec.nemesis == ["partition", "kill"] and given.to_json() == before
    for name, value in (("time_limit", 3.0), ("nemesis", []), ("extra", {}), ("name", "other"), ("run_salt", "x")):
        with pytest.raises(SpecFrozen, match=f"test.{name}: the spec is validated"):
            setattr(spec, name, value)
    assert spec.time_limit == 2.0 and spec.nemesis == ["partition", "kill"]
    spec.run_dir = Path("/tmp/run")  # where the run lands may still be written
    assert spec.run_dir == Path("/tmp/run")
    changed = spec.evolve(time_limit=3.0)  # a change is a new spec, the sealed one stays
    assert changed.time_limit == 3.0 and spec.time_limit == 2.0 and not changed.is_sealed
    changed.nemesis.append("pause")
    assert spec.nemesis == ["partition", "kill"]  # the new spec's lists are its own


def test_a_sealed_spec_refuses_a_write_to_every_field_but_run_dir():
    from dataclasses import fields

    from lab.testmap import RUN_ADDRESSES, RUN_FIELDS, RunValueReadOnly, SpecFrozen

    spec = Test(name="sealed", nemesis=["partition"]).sealed()
    before = spec.to_json()
    assert RUN_FIELDS == {"run_dir"}, "the run's stack fills the run context, never a field of the spec"
    refused = [f.name for f in fields(Test) if f.name != "run_dir"]
    assert {"name", "time_limit", "nemesis", "extra", "live", "sut", "urls"} <= set(refused)
    for name in refused:
        with pytest.raises(SpecFrozen, match=f"^test.{name}: "):
            setattr(spec, name, getattr(Test(), name))
    with pytest.raises(SpecFrozen, match="^test.not_a_field: "):  # nor a new attribute
        spec.not_a_field = 1
    for name in RUN_ADDRESSES:  # the stack's addresses are the run context's, on a sealed spec too
        with pytest.raises(RunValueReadOnly, match=f"set test.live.{name}$"):
            setattr(spec, name, None)
    assert spec.to_json() == before and spec.live is not None
    spec.run_dir = Path("/tmp/landed")
    assert spec.run_dir == Path("/tmp/landed")


def test_the_stacks_addresses_read_through_the_test_and_refuse_a_write_in_one_line():
    from lab.testmap import RUN_ADDRESSES, RunValueReadOnly

    t = Test()
    assert t.nodes == [] and t.lease_servers == [] and t.valkey is None and t.credentials_file is None
    t.live.nodes = ["http://127.0.0.1:1"]
    t.live.valkey = "redis://127.0.0.1:2/0"
    assert t.nodes is t.live.nodes and t.valkey == "redis://127.0.0.1:2/0", "test.nodes reads test.live.nodes"
    for name in RUN_ADDRESSES:
        with pytest.raises(RunValueReadOnly) as e:
            setattr(t, name, ["x"])
        assert str(e.value) == f"test.{name} is read-only: it is the run context's value; set test.live.{name}"
        assert isinstance(e.value, AttributeError)
    assert t.nodes == ["http://127.0.0.1:1"], "a refused write changes nothing"
    with pytest.raises(TypeError, match="nodes"):  # nor a constructor argument: Test(live=RunContext(nodes=...))
        Test(nodes=["n1"])
    assert Test(live=RunContext(nodes=["n1"])).nodes == ["n1"]


def test_test_json_records_the_run_contexts_addresses_and_an_old_one_loads_them_back(tmp_path):
    from lab.testmap import RUN_ADDRESSES

    test = load_test(old_run_dir(tmp_path, OLD_TEST_JSON))  # written by the lab before the run context held them
    assert test.live.lease_servers == ["http://127.0.0.1:1"] and test.live.nodes == ["http://127.0.0.1:1"]
    assert test.live.valkey is None and test.live.credentials_file is None
    d = test.to_json()
    assert {k: d[k] for k in RUN_ADDRESSES} == {k: OLD_TEST_JSON[k] for k in RUN_ADDRESSES}
    keys = list(d)  # the addresses sit where test.json always had them: after run_dir, before extra
    assert keys[keys.index("run_dir") + 1:keys.index("extra")] == list(RUN_ADDRESSES)
    fresh = Test().to_json()  # a test that never ran records them empty, as before
    assert (fresh["nodes"], fresh["lease_servers"], fresh["valkey"], fresh["store"]) == ([], [], None, None)
    t = Test(live=RunContext(store_url="http://admin:s3cret@127.0.0.1:5984", store="http://127.0.0.1:5984"))
    assert t.to_json()["store"] == "http://127.0.0.1:5984" and "s3cret" not in json.dumps(t.to_json())


def test_prepare_run_and_a_scenario_resolve_into_new_specs():
    from lab.runner import prepare_run
    from lab.scenarios import apply_scenario, scenario_workload

    given = Test(nemesis=["partition"], time_limit=2.0, nemesis_interval=1.0)
    before = given.to_json()
    spec = prepare_run(given)
    assert spec.is_sealed and spec.run_salt and "nemesis_schedule" in spec.extra
    assert given.to_json() == before  # no salt, no schedule written into the given test
    plain = Test()
    scen = apply_scenario(plain.evolve(scenario="concurrent-acquires"))
    assert plain.to_json() == Test().to_json() and scen.name == "scenario-concurrent-acquires"
    sealed = prepare_run(scen)
    run_spec, wl = scenario_workload(sealed)
    assert run_spec.is_sealed and "key_nonce" in run_spec.extra and "key_nonce" not in sealed.extra
    assert wl.name == "scenario:concurrent-acquires"


def test_the_run_context_is_typed_for_the_lab_and_a_mapping_for_a_plug_in():

    t = Test()
    assert isinstance(t.live, RunContext) and t.live.stack is None and "stack" not in t.live
    assert t.live.get("store_url") is None and len(t.live) == 0
    with pytest.raises(KeyError):
        t.live["stack"]
    t.live.store_url = "http://admin:s3cret@127.0.0.1:5984"
    t.live.sut_api_key = "k-very-secret"
    assert t.live["store_url"] == t.live.store_url and "store_url" in t.live
    table = t.live.setdefault("my_table", {"rows": 1})  # a plug-in's own entry, by its own name
    assert t.live.setdefault("my_table", {}) is table and t.live.plugins == {"my_table": table}
    t.live["client_pauses"] = pauses = object()  # a typed name set as a mapping lands on its attribute
    assert t.live.client_pauses is pauses
    assert set(t.live) == {"store_url", "sut_api_key", "client_pauses", "my_table"}
    assert t.evolve(seed=3).live is t.live  # one context per run, whatever spec the run resolves to
    assert "s3cret" not in repr(t.live) and "k-very-secret" not in repr(t.live)  # names only: secrets stay out
    assert "live" not in t.to_json() and "s3cret" not in json.dumps(t.to_json())
    t.live.plugin_errors.append("boom")
    del t.live["my_table"], t.live["plugin_errors"]
    assert "my_table" not in t.live and t.live.plugin_errors == []
