"""`fencelab test --backend ssh --hosts FILE`: a whole run on SSH nodes, nemesis included.

The nodes are three network-namespace hosts with real sshd (tests/test_ssh.py's `SshLab`): Valkey on n1, the
store and lease-1 on n2, lease-2 on n3. The run is the runner's own (`run_test`), so the stack, the nemesis
registry (iptables partitions between the hosts, kills by pid over SSH) and the checkers are the ones
`fencelab test` uses.
"""

from __future__ import annotations

import json

import pytest
from test_ssh import SshLab, needs_netns  # the namespace hosts with sshd (pytest puts tests/ on sys.path)

from lab.runner import RunError, run_test, validate
from lab.testmap import Test


def hosts_file(lab: SshLab, path) -> str:
    o = lab.options()
    path.write_text(f"nodes = {json.dumps(lab.addresses)}\nkey_file = {json.dumps(o.key_file)}\n"
                    f"known_hosts = {json.dumps(o.known_hosts)}\nremote_dir = {json.dumps(o.remote_dir)}\n")
    return str(path)


@pytest.mark.root
@needs_netns
def test_a_run_on_ssh_nodes_under_partition_and_kill(tmp_path):
    with SshLab(tmp_path / "lab") as lab:
        test = Test(name="ssh-run", workload="fenced-append", time_limit=12.0, concurrency=4, rate=30.0, keys=2,
                    seed=3, backend="ssh", nemesis=["partition", "kill"], nemesis_interval=2.5,
                    extra={"servers": 2, "hosts_file": hosts_file(lab, tmp_path / "hosts.toml")})
        res = run_test(test, tmp_path / "store")
        strays = list(lab.strays)
    assert strays == []
    run_dir = (tmp_path / "store" / "latest").resolve()
    ops = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines() if line.strip()]
    nem = [op["value"] for op in ops if op["process"] == "nemesis" and isinstance(op.get("value"), dict)]
    rules = [v for v in nem if v.get("phase") == "start" and v.get("rules")]
    kills = [v for v in nem if v.get("killed")]
    assert rules, "no partition added iptables rules on the hosts"
    assert kills, "the kill nemesis killed nothing on the hosts"
    assert all(r["at"] in ("valkey", "lease-1", "lease-2") for v in rules for r in v["rules"])
    for node in ("n1", "n2", "n3"):  # the hosts' logs came back into the run directory
        assert list((run_dir / "stack" / "nodes" / node / "logs").glob("*.log")), node
    assert res["valid"] is True, {k: (v.get("valid"), v.get("reason")) for k, v in res["results"].items()}


@pytest.mark.root
@needs_netns
def test_a_planted_bug_is_caught_on_ssh_nodes(tmp_path):
    """The mutant reaches the remote lease servers (their argv gains --allow-mutants --mutant) and is caught."""
    with SshLab(tmp_path / "lab") as lab:
        test = Test(name="ssh-mutant", workload="lease", time_limit=8.0, concurrency=6, rate=60.0, keys=1,
                    ttl_ms=300, seed=1, backend="ssh",
                    extra={"servers": 2, "hosts_file": hosts_file(lab, tmp_path / "hosts.toml"),
                           "mutant": "release-any-owner"})
        res = run_test(test, tmp_path / "store")
        strays = list(lab.strays)
    assert strays == []
    run_dir = (tmp_path / "store" / "latest").resolve()
    logs = "".join(p.read_text() for p in (run_dir / "stack" / "nodes").glob("n*/logs/lease-*.log"))
    assert logs.count("PLANTED BUG") >= 2, logs[-2000:]  # both remote servers run the planted bug
    assert res["valid"] is False, res.get("results")


def test_the_ssh_backend_refuses_what_it_cannot_do(tmp_path):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('nodes = ["10.200.0.1"]\n')
    base = {"workload": "lease", "backend": "ssh"}
    with pytest.raises(RunError, match="needs --hosts"):
        validate(Test(**base))
    with pytest.raises(RunError, match="cannot run on --backend ssh"):
        validate(Test(**base, nemesis=["latency"], extra={"hosts_file": str(hosts)}))
    with pytest.raises(RunError, match="goes with --backend ssh"):
        validate(Test(workload="lease", extra={"hosts_file": str(hosts)}))
    hosts.write_text('nodes = ["10.200.0.1"]\nkeyfile = "x"\n')
    with pytest.raises(RunError, match="unknown key 'keyfile'"):
        validate(Test(**base, extra={"hosts_file": str(hosts)}))
