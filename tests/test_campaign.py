"""Campaign specs (eager validation, expansion) and the campaign machinery (state, resume, exit codes, page).

The machinery tests swap `lab.runner.run_test` (and `run_unjudged`, what a campaign
calls) for a test double that writes a real run directory (test.json, history.jsonl, results.json) without starting a
stack; tests/test_campaign_e2e.py runs real campaigns.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab import runner
from lab.campaign import CampaignError, expand, load_spec, parse_spec, run_campaign, validate_plan
from lab.campaign.state import CampaignLock, campaign_dir, settle
from lab.cli import main

GOOD = """
name = "c1"
workloads = ["lease"]
[defaults]
time_limit = 2
"""


def spec_file(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def invoke(*args: str):
    return CliRunner().invoke(main, ["campaign", *args])


# -- validation: one line, exit 2, nothing written -------------------------------------------

BAD_SPECS = [
    ("workloads = ['lease']", "missing key 'name'"),
    ("name = 'c'", "missing key 'workloads'"),
    ("name = 'a/b'\nworkloads = ['lease']", "name: the campaign name must be"),
    ("name = 'campaigns'\nworkloads = ['lease']", "reserved"),
    ("name = 'c'\nworkloads = ['lease']\nrepititions = 2", "unknown key 'repititions' (did you mean 'repetitions'?)"),
    ("name = 'c'\nworkloads = ['lease']\nworkload = 'lease'", "the axis is 'workloads'"),
    ("name = 'c'\nworkloads = ['nope']", "workloads[0]: unknown workload 'nope'; known workloads:"),
    ("name = 'c'\nworkloads = []", "workloads must be a non-empty list"),
    ("name = 'c'\nworkloads = ['lease', 'lease']", "lease given more than once"),
    ("name = 'c'\nworkloads = ['lease']\nnemeses = ['none', 'partitoin']", "nemeses[1]: unknown nemesis partitoin"),
    ("name = 'c'\nworkloads = ['lease']\nnemeses = [['none', 'kill']]", '"none" cannot be combined'),
    ("name = 'c'\nworkloads = ['lease']\nnemeses = ['kill', ['kill']]", "nemesis 'kill' given more than once"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\ntime-limit = 2", "unknown key 'time-limit' (did you mean 'time_limit'?)"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\nseed = 3", "'seed' is an axis of the campaign"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\nrate = 'fast'", "rate must be a number of ops/s"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\nconcurrency = 2.5", "concurrency must be an integer"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\nservers = 40", "servers must be between 1 and 16"),
    ("name = 'c'\nworkloads = ['lease']\n[scenarios.x]\nttl = 3", "[scenarios.x]: unknown key 'ttl' (did you mean 'ttl_ms'?)"),
    ("name = 'c'\nworkloads = ['lease']\n[scenarios.x]\nscenario = 'no-such-race'", "unknown scenario 'no-such-race'"),
    ("name = 'c'\nworkloads = ['lease']\nimplementations = ['acme']", "implementations[0]: unknown implementation 'acme'"),
    ("name = 'c'\nworkloads = ['lease']\nimplementations = [{name = 'reference', url = 'http://x'}]", "takes no url"),
    ("name = 'c'\nworkloads = ['lease']\nseeds = 0", "seeds must be a count >= 1"),
    ("name = 'c'\nworkloads = ['lease']\nseeds = [1, true]", "seeds must be a count"),
    ("name = 'c'\nworkloads = ['lease']\nseeds = [4, 4]", "4 given more than once"),
    ("name = 'c'\nworkloads = ['lease']\nrepetitions = 0", "repetitions must be an integer >= 1"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\nrate = -5", "run lease-none-default-reference-s0-r0: rate must be > 0"),
    ("name = 'c'\nworkloads = ['lease']\n[scenarios.slow]\ntime_limit = 0",
     "run lease-none-slow-reference-s0-r0: time_limit must be > 0"),
    ("name = 'c'\nworkloads = ['lease'", "invalid TOML"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\ntime_limit = inf",
     "run lease-none-default-reference-s0-r0: time_limit must be a finite number of seconds, not inf"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\nrate = 1e308", "rate must be between 0.001 and 1000000 ops/s"),
    ("name = 'c'\nworkloads = ['lease']\n[defaults]\nnemesis_interval = nan",
     "nemesis_interval must be a finite number of seconds, not nan"),
]


@pytest.mark.parametrize("text,needle", BAD_SPECS)
def test_bad_spec_is_one_line_exit_2_and_writes_nothing(tmp_path, text, needle):
    store = tmp_path / "store"
    res = invoke(str(spec_file(tmp_path, text)), "--store-dir", str(store))
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert res.output.count("\n") == 1 and res.output.startswith("fencelab: error: ")
    assert "Traceback" not in res.output
    assert not store.exists(), "nothing may be written before the spec is valid"


def test_missing_file_and_wrong_suffix_are_refused(tmp_path):
    res = invoke(str(tmp_path / "nope.toml"))
    assert res.exit_code == 2 and "no such spec file" in res.output
    res = invoke(str(spec_file(tmp_path, GOOD, "spec.json")))
    assert res.exit_code == 2 and "a spec is a .toml file" in res.output


def test_yaml_spec_is_read_like_toml(tmp_path):
    pytest.importorskip("yaml")
    p = spec_file(tmp_path, "name: y\nworkloads: [lease]\nnemeses: [none, partition]\ndefaults: {time_limit: 2}\n",
                  "spec.yaml")
    res = invoke(str(p), "--dry-run")
    assert res.exit_code == 0, res.output
    assert "y/lease-partition-default-reference-s0-r0" in res.output
    assert "time_limit=2" in res.output


# -- expansion --------------------------------------------------------------------------------

FULL = """
name = "matrix"
workloads = ["lease", "idempotency"]
nemeses = ["none", "partition", ["partition", "kill"]]
seeds = [7, 11, 13]
repetitions = 2
[defaults]
time_limit = 3
rate = 20
extra = { deadline_s = 1.5 }
[scenarios.base]
[scenarios.short-ttl]
ttl_ms = 300
extra = { hold = 1 }
"""


def test_expansion_is_the_product_of_the_axes(tmp_path):
    spec = load_spec(spec_file(tmp_path, FULL))
    plan = validate_plan(spec)
    assert len(plan) == 2 * 3 * 2 * 1 * 3 * 2
    ids = [r.id for r in plan]
    assert len(set(ids)) == len(ids)
    assert "idempotency-partition+kill-short-ttl-reference-s13-r1" in ids
    run = next(r for r in plan if r.id == "lease-partition+kill-short-ttl-reference-s7-r0")
    test = run.to_test()
    assert test.name == "matrix/lease-partition+kill-short-ttl-reference-s7-r0"
    assert (test.workload, test.seed, test.nemesis) == ("lease", 7, ["partition", "kill"])
    assert (test.time_limit, test.rate, test.ttl_ms) == (3, 20, 300)  # the scenario overrides the defaults
    # extra tables merge; a first-class option an old spec gives in `extra` lands on its typed field
    assert test.extra == {"hold": 1} and test.deadline_s == 1.5
    assert test.servers is None and test.server_count() == 2  # not given: the stack's default
    base = next(r for r in plan if r.id == "lease-none-base-reference-s7-r0").to_test()
    assert base.ttl_ms == 2000 and base.nemesis == []
    res = invoke(str(tmp_path / "spec.toml"), "--dry-run", "--store-dir", str(tmp_path / "store"))
    assert res.exit_code == 0
    assert res.output.splitlines()[0] == "campaign matrix: 72 runs (" + str(tmp_path / "spec.toml") + ")"
    assert len(res.output.splitlines()) == 73
    assert not (tmp_path / "store").exists(), "--dry-run writes nothing"


def test_counts_of_seeds_and_defaults_of_the_axes():
    spec = parse_spec({"name": "d", "workloads": ["lease"], "seeds": 3})
    assert spec.seeds == [0, 1, 2] and spec.repetitions == 1
    assert list(spec.nemeses) == ["none"] and [s.name for s in spec.scenarios] == ["default"]
    assert [i.name for i in spec.implementations] == ["reference"]
    assert [r.id for r in expand(spec)] == [f"lease-none-default-reference-s{i}-r0" for i in range(3)]


def test_a_spec_must_be_a_table():
    with pytest.raises(CampaignError, match="a spec is a table of keys"):
        parse_spec(["name"], source="x")


# -- the machinery, with a run_test double ------------------------------------------------------


class FakeRunner:
    """Stands in for lab.runner.run_test: a real run directory, a verdict chosen per run id, no stack."""

    def __init__(self, verdicts: dict[str, object], report: bool = True):
        self.verdicts = verdicts  # id -> True | False | "unknown" | an exception to raise
        self.report = report  # write report.html, as `fencelab test` does
        self.calls: list[str] = []

    def __call__(self, test, store_dir, **kw):
        run_id = test.name.split("/", 1)[1]
        self.calls.append(run_id)
        test.run_dir = runner.new_run_dir(store_dir, test.name)
        runner.write_test_json(test)
        outcome = self.verdicts.get(run_id, True)
        if isinstance(outcome, BaseException):
            raise outcome
        ops = [{"index": 0, "time": 0, "type": "invoke", "process": 0, "f": "write", "value": 1},
               {"index": 1, "time": 2_000_000, "type": "ok", "process": 0, "f": "write", "value": 1},
               {"index": 2, "time": 3_000_000, "type": "invoke", "process": 1, "f": "read", "value": None},
               {"index": 3, "time": 9_000_000, "type": "fail", "process": 1, "f": "read", "value": None}]
        (test.run_dir / "history.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ops))
        results = {"valid": outcome, "results": {}, "ops": len(ops)}
        (test.run_dir / "results.json").write_text(json.dumps(results))
        if self.report:
            (test.run_dir / "report.html").write_text("<!doctype html><title>report</title>")
        return results

    def unjudged(self, test, store_dir, *, before_workload=None, phases=None, report=True):
        """Stands in for lab.runner.run_unjudged (what a campaign calls): the run, then its judge."""
        results = self(test, store_dir)
        if phases is not None:
            phases.update(up=0.25, workload=1.0)
        if before_workload is not None:
            before_workload()

        def judge():
            if phases is not None:
                phases.update(down=0.125, judge=0.5)
            return results
        return judge

    def install(self, monkeypatch):
        """Both seams: `fencelab test`'s run_test and a campaign's run_unjudged."""
        monkeypatch.setattr(runner, "run_test", self)
        monkeypatch.setattr(runner, "run_unjudged", self.unjudged)
        return self


SMALL = """
name = "m"
workloads = ["lease"]
nemeses = ["none", "partition"]
seeds = 2
[defaults]
time_limit = 1
"""


def campaign(tmp_path, fake, monkeypatch, text=SMALL, resume=True):
    fake.install(monkeypatch)
    lines: list[str] = []
    out = run_campaign(load_spec(spec_file(tmp_path, text)), tmp_path / "store", resume=resume,
                       echo=lines.append, fancy=False)
    return out, lines


def state_of(tmp_path, name="m"):
    return json.loads((campaign_dir(tmp_path / "store", name) / "campaign.json").read_text())


def test_a_failing_run_is_recorded_and_the_campaign_goes_on_then_resume_retries_only_it(tmp_path, monkeypatch):
    bad = "lease-partition-default-reference-s0-r0"
    fake = FakeRunner({bad: RuntimeError("stack failed to start: port in use")})
    out, lines = campaign(tmp_path, fake, monkeypatch)
    assert out.exit_code == 3
    assert len(fake.calls) == 4, "every run is attempted after one fails"
    st = state_of(tmp_path)
    by_id = {e["id"]: e for e in st["runs"]}
    assert by_id[bad]["status"] == "failed"
    assert by_id[bad]["error"] == "RuntimeError: stack failed to start: port in use"
    assert by_id[bad]["run_dir"] and (tmp_path / "store" / by_id[bad]["run_dir"]).is_dir()
    assert all(e["status"] == "done" and e["verdict"] is True for i, e in by_id.items() if i != bad)
    assert any("FAILED (RuntimeError: stack failed to start" in line for line in lines)
    page = out.page.read_text()
    assert 'class="run failed"' in page and "stack failed to start" in page
    done_dirs = {i: e["run_dir"] for i, e in by_id.items() if i != bad}

    fake2 = FakeRunner({})
    out2, _ = campaign(tmp_path, fake2, monkeypatch)
    assert fake2.calls == [bad], "only the failed run is run again"
    assert out2.exit_code == 0
    st2 = {e["id"]: e for e in state_of(tmp_path)["runs"]}
    assert all(st2[i]["run_dir"] == d for i, d in done_dirs.items())
    assert st2[bad]["status"] == "done"


@pytest.mark.parametrize("verdicts,code", [
    ({}, 0),
    ({"lease-none-default-reference-s1-r0": "unknown"}, 3),
    ({"lease-none-default-reference-s1-r0": "unknown", "lease-partition-default-reference-s0-r0": False}, 1),
    ({"lease-none-default-reference-s0-r0": RuntimeError("x"), "lease-none-default-reference-s1-r0": False}, 1),
])
def test_exit_code_follows_the_verdicts(tmp_path, monkeypatch, verdicts, code):
    out, _ = campaign(tmp_path, FakeRunner(verdicts), monkeypatch)
    assert out.exit_code == code


def test_ctrl_c_saves_the_state_and_resume_settles_the_interrupted_run(tmp_path, monkeypatch):
    victim = "lease-none-default-reference-s1-r0"
    fake = FakeRunner({victim: KeyboardInterrupt()})
    out, lines = campaign(tmp_path, fake, monkeypatch)
    assert out.interrupted and out.exit_code == 130
    assert fake.calls == ["lease-none-default-reference-s0-r0", victim], "nothing runs after Ctrl-C"
    by_id = {e["id"]: e for e in state_of(tmp_path)["runs"]}
    assert by_id[victim]["status"] == "pending" and by_id[victim]["run_dir"]
    assert "INTERRUPTED" in lines[-2]
    # the interrupted run has a run dir with test.json but no history: resume runs it again
    fake2 = FakeRunner({})
    out2, lines2 = campaign(tmp_path, fake2, monkeypatch)
    assert fake2.calls == [victim, "lease-partition-default-reference-s0-r0", "lease-partition-default-reference-s1-r0"]
    assert out2.exit_code == 0
    assert any("interrupted before its history had ops" in line for line in lines2)


def test_settle_running_entries(tmp_path):
    store = tmp_path
    base = {"id": "x", "test": {"name": "c/x"}, "status": "running", "run_dir": None, "started": "20200101T000000.000000Z",
            "verdict": None, "ops": None, "note": None, "error": None}
    e = dict(base)
    settle(e, store)
    assert e["status"] == "pending" and "before its run directory existed" in e["note"]
    run_dir = store / "c" / "x" / "20200101T000001.000000Z"
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({"valid": False, "ops": 12}))
    e = dict(base)
    settle(e, store)
    assert (e["status"], e["verdict"], e["ops"], e["run_dir"]) == ("done", False, 12, "c/x/20200101T000001.000000Z")
    e = dict(base, started="20200101T000002.000000Z")  # a directory older than the start is another attempt's
    settle(e, store)
    assert e["status"] == "pending"
    done = dict(base, status="done", run_dir="c/x/gone", verdict=True)
    settle(done, store)
    assert done["status"] == "pending" and "gone" in done["note"]


def test_a_changed_spec_keeps_matching_finished_runs_and_plans_the_rest(tmp_path, monkeypatch):
    fake = FakeRunner({})
    campaign(tmp_path, fake, monkeypatch)
    more = SMALL.replace("seeds = 2", "seeds = 3").replace('nemeses = ["none", "partition"]', 'nemeses = ["none"]')
    fake2 = FakeRunner({})
    out, _ = campaign(tmp_path, fake2, monkeypatch, text=more)
    assert fake2.calls == ["lease-none-default-reference-s2-r0"]
    st = state_of(tmp_path)
    assert len(st["runs"]) == 3 and st["dropped"] == ["lease-partition-default-reference-s0-r0",
                                                      "lease-partition-default-reference-s1-r0"]
    slower = more.replace("time_limit = 1", "time_limit = 2")
    fake3 = FakeRunner({})
    campaign(tmp_path, fake3, monkeypatch, text=slower)
    assert len(fake3.calls) == 3, "runs whose options changed are run again"


def test_no_resume_starts_over_and_keeps_the_old_state(tmp_path, monkeypatch):
    campaign(tmp_path, FakeRunner({}), monkeypatch)
    fake = FakeRunner({})
    campaign(tmp_path, fake, monkeypatch, resume=False)
    assert len(fake.calls) == 4
    kept = list(campaign_dir(tmp_path / "store", "m").glob("campaign-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["name"] == "m"


def test_one_process_per_campaign(tmp_path, monkeypatch):
    cdir = campaign_dir(tmp_path / "store", "m")
    cdir.mkdir(parents=True)
    with CampaignLock(cdir):
        with pytest.raises(CampaignError, match="is being run by pid"):
            campaign(tmp_path, FakeRunner({}), monkeypatch)


def test_page_matrix_links_and_availability(tmp_path, monkeypatch):
    out, _ = campaign(tmp_path, FakeRunner({"lease-partition-default-reference-s1-r0": False}), monkeypatch)
    page = out.page.read_text()
    hrefs = re.findall(r'class="run (\w+)" href="([^"]+)"', page)
    assert sorted(c for c, _ in hrefs) == ["invalid", "valid", "valid", "valid"]
    for _, href in hrefs:
        assert (out.page.parent / href).resolve().is_file(), href
        assert href.endswith("/report.html")
    assert "<script" not in page and "http" not in page, "self-contained, nothing fetched"
    # two client ops per run: one ok (2 ms), one fail (6 ms): pooled over the two runs of each nemesis
    row = re.search(r"<tr><td>partition</td>(.*?)</tr>", page, re.S).group(1)
    cells = re.findall(r'<td class="num">([^<]*)', row)
    assert cells[:4] == ["2", "4", "50.0%", "100.0%"]
    assert cells[-4:] == ["4.0", "6.0", "6.0", "6.0"]


def test_escaping_in_the_page(tmp_path, monkeypatch):
    text = SMALL.replace('name = "m"', 'name = "m"\ndescription = "<b>bold</b> & co"')
    out, _ = campaign(tmp_path, FakeRunner({}), monkeypatch, text=text)
    page = out.page.read_text()
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in page and "<b>bold</b>" not in page


def test_without_a_report_the_badge_links_results_json(tmp_path, monkeypatch):
    import lab.report

    def broken(run_dir):
        raise lab.report.ReportError("no plots today")

    monkeypatch.setattr(lab.report, "write_report", broken)
    out, _ = campaign(tmp_path, FakeRunner({}, report=False), monkeypatch)
    hrefs = re.findall(r'class="run \w+" href="([^"]+)"', out.page.read_text())
    assert len(hrefs) == 4 and all(h.endswith("/results.json") for h in hrefs)
    assert all((out.page.parent / h).resolve().is_file() for h in hrefs)
    assert all("no report.html (ReportError: no plots today)" == e["note"] for e in state_of(tmp_path)["runs"])


def test_progress_bar_mode_reports_every_run(tmp_path, monkeypatch, capsys):
    FakeRunner({}).install(monkeypatch)
    out = run_campaign(load_spec(spec_file(tmp_path, SMALL)), tmp_path / "store", echo=lambda s: None, fancy=True)
    printed = capsys.readouterr().out
    assert out.exit_code == 0
    for k in range(1, 5):
        assert f"[{k}/4] " in printed


def test_other_implementations_come_from_lab_sut(tmp_path, monkeypatch):
    monkeypatch.delenv("FENCELAB_API_KEY", raising=False)
    key = tmp_path / "key"
    key.write_text("star_sk_v1_cred1_00ff\n")
    text = f"""
        name = "impls"
        workloads = ["lease"]
        [implementations.reference]
        [implementations.star]
        sut = "starintel"
        url = "http://127.0.0.1:9"
        api_key_file = "{key}"
    """
    plan = validate_plan(load_spec(spec_file(tmp_path, text)))
    assert [r.id for r in plan] == ["lease-none-default-reference-s0-r0", "lease-none-default-star-s0-r0"]
    ref, star = plan[0].to_test(), plan[1].to_test()
    assert (ref.sut, ref.urls, ref.api_key_file, ref.server_count(), ref.extra) == ("reference", [], None, 2, {})
    assert (star.sut, star.urls, star.api_key_file, star.servers, star.extra) == \
        ("starintel", ["http://127.0.0.1:9"], str(key), None, {})
    # servers is the lab's own stack: beside an implementation's url it is refused (as `fencelab test` refuses it)
    res = invoke(str(spec_file(tmp_path, text.replace('workloads = ["lease"]',
                                                      'workloads = ["lease"]\n[defaults]\nservers = 3'))), "--dry-run")
    assert res.exit_code == 2 and "run lease-none-default-star-s0-r0: servers sets how many lease servers" in res.output
    assert "drop servers" in res.output
    # lab.sut checks each run before anything starts: fenced-append needs `commit`, which starintel lacks
    res = invoke(str(spec_file(tmp_path, text.replace('["lease"]', '["fenced-append"]'))), "--dry-run")
    assert res.exit_code == 2 and "run fenced-append-none-default-star-s0-r0: workload 'fenced-append' needs commit" \
        in res.output
    res = invoke(str(spec_file(tmp_path, text.replace(f'api_key_file = "{key}"', ""))), "--dry-run")
    assert res.exit_code == 2 and "no API key for the system under test: pass api_key_file" in res.output


def test_named_scenarios_come_from_lab_scenarios(tmp_path):
    from lab.scenarios import SCENARIOS

    text = """
        name = "races"
        workloads = ["lease"]
        [scenarios.race]
        scenario = "concurrent-acquires"
        rate = 5
    """
    (run,) = validate_plan(load_spec(spec_file(tmp_path, text)))
    test = run.to_test()
    options = SCENARIOS["concurrent-acquires"].options
    assert test.rate == 5, "an option set in the campaign wins over the scenario's"
    assert (test.concurrency, test.ttl_ms) == (options["concurrency"], options["ttl_ms"])
    assert test.scenario == "concurrent-acquires" and "scenario" not in test.extra
    res = invoke(str(spec_file(tmp_path, text.replace('"concurrent-acquires"', '"nope"'))), "--dry-run")
    assert res.exit_code == 2 and "unknown scenario 'nope'" in res.output and "concurrent-acquires" in res.output


def test_the_demo_campaign_is_valid_and_small():
    demo = Path(__file__).resolve().parent.parent / "campaigns" / "demo.toml"
    spec = load_spec(demo)
    plan = validate_plan(spec)
    assert len(plan) == 6 and {r.workload for r in plan} == {"lease", "fenced-append"}
    assert all(r.to_test().time_limit <= 5 for r in plan)


def test_public_surface():
    import lab.campaign

    for name in lab.campaign.__all__:
        assert hasattr(lab.campaign, name), name


# -- what a verdict does not cover: faults never injected, cut-short runs (issue 18, items 4 and 6) ---------------
class CutShort(FakeRunner):
    """Writes the run's history, then is interrupted before its results (a campaign killed mid-run)."""

    def __init__(self, victim: str):
        super().__init__({})
        self.victim = victim

    def __call__(self, test, store_dir, **kw):
        if test.name.split("/", 1)[1] != self.victim:
            return super().__call__(test, store_dir, **kw)
        super().__call__(test, store_dir, **kw)
        (test.run_dir / "results.json").unlink()
        (test.run_dir / "report.html").unlink()
        raise KeyboardInterrupt


