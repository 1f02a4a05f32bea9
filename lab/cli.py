"""The `fencelab` command: one click group; every subcommand validates before starting anything.

Errors a user can fix are one line on stderr and exit code 2 (click's usage
convention), never a traceback.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from checkers.cli import check as _check, checker_lines
from checkers.core import merge_valid
from lab.exitcodes import EXIT_BAD_INPUT, EXIT_INTERRUPTED, sigterm_interrupts, verdict_exit
from lab.paths import MissingTool, libfaketime
from lab.secrets import redact_secrets, redact_url
from lab.stack.base import StackStatus
from lab.stack.local import LocalStack, StackError, StackOptions
from lab.stack.process import ProcessError
from lab.test_options import SWARM_HELP, test_options
from lab.testmap import Test, parse_sut_opt, set_sut_options

# Each subcommand imports what it runs inside its own function, so `fencelab --help` and the quick subcommands
# stay fast (about 0.25 s): the runner with every layer below it adds about 0.26 s (`python -X importtime`),
# and paramiko (--backend ssh), redis with the Docker helpers (compose), pandas (reports) load only for the
# commands that use them. Everything cheap, or already loaded by the imports above, is imported here.

name_option = click.option("--name", default="default", show_default=True, help="Name of the local stack.")
home_option = click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
                           envvar="FENCELAB_HOME", help="State directory for named stacks [default: ~/.fencelab].")


def fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
    """Print one clear line and exit (no traceback); a URL's user info in it is hidden."""
    click.echo(f"fencelab: error: {redact_secrets(str(msg))}", err=True)
    sys.exit(code)


def suggest(name: str, known: list[str]) -> list[str]:
    """The known names a mistyped one most likely meant: those it begins (`--tim`: `--time-limit`), else the
    closest by difflib (click's own pick, difflib alone, offers `--sut` for `--tim`)."""
    prefixed = sorted(k for k in known if k.startswith(name))
    return prefixed[:3] if prefixed else difflib.get_close_matches(name, known, n=3)


