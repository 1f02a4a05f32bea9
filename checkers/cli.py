"""`fencelab check`: run checkers on stored histories (JSONL or Jepsen EDN) and report.

    fencelab check FILE... [--model NAME] [--checker NAME ...] [--time-limit S]
                           [--json] [--out DIR] [--format jsonl|edn]
    fencelab check FILE --shrink [--max-checks N] [--any-ops] [--force] [--out DIR] [checker options]

Checkers default to `linearizable` when a model is given, else every domain
checker whose operations appear in the history (`checkers.core.applicable_checkers`;
with none, the file is "unknown" with the reason). Exit codes (lab.exitcodes, docs/cli.md#exit-codes): 0 all valid,
1 any invalid, 3 any unknown (and none invalid), 2 bad input (a missing or
malformed file, a missing required field, an unknown model or checker, a bad
option, a history with operations the model does not model), reported as one
line naming the file, line and problem; never a traceback. Every file is read,
and fitted to the model, before any is judged.

`--shrink` (one file) turns a convicted history into the smallest sub-history of whole operations that the
same checker still convicts of the same violation (`checkers.shrink`, docs/shrinking.md), written
as `<stem>.shrunk.jsonl` and `<stem>.shrunk.edn`.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import click

from checkers.core import CHECKERS, DOMAIN_CHECKERS, Checker, applicable_checkers, compose, get_checker, merge_valid
from checkers.models import get_model, models_taking, unmodelled_fs
from checkers.render import render_html
from checkers.shrink import history_units, shrink_history, target_of, violation_message
from lab.exitcodes import EXIT_BAD_INPUT, EXIT_INVALID, EXIT_UNKNOWN, EXIT_VALID  # the one table (docs/cli.md)
from lab.history import HistoryError, read_history_report, write_edn, write_jsonl

__all__ = ["DEFAULT_MAX_CHECKS", "check", "checker_lines", "exit_code", "summarize"]

DEFAULT_MAX_CHECKS = 2000  # checker calls a --shrink search may make (ms each on a lab run's history)


class BadInput(Exception):
    """Input the command cannot work with; the message is the one line the user sees."""


class _Check(click.Command):
    """A click command whose usage errors exit with the table's bad-input code (lab.exitcodes)."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            e.exit_code = EXIT_BAD_INPUT
            raise


class _Unavailable:
    """Stands in for a checker whose code could not be loaded: its verdict is unknown."""

    def __init__(self, name: str, error: BaseException):
        self.error = f"checker {name!r} is unavailable: {type(error).__name__}: {error}"

    def check(self, test: dict, history: list[dict], opts: Any) -> dict:
        """Always unknown, with the reason."""
        return {"valid": "unknown", "error": self.error}


def build_checkers(names: tuple[str, ...], model: str | None, time_limit: float | None) -> dict[str, Checker]:
    """The checkers asked for, validated eagerly (unknown names and models are bad input)."""
    if time_limit is not None and not 0 <= time_limit < math.inf:  # nan too (the search would never stop)
        raise BadInput(f"--time-limit must be >= 0 seconds and finite (omit it for no limit), got {time_limit}")
    if not names:
        names = ("linearizable",) if model else DOMAIN_CHECKERS
    built: dict[str, Checker] = {}
    for name in names:
        if name not in CHECKERS:
            raise BadInput(f"unknown checker {name!r}; known checkers: {', '.join(CHECKERS)}")
        if name == "linearizable" and not model:
            raise BadInput("the linearizable checker needs --model NAME")
        kw = {"model": model, "time_limit": time_limit} if name == "linearizable" else {}
        try:
            built[name] = get_checker(name, **kw)
        except ImportError as e:
            built[name] = _Unavailable(name, e)
        except (ValueError, TypeError) as e:
            raise BadInput(str(e)) from None
    return built


def load(path: Path, fmt: str | None) -> tuple[list[dict], list[str]]:
    """Read one history through lab.history; every problem it cannot recover from is BadInput."""
    if not path.is_file():
        raise BadInput(f"{path}: no such history file")
    try:  # need_an_op: a file whose only line is bad is refused, not judged as an empty history cut short
        return read_history_report(path, fmt, need_an_op=True)
    except HistoryError as e:
        raise BadInput(str(e)) from None
    except Exception as e:  # noqa: BLE001 - whatever a reader trips on, the user gets one line, not a traceback
        raise BadInput(f"{path}: cannot read history ({type(e).__name__}: {e})") from None


