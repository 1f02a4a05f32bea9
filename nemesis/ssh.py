"""The nemeses of an SSH stack's hosts: iptables partitions between the nodes and libfaketime offset files.

`ssh_partition(stack, ...)` is `NetnsPartition` (its grudges, record and heal) with the DROP rules added on
the hosts over SSH; `ssh_clock(stack, ...)` is `ClockNemesis` writing each host's offset file over SFTP.
The registry builds them when the stack is an `lab.stack.ssh.SshStack` (docs/ssh-backend.md).
"""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

from lab.stack.ssh import SshStack
from nemesis.clock import ClockNemesis
from nemesis.core import NemesisUnavailable, Rounds, as_rng
from nemesis.netns_partition import NetnsPartition
from nemesis.network import DIRECTIONS, _choices, check_grudges
from lab.testmap import Test

__all__ = ["SshPartition", "on_hosts", "ssh_clock", "ssh_partition"]


def ssh_clock(stack: SshStack, *, rng: Any, **kw: Any) -> ClockNemesis:
    """nemesis.clock's ClockNemesis writing the hosts' offset files over SFTP."""
    if not stack.clocks():
        raise NemesisUnavailable("clock: the ssh stack was started without fake clocks (fake_clocks=True)")
    return on_hosts(stack, ClockNemesis(stack.info["clocks"], rng=rng, **kw))


def on_hosts(stack: SshStack, nem: ClockNemesis) -> ClockNemesis:
    """`nem` (clock or server-clock, as the registry builds and draws it) writing each offset file on its own
    host over SFTP: the registry's nemesis holds local FakeClocks at the remote paths, which on another host
    would move nothing."""
    remote = stack.clocks()
    missing = sorted(set(nem.files) - set(remote))
    if missing:
        raise NemesisUnavailable(f"clock: no offset file on the ssh hosts for {', '.join(missing)}")
    nem.files = {name: remote[name] for name in sorted(nem.files)}  # same names, each file on its own host
    return nem


def ssh_partition(stack: SshStack, *, rng: Any, grudges: Any = None, directions: Any = ("both",)) -> "SshPartition":
    """Kernel partitions between the nodes: iptables DROP rules on the hosts (`start-/stop-partition`)."""
    return SshPartition(stack, rng=rng, grudges=grudges, directions=directions)


# -- partitions with iptables on the hosts ------------------------------------------------
class _NodeRules:
    """Link endpoints (valkey, store, lease-N) mapped to their hosts; DROP rules added over SSH."""

    def __init__(self, stack: SshStack):
        self.stack = stack
        self.node_of = {p.name: p.node for p in stack.processes}
        self.names = sorted(self.node_of)
        self.tag = f"flab-ssh-{stack.info.get('run_id', 'run')}"
        self._rules: dict[tuple[str, str], None] = {}  # (at node, from node)

    def address(self, endpoint: str) -> str:
        return self.stack._addr(self.node_of[endpoint])

    def _spec(self, src_node: str) -> str:
        return f"INPUT -s {shlex.quote(self.stack._addr(src_node))} -m comment --comment {self.tag} -j DROP"

    def drop(self, at: str, src: str) -> None:
        """On `at`'s host, drop every packet from `src`'s host."""
        a, s = self.node_of[at], self.node_of[src]
        if (a, s) not in self._rules:
            self.stack.hosts[a].run(f"iptables -w -A {self._spec(s)}")
            self._rules[(a, s)] = None

    def undrop(self, at: str, src: str) -> None:
        """Remove that rule (already gone is fine)."""
        a, s = self.node_of[at], self.node_of[src]
        self.stack.hosts[a].run(f"iptables -w -D {self._spec(s)} 2>/dev/null; true")
        self._rules.pop((a, s), None)

    def heal(self) -> None:
        """Remove every rule carrying our tag on every host."""
        for label, host in self.stack.hosts.items():
            out = host.run("iptables -w -S INPUT").out
            for line in out.splitlines():
                if f"--comment {self.tag}" in line and line.startswith("-A "):
                    host.run(f"iptables -w -D {line[3:]}")
        self._rules = {}


class SshPartition(NetnsPartition):
    """The `partition` nemesis on remote hosts: NetnsPartition's grudges and record, rules added over SSH.

    Links are lease server -> Valkey and lease server -> store between
    different hosts (a link inside one host cannot be cut by address). The
    lab's own links to the hosts are never cut: they carry the SSH sessions
    that heal.
    """

    name = "ssh-partition"

    def __init__(self, stack: SshStack, *, rng: Any, grudges: Any = None, directions: Any = ("both",)):
        if not isinstance(stack, SshStack):
            raise ValueError(f"stack must be an SshStack, got {type(stack).__name__}")
        self.hosts = _NodeRules(stack)
        self.rng = as_rng(rng)
        node_of = self.hosts.node_of
        self.pairs = [(s, b) for s in self.hosts.names if s.startswith("lease-") for b in ("valkey", "store")
                      if b in node_of and node_of[b] != node_of[s]]
        if not self.pairs:
            raise ValueError("ssh partition: no link between different hosts (place Valkey, the store and the "
                             "lease servers on different nodes)")
        self.directions = _choices("directions", directions, DIRECTIONS)
        self.grudges = check_grudges(grudges, self.pairs)
        self.rounds = Rounds(self.rng)  # a start op with no grudge draws one, as NetnsPartition does
        self._active: list[dict[str, str]] = []

    async def setup(self, test: Test) -> None:
        """Every host must have iptables and must not share an address with the lab (the heal needs SSH)."""
        stack = self.hosts.stack
        for label, n in stack.info.get("nodes", {}).items():
            if n["lab_address"] in {m["address"] for m in stack.info["nodes"].values()}:
                raise NemesisUnavailable(f"ssh partition: the lab reaches {label} from {n['lab_address']}, a node's "
                                         "own address; a partition would cut the lab's SSH sessions")
            r = await asyncio.to_thread(stack.hosts[label].run, "iptables -w -S INPUT >/dev/null", check=False)
            if r.rc != 0:
                raise NemesisUnavailable(f"ssh partition: iptables does not work on {label}: {r.out.strip()[-200:]}")

    async def invoke(self, test: Test, op: dict) -> dict:
        """As NetnsPartition, recorded with backend `ssh-iptables`."""
        done = await super().invoke(test, op)
        if isinstance(done.get("value"), dict) and "backend" in done["value"]:
            done["value"]["backend"] = "ssh-iptables"
        return done

