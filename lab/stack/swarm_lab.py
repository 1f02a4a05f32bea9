"""A Docker Swarm of several nodes on one machine: one dockerd per node, each in namespaces of its own.

`NamespaceSwarm(root, nodes=3).start()` makes, as root:

    a bridge `fs<id>` on this machine, 10.213.<k>.1/24 (the lab's client reaches the nodes through it)
    per node: a network namespace `fs<id>-nodeN` with a veth into the bridge (10.213.<k>.1N), and in it
              `dockerd` in its own mount and UTS namespace (`unshare --mount --uts`, hostname `nodeN`)
              with its own data-root, exec-root, pid file and socket under `root/nodeN/`
    node1 `docker swarm init`s (the manager), the others join it as workers

and `stop()` removes all of it by what it recorded (each dockerd by pid, the namespaces and the bridge by
name, the node directories), so nothing is left. Images: `provide_images()` puts the local images
(lab/stack/images.py) on the manager, from a cached `docker save` or built there; the Swarm stack copies them
to the other nodes itself (`docker save | docker load`, no registry). This is what the Swarm backend's live tests run on (`tests/test_swarm_live.py`), and what
`docs/beyond-one-machine.md` uses to show `--backend swarm` on one machine.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab import paths
from lab.stack import images
from lab.stack.docker_api import connect_docker, docker_module, one_line
from lab.stack.errors import StackError
from lab.stack.process import ManagedProcess, ProcessError
from lab.stack.swarm import docker_cli

__all__ = ["NamespaceSwarm", "NodeEngine", "can_make_swarm"]


def can_make_swarm() -> str | None:
    """Why this machine cannot make a namespace Swarm (None: it can): root, dockerd, ip, unshare."""
    if os.geteuid() != 0:
        return "making network namespaces and starting dockerd needs root"
    missing = [t for t in ("dockerd", "ip", "unshare", "nsenter", "iptables") if not shutil.which(t)]
    if missing:
        return f"{', '.join(missing)} not installed (make install)"
    return None


@dataclass
class NodeEngine(ManagedProcess):
    """One node's dockerd (started inside its namespaces); healthy once the SDK's ping answers on its socket."""

    socket: str = ""

    def healthy(self) -> bool:
        try:
            client = docker_module().DockerClient(base_url=f"unix://{self.socket}", timeout=2)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # the SDK raises DockerException, requests' errors or OSError: all mean "not yet"
            return False


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """One `ip` command (iproute2: the lab's netns module drives it the same way)."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise StackError(f"`ip {' '.join(args)}` failed: {one_line(r.stderr)}")
    return r


def _iptables(*args: str, check: bool = True) -> None:
    """One `iptables` command on this machine (the lab's netns partitions drive it the same way)."""
    r = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise StackError(f"`iptables {' '.join(args)}` failed: {one_line(r.stderr)}")


@dataclass
class NamespaceSwarm:
    """A Swarm of `nodes` dockerd daemons on this machine (see the module docstring); node1 is the manager."""

    root: Path
    nodes: int = 3
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000:05d}")
    engines: list[NodeEngine] = field(default_factory=list)
    outbound: bool = False  # NAT the nodes out through this machine (for image builds on a node)
    made: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link"|"rule", name), in the order made

    @property
    def bridge(self) -> str:
        return f"fs{self.tag}"

    @property
    def subnet(self) -> str:
        return f"10.213.{int(self.tag) % 250}"

    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def address(self, node: str) -> str:
        """The node's address on the bridge (what the lab dials for its host-mode ports)."""
        return f"{self.subnet}.{10 + int(node.removeprefix('node'))}"

    def socket(self, node: str) -> str:
        return str(self.root / node / "docker.sock")

    def netns(self, node: str) -> str:
        return f"fs{self.tag}-{node}"

    @property
    def manager_url(self) -> str:
        return f"unix://{self.socket('node1')}"

    def client(self, node: str) -> Any:
        return connect_docker(lambda: docker_module().DockerClient(base_url=f"unix://{self.socket(node)}",
                                                                   timeout=120))

    # -- up ------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> "NamespaceSwarm":
        """Make the bridge, the namespaces, the engines and the Swarm; on any failure undo what was made."""
        problem = can_make_swarm()
        if problem:
            raise StackError(f"cannot make a namespace Swarm here: {problem}")
        try:
            self._network()
            for node in self.node_names():
                self.engines.append(self._engine(node, timeout))
            self._join()
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        # bridged frames pass the host's FORWARD chain (br_netfilter), whose policy a host dockerd sets to DROP
        rules = [("filter", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")]
        if self.outbound:  # image builds inside a node fetch Debian packages: NAT the nodes out through this machine
            rules += [("filter", "FORWARD", "-i", self.bridge, "!", "-o", self.bridge, "-j", "ACCEPT"),
                      ("filter", "FORWARD", "-o", self.bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                       "-j", "ACCEPT"),
                      ("nat", "POSTROUTING", "-s", f"{self.subnet}.0/24", "!", "-o", self.bridge, "-j", "MASQUERADE")]
        for table, chain, *spec in rules:
            _iptables("-t", table, "-I", chain, "1", *spec)
            self.made.append(("rule", "\t".join((table, chain, *spec))))
        for node in self.node_names():
            ns, n = self.netns(node), node.removeprefix("node")
            _ip("netns", "add", ns)
            self.made.append(("netns", ns))
            host_end = f"fs{self.tag}h{n}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.made.append(("link", host_end))
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", f"{self.subnet}.1")

    def _engine(self, node: str, timeout: float) -> NodeEngine:
        d = self.root / node
        for sub in ("data", "exec"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        # its own mount namespace hides a system containerd's socket (dockerd would use that one, not its own)
        # and a sysfs of its network namespace (`ip netns exec` would mount one too, but hide the cgroup mounts)
        script = ("set -e; hostname \"$0\"; mkdir -p \"$1\"; mount --rbind /sys/fs/cgroup \"$1\"; "
                  "mount -t sysfs sysfs /sys; mount --move \"$1\" /sys/fs/cgroup; "
                  "if [ -d /run/containerd ]; then mount -t tmpfs none /run/containerd; fi; "
                  "shift; exec dockerd \"$@\"")
        argv = ["nsenter", f"--net=/run/netns/{self.netns(node)}", "unshare", "--mount", "--uts", "--propagation",
                "private", "sh", "-c", script, node, str(d / "cgroup"), "--host", f"unix://{self.socket(node)}", "--data-root", str(d / "data"),
                "--exec-root", str(d / "exec"), "--pidfile", str(d / "dockerd.pid"), "--storage-driver", "overlay2"]
        engine = NodeEngine(name=f"dockerd-{node}", argv=argv, log_path=d / "dockerd.log", socket=self.socket(node))
        try:
            engine.start(timeout=timeout)
        except ProcessError as e:
            raise StackError(f"{node}: dockerd did not come up: {e}") from None
        return engine

    def _join(self) -> None:
        manager = self.client("node1")
        addr = self.address("node1")
        manager.swarm.init(advertise_addr=addr, listen_addr=f"{addr}:2377")
        token = manager.swarm.attrs["JoinTokens"]["Worker"]
        for node in self.node_names()[1:]:
            c = self.client(node)
            c.swarm.join(remote_addrs=[f"{addr}:2377"], join_token=token, advertise_addr=self.address(node),
                         listen_addr=f"{self.address(node)}:2377")
            c.close()
        deadline = time.monotonic() + 60
        while sum(n.attrs["Status"]["State"] == "ready" for n in manager.nodes.list()) < self.nodes:
            if time.monotonic() > deadline:
                raise StackError("the namespace Swarm's nodes did not all become ready in 60 s")
            time.sleep(0.2)
        manager.close()

    def provide_images(self, log: Path, cache: Path | None = None) -> dict[str, float]:
        """The local images (lab/stack/images.py) on the manager: loaded from `cache/<key>.tar` when an earlier
        build left one for the same parts, else built there (its packages come through `outbound`) and saved to
        the cache; seconds taken. The Swarm stack copies them to the other nodes itself (save/load)."""
        cache = Path(cache) if cache is not None else paths.TOOLS / "cache" / "swarm-images"
        tar = cache / f"{_parts_key()}.tar"
        start = time.monotonic()
        if tar.exists():
            docker_cli(f"unix://{self.socket('node1')}", ["load", "-q", "-i", str(tar)], log)
            return {"loaded": round(time.monotonic() - start, 1)}
        run = functools.partial(subprocess.run, env={**os.environ, "DOCKER_HOST": self.manager_url})
        built = images.build_local(log, run)
        cache.mkdir(parents=True, exist_ok=True)
        for old in cache.glob("*.tar"):  # one set kept: the images are about 1 GB
            old.unlink()
        partial = tar.with_suffix(".partial")
        docker_cli(f"unix://{self.socket('node1')}", ["save", "-o", str(partial), *images.LOCAL], log)
        partial.rename(tar)  # whole or absent
        return {**built, "built": round(time.monotonic() - start, 1)}

    # -- down ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every dockerd by pid, then remove the namespaces, the links and the node directories."""
        for engine in reversed(self.engines):
            try:
                engine.stop(timeout=30.0)
            except ProcessError:
                pass  # already gone
        self.engines = []
        for kind, name in reversed(self.made):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            elif kind == "rule":
                table, chain, *spec = name.split("\t")
                _iptables("-t", table, "-D", chain, *spec, check=False)
            else:
                _ip("link", "del", name, check=False)
        self.made = []
        for node in self.node_names():
            d = self.root / node
            if d.exists():
                # dockerd leaves overlay mounts behind only when killed; unmount what is left under its root first
                subprocess.run(["sh", "-c", f"grep -o ' {d}/[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l"],
                               capture_output=True, timeout=60)
                shutil.rmtree(d, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this Swarm is still here (empty after `stop`): namespaces, links, dockerd pids, directories."""
        left = [f"netns {ns}" for ns in _ip("netns", "list", check=False).stdout.split() if ns.startswith(f"fs{self.tag}-")]
        links = _ip("-o", "link", "show", check=False).stdout
        left += [f"link {w}" for w in links.replace("@", " ").split() if w.rstrip(":").startswith(f"fs{self.tag}")]
        for table in ("filter", "nat"):
            rules = subprocess.run(["iptables", "-w", "5", "-t", table, "-S"], capture_output=True, text=True).stdout
            left += [f"iptables {line}" for line in rules.splitlines() if self.bridge in line or f"{self.subnet}.0/" in line]
        left += [f"dir {self.root / n}" for n in self.node_names() if (self.root / n).exists()]
        r = subprocess.run(["pgrep", "-f", "--", f"--data-root {self.root}/"], capture_output=True, text=True)
        left += [f"dockerd pid {p}" for p in r.stdout.split()]
        return left


def _parts_key() -> str:
    """A digest of what goes into the local images (their Dockerfiles and scripts, the lab's source)."""
    h = hashlib.sha256()
    for root in (paths.REPO_ROOT / "compose", paths.REPO_ROOT / "lab"):
        for f in sorted(root.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                h.update(str(f.relative_to(paths.REPO_ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