def model_fits(path: Path, model: str, history: list[dict]) -> None:
    """BadInput naming the history's `f`s the model does not model, and the models that take them all.

    Refused rather than judged in part: a history with ops outside the model is not a history of its object,
    and its ops that share a model's names need not mean them (a fenced-append `read` reads the store's
    documents, not a register), so judging the rest could still convict it falsely.
    """
    unmodelled = unmodelled_fs(get_model(model), history)
    if not unmodelled:
        return
    fs = {str(op.get("f")) for op in history if op.get("process") != "nemesis"}
    fit = models_taking(fs)
    instead = (f"check it with --model {' or --model '.join(fit)}" if fit else
               "no registered model takes all of them: check it without --model (the domain checkers)")
    raise BadInput(f"{path}: model {model!r} does not model {', '.join(unmodelled)} "
                   f"(it takes {', '.join(sorted(get_model(model).fs or ()))}); {instead}")


def exit_code(valids: list[Any]) -> int:
    """0 when all are valid, 1 when any is invalid, 3 when any is unknown (and none invalid)."""
    merged = merge_valid(valids)
    return EXIT_VALID if merged is True else EXIT_INVALID if merged is False else EXIT_UNKNOWN


def summarize(file: str, model: str | None, history: list[dict], results: dict, elapsed: float) -> dict:
    """The one JSON object per file: validity, size, time, and what failed (or could not be decided)."""
    out: dict[str, Any] = {"file": file, "valid": results["valid"], "model": model, "ops": len(history),
                           "elapsed_s": round(elapsed, 6),
                           "checkers": {n: r.get("valid") for n, r in results["results"].items()}}
    if results["valid"] is False:
        out["counterexample"] = {n: r.get("counterexample", r.get("violations"))
                                 for n, r in results["results"].items() if r.get("valid") is False}
    unknown = {n: r.get("error") or r.get("reason") or "undecided"
               for n, r in results["results"].items() if r.get("valid") not in (True, False)}
    if unknown:
        out["unknown"] = unknown
    if results.get("reason"):
        out["reason"] = results["reason"]
    return out


def _human(summary: dict, results: dict) -> str:
    """A short human summary of one file's result."""
    lines = [f"{summary['file']}: valid={_valid_text(summary['valid'])} ({summary['ops']:,} ops, "
             f"checked in {summary['elapsed_s']:.3f} s)"]
    if summary.get("reason"):
        lines.append(f"  ({summary['reason']})")
    return "\n".join(lines + checker_lines(results))


def checker_lines(results: dict, *, violations: int = 3, only_not_valid: bool = False) -> list[str]:
    """One line per checker (`  name: verdict (why)`), with its first `violations` violations below it.

    `fencelab check` prints every checker; `fencelab test` / `analyze` only those not valid (only_not_valid).
    """
    lines = []
    for name, r in results["results"].items():
        if only_not_valid and r.get("valid") is True:
            continue
        line = f"  {name}: {_valid_text(r.get('valid'))}"
        if r.get("valid") is False:
            if "counterexample" in r:
                ce = r["counterexample"]
                line += f" (key {ce.get('key')!r}, window ops {ce.get('window')})"
            else:
                line += f" ({r.get('violation_count', 0)} violations)"
                for v in (r.get("violations") or [])[:violations]:
                    line += f"\n    - {v.get('type')}: {v.get('msg')} (ops {v.get('ops')})"
        elif r.get("valid") is not True:
            line += f" ({r.get('error') or r.get('reason') or 'undecided'})"
        lines.append(line)
    return lines


def _valid_text(v: Any) -> str:
    """true / false / unknown, as in the JSON output."""
    return json.dumps(v)


def _out_dir(out: Path, path: Path, used: set[str]) -> Path:
    """A directory under --out for one history, unique even when files share a name."""
    name, n = path.stem, 1
    while name in used:
        n += 1
        name = f"{path.stem}-{n}"
    used.add(name)
    return out / name


def _write_outputs(directory: Path, file: str, history: list[dict], results: dict) -> list[Path]:
    """results.json and timeline.html for one history."""
    directory.mkdir(parents=True, exist_ok=True)
    res_path = directory / "results.json"
    res_path.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    html = render_html(results, history, directory / "timeline.html", title="fencelab check", source=file)
    return [res_path, html]


@click.command("check", cls=_Check)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--model", metavar="NAME", help="Model for the linearizable checker (see checkers.models).")
@click.option("--checker", "checker_names", multiple=True, metavar="NAME",
              help=f"Checker to run (repeatable): {', '.join(CHECKERS)}. "
                   "Default: linearizable with --model, else every domain checker whose operations "
                   "the history has.")
@click.option("--time-limit", type=float, metavar="S", help="Seconds the linearizability search may take.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line per file.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Write results.json and timeline.html per file under DIR (with --shrink: the shrunk history).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "edn"]),
              help="History format (default: from the extension or the content).")
