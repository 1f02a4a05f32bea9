"""The layer contract (.importlinter, docs/architecture.md "Layers"): imports only point down, checked in CI.

`lint-imports` (import-linter) reads every import statement of lab, checkers, nemesis and workloads (those
inside functions too) and fails on one that points up a layer. The second test proves the check can fail:
a copy of the packages with one planted upward import is refused, naming the import.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lab", "checkers", "nemesis", "workloads")
LINT = Path(sys.executable).with_name("lint-imports")  # the dev extras install it (never skipped: CI's check)


def lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` over the packages under `root` (found first on the path), its config from there."""
    assert LINT.exists(), f"{LINT} is missing: install the dev extras (bash scripts/install.sh all)"
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_layer_contract_holds():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Layers only point down (top first) KEPT" in out.stdout, out.stdout


def test_a_planted_upward_import_breaks_the_contract(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    assert lint(tmp_path).returncode == 0, "the untouched copy keeps the contract"
    # the bottom layer reaching for the runner, from inside a function (where the old cycles hid)
    (tmp_path / "lab" / "history" / "planted.py").write_text(
        "def replay():\n    from lab.runner import run_test\n\n    return run_test\n", encoding="utf-8")
    out = lint(tmp_path)
    assert out.returncode != 0, out.stdout
    assert "BROKEN" in out.stdout and "lab.history.planted -> lab.runner" in out.stdout, out.stdout


def _import_counts():
    """scripts/import_counts.py, the reproducible count of imports inside functions."""
    spec = importlib.util.spec_from_file_location("import_counts", ROOT / "scripts" / "import_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# packages whose imports of the lab's own modules are all at module level (a new one inside a function would
# hide a cycle again): the SUT layer, workloads, scenarios, the report
AT_MODULE_LEVEL = ("lab/sut/", "workloads/", "lab/scenarios/", "lab/report/")


def test_no_import_of_our_own_modules_hides_inside_a_function_in_the_cleaned_packages():
    _, inner, where = _import_counts().count(ROOT, first_party=True)
    hidden = [w for w in where if w.startswith(AT_MODULE_LEVEL)]
    assert not hidden, f"imports inside functions (move them to module level): {hidden}"
    assert inner == len(where) and inner > 0, "the count sees the imports the other packages still make in functions"


# issue 17: at most this many imports inside functions in the product code (74 before it; 37 after), each with a
# comment saying why (a heavy import the CLI's fast paths must not pay, an optional dependency, the pytest plugin)
MAX_IMPORTS_IN_FUNCTIONS = 40


def test_at_most_40_imports_inside_functions_each_saying_why():
    counts = _import_counts()
    _, inner, where = counts.count(ROOT)
    assert inner <= MAX_IMPORTS_IN_FUNCTIONS, (
        f"{inner} imports inside functions (at most {MAX_IMPORTS_IN_FUNCTIONS}): move one to module level, or one "
        f"more has to go first:\n" + "\n".join(where))
    silent = counts.uncommented(ROOT)
    assert not silent, f"imports inside functions without a comment saying why: {silent}"


def test_an_import_inside_a_function_without_a_comment_is_found(tmp_path):
    for pkg in ("lab", "checkers", "nemesis", "workloads"):
        (tmp_path / pkg).mkdir()
    (tmp_path / "lab" / "m.py").write_text(
        "import json\n\n\n"
        "def f():\n"
        "    import pandas  # heavy: only for reports\n"
        "    import numpy\n"  # the run of imports the comment above speaks for
        "\n"
        "    import yaml\n"  # apart from the run: says nothing
        "    from lab.runner import (\n"
        "        run_test)  # the comment may sit on any line of the statement\n", encoding="utf-8")
    assert _import_counts().uncommented(tmp_path) == ["lab/m.py:8 yaml"]


def test_the_import_count_finds_an_import_inside_a_function(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "m.py").write_text("import json\nfrom lab import x\n\n\ndef f():\n    from lab.runner import run\n"
                                          "    import os\n", encoding="utf-8")
    for pkg in ("checkers", "nemesis", "workloads"):
        (tmp_path / pkg).mkdir()
    counts = _import_counts()
    assert counts.count(tmp_path)[:2] == (2, 2)
    assert counts.count(tmp_path, first_party=True) == (1, 1, ["lab/m.py:6 lab.runner"])


def test_no_module_imports_itself_back():
    """No import cycle anywhere in the product code, function-level imports included (grimp sees both):
    two modules that import each other cannot be read, or changed, one at a time (issue 17)."""
    import grimp

    graph = grimp.build_graph("lab", "nemesis", "checkers", "workloads")
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith(module + ".") or module.startswith(imported + "."):
                continue  # a package and its own submodule
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            assert chain is None, f"import cycle: {module} -> {' -> '.join(chain)}"
