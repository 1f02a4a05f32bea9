"""`write_report(run_dir)`: a run's report, written into the run directory.

One self-contained `report.html` (plots inlined as base64 PNG, the plot data
and the verdicts inlined as JSON, CSS and a few lines of JS inline; nothing is
fetched from the network) plus sibling files for tools and CI:

    report.html                 verdicts, options and replay command, plots, fencing timeline,
                                counterexamples, links to every file of the run
    latency-raw.png, latency-quantiles.png, rate.png, fencing-tokens.png
    plots.json                  the data behind every plot, and the nemesis windows each one shades
    junit.xml                   one testsuite, one testcase per checker
    counterexample-<checker>.html   checkers.render's timeline around the violations of each invalid checker

Only the run's own files are read (test.json, results.json, history.jsonl);
the report never re-runs a checker (`fencelab analyze` does).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkers.render import iter_violations, render_html
from lab.history import HistoryError, read_history_report
from lab.paths import write_text_atomic
from lab.report import plots as P
from lab.report.data import MAX_KEYS, MAX_RAW_POINTS, outcome_counts, plot_data
from lab.report.junit import checker_results, violation_summary, write_junit
from lab.templating import template_env

__all__ = ["ReportError", "Run", "load_run", "verdict_word", "write_report"]

FIRST_VIOLATIONS = 5  # violations listed per checker on the page
OPS_PER_VIOLATION = 12  # ops of a violation shown in the counterexample table
COUNTEREXAMPLE_MAX_OPS = 3_000  # ops drawn in a counterexample timeline (those nearest the failing ones)
RUN_FILES = ("history.jsonl", "history.edn", "results.json", "test.json", "fault-schedule.json", "plots.json",
             "junit.xml")
HIDDEN_OPTIONS = ("replay", "argv", "versions")

_ENV = template_env(Path(__file__).parent)


class ReportError(RuntimeError):
    """A directory cannot be reported on: not a run, or one of its files is unreadable."""


@dataclass
class Run:
    """What a report is made from: the run's test.json, results.json and history."""

    dir: Path
    test: dict
    results: dict
    history: list[dict]
    problems: list[str] = field(default_factory=list)


def _read_json(path: Path) -> Any:
    """A JSON file's content, or ReportError naming the file and the problem."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read a run directory; ReportError (one line) when it is not a run or a file is broken."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ReportError(f"{d} is not a directory (expected a run directory such as store/<test>/<timestamp>)")
    d = d.resolve()
    if not (d / "history.jsonl").is_file():
        raise ReportError(f"{d} is not a fencelab run directory: it has no history.jsonl")
    if not (d / "results.json").is_file():
        raise ReportError(f"{d} has no results.json: run `fencelab analyze {d}` first")
    results = _read_json(d / "results.json")
    if not isinstance(results, dict) or "valid" not in results:
        raise ReportError(f"{d / 'results.json'} is not a fencelab results file (no \"valid\")")
    test = _read_json(d / "test.json") if (d / "test.json").is_file() else {}
    if not isinstance(test, dict):
        raise ReportError(f"{d / 'test.json'} must hold a JSON object")
    try:
        history, problems = read_history_report(d / "history.jsonl")
    except (HistoryError, OSError) as e:
        raise ReportError(f"cannot read the history: {e}") from None
    return Run(d, test, results, history, list(problems) + list(results.get("history_problems") or []))


def verdict_word(valid: Any) -> str:
    """"valid", "invalid" or "unknown" for a checker's `valid`."""
    return "valid" if valid is True else "invalid" if valid is False else "unknown"


