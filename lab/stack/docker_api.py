"""The container engine's API for the Compose stack: the Docker SDK and the Compose CLI.

`connect_docker()` is a Docker client (`docker.from_env()` unless a factory is
given) or one `StackError` line when no engine answers; `compose_command()`
finds the Compose CLI (the v2 plugin, else Debian's `docker-compose`);
`api_errors()` is what an SDK call raises when the engine refuses or is gone,
and `one_line()` squeezes Docker's multi-line errors onto one line. The
engine itself, when the lab has to start one, is `lab.stack.dockerd`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from lab.stack.errors import StackError

__all__ = ["api_errors", "compose_command", "connect_docker", "docker_module", "is_compose_v2", "one_line"]


def docker_module() -> Any:
    """The `docker` package, or a StackError saying how to install it."""
    try:
        import docker  # the Docker SDK: only the container backends need it, and it may be absent
    except ImportError:
        raise StackError("the compose backend needs the `docker` Python package: "
                         ".tools/venv/bin/pip install 'docker>=7.1'") from None
    return docker


def one_line(text: Any) -> str:
    """`text` squeezed onto one line (Docker's errors span several)."""
    return " ".join(str(text).split())


def api_errors() -> tuple[type[BaseException], ...]:
    """What a Docker SDK call raises when the engine refuses or is gone."""
    import requests  # the Docker SDK's transport: present exactly when the SDK is (docker_module)

    return (docker_module().errors.DockerException, requests.exceptions.RequestException)


def connect_docker(factory: Callable[[], Any] | None = None) -> Any:
    """A Docker client (`docker.from_env()` by default), or one StackError line when no engine answers."""
    docker = docker_module()
    try:
        return (factory or docker.from_env)()
    except docker.errors.DockerException as e:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        raise StackError(f"cannot reach a Docker engine at {where} ({one_line(e)}): "
                         "the compose backend needs a running Docker engine") from None


def compose_command(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[str]:
    """`docker compose` (the v2 plugin) when it answers, else Debian's `docker-compose`; StackError if neither."""
    if shutil.which("docker"):
        try:
            r = run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                return ["docker", "compose"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    exe = shutil.which("docker-compose")
    if exe:
        return [exe]
    raise StackError("neither `docker compose` nor `docker-compose` is installed: install Docker's compose "
                     "plugin, or Debian's docker-compose (scripts/install.sh compose-tools)")


def is_compose_v2(cmd: Sequence[str]) -> bool:
    """Is this the v2 plugin (which knows `up --wait`)?"""
    return list(cmd[:2]) == ["docker", "compose"]