@click.option("--shrink", is_flag=True,
              help="One convicted FILE: find the smallest sub-history (whole operations) the same checker "
                   "still convicts of the same violation; write <stem>.shrunk.jsonl and .shrunk.edn beside it "
                   "(or in --out DIR). docs/shrinking.md")
@click.option("--max-checks", type=int, metavar="N",
              help=f"--shrink: at most N checker calls (default {DEFAULT_MAX_CHECKS}); Ctrl-C keeps the best so far.")
@click.option("--force", is_flag=True, help="--shrink: replace existing .shrunk.jsonl / .shrunk.edn files.")
@click.option("--any-ops", is_flag=True,
              help="--shrink: keep any violation of the kind, not only one naming an op the original violation "
                   "named (smaller, but it may blame an op that was innocent in context).")
def check(files: tuple[Path, ...], model: str | None, checker_names: tuple[str, ...], time_limit: float | None,
          as_json: bool, out: Path | None, fmt: str | None, shrink: bool, max_checks: int | None,
          force: bool, any_ops: bool) -> None:
    """Check stored histories: exit 0 all valid, 1 any invalid, 2 bad input, 3 any unknown (docs/cli.md)."""
    try:
        shrink_options_problem(files, shrink, max_checks, force or any_ops)  # the flags only --shrink takes
        checkers = build_checkers(checker_names, model, time_limit)
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise BadInput(f"{missing[0]}: no such history file")
        targets = shrink_targets(files[0], out, force) if shrink else []
    except BadInput as e:
        _fail(str(e))
    loaded = []  # every file read and fitted to the model before any is judged: bad input means nothing judged
    for path in files:
        try:
            history, problems = load(path, fmt)
            if model and "linearizable" in checkers:
                model_fits(path, model, history)
        except BadInput as e:
            _fail(str(e))
        loaded.append((path, history, problems))
    composed = compose(checkers)
    auto = not checker_names and not model  # every domain checker whose operations the history has
    if shrink:
        path, history, problems = loaded[0]
        for problem in problems:
            click.echo(f"fencelab check: warning: {problem}", err=True)
        sys.exit(_shrink(path, history, composed, checkers, auto, targets,
                         max_checks or DEFAULT_MAX_CHECKS, as_json, force, any_ops))
    valids, used = [], set()
    for path, history, problems in loaded:
        for problem in problems:
            click.echo(f"fencelab check: warning: {problem}", err=True)
        t0 = time.perf_counter()
        results = _run(composed, checkers, auto, {"name": path.stem, "history_file": str(path)}, history)
        elapsed = time.perf_counter() - t0
        summary = summarize(str(path), model, history, results, elapsed)
        valids.append(results["valid"])
        try:
            written = _write_outputs(_out_dir(out, path, used), str(path), history, results) if out else []
        except OSError as e:
            _fail(f"--out {out}: cannot write results ({e.strerror or e})")
        if as_json:
            click.echo(json.dumps(summary, default=str, separators=(",", ":")))
        else:
            click.echo(_human(summary, results))
            for p in written:
                click.echo(f"  wrote {p}")
    sys.exit(exit_code(valids))


def shrink_options_problem(files: tuple[Path, ...], shrink: bool, max_checks: int | None, flags: bool) -> None:
    """BadInput when --shrink and its options do not fit together (one file; --max-checks and the flags that
    only --shrink takes, --force and --any-ops, with it)."""
    if not shrink:
        if max_checks is not None or flags:
            raise BadInput("--max-checks, --force and --any-ops go with --shrink")
        return
    if len(files) != 1:
        raise BadInput(f"--shrink takes one history file at a time, got {len(files)}")
    if max_checks is not None and max_checks < 1:
        raise BadInput(f"--max-checks must be >= 1, got {max_checks}")


def shrink_targets(path: Path, out: Path | None, force: bool) -> list[Path]:
    """Where --shrink writes: <stem>.shrunk.jsonl and .shrunk.edn beside `path` or in `out`; never over the
    input, and never over an existing file unless `force` (checked before the search, not after it)."""
    directory = path.parent if out is None else out
    targets = [directory / f"{path.stem}.shrunk.{ext}" for ext in ("jsonl", "edn")]
    for t in targets:
        if t.resolve() == path.resolve():
            raise BadInput(f"{t}: the shrunk history would overwrite its input; give --out DIR")
        if t.exists() and not force:
            raise BadInput(f"{t} already exists (pass --force to replace it)")
    return targets


