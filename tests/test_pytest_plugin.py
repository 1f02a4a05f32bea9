"""The pytest plugin: inert unless used, its options and marker, and the example project passing with its summary.

The plugin is loaded with `-p lab.pytest_plugin -p no:fencelab`, which works
both before and after the `fencelab` pytest11 entry point is installed (the
entry point and the module must not be registered twice).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

pytest_plugins = ["pytester"]

PLUGIN = ["-p", "lab.pytest_plugin", "-p", "no:fencelab", "-p", "no:cacheprovider"]
INNER = [*PLUGIN, "-p", "no:asyncio"]  # the in-process sessions need no asyncio plugin (nor its config warning)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytest-project"


def test_plugin_is_inert_unless_used(pytester):
    pytester.makepyfile(test_plain="def test_nothing_to_do_with_the_lab():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest(*INNER, "--strict-markers")
    result.assert_outcomes(passed=1)
    assert "fencelab lab runs" not in result.stdout.str()


def test_importing_the_plugin_starts_and_loads_nothing_of_the_lab():
    code = "import sys, lab.pytest_plugin; print(sorted(m for m in sys.modules if m.startswith('lab')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['lab', 'lab.pytest_plugin']"


def test_options_and_marker_are_registered(pytester):
    result = pytester.runpytest(*INNER, "--help")
    for option in ("--lab-time-limit", "--lab-nemesis", "--lab-seed", "--lab-store-dir"):
        result.stdout.fnmatch_lines([f"*{option}*"])
    pytester.makepyfile(test_slow="import pytest\n\n@pytest.mark.lab_slow\ndef test_long():\n    pass\n\n"
                                  "def test_short():\n    pass\n")
    result = pytester.runpytest(*INNER, "--strict-markers", "-m", "not lab_slow")
    result.assert_outcomes(passed=1, deselected=1)


def test_lab_run_refuses_bad_use_with_clear_errors(pytester):
    pytester.makepyfile(test_misuse='''
import pytest

def test_unknown_option(lab_run):
    with pytest.raises(TypeError, match=r"unknown options \\['colour'\\]; Test fields are: .*concurrency"):
        lab_run("lease", colour="blue")

def test_bad_workload_is_refused_before_anything_starts(lab_run, tmp_path):
    from lab.runner import RunError
    with pytest.raises(RunError, match="unknown workload 'nope'"):
        lab_run("nope", store_dir=tmp_path)
''')
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*fencelab lab runs*", "*error: RunError: unknown workload 'nope'*",
                                 "*run dir: (not created)*", "*replay:  fencelab test --workload nope*"])


def test_example_project_passes_with_the_plugin(tmp_path):
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "pytest", str(EXAMPLE), *PLUGIN, "-m", "not lab_slow",
           "--lab-store-dir", str(store), "--lab-seed", "42", "--basetemp", str(tmp_path / "basetemp")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=EXAMPLE)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "2 passed, 1 deselected" in text
    for line in ("fencelab lab runs", "test_lease_workload_holds_the_contract", "valid=True", "run dir: ",
                 "replay:  fencelab test --workload lease", "--seed 42",
                 "rerun:   pytest 'tests/test_lease_lab.py::test_lease_workload_holds_the_contract' --lab-seed 42"):
        assert line in text, line
    results = (store / "test_lease_workload_holds_the_contract" / "latest" / "results.json").resolve()
    assert json.loads(results.read_text())["valid"] is True
    assert f"run dir: {results.parent}" in text
