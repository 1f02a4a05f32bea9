"""Side-by-side benchmark: our linearizability engine against Porcupine (Go) on one corpus.

    go -C bench/checker/porcupine build -o ../porcupine-bench .   (run.py builds it when missing or older than its source)
    .tools/venv/bin/python bench/checker/run.py [--only NAME] [--budget 60] [--porcupine-budget 10] [--repeat 3]
    .tools/venv/bin/python bench/checker/run.py --porcupine-budget 600 --write-verdicts   (Porcupine's verdicts)

The corpus: seeded cas-register histories (bench/checker/corpus.py), written to
bench/checker/corpus/ when missing or stale, in categories of four (one shape:
valid, stale read, lost write, phantom cas), plus the recorded histories of
bench/checker/real/ (the register workload against real Valkey: many keys,
partitions or pauses, crashed clients), category `valkey-register`. Each
history is checked by the Go program (Porcupine v1.3.1, cas-register with
Jepsen semantics) and by `checkers.linear.check_history` (60 s budget), each in
its own process, best of `--repeat` checks (`SMALL_REPEAT` for a history Porcupine checks in under
`SMALL_CHECK_S`). Both are timed from parsed records
in memory to the verdict (pairing, partitioning and search; not JSON parsing:
the Go harness decodes the op values while reading, as json.loads does for us),
in CPU time (Go: every thread, the parallel partition checks and its GC
included; wall time is printed too, but the machine is shared and noisy).
Peak memory is each process's peak RSS (VmHWM), interpreter or runtime included.

`figures(quick)` gives `make bench`'s rows (bench/figures.py): per category, our
CPU / Porcupine's (target <= 1.0), and verdicts identical with none unknown.
There, as in the script by default, Porcupine gets a 10 s budget (quick: 3 s): the one history it needs
minutes and 2.6 GB for counts with its budget, a lower bound that can only
make our ratio look worse, and its verdict is the one Porcupine gave in a full
run (`--write-verdicts`, bench/checker/porcupine-verdicts.json, keyed by the
history's digest).

Exit status: 0 when every verdict agrees and none of ours is "unknown";
1 otherwise; 2 when the Go binary is missing and cannot be built.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # bench/figures.py

from corpus import Spec, default_specs, generate, write_history  # noqa: E402

BINARY = HERE / "porcupine-bench"
CORPUS = HERE / "corpus"
REAL = HERE / "real"  # recorded histories of the register workload against real Valkey (gzipped JSONL)
REAL_CATEGORY = "valkey-register"


class Entry(NamedTuple):  # not a dataclass: bench/summary.py loads this file without registering the module
    """One history of the benchmark: generated from a Spec, or recorded from a real run."""

    name: str
    category: str
    path: Path
    digest: str  # of the spec and generator, or of the recorded file


def load_jsonl(path: Path) -> list[dict]:
    """Read a history: lab.history's reader when present, else a plain JSONL loop."""
    try:
        from lab.history import read_history
    except ImportError:  # the shared reader is optional here: the corpus is always well-formed JSONL
        with path.open() as fh:
            return [json.loads(line) for line in fh if line.strip()]
    return read_history(path)


def worker(path: Path, budget: float, repeat: int = 1) -> None:
    """Check one history with our engine and print {"valid", "elapsed_s", "cpu_s", "ops", "partitions",
    "peak_rss_kb"}: the best of `repeat` checks (a repeat is skipped once a check took over 2 s)."""
    from checkers.linear import check_history

    history = load_jsonl(path)
    before_kb = proc_status_kb("VmRSS")
    best: dict | None = None
    for _ in range(max(1, repeat)):
        c0 = time.process_time()
        t0 = time.perf_counter()
        res = check_history(history, "cas-register", time_limit=budget)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if best is None or cpu < best["cpu_s"]:
            best = {"valid": res["valid"], "elapsed_s": elapsed, "cpu_s": cpu, "ops": res["ops"],
                    "partitions": res["partitions"], "reason": res.get("reason")}
        if elapsed > 2.0:
            break
    peak_kb = proc_status_kb("VmHWM")
    assert best is not None
    print(json.dumps({**best, "peak_rss_kb": peak_kb, "check_rss_kb": max(0, peak_kb - before_kb)}))


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


def run_porcupine(path: Path, budget: float, repeat: int = 1) -> dict:
    """Porcupine's verdict, time and peak RSS for one history: the best (least CPU) of `repeat` checks in one
    process (one check only when the first took over 2 s)."""
    first = _porcupine_once([path], budget)[0]
    if repeat <= 1 or first["elapsed_s"] > 2.0:
        return first
    return min([first, *_porcupine_once([path] * (repeat - 1), budget)], key=lambda r: r["cpu_s"])


