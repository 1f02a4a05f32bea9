"""Faults asked for and never injected: no verdict "under fault X" when no window of X happened.

A run asked to inject `--nemesis partition,clock,kill` claims to have been tested under each of them. A fault
that never fired (the run was too short for its window, every start was refused, the lane was cut off) leaves
that claim empty, so the run's verdict must not be a plain "valid": `FaultCoverage` reads the test's `nemesis`
names and the history's nemesis ops, and a name with no completed start (an `info` completion of one of its
start `f`s whose value says `"phase": "start"`) makes its result "unknown" with the reason. Results merge
false > unknown > true, so an invalid run stays invalid.

`with_fault_coverage(checker, starts)` wraps a run's composed checker: the coverage lands in
`results["faults"]` (and the names never injected in the top-level `unexercised_faults`, which the CLI and the
campaign page show). `starts` maps each nemesis name to the `f`s that open its window (the nemesis registry
knows them: this layer does not import it); a name it lacks is matched by `start-<name>` or by the completion's
`value.fault`. A scenario run (`test["scenario"]`) scripts its own faults and its row's checker judges them: it
is not judged again here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from checkers.core import Checker, merge_valid, safe_check
from lab.history.ops import NEMESIS

__all__ = ["FaultCoverage", "asked_faults", "fault_windows", "with_fault_coverage"]


def asked_faults(test: Mapping[str, Any]) -> list[str]:
    """The nemesis names a test asked for (a list, or an older test.json's "a,b" string); none for a scenario."""
    if test.get("scenario"):
        return []
    names = test.get("nemesis") or []
    if isinstance(names, str):
        names = names.split(",")
    return [str(n).strip() for n in names if str(n).strip()]


def fault_windows(history: list[dict], names: Iterable[str],
                  starts: Mapping[str, Iterable[str]] | None = None) -> dict[str, int]:
    """Per name, how many of its starts completed with `"phase": "start"` (a window opened)."""
    starts = starts or {}
    by_f: dict[str, str] = {}
    by_fault: dict[str, str] = {}  # names the caller gave no start fs for: also matched by the completion's fault
    for name in names:
        if name in starts:
            by_f.update((str(f), name) for f in starts[name])
        else:
            by_f[f"start-{name}"] = by_fault[name] = name
    counts = {name: 0 for name in names}
    for op in history:
        if op.get("process") != NEMESIS or op.get("type") != "info":
            continue
        v = op.get("value")
        if not isinstance(v, dict) or v.get("phase") != "start":
            continue  # an invocation (value null), a stop, or a start that changed nothing ("none")
        name = by_f.get(str(op.get("f"))) or by_fault.get(str(v.get("fault")))
        if name is not None:
            counts[name] += 1
    return counts


class FaultCoverage:
    """Judges whether every asked fault opened at least one window (see the module docstring)."""

    def __init__(self, starts: Mapping[str, Iterable[str]] | None = None):
        self.starts = {str(n): tuple(fs) for n, fs in (starts or {}).items()}

    def check(self, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        """{"valid": True | "unknown", "windows": {name: n}, "unexercised": [...], "reason"?}."""
        names = asked_faults(test)
        windows = fault_windows(history, names, {n: self.starts[n] for n in names if n in self.starts})
        missing = [n for n in names if not windows[n]]
        out: dict[str, Any] = {"valid": "unknown" if missing else True, "asked": names, "windows": windows,
                               "unexercised": missing}
        schedule = (test.get("extra") or {}).get("nemesis_schedule")
        if schedule:
            out["schedule"] = schedule
        if missing:
            out["reason"] = (f"no {' / '.join(missing)} window happened (no start of it completed): nothing is "
                             f"claimed under {' / '.join(missing)}")
        return out


class _Covered:
    """A run's checker plus `FaultCoverage`: the coverage merged into its results."""

    def __init__(self, inner: Checker, coverage: FaultCoverage):
        self.inner, self.coverage = inner, coverage

    def check(self, test: Mapping, history: list[dict], opts: Mapping) -> dict:
        """The inner results, with `faults` beside the other checkers and the validity merged."""
        res = safe_check(self.inner, test, history, opts)
        if not asked_faults(test):
            return res
        cov = safe_check(self.coverage, test, history, opts)
        res = dict(res)
        if isinstance(res.get("results"), dict):
            res["results"] = {**res["results"], "faults": cov}
        else:
            res["faults"] = cov
        valid = merge_valid([res.get("valid"), cov["valid"]])
        if valid != res.get("valid") and not res.get("reason"):
            res["reason"] = cov.get("reason") or cov.get("error")
        res["valid"] = valid
        if cov.get("unexercised"):
            res["unexercised_faults"] = list(cov["unexercised"])
        return res


def with_fault_coverage(checker: Checker, starts: Mapping[str, Iterable[str]] | None = None) -> Checker:
    """`checker` whose results also say, for every fault the test asked for, whether it ever fired."""
    return _Covered(checker, FaultCoverage(starts))
