"""The check of a test's system before anything starts: it exists, can run the workload, has what it needs.

Apart from the registry (`lab.sut.registry`) because it also asks a system that brings its own processes
(`lab.sut.processes`) whether its binaries are installed and the nemeses asked can apply to it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from lab.secrets import redact_url
from lab.sut.processes import check_test
from lab.sut.protocol import SutError
from lab.sut.registry import SutEntry, WorkloadNeeds, require_capabilities, sut_of


def validate_test(test: Any, needs: WorkloadNeeds) -> SutEntry:
    """Check, before anything starts, that the test's system exists, can run its workload and has what it needs.

    `needs`: what the test's workload declares (`workloads.needs_of(test.workload)`), passed in by the runner.
    """
    for url in getattr(test, "urls", None) or []:
        problem = url_problem(url)
        if problem:
            raise SutError(problem)
    entry = sut_of(test)
    require_capabilities(entry, needs)
    if getattr(test, "commit_mode", None) is not None and "commit" not in needs.capabilities:
        raise SutError(f"--commit-mode says how a system's commits reach the store; workload {needs.workload!r} "
                       "makes no commits: drop --commit-mode, or run a workload that commits (fenced-append)")
    if entry.check is not None:
        entry.check(test)
    if entry.processes is not None:  # its binaries are installed, and every nemesis asked can apply to it
        check_test(test)
    elif "leader-pause" in (getattr(test, "nemesis", None) or []):
        raise SutError(f"--nemesis leader-pause cannot apply to SUT {entry.name!r}: it lacks a leader the lab can "
                       "find (only a system that brings its own processes and names its leader has one, e.g. etcd)")
    return entry


def url_problem(url: Any) -> str | None:
    """Why a `--url` is not the base URL of a server the lab can reach over HTTP (every external system is probed
    with an HTTP GET before the run), as one line; or None."""
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
        if ok:
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        ok = False
    if ok:
        return None
    shown = redact_url(url) if isinstance(url, str) else repr(url)
    return f"--url {shown!r} is not a URL: give the server's base URL, e.g. http://127.0.0.1:8080"
