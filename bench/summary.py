"""`make bench`: every performance figure of issue 13 beside its target, measured in one run, in one table.

Each bench script exposes `figures(quick: bool = False) -> list[bench.figures.Figure]`; this runs them in turn
(one process, one after the other, so no two benches share the cores) and prints the table. A bench that fails
to run is a row saying so (never a silent gap). `--quick` runs each bench's short form; `--json FILE` also writes
the figures (docs/performance.md is written from them).

    .tools/venv/bin/python bench/summary.py [--quick] [--only client,recording,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from figures import Figure  # noqa: E402  (bench/ is a directory of scripts, not a package)

# area -> the script that measures it
BENCHES = {
    "client": HERE / "client_path.py",
    "recording": HERE / "recording_overhead.py",
    "generator": HERE / "generator_cost.py",
    "server": HERE / "server_throughput.py",
    "domain checkers": HERE / "checker_domain.py",
    "linearizability": HERE / "checker" / "run.py",
    "campaign": HERE / "campaign_overhead.py",
}


def _load(path: Path):
    """A bench script as a module (they live in bench/, not in a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(areas: list[str], quick: bool) -> list[Figure]:
    out: list[Figure] = []
    for area in areas:
        path = BENCHES[area]
        started = time.monotonic()
        try:
            figs = list(_load(path).figures(quick=quick))
            if not figs:
                raise RuntimeError("it returned no figures")
        except Exception as e:  # noqa: BLE001 - a bench that cannot run is a failed row, the others still run
            tb = traceback.format_exc(limit=2).strip().splitlines()[-1]
            figs = [Figure(area, f"{path.relative_to(HERE.parent)} did not run", float("nan"), "-", "-", False,
                           f"{type(e).__name__}: {e}"[:300] or tb)]
        print(f"# {area}: {len(figs)} figure(s) in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        out += figs
    return out


def table(figs: list[Figure]) -> str:
    rows = [("area", "figure", "measured", "target", "met", "how")]
    for f in figs:
        value = "n/a" if f.value != f.value else (f"{f.value:,.0f}" if abs(f.value) >= 100 else f"{f.value:.3g}")
        rows.append((f.area, f.name, f"{value} {f.unit}", f.target, "yes" if f.ok else "NO", f.note))
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def machine() -> str:
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except Exception:  # noqa: BLE001 - only for the header line
        mem = "?"
    return (f"{platform.node()}: {os.cpu_count()} cores, {mem}, {platform.platform()}, Python "
            f"{platform.python_version()}, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="each bench's short form")
    ap.add_argument("--only", default="", help=f"comma-separated areas of: {', '.join(BENCHES)}")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args()
    areas = [a.strip() for a in args.only.split(",") if a.strip()] or list(BENCHES)
    unknown = [a for a in areas if a not in BENCHES]
    if unknown:
        print(f"--only: unknown area {unknown[0]!r}; known: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    header = machine()
    figs = run(areas, args.quick)
    print(f"\n{header}\n")
    print(table(figs))
    met = sum(f.ok for f in figs)
    print(f"\n{met}/{len(figs)} targets met")
    if args.json:
        args.json.write_text(json.dumps({"machine": header, "quick": args.quick,
                                         "figures": [asdict(f) for f in figs]}, indent=1))
    return 0 if met == len(figs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
