"""Every fault kind proven to expose a bug: the fault table (`campaigns/faults.toml`, docs/nemesis.md).

For each fault kind a row names a planted bug of the reference server
(lab/server/mutants) that this fault exposes, and the run that shows it. Every
seed of a row runs three times, all ordinary `fencelab test` runs
(`lab.runner.run_test`):

- **exposed**: the fault, the bug planted: the checkers must judge it invalid;
- **plain**: the same workload and options with the bug planted and no fault:
  it must be valid (the fault, not the workload, exposes the bug);
- **unmodified**: the fault, no bug: it must be valid (no false alarm).

Plain runs are shared between rows with the same mutant, workload and options.
A row holds when all three hold on every seed. Rows that need what this
machine lacks (root for `netns`) are skipped with the reason, never passed.

    python -m lab.exposure [--spec campaigns/faults.toml] [--store-dir store] [--only FAULT ...] [--jobs 2]

The spec (TOML):

    name = "faults"               # the store directory
    seeds = 2                     # seeds 0 .. seeds-1 of every row
    [defaults]                    # Test options of every run (time_limit, nemesis_interval, servers, ...)
    [faults.<fault>]              # one row per fault kind
    nemesis = "partition"         # the --nemesis names of the exposed and unmodified runs
    mutant = "renew-without-backend"
    workload = "lease"
    why = "..."                   # why this fault exposes this bug (the docs table's column)
    ttl_ms = 500                  # any Test option: time_limit, concurrency, rate, keys, ttl_ms, ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import dataclasses
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lab.runner import RunError, run_test, validate
from lab.server.mutants import MUTANT_NAMES
from lab.testmap import OptionError, Test, check_options
from nemesis.registry import NEMESES, validate_names

__all__ = ["FaultRow", "FaultsError", "FaultsSpec", "RowResult", "load_spec", "render_markdown", "run_faults",
           "unavailable"]

DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "campaigns" / "faults.toml"
TOP_KEYS = ("name", "description", "seeds", "defaults", "faults")
ROW_KEYS = ("nemesis", "mutant", "workload", "why")
TEST_OPTIONS = {"time_limit": float, "concurrency": int, "rate": float, "keys": int, "ttl_ms": int,
                "nemesis_interval": float, "servers": int}
EXPOSED, PLAIN, UNMODIFIED = "exposed", "plain", "unmodified"


class FaultsError(ValueError):
    """The spec cannot run as given; the one-line message names the key."""


@dataclass(frozen=True)
class FaultRow:
    """One fault kind, the planted bug it exposes, and the run that shows it."""

    fault: str
    nemesis: tuple[str, ...]
    mutant: str
    workload: str
    why: str
    options: dict[str, Any] = field(default_factory=dict)

    def test(self, spec: "FaultsSpec", kind: str, seed: int) -> Test:
        """The Test of one run of this row: `exposed`, `plain` or `unmodified`."""
        opts = {**spec.defaults, **self.options}
        mutant = self.mutant if kind in (EXPOSED, PLAIN) else None
        nemesis = [] if kind == PLAIN else list(self.nemesis)
        name = f"{spec.name}/{self.fault}/{kind}-s{seed}" if kind != PLAIN else \
            f"{spec.name}/plain/{self.mutant}-{self.workload}-{_options_label(opts)}/s{seed}"
        return Test(name=name, workload=self.workload, seed=seed, nemesis=nemesis, mutant=mutant, **opts)


def _options_label(opts: dict[str, Any]) -> str:
    shown = sorted((k, v) for k, v in opts.items() if k not in ("nemesis_interval", "servers"))
    return "-".join(f"{k}{v}" for k, v in shown) or "defaults"


@dataclass
class FaultsSpec:
    name: str
    seeds: int
    defaults: dict[str, Any]
    rows: list[FaultRow]
    source: str = ""


def _options(where: str, table: dict[str, Any]) -> dict[str, Any]:
    """Test options of a row or [defaults], typed by lab.testmap's one schema (as a campaign's)."""
    try:
        opts = check_options(dict(table), allowed=tuple(TEST_OPTIONS))
    except OptionError as e:
        raise FaultsError(f"{where}: {e}") from None
    return {k: TEST_OPTIONS[k](v) for k, v in opts.items()}


def parse_spec(data: dict[str, Any], source: str = "<spec>") -> FaultsSpec:
    """A FaultsSpec from parsed TOML, or FaultsError naming the first problem."""
    unknown = set(data) - set(TOP_KEYS)
    if unknown:
        raise FaultsError(f"{source}: unknown key {sorted(unknown)[0]!r}; known: {', '.join(TOP_KEYS)}")
    seeds = data.get("seeds", 2)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= 100:
        raise FaultsError(f"{source}: seeds must be an integer from 1 to 100, got {seeds!r}")
    defaults = _options(f"{source}: [defaults]", data.get("defaults", {}))
    faults = data.get("faults")
    if not isinstance(faults, dict) or not faults:
        raise FaultsError(f"{source}: no [faults.<fault>] rows")
    rows = []
    for fault, row in faults.items():
        where = f"{source}: [faults.{fault}]"
        if not isinstance(row, dict):
            raise FaultsError(f"{where}: must be a table")
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise FaultsError(f"{where}: missing {', '.join(missing)}")
        nemesis = row["nemesis"]
        names = tuple([nemesis] if isinstance(nemesis, str) else nemesis)
        if not names or any(not isinstance(n, str) or n not in NEMESES for n in names):
            raise FaultsError(f"{where}: nemesis must name known nemeses ({', '.join(NEMESES)}), got {nemesis!r}")
        if row["mutant"] not in MUTANT_NAMES:
            raise FaultsError(f"{where}: unknown mutant {row['mutant']!r}; known: {', '.join(MUTANT_NAMES)}")
        if not isinstance(row["why"], str) or not row["why"].strip():
            raise FaultsError(f"{where}: why must say why this fault exposes this bug")
        options = _options(where, {k: v for k, v in row.items() if k not in ROW_KEYS})
        rows.append(FaultRow(fault, names, row["mutant"], str(row["workload"]), " ".join(row["why"].split()),
                             options))
    spec = FaultsSpec(str(data.get("name", "faults")), seeds, defaults, rows, source)
    for r in rows:  # every Test, before anything runs (the nemesis names' own preconditions are run-time: see
        for kind in (EXPOSED, PLAIN, UNMODIFIED):  # `unavailable`)
            _validate(r.test(spec, kind, 0), f"{source}: [faults.{r.fault}]")
    return spec


def _validate(test: Test, where: str) -> None:
    try:
        validate(_without_nemesis_checks(test))
    except (RunError, ValueError) as e:
        raise FaultsError(f"{where}: {e}") from None


def _without_nemesis_checks(test: Test) -> Test:
    """The Test with a nemesis this machine cannot run (netns as non-root) replaced by none, for validation."""
    if unavailable(test.nemesis):
        return dataclasses.replace(test, nemesis=[])  # every other option (servers, mutant) as it is
    return test


def load_spec(path: Path | str = DEFAULT_SPEC) -> FaultsSpec:
    """Read and validate a faults spec."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise FaultsError(f"--spec {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise FaultsError(f"--spec {path}: not valid TOML: {e}") from None
    return parse_spec(data, str(path))


def unavailable(names: Any) -> str | None:
    """Why these nemeses cannot run on this machine (netns needs root, ip, iptables; clocks need libfaketime)."""
    try:
        validate_names(list(names))
    except ValueError as e:
        return str(e)
    return None


# -- running ------------------------------------------------------------------------------------------------
@dataclass
class RowResult:
    """One row's verdicts per seed."""

    row: FaultRow
    skipped: str | None = None
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {EXPOSED: [], PLAIN: [], UNMODIFIED: []})

    @property
    def holds(self) -> bool:
        """Exposed invalid, plain and unmodified valid, on every seed (a skipped row does not hold)."""
        if self.skipped:
            return False
        return all(r["valid"] is False for r in self.runs[EXPOSED]) and \
            all(r["valid"] is True for kind in (PLAIN, UNMODIFIED) for r in self.runs[kind])

    def caught(self) -> str:
        n = sum(r["valid"] is False for r in self.runs[EXPOSED])
        return f"{n}/{len(self.runs[EXPOSED])}"

    def checkers(self) -> str:
        """The checkers (and violation kinds) that caught the planted runs."""
        seen: dict[str, set[str]] = {}
        for r in self.runs[EXPOSED]:
            for name, kinds in r.get("failed", {}).items():
                seen.setdefault(name, set()).update(kinds)
        return "; ".join(f"{n} ({', '.join(sorted(k))})" if k else n for n, k in sorted(seen.items())) or "-"

    def to_json(self) -> dict[str, Any]:
        r = self.row
        return {"fault": r.fault, "nemesis": list(r.nemesis), "mutant": r.mutant, "workload": r.workload,
                "options": r.options, "why": r.why, "skipped": self.skipped, "holds": self.holds,
                "caught": self.caught(), "checkers": self.checkers(), "runs": self.runs}


