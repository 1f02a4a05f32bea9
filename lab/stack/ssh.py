"""The SSH stack: Valkey, the store and the lease servers on remote hosts, driven over SSH (paramiko).

`SshStack` offers what `LocalStack` offers (`up`, `status`, `process`,
`down`, a `state.json` that a later `down` reads) for processes that run on
other machines, reached with `SshHost` (strict host-key checking against a
known_hosts file). Nodes are numbered n1..nN in the order given; by default
Valkey runs on n1, the store on n2 and the lease servers on n2..nN (each on
n1 when there is one node).

"Install" is a check, not a copy: every host must hold the same fencelab
checkout at `remote_root` (default: this checkout's path), installed there
with `scripts/install.sh`. `up` logs in, runs the checkout's own
`lab.paths` lookups remotely and compares a digest of the lease server's
source with the local one, and refuses (one line per problem) a host that
lacks a program or runs different server code. Hosts that share this
machine's filesystem (network namespaces, the test's case) pass the check
trivially; real hosts need the checkout synced first (docs/ssh-backend.md).

Per run, each host gets its own directory `<remote_dir>/<stack>-<run id>/<node>/`
(logs, audit logs, data, the principals file uploaded over SFTP, libfaketime
offset files). `down` stops every process by pid, copies the logs and audit
logs back into `<stack dir>/nodes/<node>/` over SFTP, and removes the remote
run directory (only one carrying our marker file). API keys never leave the
lab machine: hosts get the principals file, which holds salted key hashes.

The nemeses run on the hosts: the process nemesis through
`RemoteProcess.kill/pause/resume/start` (`nemesis.process_faults.kill(stack.targets(), ...)`),
the clock nemesis through remote offset files (`nemesis.ssh.ssh_clock(stack, ...)`) and
partitions through iptables DROP rules on the hosts (`nemesis.ssh.ssh_partition(stack, ...)`).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from lab import __version__
from lab.paths import REPO_ROOT
from lab.server.auth import provision_demo_principals, write_principals_file
from lab.server.mutants import MUTANT_NAMES
from lab.stack.base import ProcessRow, write_private_json
from lab.stack.errors import StackError, fencelab_home, stack_dir  # noqa: F401 - re-exported
from lab.stack.lifecycle import ProcessStack
from lab.stack.process import ProcessError, port_open
from lab.stack.remote import (RemoteError, RemoteFakeClock, RemoteProcess, SshHost, SshTarget, parse_target,
                              remote_process)
from lab.stack.valkey import PERSISTENCE_MODES, valkey_argv
from lab.testmap import servers_problem

__all__ = ["SshOptions", "SshStack", "server_digest"]

MARKER = ".fencelab-run"
RUN_SUBDIRS = ("logs", "audit")  # what down() copies back


def server_digest(root: Path = REPO_ROOT) -> str:
    """sha256 over the lease server's source (lab/server: .py and .lua), to prove a host runs the same code."""
    h = hashlib.sha256()
    base = Path(root) / "lab" / "server"
    for p in sorted(list(base.rglob("*.py")) + list(base.rglob("*.lua"))):
        h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


