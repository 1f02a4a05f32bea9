"""`fencelab mutants`: is every planted bug caught by a general workload at its defaults, and does the unmodified
server pass the same runs?

A mutants spec (`campaigns/mutants.toml`) names the planted bugs of the
reference server (lab/server/mutants) and, for each, the runs that expose it:

- **general rows**: each general workload of the spec's `workloads` (lease,
  fenced-append, idempotency) at its defaults (no tuning options), plus the
  entry's `nemesis` only where the bug needs a fault to show (a Valkey restored
  from an old snapshot). Every seed 0 .. `runs`-1 is run with the bug planted:
  the row's detection rate is caught/seeds;
- **a tuned row** (`workload = "..."` with Test options and a nemesis), run the same way;
- **a scenario row** (`scenario = "..."`, extra evidence): the race scenario
  of lab.scenarios that scripts the race, run planted until the first invalid verdict.

Every distinct Test is also run against the unmodified server on the same
seeds (shared between rows: the lease workload at its defaults runs once per
seed, whatever the mutant), and every one of those runs must be valid. The
exit code is 0 only when every mutant is caught on every seed by at least one
of its general (or tuned) rows, every scenario row caught its mutant, and every
unmodified run was valid (a mutant with only a scenario row is judged on it).

Every run is an ordinary `fencelab test` run (`lab.runner.run_test`) in
`<store>/<spec name>/<mutant>/<workload or scenario>/planted-s<seed>/<timestamp>/`
(`<store>/<spec name>/unmodified/<...>/s<seed>/` for the unmodified ones), with
its test.json (the replay command carries `--mutant`), history, results.json
and report; the table's data goes to `<store>/<spec name>/summary[-fast].json`.

The spec (TOML):

    name = "mutants"          # the store directory
    runs = 3                  # seeds per row
    workloads = ["lease", "fenced-append", "idempotency"]   # the general workloads
    [defaults]                # Test options of every run (as a campaign's [defaults])
    [fast]                    # what --fast changes: runs, skip, Test options for every workload run
    [mutants.<name>]          # nemesis = "..." | [...] (general rows), workloads = [...] (else the spec's),
                              # scenario = "...", workload = "..." + Test options (a tuned row),
                              # fast = { runs, workloads, scenario = false, Test options }

Everything is validated before the first run (unknown keys and names, option
types, and each Test through `lab.runner.validate`): a problem is one line.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from lab.campaign.spec import NAME_RE
from lab.paths import write_text_atomic
from lab.runner import RunError, run_test, validate
from lab.scenarios import SCENARIOS, apply_scenario
from lab.server.mutants import MUTANT_NAMES
from lab.testmap import OptionError, Test, check_options, merge_options
from workloads import WORKLOADS

__all__ = ["Entry", "MutantRow", "MutantsError", "MutantsReport", "MutantsSpec", "RunRecord", "build_test",
           "caught_by", "config_key", "exit_code", "load_spec", "parse_spec", "render_markdown", "render_plain",
           "run_mutants"]

DEFAULT_SPEC = Path("campaigns/mutants.toml")
TOP_KEYS = ("name", "description", "runs", "workloads", "defaults", "fast", "mutants")
ENTRY_KEYS = ("scenario", "workload", "workloads", "nemesis", "runs", "fast")
GENERAL, TUNED, SCENARIO = "general", "tuned", "scenario"
NEMESIS_OPTIONS = ("nemesis_interval",)  # what a general row may set: how its fault is scheduled, not the workload
PLANTED, UNMODIFIED = "planted", "unmodified"


class MutantsError(ValueError):
    """The spec or the options cannot run as given; the one-line message says what to change."""


# -- the spec ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One row: a mutant under one run configuration (a general workload, a tuned workload, or a scenario)."""

    mutant: str
    workload: str
    scenario: str | None = None
    nemesis: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # the entry's own Test options (and --fast's): they win
    defaults: Mapping[str, Any] = field(default_factory=dict)  # the spec's [defaults]: a scenario's options beat them
    runs: int = 1  # seeds 0 .. runs-1
    kind: str = TUNED  # GENERAL (a workload at its defaults), TUNED (a workload with options) or SCENARIO

    @property
    def every_seed(self) -> bool:
        """Workload rows run every seed (a detection rate); a scenario row stops at its first detection."""
        return self.kind != SCENARIO

    def exposed_by(self) -> str:
        """The scenario, or the workload and nemesis, as the table shows it."""
        if self.scenario:
            return f"scenario {self.scenario}"
        how = " (defaults)" if self.kind == GENERAL else ""
        return f"{self.workload} workload{how}" + (f" + {'+'.join(self.nemesis)} nemesis" if self.nemesis else "")

    def label(self) -> str:
        """The row's directory name under the mutant's."""
        if self.scenario:
            return f"scenario-{self.scenario}"
        return self.workload + (f"+{'+'.join(self.nemesis)}" if self.nemesis else "") + \
            ("-tuned" if self.kind == TUNED else "")


