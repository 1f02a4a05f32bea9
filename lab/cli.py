"""The `fencelab` command: one click group; every subcommand validates before starting anything.

Errors a user can fix are one line on stderr and exit code 2 (click's usage
convention), never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from lab.paths import MissingTool
from lab.stack.local import LocalStack, StackError, StackOptions
from lab.stack.process import ProcessError

name_option = click.option("--name", default="default", show_default=True, help="Name of the local stack.")
home_option = click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
                           envvar="FENCELAB_HOME", help="State directory for named stacks [default: ~/.fencelab].")


def fail(msg: str, code: int = 2) -> None:
    """Print one clear line and exit (no traceback)."""
    click.echo(f"fencelab: error: {msg}", err=True)
    sys.exit(code)


@click.group()
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
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def up(name: str, home: Path | None, servers: int, persistence: str, no_store: bool, as_json: bool) -> None:
    """Start a local stack: Valkey, the store and reference lease servers (loopback only)."""
    opts = StackOptions(servers=servers, persistence=persistence, store=not no_store)
    stack = LocalStack(name=name, home=home)
    try:
        opts.validate()
        status = stack.up(opts)
    except (StackError, ProcessError, MissingTool) as e:
        fail(str(e))
    _print_status(status, as_json)


@main.command()
@name_option
@home_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(name: str, home: Path | None, as_json: bool) -> None:
    """Show what a local stack runs (exit 1 when it is not up)."""
    stack = LocalStack(name=name, home=home)
    try:
        found = stack.load_state()
    except StackError as e:
        fail(str(e))
    st = stack.status()
    if not found:
        if as_json:
            click.echo(json.dumps(st))
        else:
            click.echo(f"stack {name!r} is not up")
        sys.exit(1)
    _print_status(st, as_json)
    if not st["up"]:
        sys.exit(1)


@main.command()
@name_option
@home_option
def down(name: str, home: Path | None) -> None:
    """Stop every process of a local stack (by the pids `up` recorded)."""
    stack = LocalStack(name=name, home=home)
    try:
        if stack.load_state() is None:
            click.echo(f"stack {name!r} is not up")
            return
        stopped = stack.down()
    except StackError as e:
        fail(str(e))
    click.echo(f"stack {name!r} stopped: {', '.join(stopped) or 'nothing was running'}")


def _print_status(st: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(f"stack {st['name']!r}: {'up' if st['up'] else 'DEGRADED'}  ({st['dir']})")
    click.echo(f"  valkey        {st['valkey']}")
    if st.get("store"):
        click.echo(f"  store         {st['store']}")
    for url in st["lease_servers"]:
        click.echo(f"  lease server  {url}")
    click.echo(f"  credentials   {st['credentials']}")
    for p in st["processes"]:
        click.echo(f"  {p['name']:<12}  pid {p['pid']:<8} {'alive' if p['alive'] else 'DEAD'}  log {p['log']}")


@main.command()
@name_option
@home_option
def demo(name: str, home: Path | None) -> None:
    """Bring a stack up, drive the lease API (acquire, renew, release), check it, and shut down."""
    from lab.demo import run_demo

    try:
        run_demo(name=f"{name}-demo" if name == "default" else name, home=home)
    except (StackError, ProcessError, MissingTool) as e:
        fail(str(e))


from checkers.cli import check as _check  # noqa: E402

main.add_command(_check)


# -- tests ------------------------------------------------------------------------------------

VERDICT_EXIT = {True: 0, False: 1, "unknown": 3}


@main.command("test")
@click.option("--workload", "-w", default="lease", show_default=True, help="Workload name (see docs/workloads.md).")
@click.option("--time-limit", default=10.0, show_default=True, type=float, help="Seconds of the main phase.")
@click.option("--concurrency", "-c", default=5, show_default=True, type=int, help="Client processes.")
@click.option("--rate", default=50.0, show_default=True, type=float, help="Target ops/s over all clients.")
@click.option("--keys", default=3, show_default=True, type=int, help="Independent keys (lock identities).")
@click.option("--ttl-ms", default=2000, show_default=True, type=int, help="Lease TTL the workloads ask for.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed: same seed, same op choices.")
@click.option("--test-count", default=1, show_default=True, type=int, help="Run the test this many times.")
@click.option("--nemesis", default="", help="Comma-separated faults, e.g. partition,clock,kill.")
@click.option("--nemesis-interval", default=5.0, show_default=True, type=float, help="Seconds between faults.")
@click.option("--servers", default=2, show_default=True, type=int, help="Reference lease server instances.")
@click.option("--name", default=None, help="Test name (the store sub-directory) [default: the workload].")
@click.option("--store-dir", default="store", show_default=True, type=click.Path(path_type=Path),
              help="Where runs are stored.")
def test_cmd(workload, time_limit, concurrency, rate, keys, ttl_ms, seed, test_count, nemesis, nemesis_interval,
             servers, name, store_dir) -> None:
    """Run a workload against a fresh local stack; record, check, and store the run.

    Exit code: 0 valid, 1 invalid, 2 bad options, 3 unknown (any run).
    """
    from lab.runner import RunError, run_test, validate
    from lab.testmap import Test

    if test_count < 1:
        fail(f"--test-count must be >= 1, not {test_count}")
    nemeses = [n.strip() for n in nemesis.split(",") if n.strip()]
    tests = [Test(name=name or workload, workload=workload, time_limit=time_limit, concurrency=concurrency,
                  rate=rate, keys=keys, ttl_ms=ttl_ms, seed=seed + i, nemesis=nemeses,
                  nemesis_interval=nemesis_interval, extra={"servers": servers}) for i in range(test_count)]
    try:
        validate(tests[0])
        if not 1 <= servers <= 16:
            raise RunError(f"--servers must be between 1 and 16, not {servers}")
    except (RunError, ValueError) as e:
        fail(str(e))
    verdicts = []
    for t in tests:
        try:
            results = run_test(t, store_dir)
        except (RunError, StackError, ProcessError, MissingTool) as e:
            fail(str(e))
        verdicts.append(results["valid"])
        click.echo(f"{t.run_dir}: valid={json.dumps(results['valid'])} ops={results['ops']}")
        click.echo(f"  replay: {results['replay']}")
    from checkers.core import merge_valid

    sys.exit(VERDICT_EXIT.get(merge_valid(verdicts), 3))


@main.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option("--store-dir", default="store", show_default=True, type=click.Path(path_type=Path))
def analyze(run_dir: Path | None, store_dir: Path) -> None:
    """Re-run the checkers on a stored run (default: the store's latest run).

    Exit code: 0 valid, 1 invalid, 2 bad input, 3 unknown.
    """
    from lab.runner import RunError, analyze as analyze_run

    run_dir = run_dir or store_dir / "latest"
    if not run_dir.exists():
        fail(f"no run directory {run_dir}")
    try:
        results = analyze_run(run_dir.resolve())
    except RunError as e:
        fail(str(e))
    for problem in results.get("history_problems", []):
        click.echo(f"history: {problem}", err=True)
    click.echo(f"{run_dir}: valid={json.dumps(results['valid'])} ops={results['ops']}")
    sys.exit(VERDICT_EXIT.get(results["valid"], 3))