def test_a_resumed_campaign_reruns_a_cut_short_cell_instead_of_showing_its_partial_verdict(tmp_path, monkeypatch):
    victim = "lease-none-default-reference-s1-r0"
    out, _ = campaign(tmp_path, CutShort(victim), monkeypatch)
    assert out.interrupted
    partial = tmp_path / "store" / {e["id"]: e for e in state_of(tmp_path)["runs"]}[victim]["run_dir"]
    assert (partial / "history.jsonl").exists() and not (partial / "results.json").exists()
    fake2 = FakeRunner({})
    out2, lines = campaign(tmp_path, fake2, monkeypatch)
    assert fake2.calls[0] == victim, "the cut-short cell is run again, whole"
    assert any(f"resume: {victim}: pending (interrupted mid-run (its partial run" in line for line in lines)
    entry = {e["id"]: e for e in state_of(tmp_path)["runs"]}[victim]
    assert entry["status"] == "done" and entry["verdict"] is True and not entry["partial"]
    assert tmp_path / "store" / entry["run_dir"] != partial, "the verdict is the full run's"
    assert json.loads((partial / "results.json").read_text())["interrupted"], "the partial run's results say so"
    assert out2.exit_code == 0


def test_a_cut_short_run_whose_history_already_shows_a_violation_is_kept_and_marked_partial(tmp_path, monkeypatch):
    import lab.campaign.state

    victim = "lease-none-default-reference-s1-r0"
    campaign(tmp_path, CutShort(victim), monkeypatch)
    monkeypatch.setattr(lab.campaign.state, "analyze", lambda run_dir: {"valid": False, "ops": 4, "results": {}})
    fake2 = FakeRunner({})
    out2, _ = campaign(tmp_path, fake2, monkeypatch)
    assert victim not in fake2.calls and out2.exit_code == 1
    entry = {e["id"]: e for e in state_of(tmp_path)["runs"]}[victim]
    assert (entry["status"], entry["verdict"], entry["partial"]) == ("done", False, True)
    page = out2.page.read_text()
    assert re.search(r'class="run invalid marked"[^>]*>\u2717 s1 <span class="mark">\(partial run\)</span>', page)