def usage_line(e: click.UsageError) -> str:
    """click's usage error as the lab's one line: what is wrong, the likely meant name, where the help is."""
    ctx = e.ctx
    where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
    if isinstance(e, click.NoSuchOption) and ctx is not None:
        known = [o for p in ctx.command.get_params(ctx) for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
        close = suggest(e.option_name, known)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"no such option {e.option_name}{hint}{where}"
    name = getattr(e, "command_name", None)  # click >= 8.4's NoSuchCommand
    if name is not None and isinstance(ctx and ctx.command, click.Group):
        close = suggest(name, sorted(ctx.command.list_commands(ctx)))
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"no such command {name!r}{hint}{where}"
    return f"{e.format_message().rstrip('.')}{where}"


# click >= 8.2 raises this usage error for a group given no command: it prints the help, which stays as it is
_PRINTS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Main(click.Group):
    """The group: Ctrl-C anywhere exits 130 with one line (click's default is "Aborted!" and exit 1, which reads
    as "invalid" in the exit-code table); commands that keep a partial run say where it is before this. click's
    usage errors (an unknown option or command, a missing or malformed value) are one `fencelab: error:` line
    too, exit 2, not click's usage block."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except _PRINTS_HELP:
            raise  # `fencelab` alone prints the help
        except click.UsageError as e:
            fail(usage_line(e))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _PRINTS_HELP:
            raise
        except click.UsageError as e:
            fail(usage_line(e))
        except KeyboardInterrupt:
            click.echo(f"fencelab {ctx.invoked_subcommand or ''}: interrupted".replace(" :", ":"), err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Main)
@click.version_option(package_name="fencelab")
def main() -> None:
    """fencelab: a Jepsen-style test lab for lease and fencing systems."""


@main.command()
@name_option
@home_option
@click.option("--servers", default=2, show_default=True, type=int, help="Reference lease server instances.")
@click.option("--persistence", default="none", show_default=True, type=click.Choice(["none", "everysec", "always"]),
              help="Valkey persistence: no AOF, AOF fsync every second, AOF fsync always.")
@click.option("--no-store", is_flag=True, help="Do not start the CouchDB-API store (pouchdb-server).")
@click.option("--toxiproxy", is_flag=True, help="Route every link through its own Toxiproxy proxy.")
@click.option("--fake-clocks", is_flag=True, help="Run Valkey and the lease servers under libfaketime.")
@click.option("--netns", is_flag=True, help="Run each server process in its own network namespace (root).")
@click.option("--backend", default="local", show_default=True,
              help="local: processes on loopback; compose: the Docker Compose stack in compose/ (needs Docker); "
                   "ssh: remote nodes over SSH (docs/ssh-backend.md).")
@click.option("--node", "nodes", multiple=True, help="ssh: a node [user@]host[:port] (repeatable, in order n1, n2...).")
@click.option("--ssh-user", default="root", show_default=True, help="ssh: default user.")
@click.option("--ssh-port", default=22, show_default=True, type=int, help="ssh: default port.")
@click.option("--ssh-key", default=None, help="ssh: private key file.")
@click.option("--known-hosts", default=None, help="ssh: known_hosts file (unknown hosts are refused).")
@click.option("--remote-root", default=None, help="ssh: the fencelab checkout on every node [default: this one's path].")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def up(name: str, home: Path | None, servers: int, persistence: str, no_store: bool, toxiproxy: bool,
       fake_clocks: bool, netns: bool, backend: str, nodes: tuple[str, ...], ssh_user: str, ssh_port: int, ssh_key: str | None,
       known_hosts: str | None, remote_root: str | None, as_json: bool) -> None:
    """Start a named stack: Valkey, the store and reference lease servers (loopback only for local)."""
    opts = StackOptions(servers=servers, persistence=persistence, store=not no_store, toxiproxy=toxiproxy,
                        fake_clocks=fake_clocks, netns=netns)
    if backend == "ssh":
        from lab.stack.ssh import SshOptions  # paramiko (~0.08 s): only for --backend ssh

        if toxiproxy:
            fail("--toxiproxy is for the local and compose backends; on SSH nodes partitions use iptables")
        opts = SshOptions(nodes=list(nodes), user=ssh_user, port=ssh_port, key_file=ssh_key, known_hosts=known_hosts,
                          servers=servers, persistence=persistence, store=not no_store, fake_clocks=fake_clocks,
                          **({"remote_root": remote_root} if remote_root else {}))
    elif nodes:
        fail("--node is for --backend ssh")
    try:
        opts.validate()
        if fake_clocks and backend == "local":
            libfaketime()
        stack = _new_stack(backend, name, home)
        status = stack.up(opts)
    except (StackError, ProcessError, MissingTool) as e:
        fail(str(e))
    _print_status(status, as_json)


def _new_stack(backend: str, name: str, home: Path | None):
    """A named stack object of the chosen backend (its row in the Target's one list of backends)."""
    from lab.sut.target import BACKENDS  # the SUT layer (~0.16 s): only for the stack commands

    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    return BACKENDS[backend].named(name, home)


def _existing_stack(name: str, home: Path | None):
    """The stack object matching what `up` recorded for `name` (local or compose)."""
    from lab.stack.compose import stack_backend  # redis and the Docker helpers (~0.08 s): not for --help

    return _new_stack(stack_backend(name, home) or "local", name, home)


@main.command()
@name_option
@home_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(name: str, home: Path | None, as_json: bool) -> None:
    """Show what a stack runs (exit 1 when it is not up)."""
    try:
        stack = _existing_stack(name, home)
        found = stack.load_state()
    except StackError as e:
        fail(str(e))
    st = stack.status()
    if not found:
        if as_json:
            click.echo(json.dumps(st.as_dict()))
        else:
            click.echo(f"stack {name!r} is not up")
        sys.exit(1)
    _print_status(st, as_json)
    if not st.up:
        sys.exit(1)


@main.command()
@name_option
@home_option
def down(name: str, home: Path | None) -> None:
    """Stop every process of a stack (by the pids, or containers, `up` recorded)."""
    try:
        stack = _existing_stack(name, home)
        if stack.load_state() is None:
            click.echo(f"stack {name!r} is not up")
            return
        stopped = stack.down()
    except StackError as e:
        fail(str(e))
    click.echo(f"stack {name!r} stopped: {', '.join(stopped) or 'nothing was running'}")


def _print_status(st: StackStatus, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(st.as_dict(), indent=2))
        return
    click.echo(f"stack {st.name!r}: {'up' if st.up else 'DEGRADED'}  ({st.dir})")
    click.echo(f"  valkey        {st.valkey}")
    if st.store:
        click.echo(f"  store         {st.store}")
    for url in st.lease_servers:
        click.echo(f"  lease server  {url}")
    if st.toxiproxy:
        click.echo(f"  toxiproxy     {st.toxiproxy}  (every link below goes through its own proxy)")
    for link in (st.topology or {}).values():  # what clients and servers really dial
        scheme = "redis://" if link["to"].startswith("valkey") else "http://"
        click.echo(f"  proxy         {link['from'] + ' -> ' + link['to']:<18} {scheme + link['listen']:<30} "
                   f"(to {link['upstream']})")
    click.echo(f"  credentials   {st.credentials}  (API keys; one key file: docs/cli.md#api-keys)")
    for p in st.processes:
        click.echo(f"  {p.name:<12}  pid {p.pid!s:<8} {'alive' if p.alive else 'DEAD'}  log {p.log}")


@main.command("api-key")
@name_option
@home_option
@click.option("--principal", default=None, help="The principal whose key to write [default: the one the lease "
                                                 "workloads act as: targets:lease for tenant-a/program-1/actor-1].")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the key to this file (mode 0600) [default: <stack dir>/api-key.txt].")
def api_key_cmd(name: str, home: Path | None, principal: str | None, out: Path | None) -> None:
    """Write one API key of a stack to a file, for `fencelab test --url ... --api-key-file FILE`; prints its path."""
    from workloads.common import pick_credential  # the workloads and the SUT layer (~0.17 s)

    try:
        stack = _existing_stack(name, home)
        if stack.load_state() is None:
            fail(f"stack {name!r} is not up: start it with `fencelab up --name {name}`")
        path = Path(stack.status().credentials)
        creds = json.loads(path.read_text())
        cred = (next((c for c in creds if c.get("principal_id") == principal), None) if principal
                else pick_credential(creds))
    except (StackError, OSError, ValueError) as e:
        fail(str(e))
    if cred is None:
        fail(f"no principal {principal!r} in {path}; known: {', '.join(c.get('principal_id', '?') for c in creds)}")
    out = out or path.parent / "api-key.txt"
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(cred["api_key"] + "\n")
    except OSError as e:
        fail(f"--out {out}: cannot write it ({e.strerror or e})")
    click.echo(str(out))


@main.command()
@name_option
@home_option
def demo(name: str, home: Path | None) -> None:
    """Bring a stack up, drive the lease API (acquire, renew, release), check it, and shut down."""
    from lab.demo import run_demo  # the workloads and checkers it drives (~0.3 s)

    try:
        run_demo(name=f"{name}-demo" if name == "default" else name, home=home)
    except (StackError, ProcessError, MissingTool) as e:
        fail(str(e))


main.add_command(_check)


# -- tests ------------------------------------------------------------------------------------



class _TestCommand(click.Command):
    """`fencelab test`: its help ends with the nemesis and scenario names (imported only when help is shown)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from lab.scenarios import PROBE_SCENARIOS, RACE_SCENARIOS  # these three: ~0.27 s, only when help is shown
        from nemesis.registry import known_names
        from workloads import WORKLOADS

        for title, names in (("Workloads (--workload, docs/workloads.md)", sorted(WORKLOADS)),
                             ("Nemeses (--nemesis a,b; docs/nemesis.md)", known_names()),
                             ("Race scenarios (--scenario, docs/scenarios.md)", RACE_SCENARIOS),
                             ("Probe scenarios (--scenario)", PROBE_SCENARIOS)):
            with formatter.section(title):  # wrapped here, never inside a hyphenated name; \b: click keeps it
                width = max(40, (formatter.width or 80) - formatter.current_indent)
                lines = textwrap.wrap(", ".join(names), width=width, break_on_hyphens=False)
                formatter.write_text("\b\n" + "\n".join(lines))
        with formatter.section("Exit codes (docs/cli.md#exit-codes)"):
            formatter.write_text("0 valid, 1 invalid, 2 bad input, 3 unknown, 130 interrupted")
        super().format_epilog(ctx, formatter)


@main.command("test", cls=_TestCommand)
@test_options
def test_cmd(workload, time_limit, concurrency, rate, keys, ttl_ms, seed, test_count, nemesis, nemesis_interval,
             servers, name, store_dir, sut, urls, api_key_file, scenario, store_url, mutant, proxy_urls=False,
             store_db=None, lab_owns_store=False, run_salt="new", commit_mode=None, backend="local",
             hosts_file=None, swarm=None, sut_opts=(), after_info=None, stalls=None, fault_schedule=None) -> None:
    """Run a workload against a fresh local stack; record, check, and store the run.

    Exit code (docs/cli.md#exit-codes): 0 valid, 1 invalid, 2 bad input, 3 unknown (any run), 130 interrupted.
    """
    from lab import runner, scenarios, sut as sut_layer  # the runner and the layers below it (~0.26 s)

    if test_count < 1:
        fail(f"--test-count must be >= 1, not {test_count}")
    # every comma separates a name: `partition,,kill` keeps its empty one, which validate() refuses
    nemeses = [n.strip() for n in nemesis.split(",")] if nemesis.strip() else []

    try:
        sut_options = dict(parse_sut_opt(text) for text in sut_opts)
    except ValueError as e:
        fail(str(e))

    ctx = click.get_current_context()
    given = {p for p in ctx.params if ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE}
    if store_url:
        try:
            StackOptions(store_url=store_url).validate()
        except StackError as e:
            fail(str(e))

    # the options as Test fields (the API key file's path only, never the key; the store URL redacted, its real
    # form only in `live`); --servers only when given, so validate() can refuse it beside --url
    options = dict(sut=sut, urls=list(urls), api_key_file=str(api_key_file) if api_key_file is not None else None,
                   servers=servers if "servers" in given else None, proxy_urls=proxy_urls, store_db=store_db,
                   lab_owns_store=lab_owns_store, commit_mode=commit_mode, mutant=mutant, after_info=after_info,
                   stalls=stalls,
                   store_url=redact_url(store_url) if store_url else None,
                   hosts_file=str(Path(hosts_file).resolve()) if hosts_file else None, swarm=swarm,
                   fault_schedule=str(Path(fault_schedule).resolve()) if fault_schedule else None)
    tests = [Test(name=workload if name is None else name, workload=workload, time_limit=time_limit,
                  concurrency=concurrency, rate=rate, keys=keys, ttl_ms=ttl_ms, seed=seed + i, nemesis=nemeses,
                  nemesis_interval=nemesis_interval, run_salt="" if run_salt == "new" else run_salt, backend=backend,
                  **options)
             for i in range(test_count)]
    for t in tests if sut_options else ():
        set_sut_options(t, sut_options)
    for t in tests if store_url else ():
        t.live.store_url = store_url  # never saved: test.json gets the redacted form
    try:
        if scenario is not None:  # the scenario's options, except those given on the command line
            try:
                tests = [scenarios.apply_scenario(t.evolve(scenario=scenario), given) for t in tests]
            except scenarios.ScenarioError as e:
                raise runner.RunError(str(e)) from None
        system = system_label(sut, urls)
        if system and "name" not in given:  # a third-party system's runs land apart from the reference server's
            tests = [t.evolve(name=f"{system}-{t.name}") for t in tests]
        runner.validate(tests[0])
    except (runner.RunError, ValueError) as e:
        fail(str(e))
    verdicts = []
    for t in tests:
        try:
            with sigterm_interrupts():
                results = runner.run_test(t, store_dir)
        except (runner.RunError, StackError, ProcessError, MissingTool, sut_layer.SutError) as e:
            fail(str(e))
        except KeyboardInterrupt:
            interrupted(t.run_dir)
        verdicts.append(results["valid"])
        print_verdict(t.run_dir, results)
        if results.get("report"):
            click.echo(f"  report: {results['report']}")
        click.echo(f"  replay: {results['replay']}")
    sys.exit(verdict_exit(merge_valid(verdicts)))


def system_label(sut: str, urls: tuple[str, ...] | list[str]) -> str | None:
    """What names a system other than the lab's reference servers in a default test name: its `--sut` name, else
    its first `--url`'s host and port (`127.0.0.1-9000`); None for the reference servers the lab runs."""
    if sut and sut != "reference":
        label = sut
    elif urls:
        try:
            parts = urlsplit(urls[0])
            label = f"{parts.hostname or 'url'}-{parts.port}" if parts.port else (parts.hostname or "url")
        except ValueError:
            label = "url"  # not a URL: validate() names it
    else:
        return None
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-.") or "system"


def print_verdict(run_dir: Path, results: dict) -> None:
    """`<dir>: valid=... ops=N (M entries)`, then each checker that is not valid with its first violation."""
    entries = results.get("entries")
    click.echo(f"{run_dir}: valid={json.dumps(results['valid'])} ops={results['ops']}"
               + (f" ({entries} history entries)" if entries is not None else ""))
    if isinstance(results.get("results"), dict):
        for line in checker_lines(results, violations=1, only_not_valid=True):
            click.echo(line)
    if results.get("run_failed"):
        click.echo(f"  run failed: {results['run_failed']}")
    if results.get("interrupted"):
        click.echo(f"  partial run: interrupted ({results['interrupted'].get('by')}) before its time limit; the "
                   "verdict is about what it recorded")
    faults = (results.get("results") or {}).get("faults") or {}
    t = faults.get("schedule") or {}
    if t.get("scaled"):
        click.echo(f"  warning: --nemesis-interval {t['asked_interval_s']:g} s was scaled to {t['interval_s']:.3g} s "
                   "so that every nemesis got a window in the time limit (docs/nemesis.md)")
    for name in results.get("unexercised_faults") or ():
        click.echo(f"  warning: --nemesis {name} was asked for but no {name} window happened: nothing is claimed "
                   f"under {name}")


def interrupted(run_dir: Path | None) -> None:
    """Ctrl-C or SIGTERM: say where the partial run is and how to judge it, exit 130 (no traceback)."""
    if run_dir is not None and Path(run_dir).exists():
        from lab.runner import mark_interrupted  # loaded already by the run it stops: the CLI imports it lazily

        mark_interrupted(run_dir)
        click.echo(f"fencelab: interrupted; the partial run is kept in {run_dir}", err=True)
        if (Path(run_dir) / "history.jsonl").exists():
            click.echo(f"  judge what it recorded: fencelab analyze {shlex.quote(str(run_dir))}", err=True)
    else:
        click.echo("fencelab: interrupted before the run started", err=True)
    sys.exit(EXIT_INTERRUPTED)


@main.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option("--store-dir", default="store", show_default=True, type=click.Path(path_type=Path))
def analyze(run_dir: Path | None, store_dir: Path) -> None:
    """Re-run the checkers on a stored run (default: the store's latest run).

    Exit code (docs/cli.md#exit-codes): 0 valid, 1 invalid, 2 bad input, 3 unknown, 130 interrupted.
    """
    from lab.runner import RunError, analyze as analyze_run  # the runner and the layers below it (~0.26 s)

    run_dir = run_dir or store_dir / "latest"
    if not run_dir.exists():
        fail(f"no run directory {run_dir}")
    if not run_dir.is_dir():
        fail(f"{run_dir} is not a run directory (give STORE/<test>/<timestamp>)")
    try:
        results = analyze_run(run_dir.resolve())
    except RunError as e:
        fail(str(e))
    except KeyboardInterrupt:
        click.echo("fencelab analyze: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    for problem in results.get("history_problems", []):
        click.echo(f"history: {problem}", err=True)
    print_verdict(run_dir, results)
    sys.exit(verdict_exit(results["valid"]))


# -- reports ----------------------------------------------------------------------------------


@main.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
def report_cmd(run_dir: Path) -> None:
    """Write a run's report (report.html, plots, plots.json, junit.xml) into RUN_DIR; prints its path."""
    from lab.report import ReportError, write_report  # matplotlib (~0.36 s; pandas when it writes)

    try:
        path = write_report(run_dir)
    except ReportError as e:
        fail(str(e))
    click.echo(str(path))


@main.command("serve")
@click.option("--store-dir", default="store", show_default=True, type=click.Path(path_type=Path),
              help="The store to browse.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8080, show_default=True, type=int, help="Port (0: any free port, printed).")
def serve_cmd(store_dir: Path, host: str, port: int) -> None:
    """Browse the store in a browser: runs and their reports, campaigns, evidence (read-only)."""
    from lab.report.serve import ServeError, serve_store  # the report's matplotlib and uvicorn (~0.4 s)

    try:
        serve_store(store_dir, host=host, port=port, echo=click.echo)
    except ServeError as e:
        fail(str(e))


# -- shrinking a failed run ----------------------------------------------------------------------


@main.command("shrink")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--runs", default=5, show_default=True, type=click.IntRange(min=1),
              help="Runs of each candidate (its reproduction rate is convicted runs / this).")
@click.option("--threshold", default=0.6, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Accept a candidate at this rate or more (or the original's rate, when lower).")
@click.option("--max-runs", default=60, show_default=True, type=click.IntRange(min=1),
              help="At most this many runs in all (those a resumed shrink finds recorded count too).")
@click.option("--time-budget", default=None, type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Start no run after this many seconds of this command [default: no limit].")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the candidates' runs, shrink.jsonl, shrink.json and shrink.html go "
                   "[default: RUN_DIR/shrink].")
@click.option("--json", "as_json", is_flag=True, help="Print shrink.json's data at the end.")
def shrink_cmd(run_dir: Path, runs: int, threshold: float, max_runs: int, time_budget: float | None,
               out: Path | None, as_json: bool) -> None:
    """Shrink an invalid run to the smallest configuration that still reproduces its first violation.

    Fewer clients, keys, lease servers, faults, seconds, a lower rate: each candidate runs --runs times, and is
    kept when its rate meets --threshold. The same command again resumes (docs/shrinking.md). Exit code: 0 a
    result was written, 2 bad input, 3 the original did not reproduce, 130 interrupted (the best so far is written).
    """
    from lab.shrink import STOPPED_WORDS, ShrinkError, exit_code, shrink_run  # the runner and below (~0.3 s)

    if max_runs < runs:
        fail(f"--max-runs {max_runs} is less than --runs {runs}: the original alone is measured with --runs runs")
    try:  # with --json, stdout is the JSON alone: the runs' progress lines go to stderr
        with sigterm_interrupts():
            report = shrink_run(run_dir, runs=runs, threshold=threshold, max_runs=max_runs,
                                time_budget_s=time_budget, out=out, echo=lambda s: None if as_json else click.echo(s),
                                runs_output=sys.stderr if as_json else None)
    except ShrinkError as e:
        fail(str(e))
    d, outcome = report.data, report.outcome
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
    else:
        o, m = d["original"], d["minimal"]
        click.echo(f"original {o['config']['label']}: {o['convicted']}/{o['runs']} convicted")
        click.echo(f"minimal  {m['config']['label']}: {m['convicted']}/{m['runs']} convicted"
                   + (f" (smaller in {', '.join(m['changed'])})" if m["changed"] else " (nothing smaller reproduced)"))
        click.echo(f"{d['runs_used']} runs ({report.new_runs} new); stopped: {STOPPED_WORDS[outcome.stopped]}")
        if m["replay"]:
            click.echo(f"replay: {m['replay']}")
        if m["report"]:
            click.echo(f"report: {report.out / m['report']}")
        for path in report.written:
            click.echo(f"wrote {path}")
    sys.exit(exit_code(outcome))


# -- campaigns --------------------------------------------------------------------------------


@main.command("campaign")
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--store-dir", default="store", show_default=True, type=click.Path(path_type=Path),
              help="Where runs are stored; the campaign goes to STORE/campaigns/<name>/.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Go on from campaign.json (finished runs are not redone), or start over (the old state is kept aside).")
@click.option("--dry-run", is_flag=True, help="Validate the spec and print the plan; run nothing, write nothing.")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run the cells on the Dask cluster of this scheduler (tcp://host:8786) [default: the spec's "
                   "[run] dask, else here, one after another]; docs/beyond-one-machine.md.")
def campaign_cmd(spec: Path, store_dir: Path, resume: bool, dry_run: bool, dask_address: str | None) -> None:
    """Run a campaign: every combination of a spec's axes, resumably; writes campaign.json and campaign.html.

    Exit code (docs/cli.md#exit-codes): 0 all valid, 1 any invalid, 2 bad spec, 3 any unknown or failed run,
    130 interrupted.
    """
    from lab.campaign import (CampaignError, check_dask_address, check_store_dir, format_plan,  # the runner (~0.37 s)
                              load_spec, run_campaign, validate_plan)

    try:
        campaign = load_spec(spec)
        dask_address = check_dask_address(dask_address) if dask_address is not None else None
        plan = validate_plan(campaign)
        check_store_dir(store_dir, campaign.name)  # the dry run checks what the real run checks first
        if dry_run:
            for line in format_plan(campaign, plan):
                click.echo(line)
            return
        outcome = run_campaign(campaign, store_dir, resume=resume, echo=click.echo, plan=plan, dask=dask_address)
    except CampaignError as e:
        fail(str(e))
    sys.exit(outcome.exit_code)


@main.command("worker", context_settings={"ignore_unknown_options": True})
@click.argument("scheduler")
@click.option("--cells", default=1, show_default=True, type=int,
              help="Cells this worker runs at once (its `fencelab` resource and its threads).")
@click.argument("dask_args", nargs=-1, type=click.UNPROCESSED)
def worker_cmd(scheduler: str, cells: int, dask_args: tuple[str, ...]) -> None:
    """Run campaign cells for a Dask scheduler: `dask worker SCHEDULER --nthreads 1 --resources fencelab=1`.

    Needs `make install` on this machine; further options go to `dask worker` (e.g. --name w1). See
    docs/beyond-one-machine.md.
    """
    from lab.campaign import CampaignError, dask_cells  # distributed and the runner (~0.56 s)

    try:
        argv = dask_cells.worker_argv(scheduler, cells, dask_args)
    except CampaignError as e:
        fail(str(e))
    os.execv(argv[0], argv)  # the worker takes this process over (its pid is the one to stop)


# -- the contract evidence bundle ---------------------------------------------------------------


@main.command("evidence")
@click.option("--spec", "spec_path", default=None, type=click.Path(path_type=Path),
              help="The evidence spec: rows -> scenarios, depths (docs/evidence.md) "
                   "[default: campaigns/contract-evidence.toml].")
@click.option("--depth", default=None, help="How much to run: a depth of the spec (smoke, quick, standard, deep) "
                                            "[default: the spec's default_depth].")
@click.option("--store-dir", default="store", show_default=True, type=click.Path(path_type=Path),
              help="Where runs are stored; the bundle goes to STORE/evidence/<timestamp>/.")
@click.option("--url", "urls", multiple=True, help="An external lease service (repeatable) instead of the lab's stack.")
@click.option("--api-key-file", type=click.Path(path_type=Path), default=None,
              help="File with the API key for the external service (else $FENCELAB_API_KEY).")
@click.option("--sut", default="reference", show_default=True, help="The external system's client (lab.sut).")
@click.option("--backend", default="local", show_default=True,
              help="Where the lab's own stack is placed for each run (docs/compose.md, docs/ssh-backend.md, "
                   "docs/beyond-one-machine.md).")
@click.option("--hosts", "hosts_file", type=click.Path(path_type=Path), default=None,
              help="With --backend ssh: the hosts file (docs/ssh-backend.md); swarm: the placement "
                   "(docs/beyond-one-machine.md).")
@click.option("--swarm", default=None, metavar="URL", help=SWARM_HELP)
def evidence_cmd(spec_path: Path | None, depth: str | None, store_dir: Path, urls: tuple[str, ...],
                 api_key_file: Path | None, sut: str, backend: str = "local", hosts_file: Path | None = None,
                 swarm: str | None = None) -> None:
    """Run every contract row's scenarios and write evidence.json and evidence.html.

    Exit code (docs/cli.md#exit-codes): 0 every row passes (or is not applicable), 1 a row fails, 2 bad options,
    3 a row is inconclusive, 130 interrupted.
    """
    from lab.evidence import (DEFAULT_SPEC, EvidenceError, EvidenceTarget,  # the runner and scenarios (~0.31 s)
                              describe_depth, load_spec, run_evidence)

    if spec_path is None:
        spec_path = shipped_spec(DEFAULT_SPEC)

    if api_key_file is not None and not api_key_file.is_file():
        fail(f"--api-key-file {api_key_file}: no such file")
    if urls and api_key_file is None and not os.environ.get("FENCELAB_API_KEY"):
        fail("--url needs the service's API key: --api-key-file FILE (one key on one line) or $FENCELAB_API_KEY")
    try:
        spec = load_spec(spec_path)
        chosen = spec.depth(depth)
        for x in spec.depths.values():
            if x.name != chosen.name:
                d = describe_depth(spec, x)
                click.echo(f"(--depth {x.name}: {d['runs']} runs, {d['scenarios']} scenarios x {d['seeds']} seed(s) "
                           f"at x{d['time_scale']} time, {len(d['fault_runs'])} fault runs, ~{d['estimated_s']} s)")
        target = EvidenceTarget(tuple(urls), str(api_key_file) if api_key_file else None, sut, backend,
                                str(Path(hosts_file).resolve()) if hosts_file else None, swarm)
        with sigterm_interrupts():
            evidence = run_evidence(spec, store_dir, depth=chosen.name, target=target, echo=click.echo)
    except EvidenceError as e:
        fail(str(e))
    except KeyboardInterrupt:
        click.echo(f"fencelab evidence: interrupted; the runs made so far stay in {store_dir} (no bundle written)",
                   err=True)
        sys.exit(EXIT_INTERRUPTED)
    s = evidence.data["summary"]
    for row in evidence.rows:
        click.echo(f"{row.row.id:>4} {row.verdict:<15} {row.row.text}")
    click.echo(f"{s['pass']} pass, {s['fail']} fail, {s['inconclusive']} inconclusive, "
               f"{s['not-applicable']} not applicable of {s['rows']} rows in {evidence.data['elapsed_s']} s")
    click.echo(f"evidence: {evidence.dir / 'evidence.html'}")
    sys.exit(evidence.exit_code)


def shipped_spec(default: Path | str) -> Path:
    """A default spec path: the working directory's copy, else the one shipped next to the lab's package (so
    `fencelab mutants` and `fencelab evidence` work from any directory)."""
    path = Path(default)
    return path if path.exists() else Path(__file__).resolve().parent.parent / path


# -- planted bugs ------------------------------------------------------------------------------


@main.command("mutants")
@click.option("--spec", "spec_path", default=None, type=click.Path(path_type=Path),
              help="The mutants spec: each planted bug and the run that exposes it [default: campaigns/mutants.toml "
                   "here, else the one shipped with the lab].")
@click.option("--store-dir", default="store", show_default=True, type=click.Path(path_type=Path),
              help="Where runs are stored (under STORE/<spec name>/<mutant>/).")
@click.option("--fast", is_flag=True, help="The CI subset: the spec's [fast] table (every mutant, one short run).")
@click.option("--only", multiple=True, help="Run only this mutant (repeatable).")
@click.option("--markdown", is_flag=True, help="Also print the table as Markdown (for docs/mutants.md).")
@click.option("--backend", default="local", show_default=True,
              help="Where each run's stack is placed (docs/compose.md, docs/ssh-backend.md); nemeses a backend "
                   "cannot take are refused.")
@click.option("--hosts", "hosts_file", type=click.Path(path_type=Path), default=None,
              help="With --backend ssh: the hosts file (docs/ssh-backend.md); swarm: the placement "
                   "(docs/beyond-one-machine.md).")
@click.option("--swarm", default=None, metavar="URL", help=SWARM_HELP)
def mutants_cmd(spec_path: Path | None, store_dir: Path, fast: bool, only: tuple[str, ...], markdown: bool,
                backend: str = "local", hosts_file: Path | None = None, swarm: str | None = None) -> None:
    """Plant each bug of the reference server, run the general workloads at their defaults (and the scenario
    that scripts its race), and check the unmodified server passes the same runs.

    Prints the detection matrix (caught/seeds per general workload), then every row: what exposed it, the
    checkers that caught it and the unmodified server's verdict. Exit code: 0 every mutant caught on every seed
    by a workload and the unmodified server valid everywhere, 1 otherwise, 2 bad spec or options, 130 interrupted.
    """
    from lab.mutants import (DEFAULT_SPEC, MutantsError, exit_code, load_spec,  # the runner and campaigns (~0.37 s)
                             print_table, render_markdown, run_mutants, validate_spec)

    if spec_path is None:
        spec_path = shipped_spec(DEFAULT_SPEC)

    hosts = str(Path(hosts_file).resolve()) if hosts_file else None
    try:
        spec = load_spec(spec_path, fast=fast, only=only)
        validate_spec(spec, backend, hosts, swarm)
        seeds = sum(e.runs for e in spec.entries)
        mutants = len({e.mutant for e in spec.entries})
        click.echo(f"mutants {spec.name}: {mutants} mutants in {len(spec.entries)} rows, {seeds} planted runs at most, "
                   f"each distinct run also unmodified ({spec.source}{', --fast' if fast else ''})")
        report = run_mutants(spec, store_dir, echo=click.echo, backend=backend, hosts_file=hosts, swarm=swarm)
    except MutantsError as e:
        fail(str(e))
    except KeyboardInterrupt:
        click.echo("fencelab mutants: interrupted", err=True)
        sys.exit(130)
    print_table(report, click.echo)
    if markdown:
        click.echo(render_markdown(report))
    click.echo(f"summary: {report.summary_path}")
    sys.exit(exit_code(report))
