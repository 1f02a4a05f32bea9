"""fencelab's pytest plugin: run lab tests from a project's own test suite, evidence printed at the end.

Registered as the `fencelab` entry point in the `pytest11` group, so it is
active wherever fencelab is installed; without it, `-p lab.pytest_plugin`.
It does nothing until a test uses it: importing it starts nothing, and the
terminal summary stays silent when no lab run was made.

- options (group `fencelab`): `--lab-time-limit`, `--lab-nemesis`, `--lab-seed`,
  `--lab-store-dir`, defaults for every `lab_run` of the session;
- `lab_stack` (session): a local stack (Valkey, store, lease servers) up for
  the session and stopped at its end; its options come from the overridable
  `lab_stack_options` fixture;
- `lab_run` (function): `lab_run("lease", time_limit=5, rate=100, ...)` (any
  Test field: `servers=3`, `mutant="..."`, `scenario="..."`, `urls=[...]`) runs
  one fencelab test (`lab.runner.run_test`, with its own stack) and returns a
  `LabRun` (results, run dir, replay command);
- marker `lab_slow` for long campaigns: deselect them with `-m "not lab_slow"`;
- a terminal summary listing, for every lab run of the session, its verdict,
  run directory, report and the commands that replay it.

See docs/pytest-plugin.md.
"""

from __future__ import annotations

import asyncio
import re
import sys
import warnings
import zlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The lab (Test, runner, stacks, report) is imported inside the fixtures and hooks that use it: this plugin is
# loaded by every pytest session wherever fencelab is installed, and importing it imports nothing of the lab.

_RUNS = pytest.StashKey[list]()
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


if TYPE_CHECKING:  # the plugin imports nothing of the lab until a fixture runs (every pytest session loads it)
    from lab.testmap import Test


@dataclass
class LabRun:
    """One lab run made by `lab_run`: the test, its results (None when it failed to run) and where it landed."""

    test: Test
    results: dict[str, Any] | None
    run_dir: Path | None
    nodeid: str = ""
    error: str | None = None
    report: Path | None = None
    pytest_replay: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> Any:
        """The checkers' verdict: True, False or "unknown" (None when the run did not complete)."""
        return None if self.results is None else self.results.get("valid")

    @property
    def replay(self) -> str | None:
        """The `fencelab test ...` command that replays this run (same seed, same options)."""
        if self.results is not None and self.results.get("replay"):
            return self.results["replay"]
        from lab.runner import replay_command  # not at plugin load: every pytest session loads it

        return replay_command(self.test)

    @property
    def history_path(self) -> Path | None:
        return self.run_dir / "history.jsonl" if self.run_dir else None


_ENTRY_POINT = "fencelab"  # this module's name in the pytest11 entry point group (pyproject.toml)


