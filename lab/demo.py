"""`fencelab demo` (`make demo`): the lab's main job, briefly, on the local stack.

1. Bring a named stack up, acquire / renew / release one lease through the
   HTTP API with a demo principal, show the tokens, and shut the stack down.
2. Run a short real campaign (`campaigns/demo.toml`: the `lease` and
   `fenced-append` workloads under no faults, partitions and process kills, each
   run on a fresh stack of its own), record and check every run, and print the
   path of `campaign.html`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from lab.campaign import load_spec, run_campaign
from lab.client import LeaseClient
from lab.paths import REPO_ROOT
from lab.stack.base import StackStatus
from lab.stack.local import LocalStack, StackOptions
from workloads.common import identity_for, pick_credential


async def _drive(stack_status: StackStatus) -> list[str]:
    """Acquire, renew and release one lease; return printable lines."""
    creds = json.loads(Path(stack_status.credentials).read_text())
    cred = pick_credential(creds)
    ident = identity_for("demo")
    lines = []
    urls = stack_status.lease_servers
    async with LeaseClient(urls[0], cred["api_key"], service_instance_id="demo-worker") as a, \
            LeaseClient(urls[-1], cred["api_key"], service_instance_id="demo-worker") as b:
        r = await a.acquire(ident, ttl_ms=5000, deadline_s=2)
        lines.append(f"acquire via {urls[0]}: {r.outcome} {r.code} token={r.lease and r.lease.fencing_token}")
        if not r.ok:
            raise click.ClickException(f"demo acquire failed: {r.code} {r.msg}")
        r2 = await b.renew(r.lease, identity=ident, deadline_s=2)
        lines.append(f"renew via {urls[-1]}: {r2.outcome} {r2.code} token={r2.lease and r2.lease.fencing_token}")
        r3 = await a.release(r2.lease or r.lease, identity=ident, deadline_s=2)
        lines.append(f"release: {r3.outcome} {r3.code} state={r3.lease and r3.lease.state}")
        r4 = await a.acquire(ident, ttl_ms=5000, deadline_s=2)
        lines.append(f"reacquire: {r4.outcome} token={r4.lease and r4.lease.fencing_token} (strictly greater)")
        if r4.ok:
            await a.release(r4.lease, identity=ident, deadline_s=2)
        if not (r2.ok and r3.ok and r4.ok and r4.lease.fencing_token > r.lease.fencing_token):
            raise click.ClickException("demo: the lease API did not behave as the contract says")
    return lines


def run_demo(name: str = "demo", home: Path | None = None, store_dir: Path = Path("store")) -> None:
    """The whole demo; raises on any failure (make demo then exits non-zero)."""
    stack = LocalStack(name=name, home=home)
    if stack.load_state():
        stack.down()
    click.echo(f"== bringing stack {name!r} up")
    status = stack.up(StackOptions(servers=2))
    try:
        for url in status.lease_servers:
            click.echo(f"   lease server {url}")
        for line in asyncio.run(_drive(status)):
            click.echo(f"   {line}")
    finally:
        stack.down()
        click.echo(f"== stack {name!r} is down")
    spec_path = REPO_ROOT / "campaigns" / "demo.toml"
    click.echo(f"== fencelab campaign {spec_path.relative_to(REPO_ROOT)}")
    outcome = run_campaign(load_spec(spec_path), store_dir, resume=False, echo=click.echo)
    click.echo(f"== campaign page: {Path(outcome.page).resolve()}")
    if outcome.exit_code != 0:
        raise click.ClickException(f"demo campaign verdicts: {outcome.counts}")
