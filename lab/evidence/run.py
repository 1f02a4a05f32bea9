"""Running the evidence bundle: every row's scenarios, once each, then one verdict per row.

A scenario that evidences several rows runs once per seed and counts for
each of them. A row's verdict:

- `fail`: a run of it is invalid, or it executed zero runs, or its runs hold
  zero relevant ops (the contract: "a suite that executes zero tests for a row
  is a failure for that row");
- `inconclusive`: no run is invalid, but one is unknown (its race was not
  hit, a checker could not decide) or could not run;
- `not-applicable`: against an external system, every scenario of the row
  needs the lab's own stack (process kills, Valkey restores, direct Valkey
  writes); the reason is given, the row is never counted as passed;
- `pass`: otherwise.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from checkers.pairs import pair_ops
from checkers.windows import nemesis_windows
from lab.evidence.page import write_page
from lab.evidence.spec import Depth, EvidenceError, EvidenceSpec, ExtraRun, Row
from lab.history import read_history_report
from lab.paths import write_text_atomic
from lab.runner import RunError, run_test, validate
from lab.scenarios import SCENARIOS, ScenarioError, apply_scenario
from lab.secrets import redact_url
from lab.sut import SutError, load_findings
from lab.sut.registry import check_sut
from lab.sut.target import Kind, Target, target_of
from lab.testmap import Test

VERDICTS = ("pass", "fail", "inconclusive", "not-applicable")
RUN_OVERHEAD_S = 1.0  # measured on 2 cores: a quick bundle's 23 runs took 77 s for 56.5 s of time limits


@dataclass
class RunRecord:
    """One executed (or skipped) run and what it shows."""

    name: str  # scenario name, or `<workload>-<nemeses>` for a fault run
    seed: int
    kind: str = "scenario"  # scenario | fault-run
    run_dir: str | None = None  # relative to the evidence directory
    report: str | None = None  # relative link to report.html (or results.json)
    valid: Any = None
    ops: int = 0  # completed client ops
    ops_by_f: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    checkers: dict[str, Any] = field(default_factory=dict)
    not_exercised: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    error: str | None = None
    not_applicable: str | None = None


@dataclass
class RowResult:
    """A row's verdict and its evidence."""

    row: Row
    verdict: str
    reason: str
    runs: list[RunRecord]
    relevant_ops: int
    faults: dict[str, int]
    findings: list[dict[str, Any]]


@dataclass
class Evidence:
    """What `fencelab evidence` produced."""

    dir: Path
    data: dict[str, Any]
    rows: list[RowResult]

    @property
    def exit_code(self) -> int:
        """0 all rows pass (or are not applicable), 1 a row failed, 3 a row is inconclusive."""
        verdicts = {r.verdict for r in self.rows}
        return 1 if "fail" in verdicts else 3 if "inconclusive" in verdicts else 0


@dataclass(frozen=True)
class EvidenceTarget:
    """The options naming the system the evidence is for; what kind it is, the Target decides (lab.sut.target)."""

    urls: tuple[str, ...] = ()
    api_key_file: str | None = None
    sut: str = "reference"
    backend: str = "local"  # where the lab's own stack is placed per run: local processes, Docker Compose, SSH nodes
    hosts_file: str | None = None  # backend "ssh": the nodes (docs/ssh-backend.md); "swarm": the placement
    swarm: str | None = None  # backend "swarm": the manager's engine (--swarm)

    def options(self) -> dict[str, Any]:
        """The Test fields the target sets on each run."""
        return {"sut": self.sut, "urls": list(self.urls), "api_key_file": self.api_key_file,
                "hosts_file": self.hosts_file, "swarm": self.swarm, "backend": self.backend}

    def resolve(self) -> Target:
        """The Target these options name, checked (TargetError / SutError: one line naming what to change)."""
        test = Test(**self.options())
        target = target_of(test)
        target.check(test)
        check_sut(target.sut, test)  # the system's own check of its options (URLs, key); a plug-in's in one line
        return target

    def describe(self) -> dict[str, Any]:
        """The target as evidence.json records it (never a key)."""
        target = self.resolve()
        d = target.summary()
        if target.kind is Kind.REFERENCE:
            d["detail"] = f"the lab's reference servers on a fresh {target.backend.name} stack per run"
        elif target.lab_runs:
            d["detail"] = f"SUT {self.sut!r} on processes the lab starts per run"
        else:
            d["detail"] = f"{target.describe()} (SUT {self.sut!r})"
        if self.api_key_file:
            d["api_key_file"] = self.api_key_file
        return d


