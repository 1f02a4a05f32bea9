"""Verdicts of the domain checkers, old code vs new: every field of every result but the timings must be equal.

    .tools/venv/bin/python bench/checker_domain_compare.py --old HEAD~1 [--ops 200000] [--seeds 1 2 3]

The histories: bench/checker_domain.py simulations (`--ops` each, one per seed; correct by construction),
three buggy simulated servers of tests/test_checker_simulated.py (violations of mutual exclusion, fencing
and stale commits), and every history any domain checker is given while tests/test_checker*.py run (the
sensitivity catalog's violating histories, the recorded Valkey-clock run, Valkey losses, strobes, `sent`,
malformed histories, ...), captured by wrapping the one pairing. On each, every domain checker runs alone
(building its own view of the history) and all of them composed (one view), with default options and with
`require_deadline` / `min_success_rate` / `start_unix_ms` set. The old code is `git archive <rev> checkers lab`
in a temporary directory; each side runs in its own interpreter. Prints one line per history and exits 1 on
any difference.
"""

from __future__ import annotations

import argparse
import copy
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # name -> {checker: options}; the checkers not named run with their defaults
    "defaults": {},
    "options": {"deadlines": {"require_deadline": True, "start_unix_ms": 1_700_000_000_000, "slack_ms": 0},
                "availability": {"min_success_rate": 0.99}},
}


class _Capture:
    """A pytest plugin: keeps a deep copy of every history the checkers pair (strict or lenient)."""

    def __init__(self) -> None:
        self.histories: list[list] = []
        self.seen: set[int] = set()
        self.kept: list[list] = []

    def pytest_configure(self, config) -> None:  # noqa: ARG002 - pytest's hook signature
        import importlib

        # the modules that pair histories for the checkers: checkers.core before the view, checkers.view (the
        # view of a composition or a checker alone) and checkers.pairs (`pair_ops`) after it
        for name in ("checkers.core", "checkers.view", "checkers.pairs"):
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            if hasattr(module, "pair"):
                module.pair = self._capturing(module.pair)

    def _capturing(self, real):
        """`real` (lab.history.pair), keeping a copy of each history it is given."""

        def pair(history, *a, **kw):
            if isinstance(history, list) and id(history) not in self.seen:
                self.seen.add(id(history))
                self.kept.append(history)  # alive, so that its id is not reused by another history
                try:
                    self.histories.append(copy.deepcopy(history))
                except Exception:  # noqa: BLE001 - an uncopyable history is simply not compared
                    pass
            return real(history, *a, **kw)

        return pair


def _test_histories() -> list[tuple[str, list]]:
    """Every history the checker tests give a domain checker."""
    import pytest

    cap = _Capture()
    files = sorted(str(p) for p in (ROOT / "tests").glob("test_checker*.py"))
    pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", *files], plugins=[cap])
    return [(f"test history {i} ({len(h)} ops)", h) for i, h in enumerate(cap.histories)]


def build_histories(ops: int, seeds: list[int]) -> list[tuple[str, list]]:
    """(name, history) of every history compared."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]
    import checker_domain as sim
    import test_checker_simulated as buggy

    out = [(f"simulation seed {s} ({ops:,} ops)", sim.generate_history(ops, seed=s)) for s in seeds]
    for server in (buggy.IgnoresConflicts, buggy.ReusesTokens, buggy.UnfencedCommits):
        out.append((f"buggy server {server.__name__}",
                    sim.generate_history(20_000, n_keys=8, n_workers=12, seed=4, server=server())))
    return out + _test_histories()


def _strip(x):
    """A result without its timings (`elapsed_s`), NaN made comparable."""
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k != "elapsed_s"}
    if isinstance(x, list | tuple):
        return type(x)(_strip(v) for v in x)
    if isinstance(x, float) and x != x:
        return "NaN"
    return x


def worker(tree: str, histories_path: str, out_path: str) -> None:
    """In a fresh interpreter: run the checkers of `tree` on every history, pickle the results."""
    sys.path.insert(0, tree)
    from checkers.core import DOMAIN_CHECKERS, compose, get_checker

    with open(histories_path, "rb") as f:
        histories = pickle.load(f)
    results = []
    for _, h in histories:
        one = {}
        for vname, opts in VARIANTS.items():
            for name in DOMAIN_CHECKERS:
                try:
                    one[(vname, name)] = _strip(get_checker(name, **opts.get(name, {})).check({}, h, {}))
                except Exception as e:  # noqa: BLE001 - a crash is a result to compare too
                    one[(vname, name)] = f"raised {type(e).__name__}: {e}"
            composed = compose({n: get_checker(n, **opts.get(n, {})) for n in DOMAIN_CHECKERS})
            one[(vname, "composed")] = _strip(composed.check({}, h, {}))
        results.append(one)
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


def _first_difference(a, b, path="") -> str:
    """Where two results first differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'new' if k in b else 'old'}"
            if a[k] != b[k]:
                return _first_difference(a[k], b[k], f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: old {str(a)[:200]} / new {str(b)[:200]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default="HEAD", help="the git revision of the old code (default HEAD)")
    ap.add_argument("--old-tree", help="a directory holding the old checkers/ and lab/ (instead of --old)")
    ap.add_argument("--ops", type=int, default=200_000, help="ops per simulated history")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    with tempfile.TemporaryDirectory(prefix="checker-compare-") as tmp:
        old = Path(args.old_tree) if args.old_tree else Path(tmp) / "old"
        if not args.old_tree:
            old.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old, "checkers", "lab"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        histories = build_histories(args.ops, args.seeds)
        hpath = Path(tmp) / "histories.pkl"
        with open(hpath, "wb") as f:
            pickle.dump(histories, f)
        sides = {}
        for side, tree in (("old", old), ("new", ROOT)):
            out = Path(tmp) / f"{side}.pkl"
            subprocess.run([sys.executable, __file__, "--worker", str(tree), str(hpath), str(out)], check=True)
            with open(out, "rb") as f:
                sides[side] = pickle.load(f)
    differing = 0
    for (name, h), a, b in zip(histories, sides["old"], sides["new"]):
        diffs = [f"{k[0]}/{k[1]} {_first_difference(a[k], b[k])}" for k in a if a[k] != b[k]]
        verdicts = sorted({str(r["valid"]) for r in a.values() if isinstance(r, dict)})
        print(f"{'DIFFERENT' if diffs else 'identical'}  {name}: {len(a)} results, verdicts {'/'.join(verdicts)}")
        for d in diffs[:5]:
            print("    " + d)
        differing += bool(diffs)
    print(f"{len(histories)} histories, {differing} with a difference (old {args.old_tree or args.old} vs the working "
          "tree)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