@dataclass(frozen=True)
class MutantsSpec:
    """A validated mutants spec (with --fast already applied when asked)."""

    name: str
    source: str
    description: str
    runs: int
    entries: tuple[Entry, ...]
    fast: bool = False


def _options(where: str, table: Any) -> dict[str, Any]:
    """Test options, typed by lab.testmap's one schema (as a campaign's); the runner sets the mutant itself."""
    if not isinstance(table, Mapping):
        raise MutantsError(f"{where} must be a table of Test options, not {table!r}")
    extra = table.get("extra")
    for key, given in (("mutant", "mutant" in table), ("extra.mutant", isinstance(extra, Mapping) and "mutant" in extra)):
        if given:
            raise MutantsError(f"{where}: {key} is set by the runner (the entry's name); remove it")
    try:
        return check_options(dict(table))
    except OptionError as e:
        raise MutantsError(f"{where}: {e}") from None


def _runs(where: str, value: Any) -> int:
    """A seed count: an integer 1-100."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100:
        raise MutantsError(f"{where} must be an integer between 1 and 100 (seeds per mutant), not {value!r}")
    return value


def _names(where: str, value: Any, what: str) -> list[str]:
    """A name or a list of names."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise MutantsError(f"{where}: {what} must be a name or a list of names, not {value!r}")
    return value


def _workload_names(where: str, value: Any) -> list[str]:
    names = _names(where, value, "workloads")
    for w in names:
        if w not in WORKLOADS:
            raise MutantsError(f"{where}: unknown workload {w!r}; known: {', '.join(sorted(WORKLOADS))}")
    return names


