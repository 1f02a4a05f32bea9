"""`fencelab mutants`: does every planted bug get caught, and does the unmodified server pass the same runs?

A mutants spec (`campaigns/mutants.toml`) names, for each planted bug of the
reference server (lab/server/mutants), the run that exposes it: a race
scenario of lab.scenarios, or a workload and a nemesis, with Test options. For
each entry the runner

1. runs the test with the bug planted (`fencelab test --mutant NAME`: every lease
   server of the run's stack gets `--allow-mutants --mutant NAME`), seed 0, 1, ...
   up to `runs`, stopping at the first run the checkers judge invalid;
2. runs the same test against the unmodified server on every one of those seeds,
   each of which must be valid;

and prints one row per mutant: the scenario, the checker(s) that caught it, the
runs to first detection, and the unmodified server's verdict. The exit code is
0 only when every mutant was caught and every unmodified run was valid.

Every run is an ordinary `fencelab test` run (`lab.runner.run_test`) in
`<store>/<spec name>/<mutant>/<planted|unmodified>-s<seed>/<timestamp>/`, with its
test.json (the replay command carries `--mutant`), history, results.json and
report; the table's data goes to `<store>/<spec name>/summary[-fast].json`.

The spec (TOML):

    name = "mutants"          # the store directory
    runs = 3                  # seeds per mutant
    [defaults]                # Test options of every run (as a campaign's [defaults])
    [fast]                    # what --fast changes: runs, and Test options for every entry
    [mutants.<name>]          # scenario = "..." | workload = "..." [nemesis = "..." | [...]], Test options,
                              # fast = { Test options under --fast }

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

from lab.testmap import Test

__all__ = ["Entry", "MutantRow", "MutantsError", "MutantsReport", "MutantsSpec", "RunRecord", "build_test",
           "caught_by", "exit_code", "load_spec", "parse_spec", "render_markdown", "render_plain", "run_mutants"]

DEFAULT_SPEC = Path("campaigns/mutants.toml")
TOP_KEYS = ("name", "description", "runs", "defaults", "fast", "mutants")
ENTRY_KEYS = ("scenario", "workload", "nemesis", "runs", "fast")
PLANTED, UNMODIFIED = "planted", "unmodified"


class MutantsError(ValueError):
    """The spec or the options cannot run as given; the one-line message says what to change."""


# -- the spec ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One mutant and the run that exposes it."""

    mutant: str
    workload: str
    scenario: str | None = None
    nemesis: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # the entry's own Test options (and --fast's): they win
    defaults: Mapping[str, Any] = field(default_factory=dict)  # the spec's [defaults]: a scenario's options beat them
    runs: int = 1  # seeds 0 .. runs-1

    def exposed_by(self) -> str:
        """The scenario, or the workload and nemesis, as the table shows it."""
        if self.scenario:
            return f"scenario {self.scenario}"
        return f"{self.workload} workload" + (f" + {'+'.join(self.nemesis)} nemesis" if self.nemesis else "")


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
    """Test options, typed as a campaign's (lab.campaign.spec.OPTIONS)."""
    from lab.campaign.spec import OPTIONS

    if not isinstance(table, Mapping):
        raise MutantsError(f"{where} must be a table of Test options, not {table!r}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in OPTIONS:
            raise MutantsError(f"{where}: unknown key {key!r}; Test options: {', '.join(OPTIONS)}")
        ok, kind = OPTIONS[key]
        if not ok(value):
            raise MutantsError(f"{where}: {key} must be {kind}, not {value!r}")
        if key == "extra" and "mutant" in value:
            raise MutantsError(f"{where}: extra.mutant is set by the runner (the entry's name); remove it")
        out[key] = dict(value) if key == "extra" else value
    return out


def _merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win; `extra` tables merge key by key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in layer.items():
            out[k] = {**out.get(k, {}), **v} if k == "extra" else v
    return out


def _runs(where: str, value: Any) -> int:
    """A seed count: an integer 1-100."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100:
        raise MutantsError(f"{where} must be an integer between 1 and 100 (seeds per mutant), not {value!r}")
    return value


def _entry(source: str, name: str, table: Any, defaults: dict[str, Any], fast: dict[str, Any] | None,
           runs: int) -> Entry:
    """One `[mutants.<name>]` table, validated (fast: the spec's [fast] options, when --fast; runs: the spec's)."""
    from lab.server.mutants import MUTANT_NAMES
    from workloads import WORKLOADS

    where = f"{source}: [mutants.{name}]"
    if name not in MUTANT_NAMES:
        raise MutantsError(f"{where}: unknown mutant {name!r}; known: {', '.join(MUTANT_NAMES)}")
    if not isinstance(table, Mapping):
        raise MutantsError(f"{where} must be a table (scenario = ... or workload = ...)")
    own = {k: v for k, v in table.items() if k not in ENTRY_KEYS}
    options = _options(where, own)
    scenario, workload = table.get("scenario"), table.get("workload")
    if (scenario is None) == (workload is None):
        raise MutantsError(f"{where}: give exactly one of scenario (a race scenario) or workload")
    nemesis = table.get("nemesis", [])
    if isinstance(nemesis, str):
        nemesis = [nemesis]
    if not isinstance(nemesis, list) or not all(isinstance(n, str) for n in nemesis):
        raise MutantsError(f"{where}: nemesis must be a nemesis name or a list of names, not {nemesis!r}")
    if scenario is not None:
        from lab.scenarios import SCENARIOS

        if not isinstance(scenario, str) or scenario not in SCENARIOS:
            raise MutantsError(f"{where}: unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
        if nemesis:
            raise MutantsError(f"{where}: a scenario brings its own faults; remove nemesis")
        workload = SCENARIOS[scenario].workload
    elif not isinstance(workload, str) or workload not in WORKLOADS:
        raise MutantsError(f"{where}: unknown workload {workload!r}; known: {', '.join(sorted(WORKLOADS))}")
    own_fast = table.get("fast", {})
    if not isinstance(own_fast, Mapping):
        raise MutantsError(f"{where} fast must be a table (runs, Test options), not {own_fast!r}")
    entry_fast = _options(f"{where} fast", {k: v for k, v in own_fast.items() if k != "runs"})
    given = _merge(options, *((fast, entry_fast) if fast is not None else ()))
    # seeds: the entry's own count (its `fast.runs` under --fast), else the spec's (`runs`, or [fast] runs)
    mine = own_fast.get("runs") if fast is not None else table.get("runs")
    if mine is not None:
        runs = _runs(f"{where} {'fast runs' if fast is not None else 'runs'}", mine)
    return Entry(name, workload, scenario, tuple(nemesis), given, defaults, runs)


def parse_spec(data: Any, source: str = "<spec>", *, fast: bool = False, only: tuple[str, ...] = ()) -> MutantsSpec:
    """Validate a parsed spec; `fast` applies its [fast] table, `only` keeps those mutants (in spec order)."""
    if not isinstance(data, Mapping):
        raise MutantsError(f"{source}: a mutants spec is a table of {', '.join(TOP_KEYS)}")
    for key in data:
        if key not in TOP_KEYS:
            raise MutantsError(f"{source}: unknown key {key!r}; known keys: {', '.join(TOP_KEYS)}")
    name = data.get("name")
    from lab.campaign.spec import NAME_RE

    if not isinstance(name, str) or not NAME_RE.match(name):
        raise MutantsError(f"{source}: name must be letters, digits, '.', '_' or '-' (the store directory), "
                           f"not {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise MutantsError(f"{source}: description must be a string, not {description!r}")
    runs = _runs(f"{source}: runs", data.get("runs", 1))
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
    entries = [_entry(source, n, t, defaults, fast_options if fast else None, runs) for n, t in mutants.items()
               if not (fast and n in skip)]
    skipped = sorted(set(only) & set(skip)) if fast else []
    if skipped:
        raise MutantsError(f"--only {skipped[0]}: --fast skips it ([fast] skip in {source}); run it without --fast")
    if only:
        unknown = sorted(set(only) - {e.mutant for e in entries})
        if unknown:
            raise MutantsError(f"--only {unknown[0]}: not a mutant of {source} ({', '.join(e.mutant for e in entries)})")
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


def build_test(spec: MutantsSpec, entry: Entry, seed: int, planted: bool) -> Test:
    """The Test of one run: [defaults], then the scenario's options, then the entry's; `extra.mutant` if planted.

    The same merge order as a campaign's (docs/campaigns.md).
    """
    opts = _merge(entry.defaults, entry.options)
    extra = {"servers": opts.pop("servers", 2), **opts.pop("extra", {})}
    variant = PLANTED if planted else UNMODIFIED
    test = Test(name=f"{spec.name}/{entry.mutant}/{variant}-s{seed}", workload=entry.workload, seed=seed,
                nemesis=list(entry.nemesis), extra=extra, **opts)
    if entry.scenario:
        from lab.scenarios import apply_scenario

        test.extra["scenario"] = entry.scenario
        apply_scenario(test, {"name", "workload", *entry.options})
    if planted:
        test.extra["mutant"] = entry.mutant
    return test


def validate_spec(spec: MutantsSpec) -> None:
    """Every run's Test passes `lab.runner.validate` (before anything starts)."""
    from lab.runner import RunError, validate

    for entry in spec.entries:
        for planted in (True, False):
            try:
                validate(build_test(spec, entry, 0, planted))
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
    """One mutant's runs, planted and unmodified."""

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
    def caught_by(self) -> list[str]:
        """The checkers of the first detecting run."""
        at = self.detected_at
        return self.planted[at - 1].caught_by if at else []

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
        return self.detected_at is not None and self.unmodified_verdict is True


@dataclass
class MutantsReport:
    """Every row, and where the summary went."""

    spec: MutantsSpec
    rows: list[MutantRow]
    elapsed_s: float = 0.0
    summary_path: Path | None = None

    @property
    def detected(self) -> int:
        return sum(r.detected_at is not None for r in self.rows)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.spec.name, "source": self.spec.source, "fast": self.spec.fast, "runs": self.spec.runs,
                "elapsed_s": round(self.elapsed_s, 1), "detected": self.detected, "mutants": len(self.rows),
                "exit_code": exit_code(self),
                "rows": [{"mutant": r.entry.mutant, "exposed_by": r.entry.exposed_by(), "detected_at": r.detected_at,
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


def _one_run(spec: MutantsSpec, entry: Entry, seed: int, planted: bool, store_dir: Path,
             run: Callable[[Test, Path], Mapping[str, Any]]) -> RunRecord:
    """Run one test; an exception (the stack did not start, ...) is recorded, not raised (Ctrl-C is)."""
    test = build_test(spec, entry, seed, planted)
    variant = PLANTED if planted else UNMODIFIED
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
    from lab.runner import run_test

    return run_test(test, store_dir)


def run_mutants(spec: MutantsSpec, store_dir: Path | str = "store", *, echo: Callable[[str], Any] = print,
                run: Callable[[Test, Path], Mapping[str, Any]] | None = None) -> MutantsReport:
    """Run every entry (planted until caught, then unmodified on the same seeds); write the summary."""
    store_dir = Path(store_dir)
    if store_dir.exists() and not store_dir.is_dir():
        raise MutantsError(f"--store-dir {store_dir} exists and is not a directory")
    run = run or _default_run
    t0 = time.monotonic()
    rows: list[MutantRow] = []
    for entry in spec.entries:
        row = MutantRow(entry)
        rows.append(row)
        for seed in range(entry.runs):
            rec = _one_run(spec, entry, seed, True, store_dir, run)
            row.planted.append(rec)
            echo(_progress(entry, rec))
            if rec.valid is False:
                break
        for seed in range(entry.runs):
            rec = _one_run(spec, entry, seed, False, store_dir, run)
            row.unmodified.append(rec)
            echo(_progress(entry, rec))
    report = MutantsReport(spec, rows, time.monotonic() - t0)
    path = store_dir / spec.name / ("summary-fast.json" if spec.fast else "summary.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report.as_json(), indent=2, default=str))
    os.replace(tmp, path)
    report.summary_path = path
    return report


def _progress(entry: Entry, rec: RunRecord) -> str:
    """One line per finished run."""
    verdict = "FAILED " + (rec.error or "") if rec.valid is None else f"valid={json.dumps(rec.valid)}"
    caught = f" caught by {'; '.join(rec.caught_by)}" if rec.caught_by else ""
    return f"{entry.mutant} {rec.variant} s{rec.seed}: {verdict}{caught} ({rec.elapsed_s:.1f}s) {rec.run_dir or ''}"


def exit_code(report: MutantsReport) -> int:
    """0: every mutant caught and the unmodified server valid everywhere; 1: not so."""
    return 0 if report.rows and all(r.ok for r in report.rows) else 1


# -- the table ----------------------------------------------------------------------------------------------

COLUMNS = ("mutant", "exposed by", "caught by", "runs to detection", "unmodified server")


def _cells(report: MutantsReport) -> list[tuple[str, ...]]:
    """The table's rows as text."""
    out = []
    for r in report.rows:
        at = r.detected_at
        detection = f"run {at} (of up to {r.entry.runs})" if at else f"NOT CAUGHT in {len(r.planted)} runs"
        v = r.unmodified_verdict
        fails = [x for x in r.unmodified if x.valid is not True]
        verdict = {True: "valid", False: "INVALID", None: "FAILED", "unknown": "UNKNOWN"}[v]
        verdict += f" ({len(r.unmodified)} run{'s' if len(r.unmodified) != 1 else ''})"
        if fails:
            verdict += ": " + "; ".join(x.error or ", ".join(x.caught_by) or str(x.valid) for x in fails[:1])
        out.append((r.entry.mutant, r.entry.exposed_by(), "; ".join(r.caught_by) or "-", detection, verdict))
    return out


def _totals(report: MutantsReport) -> str:
    n = len(report.rows)
    pct = 100.0 * report.detected / n if n else 0.0
    valid = sum(r.unmodified_verdict is True for r in report.rows)
    return (f"{report.detected}/{n} mutants caught ({pct:.0f}% detection); unmodified server valid on "
            f"{valid}/{n} scenarios; {report.elapsed_s:.0f} s" + (" (--fast)" if report.spec.fast else ""))


def render_plain(report: MutantsReport) -> str:
    """Plain-text columns (CI logs, pipes)."""
    rows = [COLUMNS, *_cells(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + ["", _totals(report)])


def render_markdown(report: MutantsReport) -> str:
    """A Markdown table (docs/mutants.md's measured table)."""
    rows = [COLUMNS, tuple("---" for _ in COLUMNS), *_cells(report)]
    return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows) + \
        f"\n\n{_totals(report)}\n"


def print_table(report: MutantsReport, echo: Callable[[str], Any] = print) -> None:
    """A rich table on a terminal (never under CI), plain text otherwise."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal or os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        echo(render_plain(report))
        return
    from rich.table import Table

    table = Table(title=f"mutants: {report.spec.name}", show_lines=False)
    for c in COLUMNS:
        table.add_column(c, overflow="fold")
    for r, cells in zip(report.rows, _cells(report)):
        table.add_row(*cells, style=None if r.ok else "bold red")
    console.print(table)
    console.print(_totals(report), style="green" if exit_code(report) == 0 else "bold red")