def test_an_entry_an_older_lab_judged_on_its_partial_history_is_run_again(tmp_path):
    old = {"id": "x", "test": {"name": "c/x"}, "status": "done", "run_dir": "c/x/1", "verdict": True,
           "note": "interrupted mid-run; the checkers judged the history it recorded (fencelab analyze)"}
    done = dict(old)
    settle(done, tmp_path)
    assert done["status"] == "pending" and "older lab" in done["note"]
    invalid = dict(old, verdict=False)
    (tmp_path / "c" / "x" / "1").mkdir(parents=True)
    (tmp_path / "c" / "x" / "1" / "results.json").write_text("{}")
    settle(invalid, tmp_path)
    assert invalid["status"] == "done", "a violation it showed stands"


class NoPartition(FakeRunner):
    """Runs whose partition never fired (`unexercised_faults`, as lab.runner.analyze reports it)."""

    def __call__(self, test, store_dir, **kw):
        results = super().__call__(test, store_dir, **kw)
        if test.nemesis:
            results = {**results, "valid": "unknown", "unexercised_faults": ["partition"]}
        return results


def test_the_page_marks_a_cell_whose_fault_never_fired(tmp_path, monkeypatch):
    out, _ = campaign(tmp_path, NoPartition({}), monkeypatch)
    by_id = {e["id"]: e for e in state_of(tmp_path)["runs"]}
    assert by_id["lease-partition-default-reference-s0-r0"]["unexercised_faults"] == ["partition"]
    assert by_id["lease-none-default-reference-s0-r0"]["unexercised_faults"] is None
    page = out.page.read_text()
    marked = re.findall(r'class="run (\w+) marked"[^>]*>[^<]*<span class="mark">\(([^)]*)\)</span>', page)
    assert marked == [("unknown", "no partition window")] * 4, "two matrix badges and two rows of the run table"
    assert out.exit_code == 3


