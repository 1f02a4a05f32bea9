"""The local stack in network namespaces (`StackOptions(netns=True)`) and the `netns` nemesis on it.

Root only (network namespaces, veths, iptables), except the validation tests:
- `fencelab test --workload fenced-append --nemesis netns` end to end: a valid
  verdict, kernel partitions recorded as start/end ops with their exact rules,
  and nothing left behind (namespace, veth, rule, process);
- a cut between lease-1 and Valkey: lease-1 answers 503 / times out while
  lease-2 serves, and the heal restores it; cuts between the clients (this
  namespace) and a server, both ways and one-way;
- a killed lab run: its servers die with it (PR_SET_PDEATHSIG survives
  `ip netns exec`, which execs), and its namespaces are removed by the next
  `down()` or by `sweep_stale()`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from lab.client import LeaseClient
from lab.stack.local import LocalStack, StackError, StackOptions
from nemesis import registry
from nemesis.core import running
from nemesis.netns_partition import NetnsHosts, netns_partition, sweep_stale
from workloads.common import identity_for, pick_credential
from nemesis.core import invocation as op

ROOT = Path(__file__).resolve().parent.parent
is_root = os.geteuid() == 0
needs_root = pytest.mark.skipif(not is_root, reason="network namespaces, veths and iptables need root")


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def of_pid(pid: int) -> tuple[list[str], list[str]]:
    """The namespaces and root-namespace veths named after lab process `pid`."""
    return ([ns for ns in netns_names() if ns.startswith(f"flab-{pid}-")],
            [link for link in root_links() if link.startswith(f"flab{pid}-")])


def processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line mentions `text` (a test's own directory)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(p.info["cmdline"] or []):
            found.append(f"{p.info['pid']} {' '.join(p.info['cmdline'])[:120]}")
    return found


def wait_for(pred, timeout: float = 10.0, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- validation (no root needed) ---------------------------------------------------------------
@pytest.mark.parametrize("opts, message", [
    ({"toxiproxy": True}, "netns and toxiproxy are mutually exclusive"),
    ({"store_url": "http://db.example:5984"}, "netns cannot use --store-url"),
])
def test_netns_excludes_toxiproxy_and_an_external_store(opts, message):
    with pytest.raises(StackError) as e:
        StackOptions(netns=True, **opts).validate()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_netns_stack_needs_root_in_one_line(monkeypatch):
    import lab.stack.netns

    monkeypatch.setattr(lab.stack.netns.os, "geteuid", lambda: 1000)
    with pytest.raises(StackError, match=r"^netns nemesis needs root .* running as uid 1000$"):
        StackOptions(netns=True).validate()
    from lab.runner import RunError, validate
    from lab.testmap import Test

    with pytest.raises(RunError, match=r"^--nemesis netns: netns nemesis needs root"):
        validate(Test(workload="fenced-append", nemesis=["netns"]))


def test_registry_asks_for_namespaces_and_refuses_toxiproxy_faults_beside_them():
    if is_root:
        assert registry.stack_options("netns,kill") == {"netns": True, "persistence": "always", "recovery_store": True}
        StackOptions(**registry.stack_options("netns,kill,pause,clock")).validate()
    with pytest.raises(ValueError) as e:
        registry.validate_names("netns,latency,slicer")
    assert str(e.value) == ("--nemesis: netns cannot be combined with latency, slicer: netns places the servers "
                            "in network namespaces, the Toxiproxy faults need them on loopback")


def test_outside_endpoint_rules_stay_out_of_the_lab_namespace():
    hosts = NetnsHosts(["valkey", "lease-1"], subnet="10.214.9.0/24", outside="c1")
    assert hosts.endpoints == ["valkey", "lease-1", "c1"]
    assert hosts.address("c1") == "10.214.9.254" and hosts.address("lease-1") == "10.214.9.2"
    assert len(hosts.link) <= 15 and hosts.link.startswith(f"flab{os.getpid()}-")
    # a drop "at" the clients is placed in the sender's OUTPUT chain; a drop of the clients' packets at the server
    assert hosts.placement("c1", "lease-1") == ("lease-1", ["OUTPUT", "-d", "10.214.9.254/32", "-m", "comment",
                                                            "--comment", hosts.prefix, "-j", "DROP"])
    assert hosts.placement("lease-1", "c1")[1][:3] == ["INPUT", "-s", "10.214.9.254/32"]
    with pytest.raises(ValueError, match="'c1' is not a namespace host \\(the lab's own namespace\\)"):
        hosts.netns("c1")
    with pytest.raises(ValueError, match="also a host name"):
        NetnsHosts(["c1", "lease-1"], outside="c1")
    with pytest.raises(ValueError, match="not a NetnsHosts description"):
        NetnsHosts.from_description({"prefix": "x"})
    with pytest.raises(ValueError, match="must start with flab-<pid>-"):
        NetnsHosts.from_description({**hosts.describe(), "hub": "my-own-namespace"})


# -- fencelab test on the netns stack -------------------------------------------------------------
@pytest.mark.root
@needs_root
def test_fencelab_test_with_the_netns_nemesis_is_valid_and_leaves_nothing(tmp_path):
    rules_before = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
    proc = subprocess.Popen([str(ROOT / ".tools/venv/bin/fencelab"), "test", "--workload", "fenced-append",
                             "--nemesis", "netns", "--time-limit", "8", "--nemesis-interval", "1.5", "--seed", "5",
                             "--store-dir", str(tmp_path / "store")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    run = (tmp_path / "store" / "fenced-append" / "latest").resolve()
    results = json.loads((run / "results.json").read_text())
    assert results["valid"] is True, {k: v.get("valid") for k, v in results.get("results", {}).items()}
    test = json.loads((run / "test.json").read_text())
    assert all(u.startswith("http://10.214.") and u.endswith(":8080") for u in test["client_nodes"]), test

    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    nem = [o["value"] for o in history if o["process"] == "nemesis" and o["value"] and "phase" in o["value"]]
    starts = [v for v in nem if v["phase"] == "start"]
    ends = [v for v in nem if v["phase"] == "end"]
    assert len(starts) >= 2 and len(ends) == len(starts), nem
    assert [v["phase"] for v in nem if v["phase"] != "none"] == ["start", "end"] * len(starts)
    for v in starts:
        assert v["backend"] == "netns" and v["fault"] == "partition" and v["rules"], v
        for r in v["rules"]:  # each rule names its namespace (this run's), chain, and the exact addresses
            assert r["netns"].startswith(f"flab-{proc.pid}-") and r["chain"] in ("INPUT", "OUTPUT"), r
            assert r["from_ip"] == v["addresses"][r["from"]]
            if r["at"] == "c1":  # the lab's own firewall is never touched: the sender drops what goes to c1
                assert r["chain"] == "OUTPUT" and f" -d {v['addresses']['c1']}/32 " in r["rule"], r
            else:
                assert r["chain"] == "INPUT" and f" -s {r['from_ip']}/32 " in r["rule"], r
    assert [e["removed"] for e in ends] == [s["rules"] for s in starts]
    assert sum(o["f"] == "commit" and o["type"] == "ok" for o in history) >= 5

    # nothing left: namespaces, the veth, rules (they lived in the namespaces; none in ours), processes
    assert of_pid(proc.pid) == ([], [])
    assert subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout == rules_before
    assert processes_mentioning(str(tmp_path)) == []
    assert not (run / "stack" / "state.json").exists()


# -- partitions between the hosts and the clients ----------------------------------------------------
@pytest.fixture
def netns_stack(tmp_path):
    """Valkey and two lease servers, each in its own namespace; downed (and checked) at the end."""
    stack = LocalStack(name="netns", root=tmp_path / "stack")
    try:
        stack.up(StackOptions(netns=True, servers=2, store=False))
        description = stack.info["netns"]
        yield stack
    finally:
        stack.down()
    assert not any(ns.startswith(description["prefix"] + "-") for ns in netns_names())
    assert description["link"] not in root_links()
    assert processes_mentioning(str(tmp_path)) == []


def lease_api(stack, server: str) -> LeaseClient:
    cred = pick_credential(json.loads(stack.credentials_file.read_text()))
    return LeaseClient(stack.process(server).url, cred["api_key"], service_instance_id="w-1", timeout_s=2.0)


def healthz(url: str) -> int | str:
    """GET /healthz's status, or "timeout"."""
    try:
        return httpx.get(url + "/healthz", timeout=2.0).status_code
    except httpx.TimeoutException:
        return "timeout"


