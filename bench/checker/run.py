"""Side-by-side benchmark: our linearizability engine against Porcupine (Go) on one corpus.

    go -C bench/checker/porcupine build -o ../porcupine-bench .
    .tools/venv/bin/python bench/checker/run.py [--only NAME] [--budget 60] [--porcupine-budget 600]

The corpus (bench/checker/corpus.py, seeded) is written to bench/checker/corpus/
when missing or stale. Each history is checked, in its own process, by the Go
program (Porcupine v1.3.1, cas-register with Jepsen semantics) and by
`checkers.linear.check_history` under a 60 s budget. Both are timed from parsed
records in memory to the verdict (pairing, partitioning and search; not JSON
parsing). Peak memory is each process's peak RSS (VmHWM), which includes the
interpreter or runtime and the parsed history; for ours the increase during
the check alone is printed too (check_MB).

Exit status: 0 when every verdict agrees and none of ours is "unknown";
1 otherwise; 2 when the Go binary is missing. Printed: one line per history,
the totals, and the ratio porcupine_total / ours_total (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from corpus import Spec, default_specs, generate, write_history  # noqa: E402

BINARY = HERE / "porcupine-bench"
CORPUS = HERE / "corpus"


def load_jsonl(path: Path) -> list[dict]:
    """Read a history: lab.history's reader when present, else a plain JSONL loop."""
    try:
        from lab.history import read_history
    except ImportError:  # the shared reader is optional here: the corpus is always well-formed JSONL
        with path.open() as fh:
            return [json.loads(line) for line in fh if line.strip()]
    return read_history(path)


def worker(path: Path, budget: float) -> None:
    """Check one history with our engine and print {"valid", "elapsed_s", "ops", "partitions", "peak_rss_kb"}."""
    from checkers.linear import check_history

    history = load_jsonl(path)
    before_kb = proc_status_kb("VmRSS")
    t0 = time.perf_counter()
    res = check_history(history, "cas-register", time_limit=budget)
    elapsed = time.perf_counter() - t0
    peak_kb = proc_status_kb("VmHWM")
    print(json.dumps({"valid": res["valid"], "elapsed_s": elapsed, "ops": res["ops"],
                      "partitions": res["partitions"], "reason": res.get("reason"),
                      "peak_rss_kb": peak_kb, "check_rss_kb": max(0, peak_kb - before_kb)}))


def proc_status_kb(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in KiB.

    getrusage's ru_maxrss is not used: Linux carries it over from the parent across fork/exec.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def spec_digest(spec: Spec) -> str:
    """A short digest of a spec and the generator's source, to tell a stale corpus file."""
    src = (HERE / "corpus.py").read_bytes()
    return hashlib.sha256(repr(spec).encode() + src).hexdigest()[:16]


def ensure_corpus(specs: list[Spec]) -> list[Path]:
    """Write every spec's history to the corpus directory unless an up-to-date copy is there."""
    CORPUS.mkdir(exist_ok=True)
    manifest_path = CORPUS / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    paths = []
    for spec in specs:
        path = CORPUS / f"{spec.name}.jsonl"
        digest = spec_digest(spec)
        if manifest.get(spec.name) != digest or not path.exists():
            write_history(path, generate(spec))
            manifest[spec.name] = digest
        paths.append(path)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return paths


def run_porcupine(path: Path, budget: float) -> dict:
    """Porcupine's verdict, time and peak RSS for one history."""
    out = subprocess.run([str(BINARY), "-timeout", f"{budget}s", str(path)], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"porcupine-bench failed on {path}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def run_ours(path: Path, budget: float) -> dict:
    """Our verdict, time and peak RSS for one history (in a fresh interpreter)."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(path),
                          "--budget", str(budget)], capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"our checker failed on {path}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help="run only histories whose name contains this")
    ap.add_argument("--budget", type=float, default=60.0, help="our time budget per history, seconds")
    ap.add_argument("--porcupine-budget", type=float, default=600.0, help="Porcupine's budget per history, seconds")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.budget)
        return 0
    if not BINARY.exists():
        print(f"missing {BINARY.relative_to(ROOT)}; build it with:\n"
              "  go -C bench/checker/porcupine build -o ../porcupine-bench .", file=sys.stderr)
        return 2
    specs = [s for s in default_specs() if not args.only or any(o in s.name for o in args.only)]
    if not specs:
        print(f"no history matches {args.only}", file=sys.stderr)
        return 2
    paths = ensure_corpus(specs)
    rows = []
    print("ops: operations checked (fails dropped); times in seconds; ratio = porcupine / ours")
    print(f"{'history':30s} {'ops':>7s} {'parts':>5s} {'verdict':>8s} {'ours_s':>8s} {'porc_s':>8s} "
          f"{'ratio':>7s} {'ours_MB':>8s} {'check_MB':>8s} {'porc_MB':>8s}")
    for spec, path in zip(specs, paths, strict=True):
        porc = run_porcupine(path, args.porcupine_budget)
        ours = run_ours(path, args.budget)
        agree = porc["valid"] == ours["valid"] and ours["valid"] != "unknown"
        ratio = porc["elapsed_s"] / max(ours["elapsed_s"], 1e-9)
        rows.append((spec, ours, porc, agree, ratio))
        verdict = str(ours["valid"]) if agree else f"{ours['valid']}!={porc['valid']}"
        print(f"{spec.name:30s} {ours['ops']:7d} {ours['partitions']:5d} {verdict:>8s} {ours['elapsed_s']:8.3f} "
              f"{porc['elapsed_s']:8.3f} {ratio:7.2f} {ours['peak_rss_kb'] / 1024:8.1f} "
              f"{ours['check_rss_kb'] / 1024:8.1f} {porc['peak_rss_kb'] / 1024:8.1f}", flush=True)
    ours_total = sum(r[1]["elapsed_s"] for r in rows)
    porc_total = sum(r[2]["elapsed_s"] for r in rows)
    faster = sum(1 for r in rows if r[1]["elapsed_s"] <= r[2]["elapsed_s"])
    geo = math.exp(sum(math.log(max(r[4], 1e-9)) for r in rows) / len(rows))
    print(f"\nhistories: {len(rows)} ({sum(1 for r in rows if r[1]['valid'] is False)} invalid), "
          f"verdicts agree: {sum(1 for r in rows if r[3])}/{len(rows)}")
    print(f"ours total: {ours_total:.3f} s   porcupine total: {porc_total:.3f} s   "
          f"ratio porcupine/ours: {porc_total / max(ours_total, 1e-9):.2f}")
    print(f"ours faster on {faster}/{len(rows)} histories; geometric mean of per-history ratios: {geo:.2f}")
    print(f"largest peak RSS: ours {max(r[1]['peak_rss_kb'] for r in rows) / 1024:.1f} MB "
          f"(check alone {max(r[1]['check_rss_kb'] for r in rows) / 1024:.1f} MB), "
          f"porcupine {max(r[2]['peak_rss_kb'] for r in rows) / 1024:.1f} MB")
    bad = [r[0].name for r in rows if not r[3]]
    if bad:
        print(f"FAILED: verdicts differ or ours is unknown on: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
