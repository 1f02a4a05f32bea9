"""JUnit XML for CI systems: one testsuite per run, one testcase per checker.

A checker that found the history invalid is a `<failure>` whose message counts
the violations by kind and whose text lists the first ones; one whose verdict
is "unknown" (it crashed, or ran out of time) is an `<error>`. The suite's
properties carry the seed and the replay command, so a red CI build says how
to reproduce it. Built with `xml.etree` (escaping is the library's job).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from checkers.render import iter_violations

__all__ = ["checker_results", "junit_tree", "violation_summary", "write_junit"]

FIRST = 10  # violations listed in a failure's text


def checker_results(results: Mapping) -> dict[str, Mapping]:
    """{checker name: its result}: the composed results' members, or the one result as "result"."""
    inner = results.get("results")
    if isinstance(inner, Mapping):
        return {str(k): v for k, v in inner.items() if isinstance(v, Mapping)}
    return {str(results.get("checker", "result")): results}


def violation_summary(name: str, result: Mapping) -> str:
    """One line: how many violations of which kinds (or the error), e.g. "3 violations: token-regression x2, ..."."""
    if result.get("error") and result.get("valid") is not False:
        return f"{name}: {result['error']}"
    counts = result.get("violation_counts")
    if not isinstance(counts, Mapping) or not counts:
        counts = {}
        for v in iter_violations({"results": {name: result}}):
            counts[v["type"]] = counts.get(v["type"], 0) + 1
    total = result.get("violation_count", sum(counts.values()))
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{name}: {total} violation{'s' if total != 1 else ''}" + (f": {kinds}" if kinds else "")


def _violation_text(name: str, result: Mapping) -> str:
    """The first violations, one per line, with the history indices they name."""
    lines = []
    for n, v in enumerate(iter_violations({"results": {name: result}})):
        if n == FIRST:
            lines.append("...")
            break
        lines.append(f"[{v['type']}] {v['msg']} (ops {', '.join(map(str, v['ops'][:20]))})")
    return "\n".join(lines)


def junit_tree(results: Mapping, test: Mapping | None = None) -> ET.ElementTree:
    """The JUnit document for a run's results (and its test.json, for the suite name and properties)."""
    test = test or {}
    name = str(test.get("name") or test.get("workload") or "fencelab")
    checkers = checker_results(results)
    elapsed = results.get("elapsed_s") if isinstance(results.get("elapsed_s"), Mapping) else {}
    failures = sum(1 for r in checkers.values() if r.get("valid") is False)
    errors = sum(1 for r in checkers.values() if r.get("valid") not in (True, False))
    suite = ET.Element("testsuite", {
        "name": f"fencelab.{name}", "tests": str(len(checkers)), "failures": str(failures),
        "errors": str(errors), "skipped": "0", "time": f"{sum(float(t) for t in elapsed.values()):.6f}",
    })
    props = ET.SubElement(suite, "properties")
    for key in ("workload", "seed", "replay"):
        value = test.get(key, results.get(key))
        if value is not None:
            ET.SubElement(props, "property", {"name": key, "value": str(value)})
    ET.SubElement(props, "property", {"name": "valid", "value": json.dumps(results.get("valid"))})
    for cname, r in checkers.items():
        case = ET.SubElement(suite, "testcase", {"classname": f"fencelab.{name}", "name": cname,
                                                 "time": f"{float(elapsed.get(cname, 0.0)):.6f}"})
        valid = r.get("valid")
        if valid is False:
            el = ET.SubElement(case, "failure", {"type": "invalid", "message": violation_summary(cname, r)})
            el.text = _violation_text(cname, r)
        elif valid is not True:
            el = ET.SubElement(case, "error", {"type": "unknown", "message": violation_summary(cname, r)})
            el.text = str(r.get("error") or f"the checker's verdict is {valid!r}")
    ET.indent(suite)
    return ET.ElementTree(suite)


def write_junit(path: str | Path, results: Mapping, test: Mapping | None = None) -> Path:
    """Write `junit_tree(results, test)` to `path`; returns the path."""
    p = Path(path)
    junit_tree(results, test).write(p, encoding="utf-8", xml_declaration=True)
    return p