def _verdict(results: dict[str, Any], run_dir: Any, seconds: float) -> dict[str, Any]:
    """What the table needs of one run: valid, which checkers failed (and their violation kinds), where."""
    failed = {}
    for name, res in (results.get("results") or {}).items():
        if isinstance(res, dict) and res.get("valid") is False:
            failed[name] = sorted({v.get("type", "?") for v in res.get("violations") or [] if isinstance(v, dict)})
    return {"valid": results.get("valid"), "failed": failed, "run_dir": str(run_dir), "seconds": round(seconds, 1)}


def _one_run(test: Test, store_dir: str) -> dict[str, Any]:
    """One run (in a worker process when jobs > 1): its verdict for the table."""
    started = time.monotonic()
    try:
        results = run_test(test, Path(store_dir))
    except Exception as e:  # noqa: BLE001 - one broken run is that run's verdict, never the table's end
        return {"valid": "error", "failed": {}, "error": f"{type(e).__name__}: {e}"[:300],
                "run_dir": str(test.run_dir), "seconds": round(time.monotonic() - started, 1)}
    return _verdict(results, test.run_dir, time.monotonic() - started)


def _child_run(source: str, where: tuple[str, str, int], store_dir: str) -> dict[str, Any]:
    """One run in a child process; its verdict (the child's last line of output, JSON)."""
    fault, kind, seed = where
    argv = [sys.executable, "-m", "lab.exposure", "--spec", source, "--store-dir", store_dir,
            "--one", fault, kind, str(seed)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"valid": "error", "failed": {}, "error": f"exit {proc.returncode}: {tail}"[:300], "run_dir": None,
                "seconds": None}


