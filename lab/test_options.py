"""The `fencelab test` command's options, as data: the CLI builds the command from them and the runner
replays a run from them (lab.runner.replay_command), so an option added here is replayed too; both sit above
this module (docs/architecture.md, "Layers")."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

__all__ = ["SWARM_HELP", "TEST_OPTIONS", "test_options"]

SWARM_HELP = ("With --backend swarm: the Swarm manager's Docker engine (unix:///path/docker.sock, tcp://host:2375, "
              "ssh://user@host); over the placement's `manager`, which is over DOCKER_HOST "
              "(docs/beyond-one-machine.md).")

TEST_OPTIONS: list[click.Option] = [
    click.Option(["--workload", "-w"], default="lease", show_default=True, help="Workload name (see docs/workloads.md)."),
    click.Option(["--time-limit"], default=10.0, show_default=True, type=float, help="Seconds of the main phase."),
    click.Option(["--concurrency", "-c"], default=5, show_default=True, type=int, help="Client processes."),
    click.Option(["--rate"], default=50.0, show_default=True, type=float, help="Target ops/s over all clients."),
    click.Option(["--keys"], default=3, show_default=True, type=int, help="Independent keys (lock identities)."),
    click.Option(["--ttl-ms"], default=2000, show_default=True, type=int, help="Lease TTL the workloads ask for."),
    click.Option(["--seed"], default=0, show_default=True, type=int, help="Seed: same seed, same op choices."),
    click.Option(["--run-salt"], default="new", show_default=True, metavar="SALT|new",
        help="Makes the run's request ids and service instances its own (test.json run_salt): 'new' draws a "
             "fresh one, so a server that remembers an earlier run's requests cannot answer from them; give an "
             "earlier run's salt to send its very request ids again (docs/cli.md#run-identity)."),
    click.Option(["--test-count"], default=1, show_default=True, type=int, help="Run the test this many times."),
    click.Option(["--nemesis"], default="", help="Comma-separated faults, e.g. partition,clock,kill."),
    click.Option(["--nemesis-interval"], default=5.0, show_default=True, type=float, help="Seconds between faults."),
    click.Option(["--fault-schedule"], type=click.Path(path_type=Path), default=None, metavar="FILE",
        help="Replay a recorded fault schedule (a run's fault-schedule.json) instead of drawing one: the same "
             "faults on the same targets at the same times; its nemeses are the run's --nemesis "
             "(docs/nemesis.md#replaying-a-fault-schedule)."),
    click.Option(["--servers"], default=2, show_default=True, type=int, help="Reference lease server instances."),
    click.Option(["--name"], default=None, help="Test name (the store sub-directory) [default: the workload; against another system (--sut, "
             "--url) <system>-<workload>, e.g. etcd-lease]."),
    click.Option(["--store-dir"], default="store", show_default=True, type=click.Path(path_type=Path),
        help="Where runs are stored."),
    click.Option(["--sut"], default="reference", show_default=True,
        help="System under test: reference, starintel, a registered name or module:Factory "
             "(docs/plugging-in-a-system.md)."),
    click.Option(["--url", "urls"], multiple=True, help="An external lease server (repeatable); no local stack is started."),
    click.Option(["--proxy-urls"], is_flag=True,
        help="With --url: start the lab's own Toxiproxy in front of each URL, so network nemeses act on the "
             "client -> server links (docs/external-systems.md)."),
    click.Option(["--store-db"], default=None,
        help="With --url and --store-url: the database the server writes its documents into [default: fencelab]."),
    click.Option(["--lab-owns-store"], is_flag=True,
        help="The --store-url store is a scratch store the lab may set up (create the database, install the "
             "lab's fence guard); without it the lab installs nothing into a store it did not start."),
    click.Option(["--api-key-file"], type=click.Path(path_type=Path), default=None,
        help="File with the API key for an external system (else $FENCELAB_API_KEY)."),
    click.Option(["--scenario"], default=None,
        help="A named race scenario (docs/scenarios.md): its workload, faults, options and checker."),
    click.Option(["--store-url"], envvar="FENCELAB_STORE_URL", default=None,
        help="Use this CouchDB-API store (e.g. a real CouchDB, http://user:pass@host:5984) instead of "
             "starting pouchdb-server [env FENCELAB_STORE_URL]; its password is never written down."),
    click.Option(["--mutant"], default=None,
        help="Plant a named bug in the lab's reference servers (docs/mutants.md): the checkers must catch it."),
    click.Option(["--backend", "backend"], default="local",
        show_default=True,
        help="Where the lab places its reference stack: local processes, Docker Compose containers "
             "(docs/compose.md; needs a Docker engine, which the lab starts as root when none answers), or "
             "SSH nodes named by --hosts (docs/ssh-backend.md), or a Docker Swarm stack placed by --hosts "
             "(swarm; docs/beyond-one-machine.md)."),
    click.Option(["--hosts", "hosts_file"], type=click.Path(path_type=Path), default=None,
        help="With --backend ssh: a TOML file of the nodes (nodes = [...], key_file, known_hosts, ...); with "
             "--backend swarm: the placement (manager, [engines], [place])."),
    click.Option(["--swarm"], default=None, metavar="URL", help=SWARM_HELP),
    click.Option(["--commit-mode"], type=click.Choice(["fenced", "unfenced"]), default=None,
        help="For a third-party system (docs/third-party.md): commit through the store's token guard (fenced, "
             "the default when the system hands out a fencing token) or whenever the client believes it "
             "holds the lock (unfenced)."),
    click.Option(["--after-info"], type=click.Choice(["carry-on", "abandon"]), default=None,
        help="What a lease session does after its process crashed (an info) and its client was reopened: carry "
             "on with the lease it still believes it holds (the default: a stale holder the lab made, "
             "'crash-and-carry-on'), or abandon it and acquire afresh in its next session "
             "(docs/plugging-in-a-system.md#client-lifecycle-after-info)."),
    click.Option(["--stalls"], type=click.Choice(["on", "off"]), default=None,
        help="Whether the workload's own sessions stall past their TTL (on, the default: stalled and solo "
             "sessions make stale holders by themselves) or not (off: only a fault makes one, so a shrink keeps "
             "the fault that does; docs/workloads.md#stalls)."),
    click.Option(["--sut-opt", "sut_opts"], multiple=True, metavar="KEY=VALUE",
        help="A per-system option the plug-in reads from test.extra[KEY] (repeatable; kept in the replay): VALUE "
             "is a JSON scalar when it parses as one (1, 2.5, true, null, \"quoted\"), else the string as given. "
             "A Test field's name is refused: use its own option (docs/plugging-in-a-system.md#per-system-options)."),
]


def test_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command function with every option of `TEST_OPTIONS`, in their order."""
    params = f.__dict__.setdefault("__click_params__", [])
    params.extend(reversed(TEST_OPTIONS))  # click lists a function's params bottom-up, as decorators add them
    return f
