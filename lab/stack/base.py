"""What every stack backend (local, compose, ssh) shares: the `Stack` protocol, its state directory and file.

`Stack` is what the runner, `fencelab up/status/down` and the nemesis
registry use of a placement (Jepsen's DB: set up, tear down, and the nodes'
processes): `up(options)` -> status, `down()`, `status()`, `processes`,
`process(name)`, `dir`, and `info` (addresses, Toxiproxy topology, clock
files). `LocalStack`, `ComposeStack` and `SshStack` implement it
(tests/test_stack_protocol.py); a backend-specific ability (the local stack's
`netns_hosts`, a system's `leader_nemesis`) is asked for with `hasattr`, as
Jepsen's optional DB protocols are; the nemeses of SSH hosts live in
`nemesis.ssh` and take the stack.

A backend is a class with `name`, `home`, `root`, `processes` and `info`;
mixing in `StackFiles` gives it the directory layout, `save_state`, the
state file's reading, and process lookup by name.
"""

from __future__ import annotations

import json
import os
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


@runtime_checkable
class Stack(Protocol):
    """A placement of the system under test (local processes, Docker Compose, SSH nodes)."""

    name: str
    processes: list
    info: dict[str, Any]

    @property
    def dir(self) -> Path: ...

    def up(self, opts: Any) -> dict[str, Any]: ...

    def down(self) -> list[str]: ...

    def status(self) -> dict[str, Any]: ...

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

    def process_rows(self) -> list[dict[str, Any]]:
        """Each host process as `status()` lists it: name, pid, alive, ports, log."""
        return [{"name": p.name, "pid": p.pid, "alive": p.alive(), "ports": p.ports, "log": str(p.log_path)}
                for p in self.processes]

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
