"""The reference lease server owner: one `python -m lab.server` process per instance.

Several instances share one Valkey; each has its own port, instance id, audit
log and process log under the run directory. `store_url` (the CouchDB-API store
of the fenced-write boundary) becomes `--store-url`; mutant switches such as
`--allow-mutants` go through `extra_args`, and `mutant` (a planted bug of
lab/server/mutants, lab runs only) becomes `--allow-mutants --mutant NAME`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lab.secrets import redact_url
from lab.stack.process import ManagedProcess, free_port, http_status


class LeaseServerProcess(ManagedProcess):
    """A reference lease server instance on a free loopback port."""

    serves_leases = True  # nemesis.process_faults: ready when /healthz answers at all (503 while Valkey is cut off)

    def __init__(self, run_dir: Path, *, valkey_url: str, principals_file: Path, name: str = "lease-1",
                 port: int | None = None, config_file: Path | None = None, env: dict[str, str] | None = None,
                 extra_args: list[str] | None = None, store_url: str | None = None, mutant: str | None = None):
        run_dir = Path(run_dir).resolve()  # the process runs with another cwd: relative paths would break
        port = port or free_port()
        self.valkey_url = valkey_url
        self.store_url = store_url
        argv = [sys.executable, "-m", "lab.server", "--host", "127.0.0.1", "--port", str(port),
                "--valkey-url", valkey_url, "--principals", str(Path(principals_file).resolve()), "--instance-id", name,
                "--audit-log", str(run_dir / "audit" / f"{name}.jsonl")]
        if config_file is not None:
            argv += ["--config", str(config_file)]
        if store_url is not None:  # through the environment: a store password never shows in the process list
            env = dict(env or {}, FENCELAB_STORE_URL=store_url)
        if mutant:  # a planted bug: the only place the lab passes --allow-mutants
            argv += ["--allow-mutants", "--mutant", mutant]
        argv += list(extra_args or [])
        super().__init__(name=name, argv=argv, log_path=run_dir / "logs" / f"{name}.log",
                         ports={"http": port}, env=env)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports['http']}"

    def healthy(self) -> bool:
        """GET /healthz answers 200 (the server is up and reaches Valkey)."""
        return http_status(self.url + "/healthz") == 200

    def state(self) -> dict:
        d = super().state()
        d.update(url=self.url, valkey_url=self.valkey_url, store_url=redact_url(self.store_url))
        return d
