"""What every stack backend (local, compose, ssh) shares: the `Stack` protocol, its state directory and file.

`Stack` is what the runner, `fencelab up/status/down` and the nemesis
registry use of a placement (Jepsen's DB: set up, tear down, and the nodes'
processes): `up(options)` -> status, `down()`, `status()`, `processes`,
`process(name)`, `dir`, and `info` (addresses, Toxiproxy topology, clock
files). `up()` and `status()` return a `StackStatus`, one typed value for
every backend (what `fencelab status --json` prints, `as_dict()`).
`LocalStack`, `ComposeStack`, `SshStack`, `lab.sut.processes.SutStack` and
the URL stacks of `lab.sut.proxy` implement it
(tests/test_stack_protocol.py); a backend-specific ability (the local stack's
`netns_hosts`, a system's `leader_nemesis`) is asked for with `hasattr`, as
Jepsen's optional DB protocols are; the nemeses of SSH hosts live in
`nemesis.ssh` and take the stack.

A backend is a class with `name`, `home`, `root`, `processes` and `info`;
mixing in `StackFiles` gives it the directory layout, `save_state`, the
state file's reading, and process lookup by name. The lifecycle the
process-owning backends share (start and record a process, the store, the
Toxiproxy topology, `down`, `status`) is `lab.stack.lifecycle.ProcessStack`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lab.stack.errors import StackError, stack_dir


def write_private_json(path: Path, data: Any) -> None:
    """Write JSON readable only by its owner (created 0600, never world-readable even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ProcessRow:
    """One process of a stack as `status()` lists it; `node`/`host` on SSH hosts, `status`/`container` for a
    container (Docker's view), None elsewhere."""

    name: str
    pid: int | None
    alive: bool
    ports: Mapping[str, Any]
    log: str
    node: str | None = None
    host: str | None = None
    status: str | None = None
    container: str | None = None


@dataclass(frozen=True)
class StackStatus:
    """What a stack runs and where its services answer: `up()` and `status()` of every `Stack` return it.

    The runner reads the addresses (`lease_servers`, `client_nodes`, `valkey`, `store`, `credentials`);
    `fencelab status` prints the rest. Fields a backend has no use for stay None / empty: `netns` (a local
    stack in network namespaces), `system` and `members` (a system that brings its own processes), `project`,
    `store_admin` and `error` (a Compose stack; `error` when no engine answers), `nodes` (SSH hosts).
    """

    name: str
    backend: str  # local, compose, ssh, or external (URLs the lab does not run)
    dir: str
    up: bool = False
    lease_servers: Sequence[str] = ()
    client_nodes: Sequence[str] = ()  # the servers as the workload's clients dial them (through proxies)
    valkey: str | None = None
    store: str | None = None  # its URL without credentials
    credentials: str | None = None  # the path of the demo API keys (never the keys)
    toxiproxy: str | None = None
    topology: Mapping[str, Any] | None = None
    clocks: Mapping[str, str] = field(default_factory=dict)
    processes: Sequence[ProcessRow] = ()
    system: str = "reference"
    members: Mapping[str, str] = field(default_factory=dict)
    netns: Mapping[str, Any] | None = None
    project: str | None = None
    store_admin: str | None = None
    nodes: Mapping[str, Any] | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        for name in ("lease_servers", "client_nodes", "processes"):  # frozen all the way down for sequences
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict (what `fencelab status --json` prints)."""
        return asdict(self)


def rows_up(rows: Sequence[ProcessRow]) -> bool:
    """Is a stack with these processes up: at least one, and every one alive?"""
    return bool(rows) and all(r.alive for r in rows)


@runtime_checkable
class Stack(Protocol):
    """A placement of the system under test (local processes, Docker Compose, SSH nodes)."""

    name: str
    processes: list
    info: dict[str, Any]

    @property
    def dir(self) -> Path: ...

    def up(self, opts: Any) -> StackStatus: ...

    def down(self) -> list[str]: ...

    def status(self) -> StackStatus: ...

    def process(self, name: str) -> Any: ...


class StackFiles:
    """State directory, state.json and credentials.json of a named stack; process lookup."""

    name: str
    home: Path | None
    root: Path | None
    processes: list
    info: dict[str, Any]

    @property
    def dir(self) -> Path:
        return Path(self.root) if self.root is not None else stack_dir(self.name, self.home)

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def credentials_file(self) -> Path:
        return self.dir / "credentials.json"

    def save_state(self) -> None:
        """Record what runs (info and every started process) so a later `down` can find it."""
        data = dict(self.info, processes=[p.state() for p in self.processes if p.pid is not None])
        write_private_json(self.state_file, data)

    def read_state_file(self) -> dict[str, Any] | None:
        """The parsed state.json, None when the stack is not up; StackError when it is unreadable."""
        if not self.state_file.exists():
            return None
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError) as e:
            raise StackError(f"cannot read {self.state_file}: {e}") from None

    def process(self, name: str):
        """The process called `name` (e.g. `valkey`, `lease-2`, `store`)."""
        for p in self.processes:
            if p.name == name:
                return p
        raise StackError(f"stack {self.name!r} has no process {name!r}; it has {[p.name for p in self.processes]}")
