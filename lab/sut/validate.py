"""The check of a test's system before anything starts: it exists, can run the workload, has what it needs.

Apart from the registry (`lab.sut.registry`) because it also asks a system that brings its own processes
(`lab.sut.processes`) whether its binaries are installed and the nemeses asked can apply to it.
"""

from __future__ import annotations

from lab.sut.processes import check_test
from lab.sut.registry import SutEntry, WorkloadNeeds, check_sut, require_capabilities, sut_of
from lab.sut.target import Kind, target_of
from lab.testmap import Test


def validate_test(test: Test, needs: WorkloadNeeds) -> SutEntry:
    """Check, before anything starts, that the test's system exists, can run its workload and has what it needs.

    `needs`: what the test's workload declares (`workloads.needs_of(test.workload)`), passed in by the runner.
    """
    entry = sut_of(test)
    require_capabilities(entry, needs, test)
    check_sut(entry, test)
    if target_of(test).kind is Kind.SYSTEM:  # the lab runs its processes: the declaration holds, binaries installed
        check_test(test)
    return entry
