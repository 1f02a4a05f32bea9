"""What a campaign cell costs beyond its time limit, on the local backend (issue 20, target 5: at most 1 s).

Runs the demo campaign (`campaigns/demo.toml`: lease and fenced-append x none, partition, kill, 5 s each; `--quick`:
its none and partition columns, 4 cells) into a temporary store, as `fencelab campaign` does, and reads each cell's
`overhead_s` from campaign.json: the campaign's wall time the cell cost beyond its time limit (its stack's start
and stop, its final phase, its checkers; lab.campaign.execute._run_cells says how it is counted). The figure is
the median over the cells. This is wall time on a machine that may be shared: the note gives the load average
before and after, the median of each phase (`phases`: up, workload, down, judge, in wall seconds) and the
verdicts, so a figure missed under load can be told from one missed by the lab.

    .tools/venv/bin/python bench/campaign_overhead.py [--quick] [--serial]

`--serial` runs the cells as the lab did before issue 20 (each judged and its report written before the next
starts: `lab.campaign.execute.PIPELINE = False`), for a comparison in the same minutes.
`figures(quick)` returns the one figure for `make bench` (bench/summary.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from figures import Figure  # noqa: E402  (bench/ is a directory of scripts, as bench/summary.py imports it)

TARGET_S = 1.0
DEMO = ROOT / "campaigns" / "demo.toml"
QUICK_NEMESES = ["none", "partition"]
PHASES = ("up", "workload", "down", "judge")


class Measurement(NamedTuple):  # not a dataclass: tests load this script without a sys.modules entry
    """One campaign's cells: each one's overhead and phases (seconds), verdicts, and the machine's load."""

    overheads: list[float]
    phases: list[dict[str, float]] = []
    verdicts: list[object] = []
    time_limit: float = 5.0
    load_before: float = 0.0
    load_after: float = 0.0
    wall_s: float = 0.0
    serial: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.overheads) if self.overheads else float("nan")


def spec_data(quick: bool, time_limit: float | None = None, nemeses: list[str] | None = None) -> dict:
    """The demo campaign's spec (its quick subset: the none and partition columns), renamed for the bench."""
    data = tomllib.loads(DEMO.read_text())
    data["name"] = "bench-overhead"
    if quick or nemeses:
        data["nemeses"] = nemeses or QUICK_NEMESES
    if time_limit is not None:
        data["defaults"]["time_limit"] = time_limit
    return data


def measure(quick: bool = False, *, serial: bool = False, data: dict | None = None) -> Measurement:
    """Run the campaign (`data`, else the demo's) in a temporary store; the cells' overheads from campaign.json."""
    from lab.campaign import execute
    from lab.campaign.spec import parse_spec

    spec = parse_spec(data or spec_data(quick), source=str(DEMO))
    before = os.getloadavg()[0]
    saved, execute.PIPELINE = execute.PIPELINE, not serial
    try:
        with tempfile.TemporaryDirectory(prefix="fencelab-bench-campaign-") as store:
            t0 = time.monotonic()
            execute.run_campaign(spec, store, resume=False, fancy=False, echo=lambda line: None)
            wall = time.monotonic() - t0
            state = json.loads((Path(store) / "campaigns" / spec.name / "campaign.json").read_text())
    finally:
        execute.PIPELINE = saved
    runs = state["runs"]
    return Measurement(overheads=[e["overhead_s"] for e in runs if e.get("overhead_s") is not None],
                       phases=[e.get("phases") or {} for e in runs], verdicts=[e.get("verdict") for e in runs],
                       time_limit=float(runs[0]["test"].get("time_limit", 0)) if runs else 0.0,
                       load_before=before, load_after=os.getloadavg()[0], wall_s=wall, serial=serial)


def phase_medians(m: Measurement) -> dict[str, float]:
    """The median of each phase over the cells that record it."""
    out = {}
    for k in PHASES:
        values = [p[k] for p in m.phases if isinstance(p.get(k), int | float)]
        if values:
            out[k] = statistics.median(values)
    return out


def to_figures(m: Measurement) -> list[Figure]:
    """The one figure: the median per-cell overhead against the 1 s target."""
    phases = ", ".join(f"{k} {v:.2f}" for k, v in phase_medians(m).items())
    valid = sum(v is True for v in m.verdicts)
    note = (f"median of {len(m.overheads)} cells of {m.time_limit:g} s (demo campaign"
            f"{', serial' if m.serial else ''}), each {', '.join(f'{x:.2f}' for x in sorted(m.overheads))} s; "
            f"phase medians (s): {phases}; {valid}/{len(m.verdicts)} valid; campaign wall {m.wall_s:.1f} s; "
            f"load average {m.load_before:.2f} -> {m.load_after:.2f}")
    median = round(m.median, 3)
    return [Figure("campaign", "campaign cell overhead beyond its time limit (median)", median, "s",
                   f"<= {TARGET_S:g} s", median <= TARGET_S, note)]


def figures(quick: bool = False) -> list[Figure]:
    return to_figures(measure(quick))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the none and partition columns only (4 cells)")
    ap.add_argument("--serial", action="store_true", help="each cell wholly after the other (the lab before issue 20)")
    a = ap.parse_args()
    for f in to_figures(measure(a.quick, serial=a.serial)):
        print(f"{f.name}: {f.value} {f.unit} (target {f.target}: {'met' if f.ok else 'NOT met'})\n  {f.note}")


if __name__ == "__main__":
    main()