# Run remotely with the checkout's own Python: what this host can run, as JSON.
_CHECK = r"""
import json, os, subprocess, sys
out = {"python": sys.executable, "missing": {}, "paths": {}}
try:
    import lab
    from lab import paths
    from lab.stack.ssh import server_digest
    out["version"] = lab.__version__
    out["digest"] = server_digest(paths.REPO_ROOT)
    for name in sys.argv[1].split(","):
        if not name:
            continue
        try:
            out["paths"][name] = str({"valkey": paths.valkey_server, "pouchdb": paths.pouchdb_server,
                                      "node": paths.node, "libfaketime": paths.libfaketime}[name]())
        except Exception as e:
            out["missing"][name] = str(e)
    if sys.argv[2] == "1":
        h = subprocess.run([sys.executable, "-m", "lab.server", "--help"], capture_output=True, text=True, timeout=60)
        out["store_url"] = "--store-url" in h.stdout
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@dataclass
class SshOptions:
    """What `SshStack.up` starts and where; validated eagerly (before any connection)."""

    nodes: list[str] = field(default_factory=list)  # "[user@]host[:port]", in order n1, n2, ...
    user: str = "root"
    port: int = 22
    key_file: str | None = None
    known_hosts: str | None = None  # default ~/.ssh/known_hosts; unknown hosts are refused, never added
    remote_root: str = str(REPO_ROOT)  # the fencelab checkout (with .tools/) on every host
    remote_dir: str = "/tmp/fencelab"  # under which each run gets its own directory per host
    servers: int = 2
    valkey_node: int = 1  # 1-based node numbers
    store_node: int | None = None  # default n2 (n1 with one node)
    server_nodes: list[int] | None = None  # default n2..nN round-robin (n1 with one node)
    persistence: str = "none"
    store: bool = True
    fake_clocks: bool = False
    valkey_port: int = 6379
    store_port: int = 5984
    server_port: int = 8080  # the next ones for a second server on the same node
    connect_timeout: float = 10.0
    mutant: str = ""  # a planted bug in every lease server (lab/server/mutants, docs/mutants.md); "" = none

    def validate(self) -> list[SshTarget]:
        """Check every option; the parsed targets, or StackError naming the bad option."""
        if not self.nodes:
            raise StackError("the ssh backend needs at least one --node [user@]host[:port]")
        try:
            targets = [parse_target(n, user=self.user, port=self.port, key_file=self.key_file,
                                    known_hosts=self.known_hosts, connect_timeout=self.connect_timeout)
                       for n in self.nodes]
        except ValueError as e:
            raise StackError(str(e)) from None
        dup = sorted({f"{t.host}:{t.port}" for t in targets if sum(u.host == t.host and u.port == t.port
                                                                    for u in targets) > 1})
        if dup:
            raise StackError(f"--node given twice: {', '.join(dup)}")
        kh = targets[0].known_hosts_path()
        if not kh.is_file():
            raise StackError(f"--known-hosts {kh} does not exist: add the hosts' keys first (strict host-key checking)")
        n = len(targets)
        if servers_problem(self.servers):  # the one range check of a server count (lab.testmap)
            raise StackError(servers_problem(self.servers))
        if self.persistence not in PERSISTENCE_MODES:
            raise StackError(f"--persistence must be one of {', '.join(PERSISTENCE_MODES)}, not {self.persistence!r}")
        if self.mutant:
            if self.mutant not in MUTANT_NAMES:
                raise StackError(f"--mutant: unknown mutant {self.mutant!r}; known: {', '.join(MUTANT_NAMES)}")
        for opt, node in (("--valkey-node", self.valkey_node), ("--store-node", self.store_node)):
            if node is not None and not (isinstance(node, int) and 1 <= node <= n):
                raise StackError(f"{opt} must be a node number between 1 and {n}, not {node!r}")
        if self.server_nodes is not None:
            bad = [s for s in self.server_nodes if not (isinstance(s, int) and 1 <= s <= n)]
            if bad or not self.server_nodes:
                raise StackError(f"--server-nodes must be node numbers between 1 and {n}, not {self.server_nodes!r}")
        for opt, p in (("--valkey-port", self.valkey_port), ("--store-port", self.store_port),
                       ("--server-port", self.server_port)):
            if not (isinstance(p, int) and 1 <= p <= 65535 - 16):
                raise StackError(f"{opt} must be a TCP port between 1 and 65519, not {p!r}")
        for opt, d in (("--remote-root", self.remote_root), ("--remote-dir", self.remote_dir)):
            if not (isinstance(d, str) and d.startswith("/") and ".." not in d.split("/") and "\n" not in d):
                raise StackError(f"{opt} must be an absolute path without '..', not {d!r}")
        return targets

    def placement(self) -> dict[str, int]:
        """Process name -> 1-based node number: valkey, store, lease-1..lease-N."""
        n = len(self.nodes)
        place = {"valkey": self.valkey_node}
        if self.store:
            place["store"] = self.store_node or (2 if n >= 2 else 1)
        nodes = self.server_nodes or (list(range(2, n + 1)) if n >= 2 else [1])
        for i in range(self.servers):
            place[f"lease-{i + 1}"] = nodes[i % len(nodes)]
        return place


@dataclass
class SshStack(ProcessStack):
    """A named stack whose processes run on remote hosts over SSH; the lifecycle of LocalStack
    (`lab.stack.lifecycle.ProcessStack`), each process a `RemoteProcess` on its node."""

    backend = "ssh"
    stop_errors = (ProcessError, RemoteError)

    name: str = "default"
    home: Path | None = None
    root: Path | None = None  # an explicit local state directory instead of home/stacks/name
    processes: list[RemoteProcess] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    hosts: dict[str, SshHost] = field(default_factory=dict)  # node label -> connection

    # -- up ---------------------------------------------------------------------
    def _check(self, opts: SshOptions) -> None:
        self._targets = opts.validate()

    def _initial_info(self, opts: SshOptions) -> dict[str, Any]:
        self.close()
        self.hosts = {}
        run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
        return {"name": self.name, "backend": "ssh", "dir": str(self.dir), "run_id": run_id,
                "options": {k: v for k, v in vars(opts).items()}, "credentials": str(self.credentials_file),
                "nodes": {}}

    def _start_all(self, opts: SshOptions) -> None:
        """Connect, check every host, start everything."""
        for i, t in enumerate(self._targets, start=1):
            self._add_node(f"n{i}", t, opts, self.info["run_id"])
        self.save_state()
        tools = self._check_hosts(opts)
        self._start_processes(opts, tools)

    def _cleanup_after(self, error: BaseException) -> None:
        try:
            self.down()
        except StackError:
            pass  # the original failure is the one to report

    def _add_node(self, label: str, target: SshTarget, opts: SshOptions, run_id: str) -> None:
        """Log in to one host and record where its run directory is."""
        try:
            host = SshHost(target).connect()
            lab_addr, addr = host.connection_addresses()
        except RemoteError as e:
            raise StackError(f"{label}: {e}") from None
        self.hosts[label] = host
        rdir = f"{opts.remote_dir.rstrip('/')}/{self.name}-{run_id}/{label}"
        self.info["nodes"][label] = {"host": target.host, "port": target.port, "user": target.user,
                                     "key_file": target.key_file, "known_hosts": target.known_hosts,
                                     "connect_timeout": target.connect_timeout, "address": addr,
                                     "lab_address": lab_addr, "dir": rdir}

    def _check_hosts(self, opts: SshOptions) -> dict[str, dict[str, Any]]:
        """The "install" step: each host has the checkout, the programs its roles need and the same server code."""
        place = opts.placement()
        local_digest = server_digest()
        problems, tools = [], {}
        py = f"{opts.remote_root}/.tools/venv/bin/python"
        for label, host in self.hosts.items():
            roles = {name for name, n in place.items() if f"n{n}" == label}
            need = set()
            if "valkey" in roles:
                need.add("valkey")
            if "store" in roles:
                need |= {"pouchdb", "node"}
            if opts.fake_clocks and roles - {"store"}:
                need.add("libfaketime")
            servers = any(r.startswith("lease-") for r in roles)
            where = f"{label} ({host.target.host})"
            cmd = (f"cd {shlex.quote(opts.remote_root)} 2>/dev/null || {{ echo 'no directory'; exit 3; }}; "
                   f"test -x {shlex.quote(py)} || {{ echo 'no python'; exit 4; }}; "
                   f"FENCELAB_TOOLS={shlex.quote(opts.remote_root + '/.tools')} {shlex.quote(py)} "
                   f"-c {shlex.quote(_CHECK)} "
                   f"{','.join(sorted(need)) or ','} {1 if servers and opts.store else 0}")
            try:
                r = host.run(cmd, timeout=120.0, check=False)
            except RemoteError as e:
                problems.append(f"{where}: {e}")
                continue
            if r.rc == 3:
                problems.append(f"{where}: no fencelab checkout at {opts.remote_root} (--remote-root)")
                continue
            if r.rc == 4:
                problems.append(f"{where}: {py} is missing: run scripts/install.sh in {opts.remote_root} there")
                continue
            try:
                found = json.loads(r.out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                problems.append(f"{where}: the host check printed no answer: {r.out.strip()[-300:]}")
                continue
            if "error" in found:
                problems.append(f"{where}: fencelab does not import with {py}: {found['error']}")
                continue
            if found.get("version") != __version__:
                problems.append(f"{where}: fencelab {found.get('version')} there, {__version__} here")
            elif found.get("digest") != local_digest:
                problems.append(f"{where}: its lab/server source differs from this checkout's: sync {opts.remote_root}")
            problems += [f"{where}: {msg}" for msg in found["missing"].values()]
            tools[label] = dict(found["paths"], python=py, store_url=found.get("store_url", False))
        if problems:
            raise StackError("ssh hosts not ready: " + "; ".join(problems))
        return tools

    def _start_processes(self, opts: SshOptions, tools: dict[str, dict[str, Any]]) -> None:
        """Valkey, then the store, then the lease servers, each on its node, bound to the node's address."""
        place = {name: f"n{n}" for name, n in opts.placement().items()}
        for label, host in self.hosts.items():  # the run directory, marked as ours (down removes only marked ones)
            rdir = self._rdir(label)
            host.run(f"mkdir -p {shlex.quote(rdir)}/logs && echo {shlex.quote(self.info['run_id'])} > "
                     f"{shlex.quote(rdir)}/{MARKER}")
        vnode = place["valkey"]
        vaddr = self._addr(vnode)
        self._check_port_free(vnode, opts.valkey_port)
        data = f"{self._rdir(vnode)}/valkey"
        # valkey_argv is the local stack's command line; only the binary's path differs on the host
        # protected mode only lets loopback in when there is no password: the lease servers on other hosts
        # must get in (the address is the node's own; docs/ssh-backend.md says to keep that network private)
        argv = [tools[vnode]["valkey"], *valkey_argv(opts.valkey_port, PurePosixPath(data), opts.persistence,
                                                     host=vaddr)[1:], "--protected-mode", "no"]
        valkey = self._start_remote("valkey", "valkey", vnode, argv, {"valkey": opts.valkey_port}, data,
                             self._clock_env("valkey", vnode, opts, tools))
        self.info["valkey"] = f"redis://{vaddr}:{valkey.ports['valkey']}/0"

        records, credentials = provision_demo_principals()
        principals = self.dir / "principals.json"
        write_principals_file(records, principals)
        write_private_json(self.credentials_file, credentials)  # API keys stay on the lab machine
        store_url = None
        if opts.store:
            snode = place["store"]
            self._check_port_free(snode, opts.store_port)
            data = f"{self._rdir(snode)}/store"
            argv = [tools[snode]["node"], tools[snode]["pouchdb"], "--host", self._addr(snode),
                    "--port", str(opts.store_port), "--dir", data, "--no-stdout-logs"]
            self._start_remote("store", "store", snode, argv, {"http": opts.store_port}, data, None)
            store_url = self.info["store"] = f"http://{self._addr(snode)}:{opts.store_port}"

        self.info["lease_servers"] = []
        per_node: dict[str, int] = {}
        for name in sorted((n for n in place if n.startswith("lease-")), key=lambda n: int(n.split("-")[1])):
            node = place[name]
            port = opts.server_port + per_node.get(node, 0)
            per_node[node] = per_node.get(node, 0) + 1
            self._check_port_free(node, port)
            rdir = self._rdir(node)
            remote_principals = f"{rdir}/principals.json"
            self.hosts[node].write_file(remote_principals, principals.read_bytes(), mode=0o600)
            argv = [tools[node]["python"], "-m", "lab.server", "--host", self._addr(node), "--port", str(port),
                    "--valkey-url", self.info["valkey"], "--principals", remote_principals, "--instance-id", name,
                    "--audit-log", f"{rdir}/audit/{name}.jsonl"]
            if store_url and tools[node].get("store_url"):
                argv += ["--store-url", store_url]
            if opts.mutant:  # a planted bug (lab runs only): the host runs this checkout's server (source hash)
                argv += ["--allow-mutants", "--mutant", opts.mutant]
            srv = self._start_remote(name, "lease", node, argv, {"http": port}, rdir, self._clock_env(name, node, opts, tools))
            self.info["lease_servers"].append(srv.url)
            self.info["client_nodes"] = list(self.info["lease_servers"])
            self.save_state()

    def _clock_env(self, name: str, node: str, opts: SshOptions,
                   tools: dict[str, dict[str, Any]]) -> dict[str, str] | None:
        """libfaketime settings (those of lab.stack.faketime.faketime_env) with a remote offset file, created at +0."""
        if not opts.fake_clocks:
            return None
        path = f"{self._rdir(node)}/clocks/{name}.rc"
        self.hosts[node].run(f"mkdir -p {shlex.quote(str(PurePosixPath(path).parent))}")
        RemoteFakeClock(self.hosts[node], path).reset()
        self.info.setdefault("clocks", {})[name] = path
        self.info.setdefault("clock_nodes", {})[name] = node
        return {"LD_PRELOAD": tools[node]["libfaketime"], "FAKETIME_TIMESTAMP_FILE": path,
                "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def _check_port_free(self, node: str, port: int) -> None:
        """Refuse a port something already answers on (another stack, or a system service)."""
        if port_open(self._addr(node), port, timeout=1.0):
            raise StackError(f"port {port} on {node} ({self._addr(node)}) is already in use")

    def _start_remote(self, name: str, kind: str, node: str, argv: list[str], ports: dict[str, int], cwd: str,
                      env: dict[str, str] | None) -> RemoteProcess:
        """Start one process on `node` (ProcessStack._start records it in state.json at once)."""
        proc = remote_process(kind, name=name, argv=[str(a) for a in argv],
                              log_path=PurePosixPath(f"{self._rdir(node)}/logs/{name}.log"), ports=ports, env=env,
                              cwd=cwd, host=self._addr(node), remote=self.hosts[node], node=node,
                              on_start=self._started)
        try:
            return self._start(proc, timeout=60.0)
        except (ProcessError, RemoteError) as e:
            raise StackError(f"{name} on {node}: {e}") from None

    def _started(self, proc: RemoteProcess) -> None:
        """A process got a (new) pid: record it, so a later `down` stops the right one."""
        if proc in self.processes:
            self.save_state()

    def _rdir(self, node: str) -> str:
        return self.info["nodes"][node]["dir"]

    def _addr(self, node: str) -> str:
        return self.info["nodes"][node]["address"]

    # -- state --------------------------------------------------------------------
    def load_state(self) -> dict[str, Any] | None:
        """Read state.json (if any) into handles (connecting lazily) that can stop the recorded pids."""
        data = self.read_state_file()
        if data is None:
            return None
        if data.get("backend") != "ssh":
            raise StackError(f"{self.state_file} is not an ssh stack's state "
                             f"(backend {data.get('backend', 'local')!r})")
        self.info = {k: v for k, v in data.items() if k != "processes"}
        self.hosts = {label: SshHost(SshTarget(host=n["host"], port=n["port"], user=n["user"], key_file=n["key_file"],
                                               known_hosts=n["known_hosts"], connect_timeout=n["connect_timeout"]))
                      for label, n in self.info.get("nodes", {}).items()}
        self.processes = [self._process_from_state(d) for d in data.get("processes", [])]
        return data

    def _process_from_state(self, d: dict[str, Any]) -> RemoteProcess:
        proc = RemoteProcess.from_state(d, self.hosts.get(d.get("node")))
        proc.on_start = self._started
        return proc

    def _alive(self, p: RemoteProcess) -> bool:
        """Alive, and False when its host does not answer."""
        try:
            return p.alive()
        except RemoteError:
            return False

    def _row(self, p: RemoteProcess) -> ProcessRow:
        return ProcessRow(name=p.name, pid=p.pid, alive=self._alive(p), ports=p.ports, log=str(p.log_path),
                          node=p.node, host=p.host)

    def _status_extras(self) -> dict[str, Any]:
        """LocalStack's fields, plus the nodes (no Toxiproxy here: partitions are iptables rules on the hosts)."""
        return {"toxiproxy": None, "topology": None,
                "nodes": {k: {kk: v[kk] for kk in ("host", "port", "user", "address", "dir")}
                          for k, v in self.info.get("nodes", {}).items()}}

    # -- nemeses on the hosts ---------------------------------------------------------
    def targets(self) -> dict[str, RemoteProcess]:
        """The process nemesis's targets: `nemesis.process_faults.kill(stack.targets(), rng=...)` (or `pause`)."""
        return {p.name: p for p in self.processes}

    def clocks(self) -> dict[str, RemoteFakeClock]:
        """The remote libfaketime offset files (the stack was started with fake_clocks=True)."""
        nodes = self.info.get("clock_nodes", {})
        return {name: RemoteFakeClock(self.hosts[nodes[name]], path)
                for name, path in self.info.get("clocks", {}).items()}

    # -- down ----------------------------------------------------------------------------
    def _stop_error(self, p: RemoteProcess, e: BaseException) -> str:
        return f"{p.name} on {p.node}: {e}"

    def _after_stop(self) -> list[str]:
        """Fetch each node's logs, remove its run directory (when nothing of ours runs there), close the connections."""
        errors = []
        for label, host in self.hosts.items():
            rdir = self.info.get("nodes", {}).get(label, {}).get("dir")
            if not rdir:
                continue
            try:
                self._collect(label, host, rdir)
                if not any(p.node == label and self._alive(p) for p in self.processes):
                    self._remove_run_dir(host, rdir)
            except RemoteError as e:
                errors.append(f"{label}: {e}")
        self.close()
        return errors

    def _collect(self, label: str, host: SshHost, rdir: str) -> None:
        """Copy the node's logs and audit logs into <dir>/nodes/<node>/."""
        local = self.dir / "nodes" / label
        got = host.fetch_tree(rdir, local, subdirs=RUN_SUBDIRS)
        for p in self.processes:
            if p.node == label and (local / "logs" / f"{p.name}.log") in got:
                p.local_log = local / "logs" / f"{p.name}.log"

    def _remove_run_dir(self, host: SshHost, rdir: str) -> None:
        """rm -rf the remote run directory, only when it carries this run's marker."""
        q = shlex.quote(rdir)
        run_id = shlex.quote(self.info.get("run_id", ""))
        host.run(f"if [ \"$(cat {q}/{MARKER} 2>/dev/null)\" = {run_id} ]; then rm -rf {q}; "
                 f"rmdir {shlex.quote(str(PurePosixPath(rdir).parent))} 2>/dev/null; fi; true")

    def close(self) -> None:
        """Close every SSH connection."""
        for h in self.hosts.values():
            h.close()
