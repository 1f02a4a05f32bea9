"""Kernel partitions with network namespaces and iptables (root), and the one-line refusal otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import lab.stack.netns as netns  # the namespace substrate (its checks and commands are patched below)
from nemesis.core import Nemesis, NemesisUnavailable, running
from nemesis.netns_partition import NetnsHosts, check_netns_available, netns_partition
from nemesis.core import invocation as op

TEST = {"name": "nemesis-netns"}
is_root = os.geteuid() == 0


def netns_names() -> list[str]:
    return [l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                  check=True).stdout.splitlines() if l.strip()]


def root_links() -> list[str]:
    """Interface names in the host's own network namespace."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def test_not_root_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(NemesisUnavailable) as e:
        check_netns_available()
    assert "needs root" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(NemesisUnavailable, match="needs root"):
        NetnsHosts(["c1", "lease-1"]).create()  # refused before anything is created


def test_missing_iptables_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    real_which = netns.shutil.which
    monkeypatch.setattr(netns.shutil, "which", lambda b: None if b == "iptables" else real_which(b))
    with pytest.raises(NemesisUnavailable, match=r"needs iptables on PATH \(apt-get install"):
        check_netns_available()


def test_bad_hosts_are_value_errors():
    with pytest.raises(ValueError, match="at least 2"):
        NetnsHosts(["c1"])
    with pytest.raises(ValueError, match="unique"):
        NetnsHosts(["c1", "c1"])
    with pytest.raises(ValueError, match="private IPv4"):
        NetnsHosts(["c1", "lease-1"], subnet="8.8.8.0/24")
    with pytest.raises(ValueError, match="no '_'"):
        NetnsHosts(["c_1", "lease-1"])


@pytest.mark.root
@pytest.mark.skipif(not is_root, reason="network namespaces need root")
async def test_partition_blocks_then_heals_and_nothing_is_left(tmp_path):
    links_before = root_links()
    hosts = NetnsHosts(["c1", "lease-1", "valkey"])
    hosts.create()
    try:
        assert {hosts.netns(h) for h in hosts.names} | {hosts.hub} <= set(netns_names())
        assert all(ns.startswith(f"flab-{os.getpid()}-") for ns in (hosts.hub, hosts.netns("c1")))
        server = hosts.spawn("lease-1", "http-lease-1", [sys.executable, "-m", "http.server", "8080", "--bind",
                                                         hosts.address("lease-1"), "--directory", str(tmp_path)],
                             port=8080, log_dir=tmp_path)
        vk = hosts.spawn("valkey", "http-valkey", [sys.executable, "-m", "http.server", "8080", "--bind",
                                                   hosts.address("valkey"), "--directory", str(tmp_path)],
                         port=8080, log_dir=tmp_path)
        assert hosts.can_connect("c1", "lease-1", 8080)  # connectivity before
        assert hosts.can_connect("lease-1", "valkey", 8080)

        nem = netns_partition(hosts, rng=0)
        assert isinstance(nem, Nemesis) and nem.fs == {"start-partition", "stop-partition"}
        async with running(nem, TEST):
            done = await nem.invoke(TEST, op("start-partition", {"grudge": "isolate-clients", "target": "lease-1"}))
            v = done["value"]
            assert (v["phase"], v["fault"], v["backend"], v["links"]) == ("start", "partition", "netns", ["c1_lease-1"])
            assert {(r["at"], r["from"]) for r in v["rules"]} == {("lease-1", "c1"), ("c1", "lease-1")}
            assert len(hosts.rules()) == 2
            assert not hosts.can_connect("c1", "lease-1", 8080, timeout=1.0)  # blocked during the partition
            assert hosts.can_connect("lease-1", "valkey", 8080)  # other links untouched
            end = await nem.invoke(TEST, op("stop-partition"))
            assert end["value"]["phase"] == "end" and hosts.rules() == []
            assert hosts.can_connect("c1", "lease-1", 8080)  # restored after the heal

            # one way: the downstream of link lease-1 -> valkey (valkey's packets to lease-1) is dropped at
            # lease-1 and nothing is dropped at valkey; a TCP handshake needs both ways, so it fails
            v = (await nem.invoke(TEST, op("start-partition", {"grudge": "isolate-valkey", "target": "lease-1",
                                                                  "direction": "downstream"})))["value"]
            assert [(r["at"], r["from"]) for r in v["rules"]] == [("lease-1", "valkey")]
            assert [line.split(": ", 1)[0] for line in hosts.rules()] == ["lease-1"]
            assert not hosts.can_connect("lease-1", "valkey", 8080, timeout=1.0)
            # left active on purpose: leaving `running` must heal it
        assert hosts.rules() == []
        assert hosts.can_connect("lease-1", "valkey", 8080)
    finally:
        hosts.destroy()
    assert not any(ns.startswith(hosts.prefix) for ns in netns_names())  # no namespace
    assert root_links() == links_before  # no veth or bridge in the host namespace
    assert not server.alive() and not vk.alive()  # no process
    assert hosts.leftovers() == []


@pytest.mark.root
@pytest.mark.skipif(not is_root, reason="network namespaces need root")
def test_a_failed_create_deletes_what_it_made(monkeypatch):
    real_run = netns._run

    def failing(argv, **kw):
        if "addr" in argv and "add" in argv and argv[2].endswith("-1"):
            raise RuntimeError("simulated failure adding an address")
        return real_run(argv, **kw)

    monkeypatch.setattr(netns, "_run", failing)
    hosts = NetnsHosts(["c1", "lease-1"])
    with pytest.raises(RuntimeError, match="simulated failure"):
        hosts.create()
    assert not any(ns.startswith(hosts.prefix) for ns in netns_names())


@pytest.mark.root
@pytest.mark.skipif(not is_root, reason="network namespaces need root")
async def test_setup_refuses_hosts_not_created():
    nem = netns_partition(NetnsHosts(["c1", "lease-1"]), rng=0)
    with pytest.raises(NemesisUnavailable, match="not created"):
        await nem.setup(TEST)
