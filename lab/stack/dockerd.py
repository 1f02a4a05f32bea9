"""The Docker engine, when the lab has to start one: `dockerd` as root, owned like any other process.

A compose run first asks the engine the user already has (DOCKER_HOST or the
default socket). Only when none answers, and the lab runs as root, does it
start `dockerd` itself (Debian's docker.io, which the installer's
docker-compose package brings): a `DockerEngine` with its pid, log and socket,
stopped by pid when the run (or the test session) ends. An engine the lab did
not start is never stopped.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from lab.stack.docker_api import docker_module
from lab.stack.errors import StackError
from lab.stack.process import ManagedProcess, ProcessError

DEFAULT_SOCKET = "/var/run/docker.sock"


def engine_answers(timeout: float = 3.0) -> bool:
    """Does a Docker engine answer `_ping` where the Docker SDK looks (DOCKER_HOST or the default socket)?"""
    try:
        client = docker_module().from_env(timeout=timeout)  # StackError when the SDK is missing: "no" too
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # the SDK raises DockerException, requests' errors or OSError: all mean "no"
        return False


@dataclass
class DockerEngine(ManagedProcess):
    """`dockerd` started by the lab (root only); healthy once the SDK's ping answers on its socket."""

    def healthy(self) -> bool:
        return engine_answers(timeout=1.0)


def start_engine(log_dir: Path, *, timeout: float = 60.0) -> DockerEngine:
    """Start `dockerd` (logs in `log_dir/dockerd.log`) and wait until it answers; StackError naming the problem."""
    exe = shutil.which("dockerd")
    if exe is None:
        raise StackError("no Docker engine answers and `dockerd` is not installed: run `make install` "
                         "(Debian's docker.io), or start your own engine")
    if os.geteuid() != 0:
        raise StackError("no Docker engine answers, and starting dockerd needs root: start your Docker engine "
                         "(or run as root)")
    if os.environ.get("DOCKER_HOST"):
        raise StackError(f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer; the lab starts an engine only "
                         "on the default socket: unset DOCKER_HOST or start that engine")
    engine = DockerEngine(name="dockerd", argv=[exe, "--host", f"unix://{DEFAULT_SOCKET}"],
                          log_path=Path(log_dir) / "dockerd.log")
    try:
        engine.start(timeout=timeout)
    except ProcessError as e:
        raise StackError(f"dockerd did not come up: {e}") from None
    return engine


def ensure_engine(log_dir: Path) -> DockerEngine | None:
    """None when an engine already answers (not ours: never stopped); else the engine the lab started."""
    return None if engine_answers() else start_engine(log_dir)
