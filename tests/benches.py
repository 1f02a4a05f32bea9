"""Loading a bench script (bench/ is no package) as a module, for the tests of its figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(script: str):
    """bench/<script> as a module, with bench/ on the path for its own imports (bench.figures)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(Path(script).stem, BENCH / script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