def _entries(source: str, name: str, table: Any, defaults: dict[str, Any], fast: dict[str, Any] | None,
             runs: int, general: list[str]) -> list[Entry]:
    """The rows of one `[mutants.<name>]` table, validated (fast: the spec's [fast] options, when --fast;
    runs: the spec's; general: the spec's `workloads`)."""
    where = f"{source}: [mutants.{name}]"
    if name not in MUTANT_NAMES:
        raise MutantsError(f"{where}: unknown mutant {name!r}; known: {', '.join(MUTANT_NAMES)}")
    if not isinstance(table, Mapping):
        raise MutantsError(f"{where} must be a table (nemesis, workloads, scenario, workload, Test options)")
    own = {k: v for k, v in table.items() if k not in ENTRY_KEYS}
    options = _options(where, own)
    scenario, workload = table.get("scenario"), table.get("workload")
    if scenario is not None and workload is not None:
        raise MutantsError(f"{where}: give exactly one of scenario (a race scenario) or workload (a tuned run)")
    if workload is not None and "workloads" in table:
        raise MutantsError(f"{where}: workload (a tuned run) and workloads (general runs) exclude each other")
    nemesis = _names(where, table.get("nemesis", []), "nemesis")
    if scenario is not None:
        if not isinstance(scenario, str) or scenario not in SCENARIOS:
            raise MutantsError(f"{where}: unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    elif workload is not None and (not isinstance(workload, str) or workload not in WORKLOADS):
        raise MutantsError(f"{where}: unknown workload {workload!r}; known: {', '.join(sorted(WORKLOADS))}")
    names = [] if workload is not None else \
        _workload_names(where, table["workloads"]) if "workloads" in table else list(general)
    if scenario is not None and nemesis and not names:
        raise MutantsError(f"{where}: a scenario brings its own faults; remove nemesis")
    tuning = [k for k in options if k not in NEMESIS_OPTIONS]
    if tuning and workload is None and scenario is None:
        raise MutantsError(f"{where}: Test options tune a run, and general workloads run at their defaults: give "
                           f"workload = ... for a tuned run, or drop {', '.join(tuning)}")
    if workload is None and any(k in options for k in NEMESIS_OPTIONS) and not nemesis:
        raise MutantsError(f"{where}: {', '.join(k for k in options if k in NEMESIS_OPTIONS)} configures a nemesis, "
                           "and the entry names none")
    own_fast = table.get("fast", {})
    if not isinstance(own_fast, Mapping):
        raise MutantsError(f"{where} fast must be a table (runs, workloads, scenario, Test options), not {own_fast!r}")
    entry_fast = _options(f"{where} fast", {k: v for k, v in own_fast.items()
                                             if k not in ("runs", "workloads", "scenario")})
    if "scenario" in own_fast and own_fast["scenario"] is not False:
        raise MutantsError(f"{where} fast: scenario = false is the only value (leave the scenario row out)")
    given = merge_options(options, *((fast, entry_fast) if fast is not None else ()))
    # seeds: the entry's own count (its `fast.runs` under --fast), else the spec's (`runs`, or [fast] runs)
    mine = own_fast.get("runs") if fast is not None else table.get("runs")
    if mine is not None:
        runs = _runs(f"{where} {'fast runs' if fast is not None else 'runs'}", mine)
    rows: list[Entry] = []
    if workload is not None:
        rows.append(Entry(name, workload, None, tuple(nemesis), given, defaults, runs, TUNED))
    else:
        if fast is not None and "workloads" in own_fast:
            narrowed = _workload_names(f"{where} fast", own_fast["workloads"])
            names = [w for w in names if w in narrowed]
        # a general row is the workload at its defaults: only the nemesis's options and [fast]'s (a shorter run)
        nemesis_options = {k: v for k, v in options.items() if k in NEMESIS_OPTIONS}
        plain = merge_options(nemesis_options, *((fast, entry_fast) if fast is not None else ()))
        rows += [Entry(name, w, None, tuple(nemesis), plain, defaults, runs, GENERAL) for w in names]
    if scenario is not None and not (fast is not None and own_fast.get("scenario") is False):
        # its own faults and timing: [fast]'s options shorten the workload runs, not a scripted race
        own_given = merge_options(options, *((entry_fast,) if fast is not None else ()))
        scenario_options = {k: v for k, v in own_given.items() if k not in NEMESIS_OPTIONS}
        rows.append(Entry(name, SCENARIOS[scenario].workload, scenario, (), scenario_options, defaults, runs,
                          SCENARIO))
    if not rows:
        raise MutantsError(f"{where}: no run exposes it (no workloads, scenario or workload)")
    return rows


def parse_spec(data: Any, source: str = "<spec>", *, fast: bool = False, only: tuple[str, ...] = ()) -> MutantsSpec:
    """Validate a parsed spec; `fast` applies its [fast] table, `only` keeps those mutants (in spec order)."""
    if not isinstance(data, Mapping):
        raise MutantsError(f"{source}: a mutants spec is a table of {', '.join(TOP_KEYS)}")
    for key in data:
        if key not in TOP_KEYS:
            raise MutantsError(f"{source}: unknown key {key!r}; known keys: {', '.join(TOP_KEYS)}")
    name = data.get("name")

    if not isinstance(name, str) or not NAME_RE.match(name):
        raise MutantsError(f"{source}: name must be letters, digits, '.', '_' or '-' (the store directory), "
                           f"not {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise MutantsError(f"{source}: description must be a string, not {description!r}")
    runs = _runs(f"{source}: runs", data.get("runs", 1))
    general = _workload_names(f"{source}: workloads", data.get("workloads", []))
    defaults = _options(f"{source}: [defaults]", data.get("defaults", {}))
    fast_table = data.get("fast", {})
    if not isinstance(fast_table, Mapping):
        raise MutantsError(f"{source}: [fast] must be a table (runs, Test options)")
    fast_options = _options(f"{source}: [fast]", {k: v for k, v in fast_table.items() if k not in ("runs", "skip")})
    skip = fast_table.get("skip", [])
    if not isinstance(skip, list) or not all(isinstance(x, str) for x in skip):
        raise MutantsError(f"{source}: [fast] skip must be a list of mutant names, not {skip!r}")
    if fast:
        runs = _runs(f"{source}: [fast] runs", fast_table.get("runs", runs))
    mutants = data.get("mutants")
    if not isinstance(mutants, Mapping) or not mutants:
        raise MutantsError(f"{source}: no [mutants.<name>] tables: name each planted bug and the run that "
                           "exposes it")
    unknown = sorted(set(skip) - set(mutants))
    if unknown:
        raise MutantsError(f"{source}: [fast] skip: {unknown[0]!r} is not one of the spec's mutants")
    entries = [e for n, t in mutants.items() if not (fast and n in skip)
               for e in _entries(source, n, t, defaults, fast_options if fast else None, runs, general)]
    skipped = sorted(set(only) & set(skip)) if fast else []
    if skipped:
        raise MutantsError(f"--only {skipped[0]}: --fast skips it ([fast] skip in {source}); run it without --fast")
    if only:
        unknown = sorted(set(only) - {e.mutant for e in entries})  # (entries are rows: a mutant may have several)
        if unknown:
            names = ", ".join(dict.fromkeys(e.mutant for e in entries))  # each once, though it has several rows
            raise MutantsError(f"--only {unknown[0]}: not a mutant of {source} ({names})")
        entries = [e for e in entries if e.mutant in only]
    return MutantsSpec(name, source, description, runs, tuple(entries), fast)


def load_spec(path: Path | str = DEFAULT_SPEC, *, fast: bool = False, only: tuple[str, ...] = ()) -> MutantsSpec:
    """Read and validate a mutants spec file (TOML)."""
    path = Path(path)
    if not path.is_file():
        raise MutantsError(f"{path}: no such spec file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise MutantsError(f"{path}: invalid TOML: {e}") from None
    return parse_spec(data, str(path), fast=fast, only=only)


def build_test(spec: MutantsSpec, entry: Entry, seed: int, planted: bool, backend: str = "local",
               hosts_file: str | None = None, swarm: str | None = None) -> Test:
    """The Test of one run: [defaults], then the scenario's options, then the entry's; `mutant` if planted.

    The same merge order as a campaign's (docs/campaigns.md). Unmodified runs are named by their configuration
    only (`<spec>/unmodified/<row label>/s<seed>`): rows with the same configuration share them.
    """
    opts = merge_options(entry.defaults, entry.options)
    name = f"{spec.name}/{entry.mutant}/{entry.label()}/{PLANTED}-s{seed}" if planted else \
        f"{spec.name}/{UNMODIFIED}/{entry.label()}/s{seed}"
    test = Test(name=name, workload=entry.workload, seed=seed, nemesis=list(entry.nemesis), backend=backend,
                hosts_file=hosts_file, swarm=swarm, scenario=entry.scenario, mutant=entry.mutant if planted else None, **opts)
    if entry.scenario:
        test = apply_scenario(test, {"name", "workload", *entry.options})
    return test


def config_key(test: Test) -> str:
    """What makes two unmodified runs the same run: every Test option but its name and run directory."""
    d = test.to_json()
    for k in ("name", "run_dir", "live"):
        d.pop(k, None)
    return json.dumps(d, sort_keys=True, default=str)


def validate_spec(spec: MutantsSpec, backend: str = "local", hosts_file: str | None = None,
                  swarm: str | None = None) -> None:
    """Every run's Test passes `lab.runner.validate` on `backend` (before anything starts)."""
    for entry in spec.entries:
        for planted in (True, False):
            try:
                validate(build_test(spec, entry, 0, planted, backend, hosts_file, swarm))
            except (RunError, ValueError) as e:
                raise MutantsError(f"{spec.source}: [mutants.{entry.mutant}]: {e}") from None


# -- running ----------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One finished run: its verdict and, when invalid, the checkers that said so."""

    variant: str
    seed: int
    valid: Any  # True, False, "unknown", or None when the run failed
    caught_by: list[str] = field(default_factory=list)
    run_dir: str | None = None
    elapsed_s: float = 0.0
    error: str | None = None


@dataclass
class MutantRow:
    """One row: a mutant under one configuration, its planted runs and the unmodified runs of the same Tests."""

    entry: Entry
    planted: list[RunRecord] = field(default_factory=list)
    unmodified: list[RunRecord] = field(default_factory=list)

    @property
    def detected_at(self) -> int | None:
        """How many planted runs it took to the first invalid verdict (None: never caught)."""
        for i, r in enumerate(self.planted, 1):
            if r.valid is False:
                return i
        return None

    @property
    def caught(self) -> int:
        """Planted runs judged invalid."""
        return sum(r.valid is False for r in self.planted)

    @property
    def every_seed_caught(self) -> bool:
        return bool(self.planted) and self.caught == len(self.planted)

    @property
    def caught_by(self) -> list[str]:
        """The checkers that caught it, over every detecting run (first seen first)."""
        out: list[str] = []
        for r in self.planted:
            if r.valid is False:
                out += [c for c in r.caught_by if c not in out]
        return out

    @property
    def unmodified_verdict(self) -> Any:
        """True when every unmodified run was valid; else the worst (False, then failed, then unknown)."""
        verdicts = [r.valid for r in self.unmodified]
        if not verdicts:
            return None
        if False in verdicts:
            return False
        if None in verdicts:
            return None
        return True if all(v is True for v in verdicts) else "unknown"

    @property
    def ok(self) -> bool:
        """The unmodified server passed; a scenario row also caught its mutant (workload rows: see `caught_mutants`)."""
        if self.unmodified_verdict is not True:
            return False
        return self.entry.every_seed or self.detected_at is not None


@dataclass
class MutantsReport:
    """Every row, and where the summary went."""

    spec: MutantsSpec
    rows: list[MutantRow]
    elapsed_s: float = 0.0
    summary_path: Path | None = None

    def mutants(self) -> list[str]:
        """The mutants of the table, in spec order."""
        return list(dict.fromkeys(r.entry.mutant for r in self.rows))

    def is_caught(self, mutant: str) -> bool:
        """Caught on every seed by one of its workload rows (general or tuned); with none, by its scenario."""
        rows = [r for r in self.rows if r.entry.mutant == mutant]
        runs = [r for r in rows if r.entry.every_seed]
        if runs:
            return any(r.every_seed_caught for r in runs)
        return bool(rows) and all(r.detected_at is not None for r in rows)

    @property
    def detected(self) -> int:
        return sum(self.is_caught(m) for m in self.mutants())

    def unmodified_runs(self) -> list[RunRecord]:
        """Every distinct unmodified run (rows share them)."""
        seen: dict[int, RunRecord] = {}
        for r in self.rows:
            for x in r.unmodified:
                seen.setdefault(id(x), x)
        return list(seen.values())

    def as_json(self) -> dict[str, Any]:
        return {"name": self.spec.name, "source": self.spec.source, "fast": self.spec.fast, "runs": self.spec.runs,
                "elapsed_s": round(self.elapsed_s, 1), "detected": self.detected, "mutants": len(self.mutants()),
                "exit_code": exit_code(self),
                "caught": {m: self.is_caught(m) for m in self.mutants()},
                "rows": [{"mutant": r.entry.mutant, "kind": r.entry.kind, "workload": r.entry.workload,
                          "scenario": r.entry.scenario, "nemesis": list(r.entry.nemesis),
                          "exposed_by": r.entry.exposed_by(), "detected_at": r.detected_at,
                          "caught_runs": r.caught, "planted": len(r.planted),
                          "caught_by": r.caught_by, "unmodified": r.unmodified_verdict,
                          "planted_runs": [vars(x) for x in r.planted],
                          "unmodified_runs": [vars(x) for x in r.unmodified]} for r in self.rows]}


def caught_by(results: Mapping[str, Any]) -> list[str]:
    """`checker (violation kinds)` for every composed checker that judged the run invalid."""
    sub = results.get("results")
    if not isinstance(sub, Mapping):
        return ["(the checker)"] if results.get("valid") is False else []
    out = []
    for name, res in sub.items():
        if isinstance(res, Mapping) and res.get("valid") is False:
            kinds = sorted((res.get("violation_counts") or {}).items(), key=lambda kv: -kv[1])
            out.append(name + (f" ({', '.join(k for k, _ in kinds[:3])})" if kinds else ""))
    return out


def _one_run(test: Test, variant: str, seed: int, store_dir: Path,
             run: Callable[[Test, Path], Mapping[str, Any]]) -> RunRecord:
    """Run one test; an exception (the stack did not start, ...) is recorded, not raised (Ctrl-C is)."""
    t0 = time.monotonic()
    try:
        results = run(test, store_dir)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - one run's failure is a row's verdict, not the end of the table
        return RunRecord(variant, seed, None, run_dir=str(test.run_dir) if test.run_dir else None,
                         elapsed_s=round(time.monotonic() - t0, 1), error=" ".join(f"{type(e).__name__}: {e}".split()))
    return RunRecord(variant, seed, results.get("valid", "unknown"), caught_by(results),
                     str(test.run_dir) if test.run_dir else None, round(time.monotonic() - t0, 1))


def _default_run(test: Test, store_dir: Path) -> Mapping[str, Any]:
    return run_test(test, store_dir)


def run_mutants(spec: MutantsSpec, store_dir: Path | str = "store", *, echo: Callable[[str], Any] = print,
                run: Callable[[Test, Path], Mapping[str, Any]] | None = None, backend: str = "local",
                hosts_file: str | None = None, swarm: str | None = None) -> MutantsReport:
    """Run every row (planted on every seed, a scenario until caught; then the unmodified runs of the same Tests,
    each distinct one once); write the summary."""
    store_dir = Path(store_dir)
    if store_dir.exists() and not store_dir.is_dir():
        raise MutantsError(f"--store-dir {store_dir} exists and is not a directory")
    run = run or _default_run
    t0 = time.monotonic()
    rows: list[MutantRow] = []
    honest: dict[str, RunRecord] = {}  # config_key -> the unmodified run of that Test
    for entry in spec.entries:
        row = MutantRow(entry)
        rows.append(row)
        for seed in range(entry.runs):
            rec = _one_run(build_test(spec, entry, seed, True, backend, hosts_file, swarm), PLANTED, seed, store_dir, run)
            row.planted.append(rec)
            echo(_progress(entry, rec))
            if rec.valid is False and not entry.every_seed:
                break
        for seed in range(entry.runs):
            test = build_test(spec, entry, seed, False, backend, hosts_file, swarm)
            key = config_key(test)
            if key not in honest:
                honest[key] = _one_run(test, UNMODIFIED, seed, store_dir, run)
                echo(_progress(entry, honest[key]))
            row.unmodified.append(honest[key])
    report = MutantsReport(spec, rows, time.monotonic() - t0)
    path = store_dir / spec.name / ("summary-fast.json" if spec.fast else "summary.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(report.as_json(), indent=2, default=str))
    report.summary_path = path
    return report


def _progress(entry: Entry, rec: RunRecord) -> str:
    """One line per finished run."""
    verdict = "FAILED " + (rec.error or "") if rec.valid is None else f"valid={json.dumps(rec.valid)}"
    caught = f" caught by {'; '.join(rec.caught_by)}" if rec.caught_by else ""
    who = entry.mutant if rec.variant == PLANTED else "unmodified server"
    return (f"{who}, {entry.exposed_by()}, s{rec.seed}: {verdict}{caught} ({rec.elapsed_s:.1f}s) "
            f"{rec.run_dir or ''}")


def exit_code(report: MutantsReport) -> int:
    """0: every mutant caught (`is_caught`), every scenario row caught, every unmodified run valid; 1: not so."""
    ok = report.rows and all(report.is_caught(m) for m in report.mutants()) and all(r.ok for r in report.rows)
    return 0 if ok else 1


# -- the tables ---------------------------------------------------------------------------------------------

ROW_COLUMNS = ("mutant", "exposed by", "caught", "caught by", "unmodified server")


def _verdict_text(records: list[RunRecord]) -> str:
    """The unmodified server's verdict over some runs, as the tables show it."""
    row = MutantRow(Entry("-", "-"), unmodified=records)
    v = row.unmodified_verdict
    fails = [x for x in records if x.valid is not True]
    text = {True: "valid", False: "INVALID", None: "FAILED", "unknown": "UNKNOWN"}[v]
    text += f" ({len(records)} run{'s' if len(records) != 1 else ''})"
    if fails:
        text += ": " + "; ".join(x.error or ", ".join(x.caught_by) or str(x.valid) for x in fails[:1])
    return text


def _caught_text(row: MutantRow) -> str:
    if row.entry.every_seed:
        return f"{row.caught}/{len(row.planted)}" + ("" if row.caught else " NOT CAUGHT")
    at = row.detected_at
    return f"run {at} (of up to {row.entry.runs})" if at else f"NOT CAUGHT in {len(row.planted)} runs"


def _row_cells(report: MutantsReport) -> list[tuple[str, ...]]:
    """One line per row: every configuration each mutant ran under."""
    return [(r.entry.mutant, r.entry.exposed_by(), _caught_text(r), "; ".join(r.caught_by) or "-",
             _verdict_text(r.unmodified)) for r in report.rows]


def _matrix(report: MutantsReport) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The detection matrix: one line per mutant, caught/seeds per general workload (at its defaults)."""
    general = list(dict.fromkeys(r.entry.workload for r in report.rows if r.entry.kind == GENERAL))
    columns = ("mutant", "fault", *general, "tuned run", "scenario (extra evidence)", "caught")
    lines = []
    for m in report.mutants():
        rows = [r for r in report.rows if r.entry.mutant == m]
        gen_rows = {r.entry.workload: r for r in rows if r.entry.kind == GENERAL}
        fault = "+".join(dict.fromkeys(n for r in rows if r.entry.kind == GENERAL for n in r.entry.nemesis)) or "-"
        cells = [f"{gen_rows[w].caught}/{len(gen_rows[w].planted)}" if w in gen_rows else "-" for w in general]
        tuned = "; ".join(f"{r.entry.exposed_by()}: {_caught_text(r)}" for r in rows if r.entry.kind == TUNED) or "-"
        scen = "; ".join(f"{r.entry.scenario}: {_caught_text(r)}" for r in rows if r.entry.kind == SCENARIO) or "-"
        lines.append((m, fault, *cells, tuned, scen, "yes" if report.is_caught(m) else "NO"))
    return columns, lines


def _totals(report: MutantsReport) -> str:
    n = len(report.mutants())
    pct = 100.0 * report.detected / n if n else 0.0
    honest = report.unmodified_runs()
    valid = sum(x.valid is True for x in honest)
    return (f"{report.detected}/{n} mutants caught on every seed ({pct:.0f}% detection); unmodified server valid "
            f"on {valid}/{len(honest)} runs; {report.elapsed_s:.0f} s" + (" (--fast)" if report.spec.fast else ""))


def _plain(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    table = [columns, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _markdown(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    table = [columns, tuple("---" for _ in columns), *rows]
    return ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table]


def render_plain(report: MutantsReport) -> str:
    """Plain-text columns (CI logs, pipes): the detection matrix, then every row."""
    return "\n".join([*_plain(*_matrix(report)), "", *_plain(ROW_COLUMNS, _row_cells(report)), "",
                      _totals(report)])


def render_markdown(report: MutantsReport) -> str:
    """Markdown tables (docs/mutants.md's measured tables)."""
    return "\n".join([*_markdown(*_matrix(report)), "", *_markdown(ROW_COLUMNS, _row_cells(report)), "",
                      _totals(report)]) + "\n"


def print_table(report: MutantsReport, echo: Callable[[str], Any] = print) -> None:
    """Rich tables on a terminal (never under CI), plain text otherwise."""
    console = Console()
    if not console.is_terminal or os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        echo(render_plain(report))
        return
    columns, lines = _matrix(report)
    matrix = Table(title=f"mutants: {report.spec.name} (caught/seeds)")
    for c in columns:
        matrix.add_column(c, overflow="fold")
    for m, line in zip(report.mutants(), lines):
        matrix.add_row(*line, style=None if report.is_caught(m) else "bold red")
    console.print(matrix)
    table = Table(title="every run configuration")
    for c in ROW_COLUMNS:
        table.add_column(c, overflow="fold")
    for r, cells in zip(report.rows, _row_cells(report)):
        table.add_row(*cells, style=None if r.ok else "bold red")
    console.print(table)
    console.print(_totals(report), style="green" if exit_code(report) == 0 else "bold red")
