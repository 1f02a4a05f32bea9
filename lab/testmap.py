"""The test: one plain value threaded through a run (Jepsen's test map).

Everything a run needs to know is here: options, the system under test's
addresses and credentials, and what the run produced. What can never be saved
(sockets, clients, processes) lives in `live`, which `to_json` leaves out.
"""

from __future__ import annotations

import copy
import re
import secrets
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


RUN_SALT = re.compile(r"[0-9A-Za-z]{1,32}")


def new_run_salt() -> str:
    """A fresh per-run salt (8 hex digits): seeded ids stay reproducible, yet differ from every other run's."""
    return secrets.token_hex(4)


@dataclass
class Test:
    """One test run's options and context."""

    __test__ = False  # not a pytest test class

    name: str = "fencelab"
    workload: str = "lease"
    time_limit: float = 10.0
    concurrency: int = 5
    rate: float = 50.0
    keys: int = 3
    seed: int = 0
    # makes this run's request ids and service instances its own: a second run with the same seed against the
    # same server must not be answered from the first run's idempotency records (new_run_salt; "" = unsalted)
    run_salt: str = ""
    ttl_ms: int = 2000
    nemesis: list[str] = field(default_factory=list)
    nemesis_interval: float = 5.0
    backend: str = "local"  # where the lab places the system under test: local processes or Docker Compose
    run_dir: Path | None = None
    # the system under test, filled in when the stack is up; `nodes` are what the workload's clients talk to
    nodes: list[str] = field(default_factory=list)
    client_nodes: list[str] = field(default_factory=list)  # the servers as clients reach them (through proxies)
    lease_servers: list[str] = field(default_factory=list)
    valkey: str | None = None
    store: str | None = None
    credentials_file: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    live: dict[str, Any] = field(default_factory=dict, repr=False)  # never saved: clients, processes, sockets

    def to_json(self) -> dict[str, Any]:
        """Everything but `live`, JSON-able (paths as strings)."""
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != "live"}
        d["run_dir"] = str(self.run_dir) if self.run_dir else None
        return d

    def sut_name(self) -> str:
        """The system under test's registered name (`reference`: our server)."""
        return str(self.extra.get("sut", "reference"))

    def credentials(self) -> list[dict[str, Any]]:
        """The demo principals (with API keys) of the stack under test; never written to the history."""
        import json

        if "credentials" not in self.live:
            if not self.credentials_file:
                raise ValueError("the test has no credentials file (is the stack up?)")
            self.live["credentials"] = json.loads(Path(self.credentials_file).read_text())
        return self.live["credentials"]
