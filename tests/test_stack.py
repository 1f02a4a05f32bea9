"""The local stack's process owners against the real programs (valkey-server, pouchdb-server, Toxiproxy)."""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest
import redis

from lab.stack.process import ManagedProcess, ProcessError, free_port, port_open
from lab.stack.store import PouchDBProcess
from lab.stack.toxiproxy import ToxiproxyProcess
from lab.stack.valkey import ValkeyProcess, valkey_argv


def wait_for(pred, timeout=5.0):
    """Poll `pred` until true (signals are delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


@pytest.mark.parametrize("mode,appendonly,fsync", [("none", "no", None), ("everysec", "yes", "everysec"),
                                                   ("always", "yes", "always")])
def test_valkey_persistence_modes_are_applied(run_dir, mode, appendonly, fsync):
    v = ValkeyProcess(run_dir, persistence=mode).start()
    try:
        c = redis.Redis.from_url(v.url)
        assert c.config_get("appendonly")["appendonly"] == appendonly
        if fsync:
            assert c.config_get("appendfsync")["appendfsync"] == fsync
        assert c.config_get("bind")["bind"] == "127.0.0.1"
        c.close()
    finally:
        v.stop()
    assert not v.alive()
    assert not port_open("127.0.0.1", v.port)
    assert v.log_path.exists() and "Ready to accept connections" in v.log_path.read_text()


def test_valkey_aof_survives_kill_and_restart(run_dir):
    v = ValkeyProcess(run_dir, persistence="always").start()
    try:
        c = redis.Redis.from_url(v.url)
        c.set("fence", 41)
        c.incr("fence")
        c.close()
        v.kill()
        assert not v.alive()
        v.start()
        c = redis.Redis.from_url(v.url)
        assert c.get("fence") == b"42"
        c.close()
    finally:
        v.stop()


def test_bad_persistence_mode_is_refused_before_start(run_dir):
    with pytest.raises(ValueError, match="persistence must be one of"):
        valkey_argv(free_port(), run_dir, "sometimes")


def test_pause_and_resume_stop_and_continue_serving(run_dir):
    v = ValkeyProcess(run_dir).start()
    try:
        v.pause()
        assert wait_for(lambda: psutil.Process(v.pid).status() == psutil.STATUS_STOPPED)
        c = redis.Redis.from_url(v.url, socket_timeout=0.3)
        with pytest.raises(redis.TimeoutError):
            c.ping()
        v.resume()
        c2 = redis.Redis.from_url(v.url, socket_timeout=2)
        assert c2.ping()
        c.close(), c2.close()
    finally:
        v.stop()


def test_stop_handle_from_state_kills_by_pid_and_ignores_recycled_pid(run_dir):
    v = ValkeyProcess(run_dir).start()
    handle = ManagedProcess.from_state(v.state())
    assert handle.alive()
    forged = ManagedProcess.from_state(dict(v.state(), create_time=1.0))  # same pid, other start time
    assert not forged.alive(), "a pid whose start time differs is not ours and must never be signalled"
    handle.stop()
    v._reap(5)
    assert not v.alive()


def test_start_failure_reports_the_log(run_dir):
    p = ManagedProcess(name="bad", argv=["sh", "-c", "echo boom-marker; exit 3"], log_path=run_dir / "bad.log",
                       ports={"x": free_port()})
    with pytest.raises(ProcessError, match="boom-marker"):
        p.start(timeout=5)


def test_pouchdb_store_is_a_couchdb_api_with_rev_mvcc(run_dir):
    s = PouchDBProcess(run_dir).start()
    try:
        h = {"Content-Type": "application/json"}
        assert httpx.put(f"{s.url}/db1", timeout=5).status_code == 201
        r = httpx.put(f"{s.url}/db1/doc", json={"n": 1}, headers=h, timeout=5)
        assert r.status_code == 201
        rev = r.json()["rev"]
        stale = httpx.put(f"{s.url}/db1/doc", json={"n": 2}, headers=h, timeout=5)  # no _rev: conflict
        assert stale.status_code == 409
        ok = httpx.put(f"{s.url}/db1/doc", json={"n": 2, "_rev": rev}, headers=h, timeout=5)
        assert ok.status_code == 201
        assert httpx.get(f"{s.url}/db1/doc", timeout=5).json()["n"] == 2
    finally:
        s.stop()
    assert not s.alive()


def test_toxiproxy_server_starts_and_stops(run_dir):
    t = ToxiproxyProcess(run_dir).start()
    try:
        assert httpx.get(f"{t.url}/version", timeout=5).status_code == 200
        assert httpx.get(f"{t.url}/proxies", timeout=5).json() == {}
    finally:
        t.stop()
    assert not port_open("127.0.0.1", t.ports["api"])


def test_stop_reaches_a_paused_process(run_dir):
    v = ValkeyProcess(run_dir).start()
    v.pause()
    v.stop(timeout=5)
    assert not v.alive()
    with pytest.raises(ProcessError):
        v.signal(signal.SIGCONT)


def test_free_ports_are_below_the_ephemeral_range_where_no_outgoing_connection_takes_them():
    """A port from the kernel's ephemeral range can be taken as an outgoing connection's source port before
    the program we start binds it (etcd failed to start so in CI): free_port draws below that range."""
    import socket

    from lab.stack.process import _ephemeral_low, free_port

    low = _ephemeral_low()
    ports = [free_port() for _ in range(100)]
    assert all(10000 <= p < low for p in ports), [p for p in ports if not 10000 <= p < low]
    assert len(set(ports)) > 90  # drawn, not one port over and over
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # free when returned


def test_free_port_never_hands_out_a_port_twice():
    # a port drawn for a process that has not bound it yet is still free to bind, so without memory a later draw
    # (a proxy's listen port, say) could return it: etcd-3 then failed start-up with "address already in use"
    ports = [free_port() for _ in range(2000)]  # 2,000 of ~22,000: a repeat is near certain by chance alone
    assert len(set(ports)) == len(ports)