# -- the dry run checks what the real run checks --------------------------------------------------


def test_an_infinite_time_limit_fails_the_dry_run_as_it_fails_the_run(tmp_path, monkeypatch):
    """Once, `time_limit = inf` passed --dry-run and then failed every cell after its stack had started."""
    spec = spec_file(tmp_path, GOOD.replace("time_limit = 2", "time_limit = inf"))
    dry = invoke(str(spec), "--store-dir", str(tmp_path / "store"), "--dry-run")
    assert dry.exit_code == 2 and dry.output.startswith("fencelab: error: ") and len(dry.output.splitlines()) == 1
    assert "time_limit must be a finite number of seconds, not inf" in dry.output
    FakeRunner({}).install(monkeypatch)
    real = invoke(str(spec), "--store-dir", str(tmp_path / "store"))
    assert (real.exit_code, real.output) == (dry.exit_code, dry.output)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("where, needle", [
    ("file", "exists and is not a directory"),
    ("file/sub", "cannot create it, {tmp}/file is a file"),
])
def test_a_store_dir_that_cannot_be_made_is_one_line_in_the_dry_run_and_the_run(tmp_path, where, needle):
    (tmp_path / "file").write_text("x")
    spec = spec_file(tmp_path, GOOD)
    for dry in (["--dry-run"], []):
        res = invoke(str(spec), "--store-dir", str(tmp_path / where), *dry)
        assert res.exit_code == 2, res.output
        assert res.output.startswith("fencelab: error: --store-dir ") and len(res.output.splitlines()) == 1
        assert needle.format(tmp=tmp_path) in res.output and "Traceback" not in res.output


