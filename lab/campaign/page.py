"""campaign.html: one self-contained page (inline CSS, no script, nothing fetched) summing up a campaign.

- the verdict matrix: rows workload x scenario x implementation, columns the
  nemeses, one colour-coded badge per seed / repetition linking to the run's
  report.html (or its results.json when there is no report); a run that never
  injected a fault it asked for (`unexercised_faults`) or was cut short and
  kept for the violation its partial history shows (`partial`) carries a
  dashed badge saying so;
- availability and latency per nemesis (and per workload under it): client
  ops, success rate overall / during fault windows / outside them, the share
  of definite answers (ok or fail, as opposed to info: timeouts), pooled
  latency quantiles. Success rates and latencies come from each run's history
  (`lab.history.to_frame`, so quantiles are exact over all runs, not averages
  of quantiles); the in/outside-fault split from its `availability` checker;
- totals (runs, ops, valid / invalid / unknown / failed, the median overhead per run) and every run's row,
  with its overhead (the campaign's wall seconds it cost beyond its time limit, lab.campaign.execute) and the
  wall seconds of its phases (stack up, workload, stack down, judging).

Links are relative, so the page works from the file system and under `fencelab serve`.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lab.campaign.state import counts
from lab.history import is_client_process, read_history_report, to_frame
from lab.paths import write_text_atomic
from lab.templating import template_env

__all__ = ["PageData", "overhead_summary", "phases_text", "run_stats", "write_page"]

PAGE = "campaign.html"
SYMBOLS = {"valid": "\u2713", "invalid": "\u2717", "unknown": "?", "failed": "!", "pending": "\u2026",
           "running": "\u25b6"}


@dataclass
class RunStats:
    """What one finished run contributes to the availability table."""

    count: int  # client invocations
    ok: int
    fail: int  # definite failures (e.g. lease_conflict): answered, not unavailable
    latencies_ms: np.ndarray  # completed client ops
    outside_count: int | None = None  # from the availability checker: ops outside any fault window
    outside_ok: int | None = None


def run_stats(run_dir: Path) -> RunStats | None:
    """A finished run's client-op counts and latencies (history) and fault split (results.json), or None."""
    try:
        history, _ = read_history_report(run_dir / "history.jsonl")
        frame = to_frame(history)
    except (OSError, ValueError, KeyError):
        return None
    client = frame[frame["process"].map(is_client_process)] if len(frame) else frame
    lat = client["latency_ns"].dropna().to_numpy(dtype=float) / 1e6 if len(client) else np.array([])
    types = client["type"].value_counts() if len(client) else {}
    stats = RunStats(count=len(client), ok=int(types.get("ok", 0)), fail=int(types.get("fail", 0)), latencies_ms=lat)
    try:
        avail = json.loads((run_dir / "results.json").read_text())["results"]["availability"]["outside"]
        stats.outside_count, stats.outside_ok = int(avail["count"]), int(avail["ok"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no availability checker in this workload: no fault split
    return stats


@dataclass
class PageData:
    """Where the page is written and the per-run stats read so far (each run's history is read once)."""

    store_dir: Path
    directory: Path
    cache: dict[str, RunStats | None] = field(default_factory=dict)

    def stats(self, entry: dict[str, Any]) -> RunStats | None:
        """The stats of a done run (cached by run directory)."""
        if entry["status"] != "done" or not entry.get("run_dir"):
            return None
        key = entry["run_dir"]
        if key not in self.cache:
            self.cache[key] = run_stats(self.store_dir / key)
        return self.cache[key]

    def href(self, entry: dict[str, Any]) -> str | None:
        """A relative link to the run's report.html, else its results.json, else its directory."""
        if not entry.get("run_dir"):
            return None
        run_dir = self.store_dir / entry["run_dir"]
        for target in (run_dir / "report.html", run_dir / "results.json", run_dir):
            if target.exists():
                rel = os.path.relpath(target, self.directory) + ("/" if target.is_dir() else "")
                return urllib.parse.quote(rel)
        return None


def badge_class(entry: dict[str, Any]) -> str:
    """valid | invalid | unknown for done runs, else the status."""
    if entry["status"] != "done":
        return entry["status"]
    return {True: "valid", False: "invalid"}.get(entry["verdict"], "unknown")


def _badge(entry: dict[str, Any], data: PageData, reps: int) -> dict[str, Any]:
    cls = badge_class(entry)
    bits = [entry["id"], cls]
    if entry.get("ops") is not None:
        bits.append(f"{entry['ops']} ops")
    if entry.get("elapsed_s") is not None:
        bits.append(f"{entry['elapsed_s']:.1f} s")
    if entry.get("overhead_s") is not None:
        bits.append(f"overhead {entry['overhead_s']:.1f} s")
    for k in ("error", "note"):
        if entry.get(k):
            bits.append(entry[k])
    marks = run_marks(entry)
    bits += marks
    label = f"s{entry['seed']}" + (f"r{entry['rep']}" if reps > 1 else "")
    return {"cls": cls, "symbol": SYMBOLS.get(cls, "?"), "label": label, "href": data.href(entry),
            "title": " | ".join(bits), "marks": marks}


def run_marks(entry: dict[str, Any]) -> list[str]:
    """What a done run's verdict does not cover, shown on its badge: faults it never injected, a cut-short run."""
    marks = []
    if entry.get("unexercised_faults"):
        marks.append(f"no {', '.join(entry['unexercised_faults'])} window")
    if entry.get("partial"):
        marks.append("partial run")
    return marks


def _matrix(state: dict[str, Any], data: PageData) -> list[dict[str, Any]]:
    """Rows of the verdict matrix: (workload, scenario, implementation) x nemesis -> badges."""
    axes, reps = state["axes"], state["axes"]["repetitions"]
    cells: dict[tuple, list] = defaultdict(list)
    for e in state["runs"]:
        cells[(e["workload"], e["scenario"], e["implementation"], e["nemesis"])].append(_badge(e, data, reps))
    rows = []
    for wl in axes["workloads"]:
        for sc in axes["scenarios"]:
            for impl in axes["implementations"]:
                rows.append({"workload": wl, "scenario": sc, "implementation": impl,
                             "cells": [cells[(wl, sc, impl, n)] for n in axes["nemeses"]]})
    return rows


def _rate(ok: int, n: int) -> str:
    return f"{100 * ok / n:.1f}%" if n else "\u2014"


def _aggregate(label: str, stats: list[RunStats], runs: int) -> dict[str, Any]:
    """One row of the availability table from the stats of several runs."""
    count, ok, fail = sum(s.count for s in stats), sum(s.ok for s in stats), sum(s.fail for s in stats)
    split = [s for s in stats if s.outside_count is not None]
    out_n, out_ok = sum(s.outside_count for s in split), sum(s.outside_ok for s in split)
    in_n, in_ok = sum(s.count for s in split) - out_n, sum(s.ok for s in split) - out_ok
    lat = np.concatenate([s.latencies_ms for s in stats]) if stats else np.array([])
    q = np.percentile(lat, [50, 95, 99]).tolist() + [float(lat.max())] if lat.size else [None] * 4
    return {"label": label, "runs": runs, "measured": len(stats), "ops": count, "success": _rate(ok, count),
            "definite": _rate(ok + fail, count),
            "during": _rate(in_ok, in_n) if split and in_n else "\u2014",
            "during_ops": in_n if split and in_n else None,
            "outside": _rate(out_ok, out_n) if split else "\u2014",
            "latency": ["\u2014" if v is None else f"{v:.1f}" for v in q]}


def _availability(state: dict[str, Any], data: PageData) -> list[dict[str, Any]]:
    """Per nemesis (all workloads), then per workload under it."""
    rows = []
    for nem in state["axes"]["nemeses"]:
        entries = [e for e in state["runs"] if e["nemesis"] == nem and e["status"] == "done"]
        stats = [s for s in map(data.stats, entries) if s is not None]
        rows.append({**_aggregate(nem, stats, len(entries)), "level": 0})
        if len(state["axes"]["workloads"]) > 1:
            for wl in state["axes"]["workloads"]:
                sub = [e for e in entries if e["workload"] == wl]
                rows.append({**_aggregate(wl, [s for s in map(data.stats, sub) if s is not None], len(sub)),
                             "level": 1})
    return rows


def overall(state: dict[str, Any]) -> tuple[str, str]:
    """The campaign's verdict: (css class, words)."""
    c = counts(state["runs"])
    if c["invalid"]:
        return "invalid", f"{c['invalid']} invalid run(s)"
    if c["pending"]:
        return "pending", f"incomplete: {c['pending']} run(s) not finished"
    if c["failed"] or c["unknown"]:
        return "unknown", f"{c['failed']} failed and {c['unknown']} unknown run(s)"
    return "valid", "every run valid"


def _env():
    return template_env(Path(__file__).parent)


PHASES = ("up", "workload", "down", "judge")  # lab.runner.run_unjudged's phases, in the order they run


def phases_text(entry: dict[str, Any]) -> str:
    """A run's phases as `up 0.6 · workload 5.1 · down 0.2 · judge 0.1` (seconds), or ''."""
    phases = entry.get("phases") or {}
    return " \u00b7 ".join(f"{k} {phases[k]:.1f}" for k in PHASES if isinstance(phases.get(k), int | float))


def overhead_summary(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The median and the largest per-run overhead (seconds beyond the time limit) of the runs that record one."""
    values = sorted(e["overhead_s"] for e in runs if isinstance(e.get("overhead_s"), int | float))
    if not values:
        return None
    return {"median": float(np.median(values)), "max": values[-1], "runs": len(values)}


def render_page(state: dict[str, Any], data: PageData) -> str:
    """The page's HTML."""
    c = counts(state["runs"])
    verdict_cls, verdict_words = overall(state)
    runs = [{**e, "cls": badge_class(e), "href": data.href(e), "marks": run_marks(e), "phases_text": phases_text(e),
             "overhead_s": e.get("overhead_s")}  # an older lab's campaign.json has none
            for e in state["runs"]]
    return _env().get_template("campaign.html.j2").render(
        state=state, counts=c, verdict_cls=verdict_cls, verdict_words=verdict_words, matrix=_matrix(state, data),
        availability=_availability(state, data), runs=runs, symbols=SYMBOLS,
        elapsed=sum(e.get("elapsed_s") or 0 for e in state["runs"]), overhead=overhead_summary(state["runs"]))


def write_page(state: dict[str, Any], data: PageData) -> Path:
    """Write campaign.html atomically next to campaign.json; returns its path."""
    return write_text_atomic(data.directory / PAGE, render_page(state, data))