def run_time(run_dir: Path) -> str:
    """When the run started, from its directory name (store/<test>/<UTC timestamp>), else its test.json's mtime."""
    try:
        t = dt.datetime.strptime(run_dir.name, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        src = run_dir / "test.json" if (run_dir / "test.json").exists() else run_dir
        t = dt.datetime.fromtimestamp(src.stat().st_mtime, dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return struct.unpack(">II", png[16:24])


def _safe_name(name: str) -> str:
    """A checker name usable in a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "checker"


def _short(x: Any, limit: int = 160) -> str:
    """A one-line text of a value, shortened."""
    if x is None:
        return ""
    s = x if isinstance(x, str) else json.dumps(x, default=str, sort_keys=True)
    return s if len(s) <= limit else s[:limit] + "…"


def _op_row(history: list[dict], i: int) -> dict | None:
    """A history op as a table row (None for an index outside the history)."""
    if not 0 <= i < len(history):
        return None
    op = history[i]
    return {"index": op.get("index", i), "time_s": f"{op.get('time', 0) / 1e9:.6f}", "process": op.get("process"),
            "type": op.get("type"), "f": op.get("f"), "key": _short(op.get("key")), "value": _short(op.get("value")),
            "error": _short(op.get("error"))}


def _checkers(run: Run) -> list[dict]:
    """Per checker: verdict, summary line, counts by kind, the first violations, elapsed time."""
    elapsed = run.results.get("elapsed_s") if isinstance(run.results.get("elapsed_s"), Mapping) else {}
    out = []
    for name, r in checker_results(run.results).items():
        violations = list(iter_violations({"results": {name: r}}))
        counts = r.get("violation_counts") if isinstance(r.get("violation_counts"), Mapping) else {}
        out.append({
            "name": name, "valid": r.get("valid"), "verdict": verdict_word(r.get("valid")),
            "summary": violation_summary(name, r) if r.get("valid") is not True else "",
            "count": r.get("violation_count", len(violations)), "counts": dict(counts),
            "first": [dict(v, ops=v["ops"][:OPS_PER_VIOLATION]) for v in violations[:FIRST_VIOLATIONS]],
            "error": r.get("error"), "elapsed_s": elapsed.get(name),
            "violations": violations,
        })
    return out


def _counterexamples(run: Run, checkers: list[dict]) -> list[dict]:
    """Write counterexample-<checker>.html for each invalid checker; the entries the page lists."""
    for old in run.dir.glob("counterexample-*.html"):
        old.unlink()  # from an earlier report of this run, whose verdicts may have changed
    out = []
    for c in checkers:
        if c["valid"] is not False:
            continue
        file = f"counterexample-{_safe_name(c['name'])}.html"
        single = {"valid": False, "results": {c["name"]: checker_results(run.results)[c["name"]]}}
        render_html(single, run.history, run.dir / file, title=f"{c['name']}: counterexample",
                    source="history.jsonl", max_ops=COUNTEREXAMPLE_MAX_OPS)
        shown = []
        for v in c["violations"][:3]:
            rows = [r for r in (_op_row(run.history, i) for i in v["ops"][:OPS_PER_VIOLATION]) if r]
            shown.append({"type": v["type"], "msg": v["msg"], "rows": rows, "more": max(0, len(v["ops"]) - len(rows))})
        out.append({"checker": c["name"], "file": file, "violations": shown})
    return out


def _focus_keys(run: Run, checkers: list[dict]) -> list[Any]:
    """The keys of the ops violations name (drawn first in the fencing timeline)."""
    keys = []
    for c in checkers:
        for v in c["violations"]:
            for i in v["ops"]:
                if 0 <= i < len(run.history) and run.history[i].get("key") is not None:
                    keys.append(run.history[i]["key"])
    return keys


def _plots(run: Run, data: dict) -> list[dict]:
    """Draw and write every PNG; the figure entries (file, data key, shaded windows, size, inline src)."""
    figures = []
    for file, key, draw in (("latency-raw.png", "latency_raw", P.latency_raw_png),
                            ("latency-quantiles.png", "latency_quantiles", P.latency_quantiles_png),
                            ("rate.png", "rate", P.rate_png),
                            ("fencing-tokens.png", "fencing", P.fencing_png)):
        drawn = draw(data)
        if drawn is None:
            (run.dir / file).unlink(missing_ok=True)
            continue
        png, shaded = drawn
        (run.dir / file).write_bytes(png)
        w, h = png_size(png)
        figures.append({"file": file, "data": key, "shaded": shaded, "width": w, "height": h,
                        "src": "data:image/png;base64," + base64.b64encode(png).decode("ascii")})
    return figures


def _files(run: Run) -> list[dict]:
    """Links to the run's files that exist, and each log under stack/logs."""
    out = [{"name": n, "href": n, "log": False} for n in RUN_FILES if (run.dir / n).is_file()]
    logs = run.dir / "stack" / "logs"
    if logs.is_dir():
        for p in sorted(logs.glob("*.log")):
            out.append({"name": f"stack/logs/{p.name}", "href": f"stack/logs/{p.name}", "log": True,
                        "bytes": p.stat().st_size})
    return out


def _options(test: Mapping) -> list[tuple[str, str]]:
    """The test's options as (name, text) rows, without the replay command and versions shown elsewhere."""
    return [(k, v if isinstance(v, str) else json.dumps(v, default=str))
            for k, v in test.items() if k not in HIDDEN_OPTIONS]


def _utc_ms(ms: float | None) -> str:
    """A backend time in Unix milliseconds as a UTC timestamp (ms precision)."""
    if ms is None:
        return "unknown"
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"


def write_report(run_dir: str | os.PathLike, *, max_points: int = MAX_RAW_POINTS, max_keys: int = MAX_KEYS) -> Path:
    """Write report.html (and its sibling files, see the module docstring) into a run directory; returns its path."""
    run = load_run(run_dir)
    checkers = _checkers(run)
    data = plot_data(run.history, max_points=max_points, max_keys=max_keys, focus_keys=_focus_keys(run, checkers))
    figures = _plots(run, data)
    data["figures"] = [{k: v for k, v in f.items() if k != "src"} for f in figures]
    write_text_atomic(run.dir / "plots.json", json.dumps(data, separators=(",", ":")))
    write_junit(run.dir / "junit.xml", run.results, run.test)
    counterexamples = _counterexamples(run, checkers)
    test = run.test
    summary = {"valid": run.results.get("valid"), "verdict": verdict_word(run.results.get("valid")),
               "checkers": {c["name"]: c["verdict"] for c in checkers}, "ops": run.results.get("ops"),
               "entries": run.results.get("entries", len(run.history)),  # results.json's ops: client invocations
               "seed": test.get("seed"), "replay": test.get("replay") or run.results.get("replay")}
    page = _ENV.get_template("report.html.j2").render(
        title=f"fencelab {test.get('name') or test.get('workload') or run.dir.parent.name}",
        run_dir=str(run.dir), run_time=run_time(run.dir), test=test, summary=summary, checkers=checkers,
        options=_options(test), versions=test.get("versions") or {}, figures={f["file"]: f for f in figures},
        data=data, outcomes=outcome_counts(data), counterexamples=counterexamples, files=_files(run),
        problems=run.problems, fencing_base=_utc_ms(data["fencing"]["base_ms"]),
    )
    out = run.dir / "report.html"
    write_text_atomic(out, page)
    return out