def run_faults(spec: FaultsSpec, store_dir: Path, *, only: tuple[str, ...] = (), jobs: int = 1,
               progress: Callable[[str], None] = print) -> list[RowResult]:
    """Run every row (or those named in `only`) on every seed; plain runs are shared between equal configurations.

    `jobs` > 1 runs that many runs at once, each in its own process (each run owns its stack by pid).
    """
    rows = [r for r in spec.rows if not only or r.fault in only]
    unknown = set(only) - {r.fault for r in spec.rows}
    if unknown:
        raise FaultsError(f"--only: unknown fault {sorted(unknown)[0]!r}; "
                          f"rows: {', '.join(r.fault for r in spec.rows)}")
    out, planned, tests = [], {}, {}  # planned: (fault, kind, seed) -> test name; tests: name -> Test
    for row in rows:
        res = RowResult(row)
        res.skipped = unavailable(row.nemesis)
        out.append(res)
        if res.skipped:
            progress(f"{row.fault}: skipped: {res.skipped}")
            continue
        for seed in range(spec.seeds):
            for kind in (EXPOSED, PLAIN, UNMODIFIED):
                test = row.test(spec, kind, seed)
                planned[(row.fault, kind, seed)] = test.name
                tests.setdefault(test.name, test)  # equal plain runs are one run
    verdicts: dict[str, dict[str, Any]] = {}

    def record(name: str, verdict: dict[str, Any]) -> None:
        verdicts[name] = verdict
        progress(f"{name}: valid={verdict['valid']} {' '.join(verdict['failed'])} ({verdict['seconds']} s)")

    if jobs <= 1 or not Path(spec.source).is_file():
        for name, test in tests.items():
            record(name, _one_run(test, str(store_dir)))
    else:  # each run in a child `python -m lab.exposure --one ...` (its stack dies with it), `jobs` at a time
        where = {name: key for key, name in planned.items()}
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {name: pool.submit(_child_run, spec.source, where[name], str(store_dir)) for name in tests}
            for name, fut in futures.items():
                record(name, fut.result())
    for res in out:
        if res.skipped:
            continue
        for seed in range(spec.seeds):
            for kind in (EXPOSED, PLAIN, UNMODIFIED):
                res.runs[kind].append(verdicts[planned[(res.row.fault, kind, seed)]])
    return out


def render_markdown(results: list[RowResult]) -> str:
    """The docs table: fault, mutant, why this fault exposes it, detection measured."""
    lines = ["| fault | planted bug | why this fault exposes it | caught (seeds) | caught by | plain run (no fault) "
             "| unmodified server under the fault |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.row.fault} | {r.row.mutant} | {r.row.why} | skipped: {r.skipped} | | | |")
            continue
        plain = "valid" if all(v["valid"] is True for v in r.runs[PLAIN]) else \
            "INVALID: " + ", ".join(str(v["valid"]) for v in r.runs[PLAIN])
        unmod = "valid" if all(v["valid"] is True for v in r.runs[UNMODIFIED]) else \
            "INVALID: " + ", ".join(str(v["valid"]) for v in r.runs[UNMODIFIED])
        lines.append(f"| {r.row.fault} (`--nemesis {','.join(r.row.nemesis)}`, {r.row.workload}) | {r.row.mutant} | "
                     f"{r.row.why} | {r.caught()} | {r.checkers()} | {plain} ({len(r.runs[PLAIN])} seeds) | "
                     f"{unmod} ({len(r.runs[UNMODIFIED])} seeds) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.exposure", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(DEFAULT_SPEC))
    ap.add_argument("--store-dir", default="store")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    ap.add_argument("--one", nargs=3, metavar=("FAULT", "KIND", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:  # one run of a row, for a parent running several at once: the verdict as the last line
        spec = load_spec(args.spec)
        fault, kind, seed = args.one
        (row,) = [r for r in spec.rows if r.fault == fault]
        print(json.dumps(_one_run(row.test(spec, kind, int(seed)), args.store_dir), default=str))
        return 0
    try:
        spec = load_spec(args.spec)
        started = time.monotonic()
        results = run_faults(spec, Path(args.store_dir), only=tuple(args.only), jobs=args.jobs)
    except FaultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(render_markdown(results))
    held = sum(r.holds for r in results)
    print(f"\n{held}/{len(results)} rows hold; {time.monotonic() - started:.0f} s")
    summary = Path(args.store_dir) / spec.name / "summary.json"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps([r.to_json() for r in results], indent=2, default=str))
    return 0 if held == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
