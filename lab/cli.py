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
