"""The SSH backend for real: Debian's sshd, paramiko, and remote processes owned by pid.

Three groups:
- option and target validation (no SSH at all);
- one sshd on loopback (root namespace, a free port): strict host-key checking,
  the control shell, SFTP, a remote process started, paused, killed and stopped by pid;
- three network-namespace hosts (`NetnsHosts`), each running its own sshd on
  port 22, with one veth from this (root) namespace into the lab's bridge so
  the lab reaches them like remote machines: `SshStack` places Valkey, the
  store and two lease servers there, the `fenced-append` workload runs with
  kernel partitions (`netns_partition`) scheduled in the nemesis lane, the
  checkers judge the history, and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519

from lab.stack.local import StackError
from lab.stack.process import free_port
from lab.stack.remote import RemoteError, RemoteProcess, SshHost, parse_target, remote_process
from lab.stack.ssh import SshOptions, SshStack
from nemesis.ssh import ssh_clock, ssh_partition

SSHD = "/usr/sbin/sshd"
is_root = os.geteuid() == 0
have_sshd = Path(SSHD).is_file()
have_ip = shutil.which("ip") is not None and shutil.which("iptables") is not None
needs_sshd = pytest.mark.skipif(not (is_root and have_sshd),
                                reason="needs root and Debian's openssh-server (scripts/install.sh ssh)")
needs_netns = pytest.mark.skipif(not (is_root and have_sshd and have_ip),
                                 reason="needs root, ip/iptables and sshd (scripts/install.sh ssh)")


# -- keys and sshd ----------------------------------------------------------------
def write_keypair(path: Path) -> str:
    """A fresh ed25519 key in OpenSSH format at `path` (0600); returns the public key line."""
    key = ed25519.Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()))
    os.chmod(path, 0o600)
    return key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()


class Keys:
    """A host key (all test sshds share it), a client key, authorized_keys and known_hosts lines."""

    def __init__(self, d: Path):
        d.mkdir(parents=True, exist_ok=True)
        self.dir = d
        self.host_key, self.client_key = d / "ssh_host_ed25519_key", d / "client_ed25519"
        self.host_pub = write_keypair(self.host_key)
        self.client_pub = write_keypair(self.client_key)
        self.authorized = d / "authorized_keys"
        self.authorized.write_text(self.client_pub + "\n")
        self.known_hosts = d / "known_hosts"

    def pin(self, entries: list[str]) -> Path:
        """known_hosts naming the generated host key for each `host` or `[host]:port` entry."""
        self.known_hosts.write_text("".join(f"{e} {self.host_pub}\n" for e in entries))
        return self.known_hosts


def sshd_config(keys: Keys, name: str, *, port: int = 22, listen: str | None = None) -> Path:
    """An sshd_config for one test sshd: key login as root only, no PAM, its pid file in the test dir."""
    path = keys.dir / f"sshd_config-{name}"
    lines = [f"Port {port}", f"HostKey {keys.host_key}", f"AuthorizedKeysFile {keys.authorized}",
             "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
             "UsePAM no", f"PidFile {keys.dir}/sshd-{name}.pid", "Subsystem sftp internal-sftp",
             "UseDNS no", "PrintMotd no", "PrintLastLog no",
             # the keys live under /tmp (world-writable), which StrictModes refuses for authorized_keys
             "StrictModes no", "LogLevel VERBOSE"]
    if listen:
        lines.append(f"ListenAddress {listen}")
    path.write_text("\n".join(lines) + "\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    return path


def ours(marker: str) -> list[str]:
    """Live processes whose command line mentions `marker` (this test's directory)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
                found.append(f"{p.pid} {' '.join(p.info['cmdline'])[:150]}")
        except psutil.Error:
            pass
    return found


# -- validation (no SSH) ---------------------------------------------------------------
def test_targets_are_parsed_and_bad_ones_named(tmp_path):
    t = parse_target("alice@db-1.example.org:2222")
    assert (t.user, t.host, t.port) == ("alice", "db-1.example.org", 2222)
    assert parse_target("[fd00::1]:22").host == "fd00::1"
    assert parse_target("10.0.0.7", user="ops", port=2200).label == "ops@10.0.0.7:2200"
    for bad, msg in [("", "must be"), ("host:http", "port must be a number"), ("h:70000", "between 1 and 65535"),
                     ("Bad User@h", "invalid user"), ("ho st", "invalid host")]:
        with pytest.raises(ValueError, match=msg):
            parse_target(bad)
    with pytest.raises(ValueError, match="no such file"):
        parse_target("h", key_file=str(tmp_path / "missing"))


def test_options_are_validated_before_any_connection(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    ok = dict(nodes=["10.9.0.1", "10.9.0.2", "10.9.0.3"], known_hosts=str(kh))
    assert SshOptions(**ok).placement() == {"valkey": 1, "store": 2, "lease-1": 2, "lease-2": 3}
    assert SshOptions(nodes=["h"], known_hosts=str(kh)).placement() == {"valkey": 1, "store": 1, "lease-1": 1,
                                                                         "lease-2": 1}
    cases = [
        (dict(nodes=[]), "at least one --node"),
        (dict(ok, nodes=["a", "a"]), "given twice"),
        (dict(ok, known_hosts=str(tmp_path / "nope")), "does not exist"),
        (dict(ok, valkey_node=4), "--valkey-node must be a node number between 1 and 3"),
        (dict(ok, server_nodes=[0]), "--server-nodes"),
        (dict(ok, servers=0), "--servers"),
        (dict(ok, persistence="sometimes"), "--persistence"),
        (dict(ok, remote_dir="relative/dir"), "--remote-dir must be an absolute path"),
        (dict(ok, remote_root="/opt/../etc"), "--remote-root"),
        (dict(ok, server_port=0), "--server-port"),
    ]
    for kw, msg in cases:
        with pytest.raises(StackError, match=msg):
            SshOptions(**kw).validate()


# -- one sshd on loopback ---------------------------------------------------------------
@pytest.fixture
def loopback_sshd(tmp_path):
    """A real sshd on 127.0.0.1:<free port>, owned by pid; yields (keys, port)."""
    keys = Keys(tmp_path / "ssh")
    port = free_port()
    cfg = sshd_config(keys, "lo", port=port, listen="127.0.0.1")
    log = open(tmp_path / "sshd-lo.log", "wb")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not _port_answers("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "sshd-lo.log").read_text()
            time.sleep(0.05)
        yield keys, port
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _port_answers(host: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


@pytest.mark.root
@needs_sshd
def test_host_keys_are_checked_strictly(loopback_sshd, tmp_path):
    keys, port = loopback_sshd
    entry = f"[127.0.0.1]:{port}"
    target = dict(port=port, key_file=str(keys.client_key))

    with pytest.raises(RemoteError, match="known_hosts file .* does not exist"):
        SshHost(parse_target("127.0.0.1", known_hosts=str(tmp_path / "absent"), **target)).connect()
    other = tmp_path / "other_known_hosts"
    other.write_text(f"[127.0.0.2]:{port} {keys.host_pub}\n")
    with pytest.raises(RemoteError, match="host key not found in"):
        SshHost(parse_target("127.0.0.1", known_hosts=str(other), **target)).connect()
    impostor = tmp_path / "impostor_known_hosts"
    impostor.write_text(f"{entry} {write_keypair(tmp_path / 'unrelated_key')}\n")
    with pytest.raises(RemoteError, match="host key does not match"):
        SshHost(parse_target("127.0.0.1", known_hosts=str(impostor), **target)).connect()
    with pytest.raises(RemoteError, match="authentication failed with key file"):
        SshHost(parse_target("127.0.0.1", port=port, key_file=str(tmp_path / "unrelated_key"),
                             known_hosts=str(keys.pin([entry])))).connect()

    host = SshHost(parse_target("127.0.0.1", known_hosts=str(keys.pin([entry])), **target)).connect()
    try:
        assert host.run("id -u").out.strip() == "0"
    finally:
        host.close()
    assert not host.connected


@pytest.mark.root
@needs_sshd
def test_control_shell_sftp_and_a_remote_process(loopback_sshd, tmp_path):
    keys, port = loopback_sshd
    host = SshHost(parse_target("127.0.0.1", port=port, key_file=str(keys.client_key),
                                known_hosts=str(keys.pin([f"[127.0.0.1]:{port}"])))).connect()
    proc = None
    try:
        r = host.run("echo out; echo err >&2; exit 7", check=False)
        assert (r.rc, r.out.split()) == (7, ["out", "err"])
        with pytest.raises(RemoteError, match=r"failed \(exit 3\)"):
            host.run("exit 3")
        assert host.run("cd / && pwd").out.strip() == "/"
        assert host.run("pwd").out.strip() != "/"  # each command in its own subshell: no state carried over
        with pytest.raises(RemoteError, match="timed out after 0.3s"):
            host.run("sleep 5", timeout=0.3)
        assert host.run("echo recovered").out.strip() == "recovered"  # a fresh shell after the timeout

        f = str(tmp_path / "remote-file")
        host.write_file(f, "hello\n", mode=0o600)
        assert host.read_file(f) == b"hello\n" and (os.stat(f).st_mode & 0o777) == 0o600
        assert [p.name for p in Path(tmp_path).iterdir() if p.name.endswith(".tmp")] == []

        web = free_port()
        proc = remote_process("tcp", name="web", argv=[sys.executable, "-m", "http.server", str(web), "--bind",
                                                        "127.0.0.1", "--directory", str(tmp_path)],
                              log_path=tmp_path / "remote" / "logs" / "web.log", ports={"http": web},
                              host="127.0.0.1", remote=host, node="n1", env={"FLAB_MARK": "x y"})
        proc.start(timeout=20)
        ps = psutil.Process(proc.pid)  # the same machine: the pid is a real local process
        assert "http.server" in " ".join(ps.cmdline())
        assert ps.environ().get("FLAB_MARK") == "x y"
        assert os.getsid(proc.pid) == proc.pid  # its own session: the group signal reaches its children
        assert host_sshd_pid(ps) == -1  # re-parented to the host's init, not kept by our control shell
        assert proc.alive() and proc.healthy() and not proc.stopped()

        proc.pause()
        assert wait_for(proc.stopped) and proc.alive()  # the kernel marks it stopped once the signal lands
        with pytest.raises(httpx.TimeoutException):  # stopped: the kernel accepts, nobody answers
            httpx.get(f"http://127.0.0.1:{web}/", timeout=0.5)
        proc.resume()
        assert not proc.stopped() and proc.healthy()

        old = proc.pid
        proc.kill()
        assert not proc.alive()
        assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE
        proc.start(wait=False)  # what the process nemesis does: restart, then poll readiness itself
        proc.wait_healthy(20)
        assert proc.pid != old and proc.alive()
        assert httpx.get(f"http://127.0.0.1:{web}/", timeout=5).status_code == 200

        again = RemoteProcess.from_state(proc.state(), host)  # a later command finds it from state.json
        assert again.alive() and again.pid == proc.pid
        again.start_ticks += 1  # a recycled pid (another start time) is not ours
        assert not again.alive()
        with pytest.raises(Exception, match="not running"):
            again.signal(signal.SIGKILL)

        proc.stop()
        assert not proc.alive()
        assert "GET / HTTP/1.1" in (tmp_path / "remote" / "logs" / "web.log").read_text()  # its log, remotely
    finally:
        if proc is not None and proc.alive():
            proc.stop()
        host.close()
    assert ours(str(tmp_path / "remote")) == []


def wait_for(pred, timeout: float = 5.0) -> bool:
    """Poll `pred` until it holds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.root
@needs_sshd
def test_up_refuses_hosts_that_are_not_ready(loopback_sshd, tmp_path):
    """The install check runs on the host: a missing checkout or program is one line naming node and fix."""
    keys, port = loopback_sshd
    opts = SshOptions(nodes=[f"127.0.0.1:{port}"], key_file=str(keys.client_key),
                      known_hosts=str(keys.pin([f"[127.0.0.1]:{port}"])), remote_root="/nonexistent/fencelab",
                      remote_dir=str(tmp_path / "remote"))
    with pytest.raises(StackError, match=r"^ssh hosts not ready: n1 \(127.0.0.1\): no fencelab checkout at "
                                         r"/nonexistent/fencelab \(--remote-root\)$"):
        SshStack(root=tmp_path / "s1").up(opts)
    fake = tmp_path / "checkout"  # a checkout whose .tools lacks pouchdb-server
    (fake / ".tools" / "venv" / "bin").mkdir(parents=True)
    py = fake / ".tools" / "venv" / "bin" / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    opts.remote_root = str(fake)
    with pytest.raises(StackError, match=r"n1 \(127.0.0.1\): pouchdb-server .*not found at "
                                         + str(fake / ".tools" / "node")):
        SshStack(root=tmp_path / "s2").up(opts)
    assert not (tmp_path / "s2" / "state.json").exists()  # a refused up leaves nothing recorded
    assert list((tmp_path / "remote").glob("*")) == []  # and nothing on the host


def test_proc_stat_parsing_survives_odd_command_names():
    from lab.stack.remote import _stat_fields

    line = "4163 (we ird) name)) S 4063 4063 4063 0 -1 4194304 108 0 0 0 0 0 0 0 20 0 1 0 237751 2535424 280"
    assert _stat_fields(line) == ("S", 237751)
    assert _stat_fields("") is None and _stat_fields("12 (x) R 1 2") is None


def host_sshd_pid(ps: psutil.Process) -> int:
    """The pid of the sshd session process above our control shell (-1 if none)."""
    for parent in ps.parents():
        if parent.name() == "sshd":
            return parent.pid
    return -1


# -- three network-namespace hosts, each with its own sshd ---------------------------------------
HOSTS = ["valkey", "lease-1", "lease-2"]  # n1: Valkey; n2: the store and lease-1; n3: lease-2


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def free_subnet() -> str:
    """A 10.214.x.0/24 that no route of this (root) namespace overlaps, so the lab's veth adds no ambiguity."""
    out = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=True).stdout
    routed = [ipaddress.ip_network(w.split()[0], strict=False) for w in out.splitlines()
              if w.split() and w.split()[0][0].isdigit()]
    for x in range(os.getpid() % 200, os.getpid() % 200 + 250):
        net = ipaddress.ip_network(f"10.214.{x % 250}.0/24")
        if not any(net.overlaps(r) for r in routed):
            return str(net)
    raise RuntimeError("no free 10.214.x.0/24 subnet in this namespace's routes")


class LabLink:
    """One veth from this (root) namespace into the lab's bridge, so the lab reaches the namespace hosts.

    The root end gets an address of the lab's own private subnet and a route to that subnet only:
    traffic through it can only reach the namespaces the test created. Deleting the root end
    deletes its peer in the hub.
    """

    def __init__(self, hosts, subnet: str):
        net = ipaddress.ip_network(subnet)
        self.name = f"flr{os.getpid() % 100000}"
        self.address = str(net.network_address + 254)
        self.hosts = hosts
        run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, text=True)  # noqa: E731
        run("ip", "link", "add", self.name, "type", "veth", "peer", "name", "lab0", "netns", hosts.hub)
        try:
            run("ip", "-n", hosts.hub, "link", "set", "lab0", "master", "br0", "up")
            run("ip", "addr", "add", f"{self.address}/{net.prefixlen}", "dev", self.name)
            run("ip", "link", "set", self.name, "up")
        except BaseException:
            self.delete()
            raise

    def delete(self) -> None:
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)

    def exists(self) -> bool:
        return subprocess.run(["ip", "link", "show", self.name], capture_output=True).returncode == 0


class SshLab:
    """Three namespace hosts running sshd, reachable from the lab; knows what to check at the end."""

    def __init__(self, tmp: Path):
        from nemesis.netns_partition import NetnsHosts

        self.tmp = tmp
        self.keys = Keys(tmp / "ssh")
        self.subnet = free_subnet()
        self.hosts = NetnsHosts(HOSTS, subnet=self.subnet)
        self.link = None
        self.sshd = []
        self.strays: list[str] = []

    def __enter__(self) -> "SshLab":
        self.hosts.create()
        try:
            self.link = LabLink(self.hosts, self.subnet)
            for h in HOSTS:
                cfg = sshd_config(self.keys, h, listen=self.hosts.address(h))
                self.sshd.append(self.hosts.spawn(h, f"sshd-{h}", [SSHD, "-D", "-e", "-f", str(cfg)], port=22,
                                                  log_dir=self.tmp / "sshd-logs"))
            self.keys.pin([self.hosts.address(h) for h in HOSTS])
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Kill strays (anything in our namespaces but the sshd listeners: recorded, so the test fails),
        then delete the lab's veth and the namespaces."""
        try:
            listeners = {p.pid for p in self.sshd}
            for h in HOSTS:
                if self.hosts.netns(h) in netns_names() and not wait_for(lambda: self.pids_in(h) <= listeners, 3.0):
                    for pid in self.pids_in(h) - listeners:  # our namespace: whatever runs there is ours
                        self.strays.append(f"{h}: {pid} {' '.join(psutil.Process(pid).cmdline())[:120]}")
                        os.kill(pid, signal.SIGKILL)
        finally:
            if self.link is not None:
                self.link.delete()
            self.hosts.destroy()  # stops the sshds by pid, removes rules and namespaces; raises if any is left

    @property
    def addresses(self) -> list[str]:
        return [self.hosts.address(h) for h in HOSTS]

    def options(self, **kw) -> SshOptions:
        return SshOptions(nodes=self.addresses, key_file=str(self.keys.client_key),
                          known_hosts=str(self.keys.known_hosts),
                          remote_dir=str(self.tmp / "remote"), **kw)

    def pids_in(self, host: str) -> set[int]:
        """Every process in `host`'s namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts.netns(host)], capture_output=True, text=True).stdout
        return {int(p) for p in out.split()}


@pytest.fixture
def ssh_lab(tmp_path):
    """Three namespace hosts with sshd (root only); checks at the end that nothing of ours is left."""
    with SshLab(tmp_path) as lab:
        yield lab
    assert lab.strays == [], "processes were left running in the namespace hosts (killed now)"
    assert not any(ns.startswith(lab.hosts.prefix) for ns in netns_names()), "a namespace was left behind"
    assert not lab.link.exists(), "the lab's veth was left behind"
    assert all(not p.alive() for p in lab.sshd)
    assert ours(str(tmp_path)) == [], "an sshd, Valkey, store or lease server of ours is still running"


def netns_of(pid: int) -> str:
    """`ip netns identify`: the named namespace a pid lives in."""
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()


def assert_placed(lab: SshLab, stack: SshStack):
    """Each process runs inside its host's namespace, bound to that host's address (not loopback)."""
    st = stack.status()
    where = {"valkey": "valkey", "store": "lease-1", "lease-1": "lease-1", "lease-2": "lease-2"}
    for p in st.processes:
        host = where[p.name]
        assert p.alive and p.host == lab.hosts.address(host), p
        assert netns_of(p.pid) == lab.hosts.netns(host), p
        assert not any(c.laddr.ip.startswith("127.") for c in psutil.Process(p.pid).net_connections("tcp")
                       if c.status == psutil.CONN_LISTEN), p
    assert st.valkey == f"redis://{lab.hosts.address('valkey')}:6379/0"
    assert st.store == f"http://{lab.hosts.address('lease-1')}:5984"
    assert list(st.lease_servers) == [f"http://{lab.hosts.address('lease-1')}:8080",
                                   f"http://{lab.hosts.address('lease-2')}:8080"]
    assert st.up and st.backend == "ssh" and st.client_nodes == st.lease_servers
    return st


PARTITIONS = [  # (start value, the DROP rules it must add: (at host, from host))
    ({"grudge": "isolate-valkey", "target": "lease-1"}, {("lease-1", "valkey"), ("valkey", "lease-1")}),
    ({"grudge": "isolate-server", "target": "lease-2"},
     {("lease-2", "valkey"), ("valkey", "lease-2"), ("lease-2", "lease-1"), ("lease-1", "lease-2")}),
]


@pytest.mark.root
@needs_netns
@pytest.mark.parametrize("workload", ["fenced-append", "lease"])
def test_workload_over_ssh_with_kernel_partitions(ssh_lab, tmp_path, workload):
    """Valkey on n1, the store on n2, lease servers on n2 and n3; the workload under partitions: a valid verdict."""
    import lab.generator as gen
    from lab.history import HistoryWriter, read_history
    from lab.testmap import Test
    from nemesis.netns_partition import netns_partition
    from workloads import get_workload

    stack = SshStack(name="ssh-test", root=tmp_path / "stack")
    try:
        stack.up(ssh_lab.options(servers=2))
        st = assert_placed(ssh_lab, stack)
        test = Test(name=f"ssh-{workload}", workload=workload, time_limit=12, concurrency=4, rate=25,
                    keys=2, seed=11, ttl_ms=1500, run_dir=tmp_path / "run")
        test.run_dir.mkdir()
        test.live.take_status(stack, st)  # as lab.runner does: the stack's addresses, in the run context
        wl = get_workload(test.workload)(test)
        test.live.nodes = wl.nodes(test)
        # the store lives on host lease-1, so the link lease-2 -> lease-1 is lease-2's path to the store
        nem = netns_partition(ssh_lab.hosts, rng=test.seed,
                              links=[("lease-1", "valkey"), ("lease-2", "valkey"), ("lease-2", "lease-1")])
        faults = [gen.sleep(1.5)]
        for value, _ in PARTITIONS:
            faults += [{"f": "start-partition", "value": value}, gen.sleep(3.0), {"f": "stop-partition"},
                       gen.sleep(1.5)]
        phases = [gen.time_limit(test.time_limit, gen.clients(wl.generator, faults)),
                  gen.nemesis({"f": "stop-partition"})]
        if wl.final_generator is not None:  # fenced-append reads every document back
            phases.append(gen.clients(wl.final_generator))
        g = gen.phases(*phases)
        hist_path = test.run_dir / "history.jsonl"
        writer = HistoryWriter(hist_path)
        try:
            asyncio.run(gen.run(test, g, wl.client, nemesis=nem, history_writer=writer,
                                concurrency=test.concurrency, seed=test.seed))
        finally:
            writer.close()
        assert ssh_lab.hosts.rules() == [], "the partition was not healed"
        history = read_history(hist_path)
        results = wl.checker.check(test.to_json(), history, {})
        down = stack.down()
    finally:
        stack.close()
        if stack.processes:
            stack.down()

    # the faults happened, as kernel rules between the namespaces, and were healed
    nem_done = [op for op in history if op["process"] == "nemesis" and op["type"] == "info" and "phase" in
                (op.get("value") or {})]
    starts = [op["value"] for op in nem_done if op["value"]["phase"] == "start"]
    assert [{(r["at"], r["from"]) for r in v["rules"]} for v in starts] == [rules for _, rules in PARTITIONS]
    assert sum(op["value"]["phase"] == "end" for op in nem_done) == 2
    # and they bit: the cut server's client threads got nothing ok during its window (a second after
    # the start, once requests sent before it have finished), and some of their requests reached it
    for i, (value, _) in enumerate(PARTITIONS):
        t0, t1 = window(history, value["target"])
        node = st.lease_servers[int(value["target"].split("-")[1]) - 1]
        during = [op for op in history if op["process"] != "nemesis" and op["type"] != "invoke"
                  and test.nodes[(op["process"] % test.concurrency) % len(test.nodes)] == node
                  and t0 + 1_000_000_000 < op["time"] < t1]
        assert during and all(op["type"] in ("fail", "info") for op in during), [o for o in during if o["type"] == "ok"]
        assert any(op.get("error") != "not_held" for op in during), during  # not only client-side refusals
    if workload == "fenced-append":  # commits went through the servers' fenced boundary into the store
        commits = [op for op in history if op["f"] == "commit" and op["type"] == "ok"]
        reads = [op for op in history if op["f"] == "read" and op["type"] == "ok"]
        assert commits and {f"doc-k{i}" for i in range(test.keys)} <= {r["value"]["doc"] for r in reads}
        # every acknowledged commit is in the document the final phase read back (a retried commit that the
        # boundary answers as a replay is one entry, however many oks it got)
        read = {r["value"]["doc"]: {json.dumps(e) for e in r["value"]["entries"]} for r in reads}
        landed = {(op["value"]["doc"], json.dumps(op["value"].get("entry"))) for op in commits}
        assert landed and all(entry in read[doc] for doc, entry in landed), landed
    assert sum(op["f"] == "acquire" and op["type"] == "ok" for op in history) >= 5

    assert set(down) == {"valkey", "store", "lease-1", "lease-2"}
    for node, names in (("n1", ["valkey"]), ("n2", ["store", "lease-1"]), ("n3", ["lease-2"])):
        for name in names:  # each log was copied back into the run directory
            assert (tmp_path / "stack" / "nodes" / node / "logs" / f"{name}.log").is_file()
    assert (tmp_path / "stack" / "nodes" / "n3" / "audit" / "lease-2.jsonl").stat().st_size > 0
    assert list((tmp_path / "remote").iterdir()) == [], "the remote run directories were not removed"
    assert not (tmp_path / "stack" / "state.json").exists()
    api_keys = [c["api_key"] for c in test.credentials()]
    for f in (tmp_path / "stack" / "nodes").rglob("*"):  # no API key reached a host's logs
        assert not f.is_file() or not any(k in f.read_text(errors="replace") for k in api_keys), f
    for h in HOSTS:  # only the sshd listener itself is left in each namespace
        assert wait_for(lambda: ssh_lab.pids_in(h) <= {p.pid for p in ssh_lab.sshd}), (h, ssh_lab.pids_in(h))
    # the verdict: every checker of the workload accepts the history
    verdicts = {k: (v.get("valid"), v.get("violation_counts")) for k, v in results.get("results", {}).items()}
    assert results["valid"] is True, verdicts


def window(history: list[dict], target: str) -> tuple[int, int]:
    """When the partition that targeted `target` was in force: from its start's completion (rules added)
    to the invocation of the next stop (its heal begins then)."""
    start = next(op["time"] for op in history if op["process"] == "nemesis" and op["f"] == "start-partition"
                 and (op.get("value") or {}).get("phase") == "start" and op["value"].get("target") == target)
    end = next(op["time"] for op in history if op["process"] == "nemesis" and op["f"] == "stop-partition"
               and op["time"] > start)
    return start, end


def nemesis_op(f, value=None):
    return {"type": "info", "process": "nemesis", "f": f, "value": value}


@pytest.mark.root
@needs_netns
async def test_process_clock_and_partition_nemeses_run_on_the_hosts(ssh_lab, tmp_path):
    """kill/pause by remote signals, the clock by a remote offset file, partitions by remote iptables."""
    import redis

    from lab.stack.local import LocalStack
    from nemesis.process_faults import kill, pause

    test = {"name": "ssh-nemeses"}
    stack = SshStack(name="ssh-nemeses", root=tmp_path / "stack")
    try:
        stack.up(ssh_lab.options(servers=2, fake_clocks=True))
        assert_placed(ssh_lab, stack)

        # process nemesis: SIGKILL on the host, restart there (same argv, env and address)
        kn = kill(stack.targets(), rng=0)
        await kn.setup(test)
        old = stack.process("lease-2").pid
        done = (await kn.invoke(test, nemesis_op("start-kill", {"targets": ["lease-2"]})))["value"]
        assert done["phase"] == "start" and done["killed"]["lease-2"]["pid"] == old
        assert not stack.process("lease-2").alive()
        end = (await kn.invoke(test, nemesis_op("stop-kill")))["value"]
        new = stack.process("lease-2").pid
        assert end["restarted"]["lease-2"]["ready"] and new != old
        assert netns_of(new) == ssh_lab.hosts.netns("lease-2")
        assert httpx.get(stack.process("lease-2").url + "/healthz", timeout=5).status_code == 200
        await kn.teardown(test)

        # pause: SIGSTOP on the host; the kernel there reports it stopped; SIGCONT brings it back
        pn = pause(stack.targets(), rng=0)
        done = (await pn.invoke(test, nemesis_op("start-pause", {"targets": ["valkey"]})))["value"]
        assert done["paused"]["valkey"]["stopped"] is True and stack.process("valkey").stopped()
        assert psutil.Process(stack.process("valkey").pid).status() == psutil.STATUS_STOPPED
        await pn.invoke(test, nemesis_op("stop-pause"))
        assert not stack.process("valkey").stopped() and stack.process("valkey").healthy()
        await pn.teardown(test)

        # clock: the remote offset file moves Valkey's TIME (libfaketime on the host)
        vk = redis.Redis.from_url(stack.status().valkey, socket_timeout=2)
        try:
            cn = ssh_clock(stack, rng=0, targets=["valkey"])
            await cn.setup(test)
            done = (await cn.invoke(test, nemesis_op("bump-clock", {"targets": ["valkey"], "delta_s": 3600})))["value"]
            assert done["offsets"] == {"valkey": 3600}
            assert stack.clocks()["valkey"].offset() == 3600
            assert Path(stack.status().clocks["valkey"]).read_text().strip() == "+3600.000"  # shared filesystem
            assert wait_for(lambda: vk.time()[0] - time.time() > 3500)
            await cn.invoke(test, nemesis_op("reset-clock"))
            assert wait_for(lambda: abs(vk.time()[0] - time.time()) < 60)
            await cn.teardown(test)
        finally:
            vk.close()

        # partitions: iptables DROP rules added on the hosts over SSH, tagged, and healed
        part = ssh_partition(stack, rng=0)
        await part.setup(test)
        assert part.pairs == [("lease-1", "valkey"), ("lease-2", "valkey"), ("lease-2", "store")]
        done = (await part.invoke(test, nemesis_op("start-partition",
                                                   {"grudge": "isolate-valkey", "target": "lease-2"})))["value"]
        assert done["phase"] == "start" and done["backend"] == "ssh-iptables"
        assert {(r["at"], r["from"]) for r in done["rules"]} == {("valkey", "lease-2"), ("lease-2", "valkey")}
        assert "flab-ssh-" in ssh_lab.hosts.run("valkey", ["iptables", "-S", "INPUT"]).stdout
        assert not ssh_lab.hosts.can_connect("lease-2", "valkey", 6379, timeout=1.0)
        assert ssh_lab.hosts.can_connect("lease-1", "valkey", 6379)  # the other server still reaches Valkey
        assert (await part.invoke(test, nemesis_op("stop-partition")))["value"]["phase"] == "end"
        assert ssh_lab.hosts.can_connect("lease-2", "valkey", 6379)
        await part.invoke(test, nemesis_op("start-partition", {"grudge": "isolate-server", "target": "lease-2"}))
        assert not ssh_lab.hosts.can_connect("lease-2", "lease-1", 5984, timeout=1.0)  # lease-2 -> the store
        await part.teardown(test)  # the heal sweeps every tagged rule on every host
        for h in HOSTS:
            assert "flab-ssh-" not in ssh_lab.hosts.run(h, ["iptables", "-S", "INPUT"]).stdout
        assert ssh_lab.hosts.can_connect("lease-2", "lease-1", 5984)
        assert stack.status().up

        local = LocalStack(root=tmp_path / "stack")  # a local-backend `down` given this state by mistake
        local.load_state()
        assert local.processes and all(p.pid is None and not p.alive() for p in local.processes)
    finally:
        stack.close()
        later = SshStack(name="ssh-nemeses", root=tmp_path / "stack")  # `fencelab down`, another command
        stopped = later.down()
    assert set(stopped) == {"valkey", "store", "lease-1", "lease-2"}  # with lease-2's pid after its restart
    assert list((tmp_path / "remote").iterdir()) == []  # the run's directories are gone, the base stays