def test_a_store_dir_the_os_refuses_to_make_is_one_line_in_the_dry_run_and_the_run(tmp_path):
    """/proc refuses new directories, even to root, whatever its mode bits say: once --dry-run said the plan and
    exit 0 where the run said this line and exit 2; now both try to make a directory there first."""
    spec = str(spec_file(tmp_path, GOOD))
    dry, real = (invoke(spec, "--store-dir", "/proc/fencelab-no-such/store", *dry) for dry in (["--dry-run"], []))
    assert (dry.exit_code, dry.output) == (real.exit_code, real.output) == (2, (
        "fencelab: error: --store-dir /proc/fencelab-no-such/store: cannot create "
        "/proc/fencelab-no-such/store/campaigns/c1 (No such file or directory)\n"))


def test_the_dry_runs_trial_directory_leaves_nothing_behind(tmp_path):
    """The trial is made in the nearest existing parent of the campaign's directory and removed at once."""
    spec = spec_file(tmp_path, GOOD)
    (tmp_path / "store" / "campaigns" / "c1").mkdir(parents=True)
    for store in ("store", "new-store"):
        res = invoke(str(spec), "--store-dir", str(tmp_path / store), "--dry-run")
        assert res.exit_code == 0 and res.output.startswith("campaign c1: 1 runs"), res.output
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "spec.toml", "store", "store/campaigns", "store/campaigns/c1"]