# -- planning ---------------------------------------------------------------------------------------


def plan(spec: EvidenceSpec, depth: Depth) -> tuple[list[str], list[ExtraRun]]:
    """The distinct scenarios (spec order) and fault runs a depth executes."""
    names: list[str] = []
    for row in spec.rows_for(depth):
        for name in row.scenarios:
            if name not in names:
                names.append(name)
    covered = {r.id for r in spec.rows_for(depth)}
    return names, [x for x in depth.runs if set(x.rows) & covered]


def describe_depth(spec: EvidenceSpec, depth: Depth) -> dict[str, Any]:
    """What a depth runs and roughly how long it takes (for the plan printed and stored)."""
    names, extra = plan(spec, depth)
    scenario_s = sum(float(SCENARIOS[n].options.get("time_limit", 10.0)) * depth.time_scale for n in names)
    extra_s = sum(float(x.options.get("time_limit", 10.0)) for x in extra)
    runs = len(names) * depth.seeds + len(extra) * depth.seeds
    return {"name": depth.name, "description": depth.description, "rows": len(spec.rows_for(depth)),
            "scenarios": len(names), "seeds": depth.seeds, "time_scale": depth.time_scale,
            "fault_runs": [{"workload": x.workload, "nemesis": list(x.nemesis), "rows": list(x.rows), **x.options}
                           for x in extra],
            "runs": runs, "estimated_s": round((scenario_s + extra_s) * depth.seeds + runs * RUN_OVERHEAD_S)}


# -- running ----------------------------------------------------------------------------------------


def _stamp() -> str:
    """A UTC timestamp for the bundle's directory (the runs' format)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


def _rel(path: Path, base: Path) -> str:
    """`path` relative to `base` (links in the page and the json)."""
    return os.path.relpath(path, base)


def summarize_run(rec: RunRecord, run_dir: Path, results: dict[str, Any], evidence_dir: Path) -> RunRecord:
    """Fill a record from a finished run's directory: verdicts, ops by f, faults, findings, report link."""
    rec.run_dir = _rel(run_dir, evidence_dir)
    report = run_dir / "report.html"
    rec.report = _rel(report if report.exists() else run_dir / "results.json", evidence_dir)
    rec.valid = results.get("valid")
    for name, res in (results.get("results") or {}).items():
        rec.checkers[name] = res.get("valid")
        if res.get("not_exercised"):
            rec.not_exercised = res["not_exercised"]
    history, _problems = read_history_report(run_dir / "history.jsonl")
    done = [p for p in pair_ops(history) if p.comp is not None]
    rec.ops = len(done)
    rec.ops_by_f = dict(Counter(str(p.f) for p in done))
    rec.faults = dict(Counter(w["fault"] for w in nemesis_windows(history)))
    try:
        rec.findings = load_findings(run_dir)
    except ValueError as e:  # a damaged findings file is itself reported, not skipped
        rec.findings = [{"id": "findings-unreadable", "rule": "-", "contract": "-", "dialect": "-", "observed": str(e)}]
    return rec


def _scenario_test(name: str, seed: int, base: str, depth: Depth, target: EvidenceTarget):
    """The Test of one scenario run: the scenario's options, scaled, against the target."""
    test = Test(name=f"{base}/{name}-s{seed}", seed=seed, scenario=name, **target.options())
    test = apply_scenario(test, {"name"})
    return test.evolve(time_limit=round(test.time_limit * depth.time_scale, 3))


def _fault_test(run: ExtraRun, seed: int, base: str, target: EvidenceTarget):
    """The Test of one fault run (a registered workload under a random nemesis lane)."""
    opts = {"time_limit": 10.0, "concurrency": 5, "rate": 40.0, "keys": 2, "ttl_ms": 1000, "nemesis_interval": 1.5}
    opts.update(run.options)
    return Test(name=f"{base}/{run.name}-s{seed}", workload=run.workload, seed=seed, nemesis=list(run.nemesis),
                **target.options(), **{k: (int(v) if k in ("concurrency", "keys", "ttl_ms") else float(v))
                                       for k, v in opts.items()})


