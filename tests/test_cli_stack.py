"""`fencelab up / status / down` on the real local stack, as a user runs them (separate processes)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import httpx
import psutil


def fencelab(home, *args, **env_extra):
    env = dict(os.environ, FENCELAB_HOME=str(home), **env_extra)
    return subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True, env=env, timeout=120)


def test_up_status_down_round_trip(tmp_path):
    r = fencelab(tmp_path, "up", "--name", "t", "--servers", "2", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(fencelab(tmp_path, "status", "--name", "t", "--json").stdout)
    try:
        assert {"lease_servers", "valkey", "credentials"} <= set(st)
        assert len(st["lease_servers"]) == 2 and st["up"] is True
        for url in st["lease_servers"]:
            assert httpx.get(url + "/healthz", timeout=5).status_code == 200
        creds_path = st["credentials"]
        assert stat.S_IMODE(os.stat(creds_path).st_mode) == 0o600, "credentials must be readable only by the owner"
        creds = json.loads(open(creds_path).read())
        assert all({"principal_id", "api_key", "capabilities", "scopes"} <= set(c) for c in creds)
        caps = {cap for c in creds for cap in c["capabilities"]}
        assert {"targets:lease", "targets:force-release", "admin"} <= caps
        for log in (p["log"] for p in st["processes"]):
            text = open(log, errors="replace").read()
            assert not any(c["api_key"] in text for c in creds), f"a secret reached {log}"
        again = fencelab(tmp_path, "up", "--name", "t")
        assert again.returncode == 2 and "already up" in again.stderr
    finally:
        pids = [p["pid"] for p in st["processes"]]
        down = fencelab(tmp_path, "down", "--name", "t")
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    gone = fencelab(tmp_path, "status", "--name", "t")
    assert gone.returncode == 1 and "not up" in gone.stdout


def test_bad_stack_input_is_one_line_exit_2(tmp_path):
    r = fencelab(tmp_path, "up", "--name", "../escape")
    assert r.returncode == 2 and "invalid stack name" in r.stderr and "Traceback" not in r.stderr
    r = fencelab(tmp_path, "up", "--servers", "0")
    assert r.returncode == 2 and "--servers must be between 1 and 16" in r.stderr


def test_compose_backend_without_an_engine_says_so(tmp_path):
    # an engine address where none answers (whether or not this machine runs one on the default socket)
    r = fencelab(tmp_path, "up", "--backend", "compose", "--name", "c",
                 DOCKER_HOST=f"unix://{tmp_path / 'no-engine.sock'}")
    assert r.returncode == 2
    assert "Docker engine" in r.stderr and "Traceback" not in r.stderr


def test_ssh_backend_options_are_checked_before_connecting(tmp_path):
    r = fencelab(tmp_path, "up", "--backend", "ssh")
    assert r.returncode == 2 and "at least one --node" in r.stderr
    r = fencelab(tmp_path, "up", "--backend", "ssh", "--node", "10.255.0.1", "--ssh-key", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such file" in r.stderr
    r = fencelab(tmp_path, "up", "--node", "10.255.0.1")
    assert r.returncode == 2 and "--node is for --backend ssh" in r.stderr
