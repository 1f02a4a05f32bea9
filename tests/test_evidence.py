"""The contract evidence bundle: its spec, row verdicts (zero runs fail), and short real bundles.

The full default depth is `make evidence` (minutes), not part of this suite;
here the `smoke` depth (three rows, two runs) and small hand-written specs run.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.cli import main
from lab.evidence import EvidenceError, Row, RunRecord, EvidenceTarget, judge_row, load_spec, parse_spec, run_evidence
from lab.scenarios import RACE_SCENARIOS

SPEC = Path(__file__).resolve().parent.parent / "campaigns" / "contract-evidence.toml"


def spec_data(rows: list[dict], **depths) -> dict:
    return {"name": "t", "depths": depths or {"quick": {}}, "rows": rows}


def row(rid: str, scenarios: list[str], **kw) -> dict:
    return {"id": rid, "table": "races", "text": f"row {rid}", "scenarios": scenarios, **kw}


def links_resolve(evidence_dir: Path) -> list[str]:
    """Every href of evidence.html, checked to exist relative to the page."""
    hrefs = re.findall(r'href="([^"]+)"', (evidence_dir / "evidence.html").read_text())
    assert all((evidence_dir / urllib.parse.unquote(h)).exists() for h in hrefs), hrefs
    return hrefs


# -- the spec -----------------------------------------------------------------------------------------


def test_the_shipped_spec_maps_every_contract_row_to_scenarios():
    spec = load_spec(SPEC)
    ids = [r.id for r in spec.rows]
    assert ids == [f"M{i}" for i in range(1, 16)] + [f"R{i}" for i in range(1, 18)]
    assert all(r.scenarios and r.rules for r in spec.rows)
    races = [r for r in spec.rows if r.table == "races"]
    assert [r.scenarios[0] for r in races] == list(RACE_SCENARIOS)  # one scenario per races-table row, in order
    assert spec.default_depth == "quick" and {"smoke", "quick", "standard", "deep"} <= set(spec.depths)
    assert spec.depths["deep"].seeds > spec.depths["standard"].seeds > spec.depths["quick"].seeds


def test_docs_list_every_row_with_its_scenarios():
    docs = (SPEC.parent.parent / "docs" / "evidence.md").read_text()
    for r in load_spec(SPEC).rows:
        line = next((x for x in docs.splitlines() if x.startswith(f"| {r.id} |")), None)
        assert line is not None and all(f"`{s}`" in line for s in r.scenarios), (r.id, line)


@pytest.mark.parametrize("data, message", [
    (spec_data([row("R1", ["no-such"])]), "unknown scenario 'no-such'"),
    (spec_data([row("R1", []), row("R1", [])]), "repeated: R1"),
    (spec_data([dict(row("R1", []), secnarios=[])]), "unknown key 'secnarios' (did you mean 'scenarios'?)"),
    (spec_data([row("R1", [], table="other")]), "table must be one of matrix, races"),
    (spec_data([row("R1", [], rules=["R9"])]), "is not a contract rule id"),
    (spec_data([row("R1", [])], quick={"seeds": 0}), "seeds must be an integer between 1 and 100"),
    (spec_data([row("R1", [])], quick={"rows": ["R2"]}), "unknown row 'R2'"),
    (spec_data([row("R1", [])], quick={"runs": [{"workload": "lease", "nemesis": ["chaos"], "rows": ["R1"]}]}),
     "unknown nemesis chaos"),
    ({"name": "t", "rows": []}, "missing key 'depths'"),
])
def test_spec_errors_name_the_key(data, message):
    with pytest.raises(EvidenceError, match=re.escape(message)):
        parse_spec(data, "spec.toml")


@pytest.mark.parametrize("args, message", [
    (["--depth", "huge"], "unknown depth 'huge'; known: smoke, quick, standard, deep"),
    (["--url", "http://127.0.0.1:9"], "--url needs the service's API key"),
    (["--sut", "starintel"], "--sut starintel needs --url"),
    (["--spec", "nowhere.toml"], "cannot read the evidence spec nowhere.toml"),
])
def test_bad_options_are_one_line_and_run_nothing(tmp_path, monkeypatch, args, message):
    monkeypatch.delenv("FENCELAB_API_KEY", raising=False)
    res = CliRunner().invoke(main, ["evidence", *args, "--store-dir", str(tmp_path / "store")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "store").exists()


# -- row verdicts -------------------------------------------------------------------------------------


def rec(valid=True, ops=None, **kw) -> RunRecord:
    return RunRecord(name="s", seed=0, run_dir="s-s0/x", report="s-s0/x/report.html", valid=valid,
                     ops_by_f=ops if ops is not None else {"acquire": 3}, **kw)


@pytest.mark.parametrize("runs, fs, verdict, reason", [
    ([], (), "fail", "zero runs executed"),
    ([rec(ops={"inspect": 2})], ("acquire",), "fail", "zero relevant ops"),
    ([rec(), rec(valid=False, checkers={"fencing": False})], (), "fail", "invalid: s-s0: fencing"),
    ([rec(), rec(valid="unknown", not_exercised="the race was not hit")], (), "inconclusive", "race was not hit"),
    ([RunRecord(name="s", seed=0, not_applicable="it kills Valkey")], (), "not-applicable", "it kills Valkey"),
    ([RunRecord(name="s", seed=0, error="StackError: no port")], (), "fail", "StackError"),
    ([rec(), rec()], ("acquire",), "pass", "6 relevant ops"),
])
def test_row_verdicts(runs, fs, verdict, reason):
    res = judge_row(Row("R1", "races", "t", "", ("C5",), ("s",), fs), runs)
    assert res.verdict == verdict and reason in res.reason, res.reason


# -- real bundles ---------------------------------------------------------------------------------------


def test_smoke_depth_writes_the_bundle_with_links_that_resolve(tmp_path):
    res = CliRunner().invoke(main, ["evidence", "--depth", "smoke", "--store-dir", str(tmp_path / "store")])
    assert res.exit_code == 0, res.output
    assert "--depth quick:" in res.output and "--depth deep:" in res.output  # what deeper depths would run
    evidence_dir = next((tmp_path / "store" / "evidence").iterdir())
    data = json.loads((evidence_dir / "evidence.json").read_text())
    assert [(r["id"], r["verdict"]) for r in data["rows"]] == [("M3", "pass"), ("R1", "pass"), ("R9", "pass")]
    assert data["summary"]["pass"] == 3 and {d["name"] for d in data["other_depths"]} >= {"standard", "deep"}
    assert all(r["relevant_ops"] > 0 and r["runs"] for r in data["rows"])
    hrefs = links_resolve(evidence_dir)
    assert any(h.endswith("report.html") for h in hrefs)
    html = (evidence_dir / "evidence.html").read_text()
    assert "concurrent-acquires" in html and "<script" not in html


def test_a_row_mapped_to_nothing_fails_and_fault_runs_count_for_their_rows(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "empty"\n[depths.quick]\n[[depths.quick.runs]]\nworkload = "lease"\n'
                    'nemesis = ["partition"]\ntime_limit = 2\nnemesis_interval = 0.5\nrows = ["R1"]\n'
                    '[[rows]]\nid = "M99"\ntable = "matrix"\ntext = "a row no scenario evidences"\nscenarios = []\n'
                    '[[rows]]\nid = "R1"\ntable = "races"\ntext = "evidenced by a fault run only"\nscenarios = []\n'
                    'fs = ["acquire"]\n')
    res = CliRunner().invoke(main, ["evidence", "--spec", str(spec), "--store-dir", str(tmp_path / "store")])
    assert res.exit_code == 1, res.output
    evidence_dir = next((tmp_path / "store" / "evidence").iterdir())
    data = json.loads((evidence_dir / "evidence.json").read_text())
    rows = {r["id"]: r for r in data["rows"]}
    assert rows["M99"]["verdict"] == "fail" and "zero runs" in rows["M99"]["reason"]
    assert rows["R1"]["verdict"] == "pass" and rows["R1"]["runs"][0]["kind"] == "fault-run", rows["R1"]
    assert rows["R1"]["faults"].get("partition", 0) >= 1 and rows["R1"]["relevant_ops"] > 0
    assert data["summary"] == {"rows": 2, "pass": 1, "fail": 1, "inconclusive": 0, "not-applicable": 0}
    assert "zero runs" in (evidence_dir / "evidence.html").read_text()
    links_resolve(evidence_dir)


def test_external_system_marks_stack_rows_not_applicable_and_lists_findings(tmp_path):
    """The lab's own server as an external URL: stack-only rows are not applicable, the rest run against it."""
    from lab.runner import run_test
    from lab.stack.local import LocalStack, StackOptions
    from workloads.common import pick_credential

    finding = {"id": "renew-other-instance", "rule": "C12", "contract": "any instance renews",
               "dialect": "only the acquiring node", "observed": "renew via node 2: not_owner"}

    def runner_with_a_finding(test, store_dir):
        """run_test, then the findings file a dialect adapter would have written during the run."""
        results = run_test(test, store_dir)
        (Path(test.run_dir) / "findings.jsonl").write_text(json.dumps(finding) + "\n")
        return results

    spec = parse_spec(spec_data([row("R14", ["malformed-record"]), row("R9", ["changed-body-same-request-id"]),
                                 row("X1", [])]), "spec.toml")
    stack = LocalStack(name="ext", root=tmp_path / "ext", die_with_parent=True)
    try:
        status = stack.up(StackOptions(servers=1, store=False))
        key = tmp_path / "key"
        key.write_text(pick_credential(json.loads(Path(status.credentials).read_text()))["api_key"])
        evidence = run_evidence(spec, tmp_path / "store", target=EvidenceTarget((status.lease_servers[0],), str(key)),
                                echo=lambda line: None, runner=runner_with_a_finding)
    finally:
        stack.down()
    verdicts = {r.row.id: (r.verdict, r.reason) for r in evidence.rows}
    assert verdicts["R14"][0] == "not-applicable" and "writes corrupt records" in verdicts["R14"][1]
    assert verdicts["R9"][0] == "pass" and verdicts["X1"][0] == "fail"
    assert evidence.exit_code == 1
    data = json.loads((evidence.dir / "evidence.json").read_text())
    assert data["system"]["kind"] == "url" and data["findings"][0]["id"] == "renew-other-instance"
    html = (evidence.dir / "evidence.html").read_text()
    assert "only the acquiring node" in html and "not-applicable" in html
    links_resolve(evidence.dir)