def _execute(rec: RunRecord, test, store_dir: Path, evidence_dir: Path,
             runner: Callable[[Any, Path], dict[str, Any]]) -> RunRecord:
    """Run one Test; any failure to run is recorded on the record (the bundle goes on)."""
    started = time.monotonic()
    try:
        results = runner(test, store_dir)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - one run that cannot run is evidence missing for its rows, not a crash
        rec.error = f"{type(e).__name__}: {e}"
        rec.elapsed_s = round(time.monotonic() - started, 2)
        return rec
    rec.elapsed_s = round(time.monotonic() - started, 2)
    return summarize_run(rec, Path(test.run_dir), results, evidence_dir)


def judge_row(row: Row, runs: list[RunRecord]) -> RowResult:
    """A row's verdict from its runs (see the module docstring)."""
    executed = [r for r in runs if r.error is None and r.not_applicable is None and r.run_dir is not None]
    skipped = [r for r in runs if r.not_applicable is not None]
    broken = [r for r in runs if r.error is not None]
    relevant = sum(sum(n for f, n in r.ops_by_f.items() if not row.fs or f in row.fs) for r in executed)
    faults: Counter = Counter()
    findings: list[dict[str, Any]] = []
    for r in executed:
        faults.update(r.faults)
        findings += [dict(f, run=r.run_dir) for f in r.findings]
    if not runs:
        verdict, reason = "fail", "no scenario maps to this row: zero runs executed"
    elif not executed and skipped and not broken:
        verdict = "not-applicable"
        reason = "not applicable to this system: " + "; ".join(sorted({r.not_applicable for r in skipped}))
    elif not executed:
        verdict, reason = "fail", "zero runs executed: " + "; ".join(r.error or r.not_applicable for r in runs)
    elif relevant == 0:
        verdict, reason = "fail", f"zero relevant ops ({', '.join(row.fs) or 'any op'}) in {len(executed)} run(s)"
    elif any(r.valid is False for r in executed):
        bad = [f"{r.name}-s{r.seed}: " + ", ".join(n for n, v in r.checkers.items() if v is False)
               for r in executed if r.valid is False]
        verdict, reason = "fail", "invalid: " + "; ".join(bad)
    elif any(r.valid is not True for r in executed) or broken:
        why = [f"{r.name}-s{r.seed}: {r.not_exercised or 'unknown'}" for r in executed if r.valid is not True]
        why += [f"{r.name}-s{r.seed}: {r.error}" for r in broken]
        verdict, reason = "inconclusive", "; ".join(why)
    else:
        verdict = "pass"
        reason = f"{len(executed)} run(s) valid, {relevant} relevant ops"
    if verdict != "not-applicable" and skipped:
        reason += " (not applicable here: " + ", ".join(sorted({r.name for r in skipped})) + ")"
    return RowResult(row, verdict, reason, runs, relevant, dict(faults), findings)


