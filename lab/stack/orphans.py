"""Orphan reaping: the Compose projects of runs whose lab process died before its `down`.

A run's Compose stack (`ComposeStack(die_with_owner=True)`) labels its
containers with its owner, `org.fencelab.owner` = "pid:start time" of the
lab process; a later run removes the projects whose owner no longer runs
(`reap_orphans`), their containers, networks and volumes. Nothing without
that label, and no live owner's project, is touched.
"""

from __future__ import annotations

from typing import Any

import psutil

__all__ = ["OWNER_LABEL", "PROJECT_LABEL", "owner_alive", "owner_id", "reap_orphans"]

OWNER_LABEL = "org.fencelab.owner"  # "pid:start time" of the lab process whose run owns the project
PROJECT_LABEL = "com.docker.compose.project"


def owner_id(pid: int | None = None) -> str:
    """This process (or `pid`) as an owner label: its pid and start time (a reused pid is not the owner)."""
    p = psutil.Process(pid)
    return f"{p.pid}:{p.create_time():.2f}"


def owner_alive(owner: str) -> bool:
    """Is the process an owner label names still running (same pid, same start time)?"""
    try:
        pid, started = owner.split(":", 1)
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 0.5
    except (ValueError, psutil.Error):
        return False


def reap_orphans(client: Any) -> dict[str, dict[str, int]]:
    """Remove the Compose projects of runs whose lab process died before its `down` (SIGKILL, power loss):
    containers labelled with an owner that is no longer running, then their project's networks and volumes.
    Only resources carrying `org.fencelab.owner` with a dead owner are touched: `fencelab up` stacks (no owner)
    and other projects never are. Returns project -> counts removed."""
    dead: set[str] = set()
    for c in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
        labels = c.labels or {}
        owner, project = labels.get(OWNER_LABEL, ""), labels.get(PROJECT_LABEL, "")
        if owner and project.startswith("fencelab-") and not owner_alive(owner):
            dead.add(project)
    out: dict[str, dict[str, int]] = {}
    for project in sorted(dead):
        flt = {"label": f"{PROJECT_LABEL}={project}"}
        counts = {"containers": 0, "networks": 0, "volumes": 0}
        for c in client.containers.list(all=True, filters=flt):
            c.remove(force=True, v=True)
            counts["containers"] += 1
        for n in client.networks.list(filters=flt):
            n.remove()
            counts["networks"] += 1
        for v in client.volumes.list(filters=flt):
            v.remove(force=True)
            counts["volumes"] += 1
        out[project] = counts
    return out