def _shrink(path: Path, history: list[dict], composed: Checker, checkers: dict[str, Checker], auto: bool,
            targets: list[Path], max_checks: int, as_json: bool, force: bool, any_ops: bool) -> int:
    """`check --shrink` of one loaded history: judge it, shrink it for its first conviction's kind with that
    checker alone, re-judge the result with every checker, write it as JSONL and EDN; the exit code is the
    original's verdict (1: convicted), or check's own code when there was nothing to shrink."""
    test = {"name": path.stem, "history_file": str(path)}
    before = _run(composed, checkers, auto, test, history)
    target = target_of(before, any_ops=any_ops)
    if target is None:
        if as_json:
            click.echo(json.dumps({"file": str(path), "valid": before["valid"], "shrunk": None}))
        else:
            click.echo(f"{path}: not convicted (valid={_valid_text(before['valid'])}): nothing to shrink, "
                       "nothing written")
        return exit_code([before["valid"]])
    kind = target.kind
    units = len(history_units(history))
    if not as_json:
        click.echo(f"{path}: valid=false; shrinking for {target} (the first violation of the first failing "
                   f"checker), running only {kind.checker}, at most {max_checks} checks (Ctrl-C keeps the best "
                   "so far)")
    try:
        shrunk = shrink_history(history, target, checkers[kind.checker], max_checks=max_checks, test=test)
    except ValueError:  # the checker alone does not convict what it convicted composed: nothing to start from
        _fail(f"{path}: {kind.checker} alone does not convict it of {target}: nothing to shrink")
    search = shrunk.search
    after = _run(composed, checkers, auto, test, shrunk.history)
    try:
        if not targets[0].parent.is_dir():
            targets[0].parent.mkdir(parents=True)
        write_jsonl(shrunk.history, targets[0], overwrite=force)
        write_edn(shrunk.history, targets[1], overwrite=force)
    except (OSError, HistoryError) as e:
        _fail(f"cannot write the shrunk history: {getattr(e, 'strerror', None) or e}")
    msg = violation_message(after, target, shrunk.positions)
    stopped = {"done": "1-minimal: without any one more whole operation it is not convicted of this",
               "budget": f"cut short: --max-checks {max_checks} reached, not minimal",
               "interrupted": "cut short: interrupted (Ctrl-C), not minimal; the best so far"}[search.stopped]
    if as_json:
        click.echo(json.dumps({
            "file": str(path), "valid": before["valid"], "checker": kind.checker, "kind": kind.type, "msg": msg,
            "anchor": sorted(target.anchor or ()), "ops_before": len(history), "ops_after": len(shrunk.history),
            "operations_before": units, "operations_after": shrunk.units_after, "original_ops": shrunk.positions,
            "checks": search.tests, "search_s": round(search.elapsed_s, 6), "stopped": search.stopped,
            "minimal": search.minimal, "shrunk_valid": after["valid"],
            "shrunk_checkers": {n: r.get("valid") for n, r in after["results"].items()},
            "written": [str(t) for t in targets]}, default=str, separators=(",", ":")))
    else:
        click.echo(f"  shrunk {len(history):,} ops ({_operations(units)}) to {len(shrunk.history):,} ops "
                   f"({_operations(shrunk.units_after)}) in {search.tests:,} checks, {search.elapsed_s:.2f} s; "
                   f"{stopped}")
        click.echo(f"  still convicted: {kind}: {msg}")
        click.echo(f"  its ops 0..{len(shrunk.history) - 1} are the original's {_span(shrunk.positions)}")
        click.echo(f"  every checker on the shrunk history: valid={_valid_text(after['valid'])}")
        for line in checker_lines(after, violations=1):
            click.echo(textwrap.indent(line, "  "))
        for t in targets:
            click.echo(f"  wrote {t}")
    return exit_code([before["valid"]])


def _span(positions: list[int], most: int = 20) -> str:
    """The original positions of a shrunk history's ops, at most `most` of them named."""
    shown = ", ".join(map(str, positions[:most]))
    return f"[{shown}{', ...' if len(positions) > most else ''}]"


def _operations(n: int) -> str:
    """`1 operation`, `12 operations` (whole operations: an invocation with its completion, a fault)."""
    return f"{n:,} operation" + ("" if n == 1 else "s")


def _run(composed: Checker, checkers: dict[str, Checker], auto: bool, test: dict, history: list[dict]) -> dict:
    """The composed result for one history; by default only the checkers its operations give something to
    judge, and "unknown" with the reason when none does (a verdict about nothing is never a pass)."""
    if not auto:
        return composed.check(test, history, {})
    names, why = applicable_checkers(history)
    if not names:
        return {"valid": "unknown", "reason": why, "results": {}, "elapsed_s": {}}
    return compose({n: checkers[n] for n in names}).check(test, history, {})


def _fail(msg: str) -> None:
    """Report bad input in one line and exit 2."""
    click.echo(f"fencelab: error: {msg}", err=True)  # the lab's one bad-input line (lab.cli.fail)
    sys.exit(EXIT_BAD_INPUT)
