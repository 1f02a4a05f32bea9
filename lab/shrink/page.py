"""shrink.html: one self-contained page (inline CSS, no script, nothing fetched) of a finished shrink.

The original configuration and the minimal one side by side (each dimension, the faults kept, the rates), the
steps of the search with their rates, the minimal case's replay command, and a link to the minimal run's own
report (its counterexample). Links are relative, so the page works from the file system and `fencelab serve`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.paths import write_text_atomic
from lab.templating import template_env

__all__ = ["PAGE", "write_page"]

PAGE = "shrink.html"
_ROWS = (("clients", "concurrency"), ("keys", "keys"), ("lease servers", "servers"), ("time limit (s)", "time_limit"),
         ("rate (ops/s)", "rate"))


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per dimension: its name, the original's value, the minimal's, whether it shrank."""
    o, m = data["original"]["config"], data["minimal"]["config"]
    out = [{"name": name, "original": o[key], "minimal": m[key], "shrank": m[key] != o[key]}
           for name, key in _ROWS if o.get(key) is not None]
    out.append({"name": "faults (windows)", "original": len(o["faults"]), "minimal": len(m["faults"]),
                "shrank": len(m["faults"]) != len(o["faults"])})
    return out


def write_page(out: Path, data: dict[str, Any]) -> Path:
    """Render shrink.html into `out` from shrink.json's data; returns its path."""
    html = template_env(Path(__file__).parent).get_template("shrink.html.j2").render(d=data, rows=rows(data))
    return write_text_atomic(Path(out) / PAGE, html)