@pytest.mark.root
@needs_root
async def test_lease1_cut_from_valkey_fails_while_lease2_serves_and_heals(netns_stack):
    stack, hosts = netns_stack, netns_stack.netns_hosts
    for p in stack.processes:  # each server runs in its own namespace, on its own address, pid its own
        assert subprocess.run(["ip", "netns", "identify", str(p.pid)], capture_output=True,
                              text=True).stdout.strip() == hosts.netns(p.name)
        assert psutil.Process(p.pid).name() != "ip" and p.host == hosts.address(p.name)
    nem = netns_partition(hosts, rng=3)
    async with running(nem, None), lease_api(stack, "lease-1") as l1, lease_api(stack, "lease-2") as l2:
        assert (await l1.acquire(identity_for("a"), ttl_ms=5000)).ok
        started = await nem.invoke(None, op("start-partition", {"grudge": "isolate-valkey", "target": "lease-1"}))
        v = started["value"]
        assert "error" not in started and v["phase"] == "start" and v["links"] == ["lease-1_valkey"]
        assert v["addresses"] == {"lease-1": hosts.address("lease-1"), "valkey": hosts.address("valkey")}
        assert {(r["at"], r["from"], r["netns"], r["chain"]) for r in v["rules"]} == {
            ("valkey", "lease-1", hosts.netns("valkey"), "INPUT"), ("lease-1", "valkey", hosts.netns("lease-1"), "INPUT")}
        assert len(hosts.rules()) == 2

        cut = await l1.acquire(identity_for("b"), ttl_ms=5000)
        assert not cut.ok and (cut.http_status == 503 or cut.outcome == "info"), cut
        assert healthz(stack.process("lease-1").url) in (503, "timeout")
        assert (await l2.acquire(identity_for("c"), ttl_ms=5000)).ok, "lease-2 still reaches Valkey"
        assert healthz(stack.process("lease-2").url) == 200

        stopped = await nem.invoke(None, op("stop-partition"))
        assert stopped["value"] == {"fault": "partition", "backend": "netns", "phase": "end", "removed": v["rules"]}
        assert hosts.rules() == []
        assert wait_for(lambda: healthz(stack.process("lease-1").url) == 200), "lease-1 did not heal"
        assert (await l1.acquire(identity_for("d"), ttl_ms=5000)).ok


