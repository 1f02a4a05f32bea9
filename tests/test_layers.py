"""The layer contract (.importlinter, docs/architecture.md "Layers"): imports only point down, checked in CI.

`lint-imports` (import-linter) reads every import statement of lab, checkers, nemesis and workloads (those
inside functions too) and fails on one that points up a layer. The second test proves the check can fail:
a copy of the packages with one planted upward import is refused, naming the import.
"""

from __future__ import annotations

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
