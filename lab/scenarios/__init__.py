"""Named race scenarios: every row of the contract's races table (section 8), plus the matrix probes, runnable.

    fencelab test --scenario concurrent-acquires

`SCENARIOS` maps each name to its `Scenario` (script, faults, Test options,
checker); campaigns name them with `scenario = "<name>"` and read their
`options`. The runner asks `scenario_workload(test)` for the spec and workload of a
Test whose `scenario` names one. See docs/scenarios.md.
"""

from __future__ import annotations

from typing import Any

from lab.scenarios import scenario as _scenario
from lab.scenarios.scenario import Scenario, ScenarioError, ScenarioWorkload
from lab.scenarios.probes import PROBES
from lab.scenarios.races import RACES
from lab.testmap import Test

SCENARIOS: dict[str, Scenario] = {s.name: s for s in RACES + PROBES}
RACE_SCENARIOS = tuple(s.name for s in RACES)  # in the order of the races table
PROBE_SCENARIOS = tuple(s.name for s in PROBES)

__all__ = ["PROBE_SCENARIOS", "RACE_SCENARIOS", "SCENARIOS", "Scenario", "ScenarioError", "ScenarioWorkload",
           "apply_scenario", "get_scenario", "scenario_workload", "validate_scenario"]


def get_scenario(name: str) -> Scenario:
    """The scenario called `name`; ScenarioError lists the known ones."""
    if name not in SCENARIOS:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def validate_scenario(test: Test) -> Scenario:
    """Check a Test naming a scenario before anything starts (ScenarioError: one line saying what to change)."""
    return _scenario.validate_scenario(test, SCENARIOS)


def apply_scenario(test: Test, given: Any = frozenset()) -> Test:
    """A new Test: this one with its scenario's workload, name and options, except the options in `given` (the
    user's)."""
    return _scenario.apply_scenario(test, SCENARIOS, frozenset(given))


def scenario_workload(test: Test, base: Any = None) -> tuple[Test, ScenarioWorkload]:
    """The spec a scenario run goes on (a new one) and the workload that runs it (`base`, the workload the runner
    built, is replaced)."""
    return _scenario.scenario_workload(test, SCENARIOS)