def test_the_complete_example_of_the_docs_is_a_valid_campaign(tmp_path, monkeypatch):
    """docs/campaigns.md's complete example parses and its whole plan validates (with the hosts file it names)."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "campaigns.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", doc, re.S)
    example = next(b for b in blocks if b.startswith('name = "nightly"'))
    (tmp_path / "hosts.toml").write_text('nodes = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]\n')
    monkeypatch.chdir(tmp_path)
    path = spec_file(tmp_path, example, "nightly.toml")
    plan = validate_plan(load_spec(path))
    assert {r.implementation for r in plan} == {"reference", "lock-unfenced", "compose", "nodes"}
    assert {r.scenario for r in plan} == {"base", "short-ttl", "race"}
    res = invoke(str(path), "--dry-run", "--store-dir", str(tmp_path / "store"))
    assert res.exit_code == 0 and f"campaign nightly: {len(plan)} runs" in res.output, res.output


def test_an_implementation_sets_per_system_options_kept_in_the_replay():
    """`sut_options = {k = v}` (what `fencelab test --sut-opt k=v` sets): in the run's Test.extra and its replay
    command; a Test field's name is refused."""
    base = {"name": "c", "workloads": ["lease"]}
    spec = parse_spec({**base, "implementations": {"v": {"sut": "valkey-lock", "sut_options": {
        "valkey_persistence": "none", "hold_s": 1.5}}}})
    test = expand(spec)[0].to_test()
    assert (test.extra["valkey_persistence"], test.extra["hold_s"]) == ("none", 1.5)
    assert "--sut-opt hold_s=1.5 --sut-opt valkey_persistence=none" in runner.replay_command(test)
    with pytest.raises(CampaignError, match=r"implementations.v: sut_options: ttl_ms is a Test field"):
        parse_spec({**base, "implementations": {"v": {"sut": "valkey-lock", "sut_options": {"ttl_ms": 5}}}})
    with pytest.raises(CampaignError, match=r"sut_options: hold_s: the value must be a string, a finite number"):
        parse_spec({**base, "implementations": {"v": {"sut": "valkey-lock", "sut_options": {"hold_s": [1]}}}})