def pytest_addhooks(pluginmanager) -> None:
    """Loaded by module (`-p lab.pytest_plugin`) while the `fencelab` entry point is installed: skip the entry point.

    pytest would otherwise register this same module a second time under the entry point's name and refuse
    ("Plugin already registered under a different name"); blocking that name makes both activations work.
    """
    name = pluginmanager.get_name(sys.modules[__name__])
    if name is not None and name != _ENTRY_POINT and pluginmanager.get_plugin(_ENTRY_POINT) is None:
        pluginmanager.set_blocked(_ENTRY_POINT)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fencelab", "fencelab lab runs (the lab_run and lab_stack fixtures)")
    group.addoption("--lab-time-limit", type=float, default=None, metavar="SECONDS",
                    help="time limit of every lab_run that does not set its own (default: 5)")
    group.addoption("--lab-nemesis", default=None, metavar="NAMES",
                    help="comma-separated nemeses for every lab_run that does not set its own")
    group.addoption("--lab-seed", type=int, default=None, metavar="N",
                    help="seed of every lab_run (default: derived from the test id, so reruns replay)")
    group.addoption("--lab-store-dir", default=None, metavar="DIR",
                    help="where lab runs land, store/<test-name>/<timestamp>/ (default: under pytest's basetemp)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "lab_slow: a slow fencelab campaign; deselect with -m 'not lab_slow'")


@pytest.fixture(scope="session")
def lab_stack_options():
    """What `lab_stack` starts (override this fixture in a conftest.py to change it)."""
    from lab.stack.local import StackOptions  # not at plugin load: every pytest session loads it

    return StackOptions(servers=2, store=True)


@pytest.fixture(scope="session")
def lab_stack(lab_stack_options, tmp_path_factory):
    """A local stack (Valkey, store, lease servers) for the whole session; `.status()` (a `StackStatus`) has its
    URLs and the path of its API keys."""
    from lab.stack.local import LocalStack  # not at plugin load: every pytest session loads it

    stack = LocalStack(name="pytest-lab", root=tmp_path_factory.mktemp("lab-stack"), die_with_parent=True)
    stack.up(lab_stack_options)
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture
def lab_run(request: pytest.FixtureRequest, tmp_path_factory):
    """A function running one fencelab test with the session's --lab-* defaults; returns a `LabRun`."""
    config = request.config

    def run(workload: str = "lease", *, name: str | None = None, time_limit: float | None = None,
            nemesis: str | list[str] | None = None, seed: int | None = None, store_dir: str | Path | None = None,
            report: bool = True, **options: Any) -> LabRun:
        _refuse_inside_event_loop()
        test = _build_test(request, workload, name, time_limit, nemesis, seed, options)
        store = Path(store_dir or config.getoption("--lab-store-dir") or
                     tmp_path_factory.getbasetemp() / "fencelab-store")
        return _run(config, request.node.nodeid, test, store, report)

    return run


def _refuse_inside_event_loop() -> None:
    """lab_run drives its own event loop: an async test cannot call it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise pytest.UsageError("lab_run runs its own event loop: call it from a plain (non-async) test function")


def _build_test(request: pytest.FixtureRequest, workload: str, name: str | None, time_limit: float | None,
                nemesis: Any, seed: int | None, options: dict[str, Any]):
    """The Test for one lab_run: explicit arguments, else --lab-* options, else defaults."""
    from lab.testmap import Test  # not at plugin load: every pytest session loads it

    config = request.config
    known = {f.name for f in fields(Test)} - {"name", "workload", "time_limit", "nemesis", "seed", "run_dir", "live"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"lab_run got unknown options {unknown}; Test fields are: {', '.join(sorted(known))}")
    if time_limit is None:
        time_limit = config.getoption("--lab-time-limit") or 5.0
    if nemesis is None:
        nemesis = config.getoption("--lab-nemesis") or []
    if isinstance(nemesis, str):
        nemesis = [n.strip() for n in nemesis.split(",") if n.strip()]
    if seed is None:
        seed = config.getoption("--lab-seed")
    if seed is None:
        seed = zlib.crc32(request.node.nodeid.encode())  # stable per test: a rerun replays the same run
    name = name or _NAME_BAD.sub("-", request.node.name).strip("-.")[:64] or "lab-run"
    return Test(name=name, workload=workload, time_limit=float(time_limit), nemesis=list(nemesis), seed=int(seed),
                **options)


def _run(config: pytest.Config, nodeid: str, test, store: Path, report: bool) -> LabRun:
    """Run the test, write its report, and remember it for the terminal summary (also when it fails)."""
    from lab.runner import run_test, validate  # not at plugin load: every pytest session loads it

    runs = config.stash.setdefault(_RUNS, [])
    run = LabRun(test=test, results=None, run_dir=None, nodeid=nodeid,
                 pytest_replay=f"pytest {nodeid!r} --lab-seed {test.seed}")
    runs.append(run)
    try:
        validate(test)  # the one check of a Test (as `fencelab test`): a bad option is a RunError naming it
        run.results = run_test(test, store)
    except BaseException as e:
        run.error = f"{type(e).__name__}: {e}"
        raise
    finally:
        run.run_dir = Path(test.run_dir) if test.run_dir else None
    if report:
        run.report = _write_report(run.run_dir)
    return run


def _write_report(run_dir: Path) -> Path | None:
    """report.html for a run (a warning, not a test failure, when it cannot be written)."""
    try:
        from lab.report import write_report  # not at plugin load: every pytest session loads it

        return Path(write_report(run_dir))
    except Exception as e:  # noqa: BLE001 - the run's verdict stands without its report
        warnings.warn(f"fencelab: no report.html for {run_dir}: {type(e).__name__}: {e}", stacklevel=3)
        return None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """For every lab run of the session: verdict, run dir, report, and how to replay it."""
    runs = config.stash.get(_RUNS, None)
    if not runs:
        return
    tr = terminalreporter
    tr.section("fencelab lab runs")
    for run in runs:
        verdict = f"valid={run.valid}" if run.error is None else f"error: {run.error}"
        tr.write_line(f"{run.test.name} ({run.nodeid}): {verdict}")
        tr.write_line(f"  run dir: {run.run_dir or '(not created)'}")
        if run.report is not None:
            tr.write_line(f"  report:  {run.report}")
        elif run.run_dir is not None and (run.run_dir / "results.json").exists():
            tr.write_line(f"  results: {run.run_dir / 'results.json'}")
        tr.write_line(f"  replay:  {run.replay}")
        tr.write_line(f"  rerun:   {run.pytest_replay}")
