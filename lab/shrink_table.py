"""Every planted bug of `fencelab mutants`, shrunk from a default-run failure (issue 21: the per-mutant table).

    python -m lab.shrink_table [--spec campaigns/mutants.toml] [--store-dir DIR] [--only MUTANT ...]
                               [--runs 5] [--max-runs 60] [--seeds 3] [--markdown]

For each mutant: its general workload at its defaults (the workload the spec's `[fast]` table names for it; its
nemesis where the bug needs a fault), seeds 0, 1, ... until a run is invalid (at most `--seeds`), then
`fencelab shrink` on that run with the default budget. A row records the original and the minimal
configuration (clients, keys, servers, seconds, rate, faults), the minimal case's reproduction rate, the runs
and seconds the shrink used and why it stopped. `SMALL` is what the issue asks of every row: at most 3 clients,
2 keys and 2 faults, reproducing at >= 0.6. `tests/test_shrink_table.py` (marked slow) runs it and asserts that;
docs/shrinking.md has the measured table. Resumable: a mutant whose row is in DIR/shrink-table.json is not redone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.mutants import GENERAL, DEFAULT_SPEC, MutantsError, build_test, load_spec
from lab.paths import write_text_atomic
from lab.runner import run_test
from lab.shrink.run import ShrinkError, shrink_run
from lab.shrink.search import INTERRUPTED

__all__ = ["SMALL", "Row", "main", "row_problems", "shrink_mutant"]

SMALL = {"concurrency": 3, "keys": 2, "faults": 2, "rate": 0.6}  # the bounds on a minimal case
TABLE = "shrink-table.json"


@dataclass
class Row:
    """One mutant: its default run (seed, verdict, where), the shrink's original and minimal configuration."""

    mutant: str
    workload: str
    nemesis: list[str]
    seed: int | None = None  # the seed whose default run was invalid (None: no seed failed)
    run_dir: str | None = None
    shrink: dict[str, Any] | None = None  # shrink.json's data
    error: str | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def row_problems(row: dict[str, Any]) -> list[str]:
    """Where a row misses the issue's bounds (empty: it meets them)."""
    if row.get("error") or not row.get("shrink"):
        return [row.get("error") or "no default run failed: nothing to shrink"]
    m = row["shrink"]["minimal"]
    c = m["config"]
    out = []
    if c["concurrency"] > SMALL["concurrency"]:
        out.append(f"{c['concurrency']} clients")
    if c["keys"] > SMALL["keys"]:
        out.append(f"{c['keys']} keys")
    if len(c["windows"]) > SMALL["faults"]:
        out.append(f"{len(c['windows'])} faults")
    if (m["rate"] or 0) < SMALL["rate"]:
        out.append(f"reproduces at {m['rate']}")
    return out


def shrink_mutant(mutant: str, store: Path, *, spec_path: str = str(DEFAULT_SPEC), runs: int = 5,
                  max_runs: int = 60, seeds: int = 3, echo=print) -> Row:
    """Find a failing default run of `mutant` and shrink it (the module docstring)."""
    fast = load_spec(spec_path, fast=True, only=(mutant,))
    full = load_spec(spec_path, only=(mutant,))
    workload = fast.entries[0].workload
    entry = next(e for e in full.entries if e.kind == GENERAL and e.workload == workload)
    row = Row(mutant, workload, list(entry.nemesis))
    started = time.monotonic()
    for seed in range(seeds):
        test = build_test(full, entry, seed, planted=True)
        results = run_test(test, store)
        echo(f"{mutant}: default run seed {seed} ({workload}{' + ' + '+'.join(entry.nemesis) if entry.nemesis else ''}):"
             f" valid={results.get('valid')}")
        if results.get("valid") is False:
            row.seed, row.run_dir = seed, str(test.run_dir)
            break
    if row.run_dir is not None:
        try:
            report = shrink_run(Path(row.run_dir), runs=runs, max_runs=max_runs,
                                echo=lambda s: echo(f"  {s}"), runs_output=sys.stderr)
            if report.data["stopped"] == INTERRUPTED:
                # Ctrl-C stops the table, not just this row's shrink: an interrupted row is not a
                # finished one, so it is not written, and the same command starts that row again
                raise KeyboardInterrupt
            row.shrink = report.data
        except ShrinkError as e:
            row.error = str(e)
    row.seconds = round(time.monotonic() - started, 1)
    return row


def _dims(c: dict[str, Any]) -> str:
    servers = f", {c['servers']} servers" if c.get("servers") is not None else ""
    return (f"{c['concurrency']} clients, {c['keys']} keys{servers}, {c['time_limit']:g} s, {c['rate']:g} ops/s, "
            f"{len(c['windows'])} faults")


def render_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| planted bug | default run | target | original | minimal | reproduces | runs, seconds | stopped |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        run = f"{r['workload']}" + (f" + {'+'.join(r['nemesis'])}" if r["nemesis"] else "") + \
            (f", seed {r['seed']}" if r["seed"] is not None else "")
        s = r.get("shrink")
        if not s:
            lines.append(f"| {r['mutant']} | {run} | | | | {r.get('error') or 'no seed failed'} | | |")
            continue
        m = s["minimal"]
        lines.append(f"| {r['mutant']} | {run} | {s['target']['checker']}: {s['target']['type']} | "
                     f"{_dims(s['original']['config'])} | {_dims(m['config'])} | {m['convicted']}/{m['runs']} | "
                     f"{s['runs_used']}, {r['seconds']:.0f} s | {s['stopped']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.shrink_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(DEFAULT_SPEC))
    ap.add_argument("--store-dir", default="store/shrink-table")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-runs", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    store = Path(args.store_dir)
    table_path = store / TABLE
    try:
        spec = load_spec(args.spec, only=tuple(args.only))
    except MutantsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        done = json.loads(table_path.read_text()) if table_path.is_file() else {}
    except (ValueError, OSError) as e:
        print(f"error: {table_path}: cannot read the finished rows ({e}); move it aside to start over",
              file=sys.stderr)
        return 2
    mutants = list(dict.fromkeys(e.mutant for e in spec.entries))
    try:
        for m in mutants:
            if m in done:
                continue
            done[m] = shrink_mutant(m, store, spec_path=args.spec, runs=args.runs, max_runs=args.max_runs,
                                    seeds=args.seeds).to_json()
            store.mkdir(parents=True, exist_ok=True)
            write_text_atomic(table_path, json.dumps(done, indent=2, default=str) + "\n")
    except KeyboardInterrupt:
        return 130
    rows = [done[m] for m in mutants if m in done]
    if args.markdown:
        print(render_markdown(rows))
    missed = {r["mutant"]: row_problems(r) for r in rows if row_problems(r)}
    for m, why in missed.items():
        print(f"{m}: {'; '.join(why)}")
    print(f"{len(rows) - len(missed)}/{len(rows)} planted bugs shrink to at most {SMALL['concurrency']} clients, "
          f"{SMALL['keys']} keys and {SMALL['faults']} faults at a rate of at least {SMALL['rate']}")
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