def run_evidence(spec: EvidenceSpec, store_dir: Path, *, depth: str | None = None, target: EvidenceTarget = EvidenceTarget(),
                 echo: Callable[[str], None] = print,
                 runner: Callable[[Any, Path], dict[str, Any]] | None = None) -> Evidence:
    """Run every scenario the depth's rows name (and its fault runs), judge each row, write the bundle."""
    runner = runner or run_test
    try:
        system = target.resolve()  # what the evidence is for, decided once
    except SutError as e:
        raise EvidenceError(str(e)) from None
    d = spec.depth(depth)
    store_dir = Path(store_dir)
    if store_dir.exists() and not store_dir.is_dir():
        raise EvidenceError(f"--store-dir {store_dir} exists and is not a directory")
    stamp = _stamp()
    base = f"evidence/{stamp}"
    evidence_dir = store_dir / base
    evidence_dir.mkdir(parents=True, exist_ok=False)
    names, extra = plan(spec, d)
    started = time.monotonic()
    records: dict[tuple[str, int], RunRecord] = {}
    total = (len(names) + len(extra)) * d.seeds
    echo(f"evidence {spec.name} ({d.name}): {len(spec.rows_for(d))} rows, {total} runs -> {evidence_dir}")
    for seed in range(d.seeds):
        for name in names:
            rec = records[(name, seed)] = RunRecord(name=name, seed=seed)
            sc = SCENARIOS[name]
            why = system.scenario_problem(sc.stack_only)
            if why:
                rec.not_applicable = why
                echo(f"  {name} s{seed}: not applicable ({why})")
                continue
            try:
                test = _scenario_test(name, seed, base, d, target)
                validate(test)
            except (RunError, ScenarioError, ValueError) as e:
                rec.error = str(e)
                echo(f"  {name} s{seed}: cannot run: {e}")
                continue
            _execute(rec, test, store_dir, evidence_dir, runner)
            echo(f"  {name} s{seed}: {_line(rec)}")
            _write(spec, d, target, evidence_dir, records, started)
        for run in extra:
            rec = records[(run.name, seed)] = RunRecord(name=run.name, seed=seed, kind="fault-run")
            why = next(filter(None, map(system.fault_problem, run.nemesis)), None)
            if why:
                rec.not_applicable = why
                continue
            try:
                test = _fault_test(run, seed, base, target)
                validate(test)
            except (RunError, ValueError) as e:
                rec.error = str(e)
                echo(f"  {run.name} s{seed}: cannot run: {e}")
                continue
            _execute(rec, test, store_dir, evidence_dir, runner)
            echo(f"  {run.name} s{seed}: {_line(rec)}")
            _write(spec, d, target, evidence_dir, records, started)
    evidence = _write(spec, d, target, evidence_dir, records, started)
    return evidence


def _line(rec: RunRecord) -> str:
    """One progress line for a finished run."""
    if rec.error:
        return f"ERROR {rec.error}"
    return f"valid={json.dumps(rec.valid)} ops={rec.ops} {rec.elapsed_s}s" + (
        f" ({rec.not_exercised})" if rec.not_exercised and rec.valid is not True else "")


def _row_runs(row: Row, depth: Depth, records: dict[tuple[str, int], RunRecord]) -> list[RunRecord]:
    """The records that evidence a row: its scenarios' and the fault runs naming it, every seed."""
    out = [rec for (name, _seed), rec in records.items() if name in row.scenarios]
    out += [rec for run in depth.runs if row.id in run.rows for (name, _s), rec in records.items() if name == run.name]
    return out


def _write(spec: EvidenceSpec, depth: Depth, target: EvidenceTarget, evidence_dir: Path,
           records: dict[tuple[str, int], RunRecord], started: float) -> Evidence:
    """evidence.json and evidence.html for the rows as they stand now (rewritten after every run)."""
    rows = [judge_row(row, _row_runs(row, depth, records)) for row in spec.rows_for(depth)]
    counts = Counter(r.verdict for r in rows)
    deeper = [describe_depth(spec, x) for x in spec.depths.values() if x.name != depth.name]
    data = {
        "name": spec.name, "spec": spec.source, "created": dt.datetime.now(dt.timezone.utc).isoformat(),
        "depth": describe_depth(spec, depth), "other_depths": deeper, "system": target.describe(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "summary": {"rows": len(rows), **{v: counts.get(v, 0) for v in VERDICTS}},
        "rows": [{"id": r.row.id, "table": r.row.table, "text": r.row.text, "requires": r.row.requires,
                  "rules": list(r.row.rules), "scenarios": list(r.row.scenarios), "note": r.row.note,
                  "verdict": r.verdict, "reason": r.reason, "relevant_ops": r.relevant_ops, "faults": r.faults,
                  "findings": r.findings, "runs": [asdict(x) for x in r.runs]} for r in rows],
        "runs": [asdict(x) for x in records.values()],
        "findings": [f for r in rows for f in r.findings],
    }
    write_text_atomic(evidence_dir / "evidence.json", json.dumps(data, indent=2, default=str))
    write_page(data, evidence_dir / "evidence.html")
    return Evidence(evidence_dir, data, rows)