def test_each_run_records_its_overhead_and_phases_and_the_page_shows_them(tmp_path, monkeypatch):
    """campaign.json: overhead_s (the campaign's wall seconds beyond the run's time limit) and the phases; the page:
    the median in the totals, each run's overhead and phases in its row (no wall time is asserted)."""
    out, _ = campaign(tmp_path, FakeRunner({}), monkeypatch)
    runs = state_of(tmp_path)["runs"]
    assert all(isinstance(e["overhead_s"], float) for e in runs)
    assert all(e["phases"] == {"up": 0.25, "workload": 1.0, "down": 0.125, "judge": 0.5} for e in runs)
    page = out.page.read_text()
    values = sorted(e["overhead_s"] for e in runs)
    total = re.search(r'<td class="num" id="overhead">median (\S+) s, max (\S+) s', page)
    assert total and total.groups() == (f"{(values[1] + values[2]) / 2:.2f}", f"{values[-1]:.2f}")
    for e in runs:
        row = re.search(rf">{re.escape(e['id'])}</a></td>(.*?)</tr>", page, re.S).group(1)
        assert f'<td class="num">{e["overhead_s"]:.2f} s</td>' in row
        assert "<td>up 0.2 \u00b7 workload 1.0 \u00b7 down 0.1 \u00b7 judge 0.5</td>" in row


def test_an_older_campaign_json_without_overheads_still_renders(tmp_path, monkeypatch):
    out, _ = campaign(tmp_path, FakeRunner({}), monkeypatch)
    state = state_of(tmp_path)
    for e in state["runs"]:
        del e["overhead_s"], e["phases"]
    from lab.campaign.page import PageData, render_page

    page = render_page(state, PageData(tmp_path / "store", out.page.parent))
    assert '<td class="num" id="overhead">&mdash;</td>' in page
