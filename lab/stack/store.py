"""The CouchDB-API document store owner: pouchdb-server from npm, with its own data dir.

pouchdb-server speaks the CouchDB HTTP API (`_rev` MVCC, design documents with
`validate_doc_update`). It writes `config.json` and `log.txt` into its working
directory, so it runs inside its own data directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from lab import paths
from lab.stack.process import ManagedProcess, free_port, probe_get


@dataclass
class ExternalStore:
    """A CouchDB-API store the lab does not run (the user's real CouchDB, `--store-url`): only its URL."""

    url: str

    @property
    def address(self) -> str:
        """host:port, for a Toxiproxy upstream."""
        u = urlsplit(self.url)
        return f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"

    def via(self, listen: str) -> str:
        """The same URL (credentials kept) through a proxy listening on `listen`."""
        u = urlsplit(self.url)
        auth = f"{u.username}:{u.password}@" if u.username else ""
        return urlunsplit((u.scheme, auth + listen, u.path, u.query, u.fragment))


class PouchDBProcess(ManagedProcess):
    """pouchdb-server on a free loopback port, LevelDB files under `run_dir/<name>`."""

    def __init__(self, run_dir: Path, *, name: str = "store", port: int | None = None,
                 in_memory: bool = False, env: dict[str, str] | None = None):
        run_dir = Path(run_dir).resolve()  # the process runs with another cwd: relative paths would break
        self.data_dir = run_dir / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        argv = [str(paths.node()), str(paths.pouchdb_server()), "--host", "127.0.0.1", "--port", str(port),
                "--dir", str(self.data_dir), "--no-stdout-logs"]
        if in_memory:
            argv.append("--in-memory")
        super().__init__(name=name, argv=argv, log_path=run_dir / "logs" / f"{name}.log",
                         ports={"http": port}, env=env, cwd=self.data_dir)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports['http']}"

    @property
    def address(self) -> str:
        """host:port, for a Toxiproxy upstream."""
        return f"{self.host}:{self.ports['http']}"

    def via(self, listen: str) -> str:
        """The store's URL through a proxy listening on `listen`."""
        return f"http://{listen}"

    def healthy(self) -> bool:
        """GET / answers the CouchDB welcome document."""
        r = probe_get(self.url + "/")
        try:
            return r is not None and r.status_code == 200 and "version" in r.json()
        except ValueError:
            return False

    def state(self) -> dict:
        d = super().state()
        d.update(url=self.url, data_dir=str(self.data_dir))
        return d
