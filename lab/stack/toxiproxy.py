"""The Toxiproxy server owner: the real server built by `go install .../cmd/server@v2.12.0`."""

from __future__ import annotations

from pathlib import Path

from lab import paths
from lab.stack.process import ManagedProcess, free_port, http_status


class ToxiproxyProcess(ManagedProcess):
    """Toxiproxy's API server on a free loopback port (proxies listen on ports the lab picks)."""

    def __init__(self, run_dir: Path, *, name: str = "toxiproxy", port: int | None = None):
        run_dir = Path(run_dir).resolve()  # the process runs with another cwd: relative paths would break
        port = port or free_port()
        argv = [str(paths.toxiproxy_server()), "-host", "127.0.0.1", "-port", str(port)]
        super().__init__(name=name, argv=argv, log_path=run_dir / "logs" / f"{name}.log", ports={"api": port})

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports['api']}"

    def healthy(self) -> bool:
        """GET /version answers."""
        return http_status(self.url + "/version") == 200

    def state(self) -> dict:
        d = super().state()
        d.update(url=self.url)
        return d
