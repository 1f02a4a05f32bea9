"""evidence.html: one self-contained page (inline CSS, no script, nothing fetched) for an evidence bundle.

Rendered from the same data as evidence.json, with jinja2 autoescaping: a
summary of verdicts, then one row per contract row (its rule ids, scenarios,
runs with links to their report.html, ops, faults injected, verdict and
reason), the findings the system's adapter recorded, and what the deeper
depths would run. Links are relative (percent-encoded), so the page works
from the file system and under `fencelab serve`.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from lab.paths import write_text_atomic
from lab.templating import template_env

_ENV = template_env(Path(__file__).parent)
_ENV.filters["href"] = lambda path: urllib.parse.quote(str(path)) if path else ""
VERDICT_CLASS = {"pass": "valid", "fail": "invalid", "inconclusive": "unknown", "not-applicable": "na"}
RUN_CLASS = {True: "valid", False: "invalid"}


def _run_class(run: dict[str, Any]) -> str:
    """The CSS class of a run's badge: valid, invalid, unknown, failed (could not run) or na."""
    if run.get("not_applicable"):
        return "na"
    if run.get("error"):
        return "failed"
    return RUN_CLASS.get(run.get("valid"), "unknown")


def write_page(data: dict[str, Any], path: Path) -> Path:
    """Render evidence.html from the evidence.json data."""
    html = _ENV.get_template("evidence.html.j2").render(d=data, verdict_class=VERDICT_CLASS, run_class=_run_class)
    return write_text_atomic(Path(path), html)