def _porcupine_once(paths: list[Path], budget: float) -> list[dict]:
    """One run of the Go program over `paths` (one JSON line each)."""
    out = subprocess.run([str(BINARY), "-timeout", f"{budget}s", *map(str, paths)], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"porcupine-bench failed on {paths[0]}: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def run_ours(path: Path, budget: float, repeat: int = 1) -> dict:
    """Our verdict, time and peak RSS for one history (in a fresh interpreter; best of `repeat` checks)."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(path),
                          "--budget", str(budget), "--repeat", str(repeat)], capture_output=True, text=True,
                         check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"our checker failed on {path}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def category(spec: Spec) -> str:
    """A history's category: its generator and size (the four variants, valid and three anomalies, of one shape)."""
    return spec.name.rsplit("-", 1)[0] if spec.bug is None else spec.name[: -len(spec.bug) - 1]


def recorded_verdicts() -> dict:
    """Porcupine's verdicts from a full run, by history name and corpus digest (for histories it cannot decide
    within a short budget: the figures compare our verdict with the one it gave without a budget)."""
    path = HERE / "porcupine-verdicts.json"
    return json.loads(path.read_text()) if path.exists() else {}


def entries(specs: list[Spec], real: bool = True, only: list[str] | None = None) -> list[Entry]:
    """The generated histories of `specs`, then (with `real`) the recorded ones of bench/checker/real/,
    decompressed into the corpus directory; `only`: names containing one of these."""
    out = [Entry(s.name, category(s), p, spec_digest(s)) for s, p in zip(specs, ensure_corpus(specs), strict=True)]
    if not real:
        return out
    manifest_path = CORPUS / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for gz in sorted(REAL.glob("*.jsonl.gz")):
        name = gz.name.removesuffix(".jsonl.gz")
        if only and not any(o in name for o in only):
            continue
        data = gz.read_bytes()
        digest = hashlib.sha256(data).hexdigest()[:16]
        path = CORPUS / f"{name}.jsonl"
        if manifest.get(name) != digest or not path.exists():
            path.write_bytes(zlib.decompress(data, wbits=31))  # wbits 31: the gzip container
            manifest[name] = digest
        out.append(Entry(name, REAL_CATEGORY, path, digest))
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return out


# A history Porcupine checks in under SMALL_CHECK_S of CPU is checked SMALL_REPEAT times on each side (the best
# counts), not `repeat`: at 1-3 ms a check, a best of 3 moved cas-1000's ratio from 0.97 to 1.20 between two runs.
SMALL_CHECK_S = 0.02
SMALL_REPEAT = 15


def measure(items: list[Entry], budget: float, porcupine_budget: float, repeat: int, echo: bool) -> list[dict]:
    """Check every history with both checkers; one row per history."""
    recorded = recorded_verdicts()
    rows = []
    if echo:
        print("ops: operations checked (fails dropped); times: best of "
              f"{repeat} checks, seconds; cpu ratio = ours / porcupine (CPU time, every thread)")
        print(f"{'history':34s} {'ops':>7s} {'parts':>5s} {'verdict':>8s} {'ours_s':>8s} {'porc_s':>8s} "
              f"{'ours_cpu':>8s} {'porc_cpu':>8s} {'cpu_ratio':>9s} {'ours_MB':>8s} {'porc_MB':>8s}")
    for item in items:
        porc = run_porcupine(item.path, porcupine_budget, repeat)
        n = repeat
        if repeat > 1 and porc["cpu_s"] < SMALL_CHECK_S:  # a few-ms check: one busy moment moves a best of 3
            n = SMALL_REPEAT
            porc = min([porc, *_porcupine_once([item.path] * (n - repeat), porcupine_budget)],
                       key=lambda r: r["cpu_s"])
        ours = run_ours(item.path, budget, n)
        porc_verdict, porc_from = porc["valid"], "this run"
        if porc_verdict == "unknown" and recorded.get(item.name, {}).get("digest") == item.digest:
            porc_verdict, porc_from = recorded[item.name]["valid"], "recorded full run"
        agree = porc_verdict == ours["valid"] and ours["valid"] != "unknown"
        row = {"name": item.name, "category": item.category, "ours": ours, "porc": porc, "agree": agree,
               "porc_verdict": porc_verdict, "porc_from": porc_from, "digest": item.digest,
               "porc_timed_out": porc["valid"] == "unknown"}
        rows.append(row)
        if echo:
            verdict = str(ours["valid"]) if agree else f"{ours['valid']}!={porc_verdict}"
            mark = "+" if row["porc_timed_out"] else ""
            print(f"{item.name:34s} {ours['ops']:7d} {ours['partitions']:5d} {verdict:>8s} "
                  f"{ours['elapsed_s']:8.3f} {porc['elapsed_s']:7.3f}{mark:1s} {ours['cpu_s']:8.3f} "
                  f"{porc['cpu_s']:8.3f} {ours['cpu_s'] / max(porc['cpu_s'], 1e-9):9.2f} "
                  f"{ours['peak_rss_kb'] / 1024:8.1f} {porc['peak_rss_kb'] / 1024:8.1f}", flush=True)
    return rows


def by_category(rows: list[dict]) -> dict[str, dict]:
    """Per category: our CPU, Porcupine's CPU (a lower bound where it hit its budget), verdicts agreeing."""
    cats: dict[str, dict] = {}
    for r in rows:
        c = cats.setdefault(r["category"], {"ours": 0.0, "porc": 0.0, "n": 0, "agree": 0, "timed_out": 0})
        c["ours"] += r["ours"]["cpu_s"]
        c["porc"] += r["porc"]["cpu_s"]
        c["n"] += 1
        c["agree"] += r["agree"]
        c["timed_out"] += r["porc_timed_out"]
    return cats


def figures(quick: bool = False) -> list:
    """Issue 13 target 5: per corpus category, our CPU time / Porcupine's (<= 1.0), and verdicts agreeing.

    quick: the valid and phantom-cas history of each category, one check each, Porcupine's budget 3 s.
    Full: every history, best of 3 checks, Porcupine's budget 10 s. Where Porcupine hits its budget (one
    history needs minutes and 2.6 GB), its CPU time up to the budget counts: a lower bound of its time, so
    our ratio can only look worse for it; its verdict there is the one it gave in a recorded full run
    (bench/checker/porcupine-verdicts.json, keyed by the history's digest).
    """
    from figures import Figure

    area = "linearizability"
    if not ensure_binary():
        return [Figure(area, "ours / Porcupine CPU, every category", float("nan"), "x", "<= 1.0", False,
                       "porcupine-bench could not be built (Go toolchain missing): not measured")]
    specs = default_specs()
    if quick:
        specs = [s for s in specs if s.bug in (None, "phantom-cas")]
    rows = measure(entries(specs, real=True), 60.0, 3.0 if quick else 10.0, 1 if quick else 3, echo=False)
    cats = by_category(rows)
    out = []
    how = (f"{'quick: 2' if quick else 'all 4'} histories per category, "
           f"{'one check' if quick else f'best of 3 checks ({SMALL_REPEAT} under {SMALL_CHECK_S * 1e3:g} ms)'} "
           "each side, process CPU time (Go: every thread), "
           "shared loaded 2-core machine")
    for name, c in cats.items():
        ratio = c["ours"] / max(c["porc"], 1e-9)
        note = f"ours {c['ours'] * 1e3:.1f} ms vs Porcupine {c['porc'] * 1e3:.1f} ms CPU; {how}"
        if c["timed_out"]:
            note += f"; Porcupine hit its budget on {c['timed_out']} (its time there is a lower bound)"
        out.append(Figure(area, f"ours / Porcupine CPU: {name}", round(ratio, 2), "x", "<= 1.0", ratio <= 1.0, note))
    agree = sum(c["agree"] for c in cats.values())
    total = sum(c["n"] for c in cats.values())
    unknown = sum(1 for r in rows if r["ours"]["valid"] == "unknown")
    from_recorded = [r["name"] for r in rows if r["porc_from"] != "this run"]
    note = f"{unknown} unknown of ours"
    if from_recorded:
        note += f"; Porcupine's verdict from its recorded full run for {', '.join(from_recorded)}"
    out.append(Figure(area, "verdicts identical to Porcupine's (none unknown)", agree, f"of {total}",
                      f"{total} of {total}", agree == total and unknown == 0, note))
    ours_total = sum(r["ours"]["cpu_s"] for r in rows)
    porc_total = sum(r["porc"]["cpu_s"] for r in rows)
    out.append(Figure(area, "ours / Porcupine CPU, whole corpus", round(ours_total / max(porc_total, 1e-9), 3), "x",
                      "<= 1.0", ours_total <= porc_total, how))
    return out


def porcupine_stale() -> bool:
    """Whether the built harness (at its usual place) is older than its sources: the harness changed, e.g.
    where its timed span starts, and must be rebuilt before its times mean what the doc says."""
    if BINARY != HERE / "porcupine-bench" or not BINARY.exists():
        return False
    src = max(p.stat().st_mtime for p in (HERE / "porcupine").iterdir() if p.is_file())
    return BINARY.stat().st_mtime < src


def ensure_binary() -> bool:
    """The Go harness is there and up to date: built when missing or stale (a stale one is kept, with a
    warning, only when there is no toolchain to rebuild it)."""
    if BINARY.exists() and not porcupine_stale():
        return True
    if build_porcupine():
        return True
    if BINARY.exists():
        print(f"warning: {BINARY.name} is older than its source and could not be rebuilt", file=sys.stderr)
        return True
    return False


def build_porcupine() -> bool:
    """Build the Go harness with the installed toolchain (PATH or .tools/go); False when there is none."""
    import shutil

    go = shutil.which("go") or next((str(p) for p in (ROOT / ".tools" / "go" / "bin" / "go",) if p.exists()), None)
    if go is None:
        return False
    r = subprocess.run([go, "build", "-o", str(BINARY), "."], cwd=HERE / "porcupine", capture_output=True,
                       text=True, timeout=90, check=False)
    return r.returncode == 0 and BINARY.exists()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help="run only histories whose name contains this")
    ap.add_argument("--budget", type=float, default=60.0, help="our time budget per history, seconds")
    ap.add_argument("--porcupine-budget", type=float, default=10.0,
                    help="Porcupine's budget per history, seconds (past it: its verdict from the recorded full run; "
                         "with --write-verdicts give it minutes, e.g. 600)")
    ap.add_argument("--repeat", type=int, default=3, help="checks per history and side; the best counts")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--write-verdicts", action="store_true",
                    help="record Porcupine's verdicts of this run in porcupine-verdicts.json (run with no budget)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.budget, args.repeat)
        return 0
    if not ensure_binary():
        print(f"missing {BINARY.relative_to(ROOT)} and no Go toolchain to build it; build it with:\n"
              "  go -C bench/checker/porcupine build -o ../porcupine-bench .", file=sys.stderr)
        return 2
    specs = [s for s in default_specs() if not args.only or any(o in s.name for o in args.only)]
    items = entries(specs, real=True, only=args.only)
    if not items:
        print(f"no history matches {args.only}", file=sys.stderr)
        return 2
    rows = measure(items, args.budget, args.porcupine_budget, args.repeat, echo=True)
    if args.write_verdicts:
        rec = recorded_verdicts()
        rec.update({r["name"]: {"valid": r["porc"]["valid"], "digest": r["digest"]} for r in rows
                    if r["porc"]["valid"] != "unknown"})
        (HERE / "porcupine-verdicts.json").write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    ours_total = sum(r["ours"]["cpu_s"] for r in rows)
    porc_total = sum(r["porc"]["cpu_s"] for r in rows)
    faster = sum(1 for r in rows if r["ours"]["cpu_s"] <= r["porc"]["cpu_s"])
    geo = math.exp(sum(math.log(max(r["ours"]["cpu_s"], 1e-9) / max(r["porc"]["cpu_s"], 1e-9)) for r in rows)
                   / len(rows))
    print(f"\nhistories: {len(rows)} ({sum(1 for r in rows if r['ours']['valid'] is False)} invalid), "
          f"verdicts agree: {sum(1 for r in rows if r['agree'])}/{len(rows)}")
    print(f"CPU: ours total {ours_total:.3f} s, porcupine total {porc_total:.3f} s, ratio ours/porcupine "
          f"{ours_total / max(porc_total, 1e-9):.3f}; ours faster on {faster}/{len(rows)} histories; "
          f"geometric mean of per-history ratios {geo:.2f}")
    print("\nper category (target: ours / porcupine CPU <= 1.0):")
    for name, c in by_category(rows).items():
        ratio = c["ours"] / max(c["porc"], 1e-9)
        print(f"  {name:16s} ours {c['ours']:8.3f} s  porcupine {c['porc']:8.3f} s{'+' if c['timed_out'] else ' '} "
              f" ratio {ratio:6.2f}  {'ok' if ratio <= 1.0 else 'OVER'}  verdicts {c['agree']}/{c['n']}")
    if any(r["porc_timed_out"] for r in rows):
        print("  (+: Porcupine hit its budget on a history of the category; its time there is a lower bound)")
    print(f"largest peak RSS: ours {max(r['ours']['peak_rss_kb'] for r in rows) / 1024:.1f} MB "
          f"(check alone {max(r['ours']['check_rss_kb'] for r in rows) / 1024:.1f} MB), "
          f"porcupine {max(r['porc']['peak_rss_kb'] for r in rows) / 1024:.1f} MB")
    bad = [r["name"] for r in rows if not r["agree"]]
    if bad:
        print(f"FAILED: verdicts differ or ours is unknown on: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
