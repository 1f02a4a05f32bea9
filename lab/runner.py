"""`fencelab test`: one run, end to end, landing in `store/<test-name>/<timestamp>/`.

Data flows one way: the workload's generator drives its clients through the
interpreter; every op goes to `history.jsonl` as it happens; after the run the
stack is stopped, the history exported as `history.edn`, and the checkers
judge the history into `results.json`. `analyze(run_dir)` re-runs the checkers
on a stored run (also one whose lab process was killed mid-run).

A run directory holds:
    test.json        every option, the seed, versions, the replay command
    history.jsonl    the op record (docs/history-format.md); history.edn (Jepsen's format)
    fault-schedule.json  the fault windows the nemesis executed (`--fault-schedule` replays them)
    results.json     the checkers' verdicts
    stack/           the run's own stack: logs/ (one per process), audit/, data
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import lab.generator as gen
from checkers.core import safe_check
from checkers.faults import asked_faults, with_fault_coverage
from lab import __version__
from lab.history import HistoryError, HistoryWriter, read_history_report, write_edn
from lab.history.ops import is_client_process
from lab.paths import temp_beside
from lab.scenarios import SCENARIOS, ScenarioError, scenario_workload, validate_scenario
from lab.secrets import redact_secrets, redact_tree, redact_url
from lab.server.mutants import MUTANT_NAMES
from lab.sut import PluginError, SutError, get_sut, validate_test
from lab.sut.probe import ProbeError, probe_external as probe, store_db
from lab.sut.registry import claimed_checker
from lab.sut.target import BACKENDS, Kind, Target, TargetError, load_hosts as _load_hosts, target_of
from lab.test_options import TEST_OPTIONS
from lab.testmap import (AFTER_INFO, COMMIT_MODES, FIRST_CLASS, RUN_SALT, STALLS, Test, field_problem, new_run_salt,
                         servers_problem, sut_opt_arg, sut_options_of)
from nemesis import fault_schedule
from nemesis.registry import build, start_fs
from nemesis.schedule import Window, lane_timing, timing_problem
from workloads import get_workload, needs_of


class RunError(RuntimeError):
    """A test cannot be run as asked (bad options, missing store, ...)."""


def validate(test: Test) -> Target:
    """Check every option before anything starts; raise RunError naming the bad one. Returns the test's Target.
    It writes nothing into the test: `resolve` makes the normalised spec a run goes on.

    The one check of a Test: `fencelab test`, campaigns, evidence, mutants, the fault-exposure spec and the
    pytest plugin's `lab_run` all call it (and `run_test` again), so each refuses the same tests the same way.
    What the system is and where it runs is decided once, by `lab.sut.target.target_of`; every question about
    it (may it take this fault, this planted bug, this backend) is asked of that Target.
    """
    _validate_fields(test)
    try:
        get_workload(test.workload)
    except ValueError as e:
        raise RunError(str(e)) from None
    checks = [
        (test.time_limit > 0, f"--time-limit must be > 0 seconds, not {test.time_limit}"),
        (test.rate > 0, f"--rate must be > 0 ops/s, not {test.rate}"),
        (1 <= test.concurrency <= 1000, f"--concurrency must be between 1 and 1000, not {test.concurrency}"),
        (1 <= test.keys <= 10_000, f"--keys must be between 1 and 10000, not {test.keys}"),
        (50 <= test.ttl_ms <= 3_600_000, f"--ttl-ms must be between 50 and 3600000, not {test.ttl_ms}"),
        (test.servers is None or not servers_problem(test.servers), servers_problem(test.servers)),
        (test.deadline_s is None or test.deadline_s > 0, f"deadline_s must be > 0 seconds, not {test.deadline_s}"),
        (test.commit_mode in (None, *COMMIT_MODES),
         f"--commit-mode must be one of {', '.join(COMMIT_MODES)}, not {test.commit_mode!r}"),
        (test.after_info in (None, *AFTER_INFO),
         f"--after-info must be one of {', '.join(AFTER_INFO)}, not {test.after_info!r}"),
        (test.stalls in (None, *STALLS), f"--stalls must be one of {', '.join(STALLS)}, not {test.stalls!r}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise RunError(msg)
    check_name(test.name)
    if test.run_salt and not RUN_SALT.fullmatch(str(test.run_salt)):
        raise RunError(f"--run-salt must be 1 to 32 letters or digits (or 'new'), not {test.run_salt!r}")
    needs = needs_of(test.workload)
    try:
        target = target_of(test)
        validate_test(test, needs)  # what the workload declares it needs, passed down
        target.check(test)
    except SutError as e:
        raise RunError(str(e)) from None
    if test.scenario:  # a named race scenario (lab.scenarios): known, and applicable here
        try:
            validate_scenario(test)
        except ScenarioError as e:
            raise RunError(str(e)) from None
    if needs.lab_only and not target.reads_backend:
        raise RunError(f"workload {test.workload!r} tests the lab's own Valkey (it needs the stack the lab starts), "
                       f"not {target.describe()}: use a lease-API workload (lease, idempotency, fenced-append)")
    if target.external:
        _validate_external(test, target)
    if test.mutant and test.mutant not in MUTANT_NAMES:
        raise RunError(f"--mutant: unknown mutant {test.mutant!r}; known: {', '.join(MUTANT_NAMES)}")
    nemeses = nemeses_of(test)
    if nemeses:
        try:
            target.check_faults(nemeses)
        except (ValueError, SutError) as e:
            raise RunError(str(e)) from None
        if not test.nemesis_interval > 0:
            raise RunError(f"--nemesis-interval must be > 0 seconds, not {test.nemesis_interval}")
        drawn = not (test.scenario or test.fault_schedule)  # a replayed schedule draws no interval
        problem = timing_problem(len(nemeses), interval_s=test.nemesis_interval,
                                 time_limit=test.time_limit) if drawn else None
        if problem:
            raise RunError(problem)
    return target


def nemeses_of(test: Test) -> list[str]:
    """The nemesis names a test runs: its `nemesis`, or those of its `--fault-schedule` (the file is read and
    checked, its windows against the time limit); RunError, one line, for a schedule that cannot be replayed."""
    if test.fault_schedule is None:
        return list(test.nemesis)
    return replayed_schedule(test)[0]


def replayed_schedule(test: Test) -> tuple[list[str], list[Window]]:
    """(nemesis names, windows) of the test's `--fault-schedule`, checked (nemesis.fault_schedule.load); a
    `--nemesis` naming other nemeses, or a scenario (its faults are its script), is a RunError."""
    if test.scenario:
        raise RunError("--fault-schedule replays the faults a --nemesis run executed; a --scenario scripts its own: "
                       "give one or the other")
    try:
        names, windows = fault_schedule.load(test.fault_schedule, time_limit=test.time_limit)
    except fault_schedule.ScheduleError as e:
        raise RunError(str(e)) from None
    if test.nemesis and set(test.nemesis) != set(names):
        raise RunError(f"--nemesis {','.join(test.nemesis)} is not what --fault-schedule {test.fault_schedule} "
                       f"replays ({','.join(names) or 'no nemesis'}): the schedule names its nemeses, leave "
                       "--nemesis out")
    return names, windows


def resolve(test: Test) -> tuple[Test, Target]:
    """The validated spec a run goes on, as a new, sealed Test (its fault names normalised), and its Target.

    `test` itself is left as it was: a spec is never written into after validation (`Test.sealed`); what a run
    adds to it (a salt, a probe, its scenario's workload) makes another new spec.
    """
    target = validate(test)
    nemeses = nemeses_of(test)
    return test.evolve(nemesis=target.check_faults(nemeses) if nemeses else []).sealed(), target


def _validate_fields(test: Test) -> None:
    """Each field holds its declared type (testmap's schema), and no first-class option hides in `extra`."""
    problem = field_problem(test)
    if problem:
        raise RunError(problem)
    hidden = sorted(set(test.extra) & set(FIRST_CLASS))
    if hidden:
        raise RunError(f"extra[{hidden[0]!r}]: {hidden[0]} is a Test field; set test.{hidden[0]} instead")


def _validate_external(test: Test, target: Target) -> None:
    """What an external run needs and may do (docs/external-systems.md); RunError naming what to change."""
    if target.proxied:
        tls = [u for u in target.urls if not u.startswith("http://")]
        if tls:
            raise RunError(f"--proxy-urls: {redact_url(tls[0])} is not plain http://; the proxy listens on loopback, "
                           "so a TLS certificate naming the server's host would not match")
    if test.lab_owns_store and not test.store_url:
        raise RunError("--lab-owns-store says the --store-url store is a scratch store the lab may set up: give "
                       "--store-url")
    if needs_store(test) and not test.live.store_url and not test.scenario:
        raise RunError(f"workload {test.workload!r} against an external system needs --store-url: the store the "
                       f"server writes into (database {store_db(test)!r}, --store-db), which the final reads check")


def needs_store(test: Test) -> bool:
    """Does the test's workload (or scenario) commit into, and read back from, a document store?"""
    if test.scenario:
        sc = SCENARIOS.get(test.scenario)
        return bool(sc and sc.needs_store)
    return needs_of(test.workload).store


def probe_external(test: Test) -> Test:
    """Health, auth and store probes of an external system before its run (RunError: bad input, exit 2); the
    spec with what they found (`extra["probe"]`), a new one."""
    try:
        found = probe(test, needs_store=needs_store(test))
    except ProbeError as e:
        raise RunError(str(e)) from None
    return test.evolve(extra={**test.extra, "probe": found}).sealed()


def check_name(name: str) -> None:
    """A test name is a relative path inside the store (`a` or `a/b`): never absolute, empty, `.`/`..` or `latest`."""
    parts = str(name).split("/")
    if (not isinstance(name, str) or not name.strip() or name.startswith("/") or "\\" in name
            or any(p in ("", ".", "..", "latest") or not p.isprintable() for p in parts)):
        raise RunError(f"--name must be a plain name inside the store (letters, digits, '-', '_', '.', "
                       f"optionally a/b), not {name!r}")


def new_run_dir(store_dir: Path, name: str) -> Path:
    """A fresh `store/<name>/<timestamp>/`; `link_latest` points the `latest` links at it once it is judged."""
    check_name(name)
    store_dir = Path(store_dir)
    if store_dir.exists() and not store_dir.is_dir():
        raise RunError(f"--store-dir {store_dir} exists and is not a directory")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    run_dir = store_dir / name / stamp
    try:
        run_dir.mkdir(parents=True, exist_ok=False)
    except OSError as e:
        raise RunError(f"cannot create the run directory {run_dir}: {e.strerror or e}") from None
    return run_dir


def link_latest(run_dir: Path, store_dir: Path, name: str) -> None:
    """Point `store/<name>/latest` and `store/latest` at a run that completed and was judged (never an aborted one)."""
    store_dir, stamp = Path(store_dir), Path(run_dir).name
    for link, target in ((store_dir / name / "latest", Path(stamp)), (store_dir / "latest", Path(name) / stamp)):
        tmp = temp_beside(link)  # runs at once in one store each replace `store/latest`
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(target)
        os.replace(tmp, link)


# Test fields given on `fencelab test`'s command line under their own names
RUN_FAILED = "run_failed"  # test.extra: why the system's own code cut the run short (results: valid unknown)
INTERRUPTED_FILE = "interrupted.json"  # in a run dir: Ctrl-C or SIGTERM stopped it (results: "interrupted")


def mark_interrupted(run_dir: Path) -> None:
    """Record in the run dir that the run was stopped before its time limit, so every later judgement of it
    (`fencelab analyze`, its results.json) says it judged a partial run."""
    mark = {"by": "Ctrl-C or SIGTERM", "at": dt.datetime.now(dt.timezone.utc).isoformat()}
    (Path(run_dir) / INTERRUPTED_FILE).write_text(json.dumps(mark) + "\n")
_REPLAY_FIELDS = ("workload", "time_limit", "concurrency", "rate", "keys", "ttl_ms", "seed", "nemesis",
                  "nemesis_interval", "name", "run_salt", "backend")


def replay_command(test: Test) -> str:
    """The command line that replays this test: every `fencelab test` option it was given, same seed.

    Built from the command's own options, so an option added to `fencelab test` and kept in the Test field
    of its name is replayed too (tests/test_cli_safety.py parses the command back into the same Test).
    The run salt is pinned when the lab ran the system (a fresh stack remembers nothing, so the replay sends
    the very same request ids) and left out for an external system, whose idempotency records would answer
    the replay with the first run's replies: add `--run-salt` from test.json to reuse it anyway. URLs keep
    no user info (give the password back, or set FENCELAB_STORE_URL).
    """
    args = ["fencelab", "test"]
    for p in TEST_OPTIONS:
        if p.name in ("test_count", "store_dir"):
            continue
        if p.name in _REPLAY_FIELDS:
            value = getattr(test, p.name)
            if p.name == "nemesis":
                value = ",".join(value)
            elif p.name == "run_salt" and not _lab_ran(test):
                value = None
        elif p.name == "sut":
            value = test.extra.get("sut_import") or test.sut_name()
        elif p.name == "sut_opts":
            value = [sut_opt_arg(k, v) for k, v in sut_options_of(test).items()]
        elif p.name == "servers" and test.urls:  # the lab's own stack only: --url names the servers
            value = None
        else:
            value = getattr(test, p.name)  # every other option of `fencelab test` is a Test field of its name
        flag = next((o for o in p.opts if o.startswith("--")), p.opts[0])
        if value is None or value == "" or value == [] or (p.name == "sut" and value == "reference"):
            continue
        if p.is_flag:
            if value:
                args.append(flag)
            elif p.secondary_opts:
                args.append(p.secondary_opts[0])
            continue
        for v in (value if p.multiple else [value]):
            args += [flag, str(v)]
    store_dir = _store_dir_of(test)
    if store_dir is not None:
        args += ["--store-dir", str(store_dir)]
    return redact_secrets(shlex.join(args))


def _lab_ran(test: Test) -> bool:
    """Did the lab run the test's system (so a replay may send the very same request ids)? A system no longer
    registered here (a plug-in gone with its process) is taken as external: the replay then draws a fresh salt."""
    try:
        return target_of(test).lab_runs
    except SutError:
        return False


def _store_dir_of(test: Test) -> Path | None:
    """The store a run landed in: run_dir is STORE/<name>/<timestamp> (a name may have several parts)."""
    if not test.run_dir:
        return None
    depth, run_dir = len(str(test.name).split("/")), Path(test.run_dir)
    parents = run_dir.resolve().parents
    # a run directory moved out of its store (copied elsewhere, renamed) has no store to name
    if depth >= len(parents) or run_dir.resolve().parts[-1 - depth:-1] != tuple(str(test.name).split("/")):
        return None
    return parents[depth]


def write_test_json(test: Test) -> None:
    """test.json: every option, versions and the replay command (no secrets: credentials are a path)."""
    d = test.to_json()
    d["versions"] = {"fencelab": __version__, "python": platform.python_version(), "platform": platform.platform()}
    d["replay"] = replay_command(test)
    d["argv"] = list(sys.argv)
    # a --url or --store-url (also as --store-url=URL) may carry user info: none of it is written down
    (test.run_dir / "test.json").write_text(json.dumps(redact_tree(d), indent=2, default=str))


async def _run(test: Test, wl, writer, target: Target, schedule: list[Window] | None = None) -> None:
    """The main phase (clients, and the nemesis lane beside them), then the final phase, through the interpreter.

    The nemesis lane runs for the time limit (or replays `schedule`, a recorded one) and then stops every fault
    it started, so the final phase (e.g. reading every document) sees a healed system.
    """
    nemesis, main = None, gen.time_limit(test.time_limit, gen.clients(wl.generator))
    if getattr(wl, "build_nemesis", None) is not None:  # a scenario's own faults and script (lab.scenarios)
        nemesis, script = wl.build_nemesis(test)
        main = gen.any_of(main, script)
    elif test.nemesis:
        nemesis, lane = build(test, test.nemesis, interval_s=test.nemesis_interval, seed=test.seed,
                              builders=target.fault_builders(), schedule=schedule)
        main = gen.any_of(main, lane)
    phases = [main]
    if wl.final_generator is not None:
        phases.append(gen.clients(wl.final_generator))
    progress = asyncio.create_task(_show_progress(test, writer))
    try:
        await gen.run(test, gen.phases(*phases), wl.client, nemesis=nemesis, history_writer=writer,
                      concurrency=test.concurrency, seed=test.seed)
    finally:
        progress.cancel()
        await asyncio.gather(progress, return_exceptions=True)


def _fancy_output() -> bool:
    """A rich progress bar on a terminal; plain lines in CI or when piped."""
    return sys.stdout.isatty() and not os.environ.get("CI")


async def _show_progress(test: Test, writer, plain_every_s: float = 10.0) -> None:
    """Show how far the run is: elapsed / time limit and ops recorded (the history is the source)."""
    start = time.monotonic()
    if not _fancy_output():
        while True:
            await asyncio.sleep(plain_every_s)
            print(f"  [{test.name}] {time.monotonic() - start:5.0f}s / {test.time_limit:.0f}s  "
                  f"{writer.count} history entries", flush=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[ops]} ops"), transient=True) as bar:
        task = bar.add_task(f"{test.name} ({test.workload})", total=test.time_limit, ops=0)
        while True:
            bar.update(task, completed=min(test.time_limit, time.monotonic() - start), ops=writer.count)
            await asyncio.sleep(0.25)


def run_test(test: Test, store_dir: Path, *, progress=None) -> dict[str, Any]:
    """Run one test: stack up, workload, stack down, checkers. Returns results (also in results.json).

    One path for every kind of system: the Target makes the run's stack (the reference stack on its backend,
    a system's own processes, or, for a system at a URL, nothing or the lab's Toxiproxy in front of it), whose
    status says where the clients go.
    """
    return run_unjudged(test, store_dir)()


def run_unjudged(test: Test, store_dir: Path, *, before_workload: Callable[[], Any] | None = None,
                 phases: dict[str, float] | None = None, report: bool = True) -> Callable[[], dict[str, Any]]:
    """`run_test` up to the end of the workload; returns `judge()`, which stops the stack, runs the checkers
    (results.json, and the report unless `report=False`) and points the `latest` links at the run, returning the
    results.

    A campaign calls `judge` in a thread while the next cell's stack starts (lab.campaign.execute): the next
    workload starts only once it returned, so no run shares the machine with another's judging.
    `before_workload` is called once the stack is up, just before the workload starts (the campaign settles the
    previous cell there); `phases` gets the wall seconds of `up`, `workload`, `down` and `judge`.
    A workload that raises stops the stack before the error goes on, as `run_test` does.
    """
    phases = {} if phases is None else phases
    t0 = time.monotonic()
    spec, target = resolve(test)
    schedule = replayed_schedule(spec)[1] if spec.fault_schedule else None  # read once, before anything starts
    if target.kind is Kind.URL:  # a wrong URL, key or store: refused before the run
        spec = probe_external(spec)
    spec = prepare_run(spec)
    wl = get_workload(spec.workload)(spec)
    if spec.scenario:  # the scenario replaces the workload: its client, script, faults and checker (a new spec)
        spec, wl = scenario_workload(spec, wl)
    # the caller's one view of the run: where it lands (read also when the run is interrupted); a run-only field
    test.run_dir = spec.run_dir = new_run_dir(store_dir, spec.name)
    test = spec
    write_test_json(test)
    stack = target.make_stack(test, test.run_dir / "stack")
    writer = None
    try:
        status = stack.up(target.stack_options(test, store=wl.needs_store))
        test.live.take_status(stack, status)  # what exists only while running: the run context, not the spec
        test.live.nodes = wl.nodes(test) or ["in-process"]  # no node to dial: the system runs inside its client
        write_test_json(test)
        phases["up"] = time.monotonic() - t0
        if before_workload is not None:
            before_workload()
        t1 = time.monotonic()
        writer = HistoryWriter(test.run_dir / "history.jsonl")  # time 0 of the history: the workload starts now
        try:
            asyncio.run(_run(test, wl, writer, target, schedule))
        except PluginError as e:  # the system's own code raised at its first open: bad input, nothing ran
            if not writer.count:
                raise RunError(str(e)) from None
            test.live.plugin_errors.append(str(e))
        failures = test.live.plugin_errors
        if failures:  # a worker's open raised during the run: the run is marked failed (`analyze` reads test.json)
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            test = test.evolve(extra={**test.extra, RUN_FAILED: f"{failures[0]}{more}"}).sealed()
            write_test_json(test)
        phases["workload"] = time.monotonic() - t1
    except BaseException:
        if writer is not None:
            writer.close()
        stack.down()
        raise
    writer.close()

    def judge() -> dict[str, Any]:
        t2 = time.monotonic()
        stack.down()
        t3 = time.monotonic()
        results = analyze(test.run_dir, checker=wl.checker, test=test, report=report)
        link_latest(test.run_dir, store_dir, test.name)
        phases.update(down=t3 - t2, judge=time.monotonic() - t3)
        return results

    return judge


def load_hosts(path: Any) -> dict[str, Any]:
    """`--hosts FILE`: the SSH nodes and how to reach them (lab.sut.target.load_hosts); RunError naming the key."""
    try:
        return _load_hosts(path)
    except TargetError as e:
        raise RunError(str(e)) from None


def prepare_run(test: Test) -> Test:
    """What a validated test gets before its run dir, as a new spec: its run salt (fresh unless given), its SUT's
    import path and its fault lane's schedule."""
    extra = dict(test.extra)
    sut_import = _sut_import(test)
    if sut_import:
        extra["sut_import"] = sut_import
    if test.nemesis and not test.scenario and not test.fault_schedule:  # the lane's interval as it runs (scaled)
        extra["nemesis_schedule"] = lane_timing(len(test.nemesis), interval_s=test.nemesis_interval,
                                                time_limit=test.time_limit)
    salt = new_run_salt() if not test.run_salt or test.run_salt == "new" else test.run_salt
    return test.evolve(run_salt=salt, extra=extra).sealed()


def _sut_import(test: Test) -> str | None:
    """A SUT registered in-process (a conftest, a plugin) is replayed by its import path, `module:Factory`."""
    name = test.sut_name()
    if name == "reference" or ":" in name:
        return None

    if get_sut(name).trusted or any(ep.name == name for ep in metadata.entry_points(group="fencelab.suts")):
        return None  # a built-in (starintel, valkey-lock, ...) or an installed system: its name replays it
    factory = get_sut(name).factory
    module, qual = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if module and qual and "<" not in qual and module != "__main__":
        return f"{module}:{qual}"
    return None


def analyze(run_dir: Path, *, checker=None, test: Test | None = None, report: bool = True) -> dict[str, Any]:
    """Re-run the workload's checkers on a stored run; writes history.edn, fault-schedule.json and results.json,
    then report.html (`report=False`: the caller writes it, as a campaign does off its cells' critical path)."""
    run_dir = Path(run_dir)
    hist_path = run_dir / "history.jsonl"
    if not hist_path.exists():
        raise RunError(f"{run_dir} has no history.jsonl: is it a fencelab run directory?")
    if test is None:
        test = load_test(run_dir)

    try:
        history, problems = read_history_report(hist_path)
    except HistoryError as e:
        raise RunError(str(e)) from None
    if checker is None:  # the recorded test's own checkers: a test.json naming what this lab lacks is bad input

        try:
            if test.scenario:
                checker = scenario_workload(test)[1].checker
            else:
                checker = get_workload(test.workload)(test).checker
        except (ValueError, TypeError, KeyError, ScenarioError) as e:
            raise RunError(f"{run_dir / 'test.json'}: cannot rebuild the test's checkers: {e}") from None
    write_edn(history, run_dir / "history.edn", overwrite=True)
    if not test.scenario:  # what the nemesis executed, to replay (a scenario's faults are its script)
        fault_schedule.write_for_run(run_dir, history, asked_faults(test.to_json()))

    # every asked fault fired, or the verdict says which did not (a scenario's own faults: its row's checker)
    results = safe_check(with_fault_coverage(claimed_checker(test, checker), start_fs()), test.to_json(), history, {})
    if test.extra.get(RUN_FAILED):  # cut short by the system's own code: what was judged stands, no verdict
        results["run_failed"] = test.extra[RUN_FAILED]
        results["valid"] = "unknown"
    mark = run_dir / INTERRUPTED_FILE
    if mark.exists():  # a partial run: its verdict is about what it recorded before it was stopped
        results["interrupted"] = json.loads(mark.read_text())
    results["history_problems"] = problems
    results["ops"] = count_operations(history)  # operations the clients invoked (each is 2 entries when complete)
    results["entries"] = len(history)
    results["replay"] = replay_command(test)
    (run_dir / "results.json").write_text(json.dumps(redact_tree(results), indent=2, default=str))
    if not report:
        return results
    from lab.report import ReportError, write_report  # pandas and the plots (~0.35 s): once, after the run

    try:
        results["report"] = str(write_report(run_dir))
    except ReportError as e:  # the verdict stands without its report; say why there is none
        results["history_problems"].append(f"report: {e}")
        (run_dir / "results.json").write_text(json.dumps(redact_tree(results), indent=2, default=str))
    return results


def count_operations(history: list[dict]) -> int:
    """Client operations: the invocations by client processes (not the nemesis), whatever their outcome."""
    return sum(1 for op in history if op.get("type") == "invoke" and is_client_process(op.get("process")))


def load_test(run_dir: Path) -> Test:
    """The Test recorded in a run's test.json."""
    path = Path(run_dir) / "test.json"
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {path}: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("extra", {}), dict):
        raise RunError(f"{path}: not a fencelab test.json (an object with the test's options)")
    test = Test.from_json(d)  # also an old one: its first-class options were keys of `extra`
    test.run_dir = Path(run_dir)
    return test