@pytest.mark.root
@needs_root
async def test_cuts_between_the_clients_and_one_server(netns_stack):
    hosts = netns_stack.netns_hosts
    nem = netns_partition(hosts, rng=4, directions=("both", "upstream", "downstream"))
    where = {"upstream": {("lease-2", "c1", "lease-2", "INPUT")},  # requests lost: dropped as they arrive
             "downstream": {("c1", "lease-2", "lease-2", "OUTPUT")}}  # replies lost: dropped as they leave
    where["both"] = where["upstream"] | where["downstream"]
    async with running(nem, None):
        for direction, rules in where.items():
            started = await nem.invoke(None, op("start-partition", {"grudge": "isolate-clients", "target": "lease-2",
                                                                    "direction": direction}))
            v = started["value"]
            assert v["links"] == ["c1_lease-2"] and v["direction"] == direction
            assert {(r["at"], r["from"], r["host"], r["chain"]) for r in v["rules"]} == rules
            # a kernel DROP also loses the handshake's own packets: no new connection either way
            assert not hosts.can_connect("c1", "lease-2", 8080, timeout=0.5)
            assert hosts.can_connect("c1", "lease-1", 8080, timeout=2.0)
            assert (await nem.invoke(None, op("stop-partition")))["value"]["phase"] == "end"
            assert hosts.can_connect("c1", "lease-2", 8080, timeout=2.0)
        assert hosts.rules() == []


# -- a killed run ------------------------------------------------------------------------------
KILLED_RUN = """
import json, sys, time
from lab.stack.local import LocalStack, StackOptions
stack = LocalStack(name="killed", root=sys.argv[1], die_with_parent=True)
status = stack.up(StackOptions(netns=True, servers=1, store=False))
print(json.dumps({"pids": {p.name: p.pid for p in status.processes}, "netns": status.netns}), flush=True)
time.sleep(120)
"""


@pytest.mark.root
@needs_root
@pytest.mark.parametrize("cleanup", ["down", "sweep_stale"])
def test_a_killed_run_dies_whole_and_its_namespaces_are_cleaned(tmp_path, cleanup):
    root = tmp_path / "stack"
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(root)], cwd=ROOT, stdout=subprocess.PIPE,
                           text=True)
    try:
        line = run.stdout.readline()
        assert line, "the run did not bring its stack up"
        st = json.loads(line)
        for name, pid in st["pids"].items():
            assert subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True,
                                  text=True).stdout.strip() == st["netns"]["namespaces"][name]
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
        run.stdout.close()
    # PR_SET_PDEATHSIG was set before `ip netns exec`, which execs the server: it dies with the run
    assert wait_for(lambda: all(dead(pid) for pid in st["pids"].values()), 5.0), st["pids"]
    left_ns, left_link = of_pid(run.pid)
    assert len(left_ns) == 3 and left_link == [st["netns"]["link"]], "a killed run cannot clean up itself"

    if cleanup == "down":
        stopped = LocalStack(name="killed", root=root).down()  # another process, from state.json
        assert stopped == []
    else:
        sweep_stale()  # no state file needed: the creator's pid is in the names
        assert of_pid(run.pid) == ([], [])
        LocalStack(name="killed", root=root).down()  # only state.json is left to remove
    assert wait_for(lambda: of_pid(run.pid) == ([], []), 5.0), of_pid(run.pid)
    assert not (root / "state.json").exists()
    assert processes_mentioning(str(tmp_path)) == []
