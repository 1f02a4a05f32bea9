"""docs/workloads.md is generated from the registry and must be current."""

from workloads import WORKLOADS, get_workload
from workloads.docs import main, render

import pytest


def test_workload_docs_are_current():
    assert main(["--check"]) == 0, "run `python -m workloads.docs`"
    for name in WORKLOADS:
        assert f"## `{name}`" in render()


def test_unknown_workload_lists_known_names():
    with pytest.raises(ValueError, match="known workloads: fenced-append, idempotency, lease, register"):
        get_workload("bogus")
