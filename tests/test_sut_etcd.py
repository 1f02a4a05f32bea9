"""`--sut etcd`: a real 3-member etcd cluster the lab runs, its lock, the nemeses on its processes, real pauses.

Needs `.tools/bin/etcd` (`scripts/install.sh etcd`, part of `make install`): skipped
with the reason when it is missing, and a failure under CI (CI=true), where
`make test` has just installed it.
"""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import httpx
import psutil
import pytest

from lab import paths
from lab.stack.local import StackOptions
from lab.sut.etcd import EtcdLockSystem, _b64, etcd_binary, etcd_processes, lock_key
from lab.sut.processes import MEMBERS, Placement, SutStack, member_processes_of
from lab.testmap import Test
from tests.conftest import until
from workloads.common import identity_for


@pytest.fixture(autouse=True)
def _etcd_installed():
    try:
        etcd_binary()
    except paths.MissingTool as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: `make test` installs etcd, yet {e}")
        pytest.skip(str(e))


@pytest.fixture
def per_pair_links():
    """The lab can give each member its own /etc/hosts here (root, unshare); skipped with the reason where it
    cannot, a failure under CI (which runs as root)."""
    from lab.sut.processes import own_hosts_problem

    problem = own_hosts_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true runs as root, yet no per-pair member links: {problem}")
        pytest.skip(problem)


@pytest.fixture
def cluster(tmp_path):
    """A running 3-member cluster with the lab's store and a Toxiproxy proxy on every link."""
    stack = SutStack(etcd_processes(Test(extra={"sut": "etcd"})), root=tmp_path / "stack", die_with_parent=True)
    stack.up(StackOptions(store=True, toxiproxy=True))
    yield stack
    stack.down()


def client(stack: SutStack, group: int, member: int, mode: str = "fenced", timeout_s: float = 2.0) -> EtcdLockSystem:
    node = f"http://{stack.info['topology'][f'c{group}_etcd-{member}']['listen']}"
    return EtcdLockSystem(node, stack.store_url_for(node), service_instance_id=f"w{group}{member}",
                          timeout_s=timeout_s, commit_mode=mode)


async def lease_gone(c: EtcdLockSystem, lease) -> bool:
    """etcd has revoked the lease (TimeToLive says TTL -1; an absent TTL is 0 s left, not yet revoked)."""
    r = await c._post("/v3/lease/timetolive", {"ID": str(int(lease.lease_id, 16))}, 2.0)
    return r.status == 200 and str(r.body.get("TTL")) == "-1"


def test_cluster_is_three_lab_owned_members(per_pair_links, cluster):
    members = member_processes_of(cluster)
    assert sorted(members) == ["etcd-1", "etcd-2", "etcd-3"]
    for p in members.values():
        assert p.alive() and p.log_path.exists() and (p.data_dir / "data").is_dir()
        r = httpx.get(f"http://127.0.0.1:{p.ports['client']}/health", timeout=2)
        assert r.json()["health"] == "true"
    topo = cluster.info["topology"]
    assert {"c1_etcd-1", "c2_etcd-3", "etcd-1_etcd-2", "etcd-2_etcd-1", "c1_store"} <= set(topo)
    # the cluster agrees on one peer URL per member, whose port is every sender's own proxy's to it
    argv = " ".join(members["etcd-1"].argv)
    for n in ("etcd-1", "etcd-2", "etcd-3"):
        other = "etcd-2" if n == "etcd-1" else "etcd-1"
        port = topo[f"{other}_{n}"]["listen"].rsplit(":", 1)[1]
        assert f"{n}=http://{n}.fencelab.test:{port}" in argv
    # the pid the lab records is etcd's own (unshare and sh exec it), so kill and pause reach etcd itself
    assert all(psutil.Process(p.pid).name() == "etcd" for p in members.values())
    pids = [p.pid for p in members.values()]
    cluster.down()  # every member stopped by pid; its scratch data (64 MB WAL files) dropped, its log kept
    for p, pid in zip(members.values(), pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert p.log_path.exists() and not p.data_dir.exists()
    assert (cluster.dir / "store").is_dir()  # the store's documents are kept


def test_members_have_a_link_per_sender_and_receiver_and_each_resolves_its_own(tmp_path):
    """No live etcd: the declared links are the client links plus one per (sender, receiver) pair of members, and
    each member's own hosts file maps every member's agreed name to the address of its own proxy to it."""
    decl = etcd_processes(Test(extra={"sut": "etcd"}))
    decl.validate()
    names = ["etcd-1", "etcd-2", "etcd-3"]
    placement = Placement(decl, tmp_path, 2, False)
    placement.set_per_pair()
    links = {(f, t) for f, t, _ in placement.pairs()}
    pairs = {(a, b) for a in names for b in names if a != b}
    assert links == {(f"c{g}", m) for g in (1, 2) for m in names} | pairs  # no shared peer link
    assert placement.pair_links() == pairs
    for a in names:
        agreed = {b: placement.url(MEMBERS, b, "peer") for b in names}
        assert agreed["etcd-2"] == f"http://etcd-2.fencelab.test:{placement.agreed_ports['etcd-2']}"
        hosts = dict(line.split()[::-1] for line in placement.hosts_text(a).splitlines()
                     if line.endswith(".fencelab.test"))
        for b in names:
            if b != a:  # the name of b, in a's hosts, is where the proxy a_b listens
                assert hosts[f"{b}.fencelab.test"] == placement.pair_host(a, b) == f"127.0.{a[-1]}.{b[-1]}"
        argv = placement.in_own_hosts(a, ["etcd", "--name", a])
        assert argv[:3] == ["unshare", "--mount", "--propagation"] and argv[-3:] == ["etcd", "--name", a]
        assert (tmp_path / "hosts" / a).read_text() == placement.hosts_text(a)
    # where a member cannot have its own /etc/hosts: one shared proxy per receiver, as before
    shared = Placement(decl, tmp_path, 1, False)
    assert {(f, t) for f, t, _ in shared.pairs() if f == MEMBERS} == {(MEMBERS, n) for n in names}
    assert shared.in_own_hosts("etcd-1", ["etcd"]) == ["etcd"]


def _peer_bytes(stack: SutStack) -> dict[tuple[str, str], float]:
    """(sender, receiver) -> the raft bytes the receiver has read from the sender, by etcd's own metric
    `etcd_network_peer_received_bytes_total{From=<sender's id>}` (read on each member's real client port)."""
    members = member_processes_of(stack)
    port = next(iter(members.values())).ports["client"]
    listed = httpx.post(f"http://127.0.0.1:{port}/v3/cluster/member/list", json={}, timeout=2).json()["members"]
    name_of = {format(int(m["ID"]), "x"): m["name"] for m in listed}
    out = {}
    for name, proc in members.items():
        text = httpx.get(f"http://127.0.0.1:{proc.ports['client']}/metrics", timeout=2).text
        for line in text.splitlines():
            if line.startswith("etcd_network_peer_received_bytes_total{"):
                sender = line.split('From="', 1)[1].split('"', 1)[0]
                if sender not in name_of:  # From="0": read before the sender was known
                    continue
                out[(name_of[sender], name)] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_partition_of_one_pair_of_members_leaves_the_third_talking_to_both(per_pair_links, cluster):
    """Cut the leader and one follower from each other only (both directions, by the partition nemesis naming
    the two links): the third member still reaches both, the cluster keeps its leader and serves writes, and
    etcd's own byte counters show raft traffic on every link but the two cut."""
    from nemesis import network
    from nemesis.core import invocation
    from lab.sut.etcd import leader_of
    from lab.stack.topology import Topology
    from lab.stack.toxiproxy_api import ToxiproxyClient

    assert cluster.info["peer_links"] == {"mode": "per-pair"}
    leader = leader_of(cluster)
    assert leader is not None
    cut, bridge = [n for n in ("etcd-1", "etcd-2", "etcd-3") if n != leader]
    ident = identity_for("k-pair")

    async def grown(before, links) -> bool:
        now = await asyncio.to_thread(_peer_bytes, cluster)
        return all(now.get(k, 0) > before.get(k, 0) for k in links)

    async def scenario():
        topo = Topology.from_description(ToxiproxyClient(cluster.info["toxiproxy"]), cluster.info["topology"])
        part = network.partition(topo, rng=1)
        await part.setup(None)
        via_bridge = client(cluster, 1, int(bridge[-1]))
        try:
            done = await part.invoke(None, invocation("start-partition", {
                "links": [f"{leader}_{cut}", f"{cut}_{leader}"], "direction": "both"}))
            assert sorted(done["value"]["links"]) == sorted([f"{leader}_{cut}", f"{cut}_{leader}"])
            flowing = [(leader, bridge), (bridge, leader)]
            # let what was in flight when the cut came land, then count from there
            await until(lambda: grown(_peer_bytes(cluster), flowing), timeout=20, what="heartbeats to flow")
            before = await asyncio.to_thread(_peer_bytes, cluster)
            # the bridge reaches both: the leader's heartbeats, and the cut follower's (pre-)votes
            await until(lambda: grown(before, flowing + [(cut, bridge)]), timeout=30,
                        what="traffic on every uncut link")
            first = await via_bridge.acquire(ident, ttl_ms=5000, deadline_s=5)  # a write, through the bridge
            assert first.ok, first
            after = await asyncio.to_thread(_peer_bytes, cluster)
            assert after[(leader, cut)] == before[(leader, cut)], "the cut link carried raft bytes"
            assert after[(cut, leader)] == before[(cut, leader)], "the cut link carried raft bytes"
            assert leader_of(cluster) == leader  # check-quorum and pre-vote: the cut follower cannot unseat it
            await part.invoke(None, invocation("stop-partition"))
            healed = await asyncio.to_thread(_peer_bytes, cluster)
            await until(lambda: grown(healed, [(leader, cut)]), timeout=30, what="the healed link to carry raft")
        finally:
            await via_bridge.aclose()
            await part.teardown(None)
            await topo.client.aclose()

    asyncio.run(scenario())


def test_without_own_hosts_files_members_share_a_link_per_receiver_and_say_why(tmp_path, monkeypatch):
    """Where the lab cannot give each member its own /etc/hosts (not root, no unshare): one proxy per receiver
    (`members_etcd-2`), the reason in the stack's info, a cluster that still forms, and a per-pair cut refused
    with that reason."""
    from lab.sut import processes
    from nemesis import network
    from nemesis.core import invocation
    from lab.stack.topology import Topology

    monkeypatch.setattr(processes, "own_hosts_problem", lambda: "the lab is not root (test)")
    stack = SutStack(etcd_processes(Test(extra={"sut": "etcd"})), root=tmp_path / "stack", die_with_parent=True)
    stack.up(StackOptions(store=False, toxiproxy=True))
    try:
        assert stack.info["peer_links"] == {"mode": "per-receiver", "why": "the lab is not root (test)"}
        topo = stack.info["topology"]
        assert {"members_etcd-1", "members_etcd-2", "members_etcd-3"} <= set(topo)
        assert not any(n.startswith("etcd-") for n in topo)
        argv = member_processes_of(stack)["etcd-1"].argv
        assert argv[0].endswith("etcd") and f"etcd-2=http://{topo['members_etcd-2']['listen']}" in " ".join(argv)
        part = network.partition(Topology.from_description(None, topo), rng=1)
        with pytest.raises(ValueError, match="no per-pair links between members here"):
            part._named_links(["etcd-1_etcd-2"])
    finally:
        stack.down()


def test_lock_recipe_tokens_expiry_and_commits(cluster):
    ident = identity_for("k0")

    async def scenario():
        a, b, u = client(cluster, 1, 1), client(cluster, 2, 3), client(cluster, 1, 2, mode="unfenced")
        try:
            first = await a.acquire(ident, ttl_ms=2000, deadline_s=3)
            assert first.ok and first.lease.fencing_token > 0
            taken = await b.acquire(ident, ttl_ms=2000, deadline_s=3)
            assert (taken.outcome, taken.code) == ("fail", "lease_conflict")
            # the token is the lock key's create revision, as etcd itself reports it
            r = await a._post("/v3/kv/range", {"key": _b64(lock_key(ident))}, 2.0)
            assert int(r.body["kvs"][0]["create_revision"]) == first.lease.fencing_token
            c1 = await a.commit(first.lease, "doc-k0", {"append": [0, first.lease.fencing_token, 1]}, deadline_s=3)
            assert c1.ok and c1.data["commit"]["accepted_token"] == first.lease.fencing_token
            renewed = await a.renew(first.lease, identity=ident, deadline_s=3)
            assert renewed.ok and renewed.lease.ttl_ms >= 2000
            await until(lambda: lease_gone(b, first.lease), timeout=20, what="the first lease to expire in etcd")
            lost = await a.renew(first.lease, identity=ident, deadline_s=3)
            assert (lost.outcome, lost.code) == ("fail", "lease_lost")
            second = await b.acquire(ident, ttl_ms=2000, deadline_s=3)
            assert second.ok and second.lease.fencing_token > first.lease.fencing_token
            # fenced: the stale holder is refused (etcd says the lock is another lease's); nothing is written
            stale = await a.commit(first.lease, "doc-k0", {"append": [0, first.lease.fencing_token, 2]},
                                   identity=ident, deadline_s=3)
            assert (stale.outcome, stale.code) == ("fail", "lease_lost")
            c2 = await b.commit(second.lease, "doc-k0", {"append": [1, second.lease.fencing_token, 1]},
                                identity=ident, deadline_s=3)
            assert c2.ok
            # unfenced: the same stale holder writes on belief alone, and the store takes it
            late = await u.commit(first.lease, "doc-k0", {"append": [0, first.lease.fencing_token, 3]},
                                  identity=ident, deadline_s=3)
            assert late.ok and late.data["commit"]["db"] != c2.data["commit"]["db"]
            seen = await b.inspect(ident, deadline_s=3)
            assert seen.ok and seen.lease.fencing_token == second.lease.fencing_token
            assert (await b.release(second.lease, identity=ident, deadline_s=3)).ok
            again = await b.release(second.lease, identity=ident, deadline_s=3)
            assert (again.outcome, again.code) == ("fail", "lease_lost")
            assert (await b.inspect(ident, deadline_s=3)).code == "lease_not_found"
        finally:
            for c in (a, b, u):
                await c.aclose()

    asyncio.run(scenario())


def test_each_nemesis_takes_effect_on_the_etcd_processes(cluster):
    """kill: the member's pid is gone and comes back; pause: SIGSTOPped, requests time out; partition:
    requests through the isolated member time out, and it answers again after the heal."""
    from nemesis import network, process_faults
    from nemesis.core import invocation
    from lab.stack.topology import Topology
    from lab.stack.toxiproxy_api import ToxiproxyClient

    ident = identity_for("k1")
    targets = process_faults.stack_targets(cluster)
    assert {"etcd-1", "etcd-2", "etcd-3", "store"} <= set(targets)
    etcd2 = cluster.process("etcd-2")

    async def answers(c: EtcdLockSystem) -> bool:
        return (await c.inspect(ident, deadline_s=1.0)).code in ("lease_inspected", "lease_not_found")

    async def scenario():
        via2 = client(cluster, 1, 2, timeout_s=1.0)
        try:
            assert await answers(via2)
            kill = process_faults.kill(targets, rng=1, leader=cluster.leader_probe())
            await kill.setup(None)
            old = etcd2.pid
            done = await kill.invoke(None, invocation("start-kill", {"targets": ["etcd-2"]}))
            assert done["value"]["killed"]["etcd-2"]["pid"] == old
            assert done["value"]["leader"] in ("etcd-1", "etcd-2", "etcd-3"), "the leader when the kill hit"
            assert not etcd2.alive()
            with pytest.raises(ProcessLookupError):
                os.kill(old, 0)
            assert not await answers(via2)
            done = await kill.invoke(None, invocation("stop-kill"))
            assert done["value"]["restarted"]["etcd-2"]["ready"] and etcd2.alive() and etcd2.pid != old
            await until(lambda: answers(via2), timeout=30, what="the restarted member to serve")

            pause = process_faults.pause(targets, rng=1)
            await pause.invoke(None, invocation("start-pause", {"targets": ["etcd-2"]}))
            assert process_faults.is_stopped(etcd2)
            timed_out = await via2.inspect(ident, deadline_s=1.0)
            assert timed_out.code == "lease_backend_unavailable" and "after sending" in timed_out.msg
            await pause.invoke(None, invocation("stop-pause"))
            await until(lambda: answers(via2), timeout=30, what="the resumed member to serve")

            topo = Topology.from_description(ToxiproxyClient(cluster.info["toxiproxy"]), cluster.info["topology"])
            part = network.partition(topo, rng=1)
            await part.setup(None)
            done = await part.invoke(None, invocation("start-partition", {"grudge": "isolate-server",
                                                                           "target": "etcd-2"}))
            members = ({"etcd-1_etcd-2", "etcd-2_etcd-3"} if cluster.info["peer_links"]["mode"] == "per-pair"
                       else {"members_etcd-2"})  # no own /etc/hosts here: one link per receiver
            assert {"c1_etcd-2", "c2_etcd-2"} | members <= set(done["value"]["links"])
            timed_out = await via2.acquire(ident, ttl_ms=2000, deadline_s=1.0)
            assert timed_out.outcome in ("fail", "info") and "after sending" in (timed_out.msg or "") + \
                str(timed_out.code), timed_out
            via1 = client(cluster, 1, 1)
            try:  # the majority side still serves (once it has a leader: etcd-2 may have been the leader)
                await until(lambda: answers(via1), timeout=30, what="the majority side to serve")
            finally:
                await via1.aclose()
            await part.invoke(None, invocation("stop-partition"))
            await until(lambda: answers(via2), timeout=30, what="the healed member to serve")
            await part.teardown(None)
            await topo.client.aclose()
        finally:
            await via2.aclose()

    asyncio.run(scenario())


def test_leader_pause_stops_the_raft_leader_and_another_takes_over(cluster):
    from lab.sut.etcd import leader_of
    from lab.sut.processes import leader_pause
    from nemesis import process_faults
    from nemesis.core import invocation

    first = leader_of(cluster)
    assert first in ("etcd-1", "etcd-2", "etcd-3")

    async def scenario():
        nem = leader_pause(cluster, rng=1)
        assert nem.fs == {"start-leader-pause", "stop-leader-pause"}
        done = await nem.invoke(None, invocation("start-leader-pause"))
        assert done["value"]["phase"] == "start" and done["value"]["targets"] == [first]
        assert process_faults.is_stopped(cluster.process(first))
        second = await until(lambda: asyncio.to_thread(leader_of, cluster), timeout=30,
                             what="the other members to elect a leader")
        assert second != first
        done = await nem.invoke(None, invocation("stop-leader-pause"))
        assert done["value"]["resumed"][first]["signal"] == "SIGCONT" and not process_faults.is_stopped(
            cluster.process(first))
        await nem.teardown(None)

    asyncio.run(scenario())


def test_paused_client_sends_nothing_while_its_lease_runs_out(cluster):
    """The lab's client-pause gate is a real pause for this client: it has no background task, so a worker
    held at its gate sends no request at all (no keep-alive either) while etcd expires its lease and a
    successor takes the lock; resumed, its renew learns the lease is gone."""
    from nemesis.process_faults import ClientPauses
    from workloads.fenced_append import FencedAppendDriver

    test = Test(workload="fenced-append", extra={"sut": "etcd"}, concurrency=2)
    pauses = test.live["client_pauses"] = ClientPauses(2)
    ident = identity_for("k2")

    async def scenario():
        holder = FencedAppendDriver(ttl_ms=2000, deadline_s=3.0)
        holder.api = client(cluster, 1, 1)
        successor = client(cluster, 2, 2)
        try:
            got = await holder.invoke(test, {"process": 0, "f": "acquire", "key": "k2",
                                             "value": {"request_id": "r1", "ttl_ms": 2000}})
            assert got["type"] == "ok"
            lease = SimpleNamespace(lease_id=got["value"]["lease_id"], fencing_token=got["value"]["fencing_token"])
            pauses.pause(0)
            sent_before = list(holder.api.sent)
            renew = asyncio.create_task(holder.invoke(test, {"process": 0, "f": "renew", "key": "k2",
                                                             "value": {"request_id": "r2"}}))
            await until(lambda: lease_gone(successor, lease), timeout=20, what="etcd to expire the paused lease")
            won = await successor.acquire(ident, ttl_ms=2000, deadline_s=3)
            assert won.ok and won.lease.fencing_token > lease.fencing_token
            assert not renew.done() and holder.api.sent == sent_before  # nothing left the paused client
            pauses.resume(0)
            done = await renew
            assert (done["type"], done["error"]) == ("fail", "lease_lost")
            assert holder.api.sent == sent_before + ["/v3/lease/keepalive"]
        finally:
            await holder.api.aclose()
            await successor.aclose()

    asyncio.run(scenario())


class HoldAt:
    """A pause gate that holds the Nth request (1-based) the client is about to send, until released."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls == self.n:
            self.reached.set()
            await self.release.wait()


@pytest.mark.parametrize("mode", ["fenced", "unfenced"])
def test_a_pause_after_the_check_and_before_the_write(cluster, mode):
    """Kleppmann's pause, inside the commit: the holder is stopped at the gate right before its store write (after
    the fenced commit's ownership read), its lease expires, a successor acquires and writes; resumed, the stale
    write is refused by the store's token guard (fenced) or lands over the successor's (unfenced)."""
    ident = identity_for("k3")

    async def scenario():
        holder, successor = client(cluster, 1, 1, mode=mode), client(cluster, 2, 2, mode=mode)
        try:
            first = await holder.acquire(ident, ttl_ms=2000, deadline_s=3)
            assert first.ok
            gate = holder.pause_gate = HoldAt(2 if mode == "fenced" else 1)  # fenced: the read, then the write
            stale = asyncio.create_task(holder.commit(first.lease, "doc-k3", {"append": [0, first.lease.fencing_token,
                                                                                          1]}, identity=ident,
                                                      deadline_s=3))
            await asyncio.wait_for(gate.reached.wait(), 10)
            sent = list(holder.sent)
            await until(lambda: lease_gone(successor, first.lease), timeout=20, what="the held lease to expire")
            second = await successor.acquire(ident, ttl_ms=2000, deadline_s=3)
            assert second.ok and second.lease.fencing_token > first.lease.fencing_token
            wrote = await successor.commit(second.lease, "doc-k3", {"append": [1, second.lease.fencing_token, 1]},
                                           identity=ident, deadline_s=3)
            assert wrote.ok and holder.sent == sent  # the paused holder sent nothing meanwhile
            gate.release.set()
            late = await stale
            db = wrote.data["commit"]["db"]
            from lab.couch import CouchClient

            async with CouchClient(cluster.store_url_for(holder.node)) as couch:
                entries = (await couch.get(db, "doc-k3"))["entries"]
            if mode == "fenced":
                assert (late.outcome, late.code) == ("fail", "stale_token")
                assert [e[1] for e in entries] == [second.lease.fencing_token]
            else:
                assert late.ok
                assert [e[1] for e in entries] == [second.lease.fencing_token, first.lease.fencing_token]
        finally:
            await holder.aclose()
            await successor.aclose()

    asyncio.run(scenario())


def _run(tmp_path, name: str, seed: int, nemesis: list[str], time_limit: float, **extra):
    from lab.runner import run_test

    test = Test(name=name, workload="fenced-append", time_limit=time_limit, concurrency=4, keys=1, seed=seed,
                nemesis=nemesis, nemesis_interval=3.0, extra={"sut": "etcd", **extra})
    return run_test(test, tmp_path / "store"), test


@pytest.mark.timeout(600)
def test_fencelab_test_runs_and_judges_etcd_under_pause_partition_kill(tmp_path):
    from lab.cli import main
    from click.testing import CliRunner

    res = CliRunner().invoke(main, ["test", "--sut", "etcd", "--workload", "fenced-append", "--nemesis",
                                    "pause,partition,kill", "--time-limit", "20", "--nemesis-interval", "4",
                                    "--store-dir", str(tmp_path / "store"), "--name", "etcd-faults"])
    assert res.exit_code in (0, 1), res.output
    run = tmp_path / "store" / "etcd-faults" / "latest"
    results = json.loads((run / "results.json").read_text())
    assert results["valid"] is True, {k: v.get("violation_counts") for k, v in results["results"].items()}
    assert set(results["not_claimed"]) == {"idempotency", "mutual-exclusion", "linearizable"}
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    started = {o["value"]["fault"] for o in history if o["process"] == "nemesis" and o.get("type") == "info"
               and isinstance(o.get("value"), dict) and o["value"].get("phase") == "start"}
    assert started, "no fault took effect"
    logs = {p.name for p in (run / "stack" / "logs").iterdir()}
    assert {"etcd-1.log", "etcd-2.log", "etcd-3.log", "store.log", "toxiproxy.log"} <= logs


def paused_holders_stale_commits(run, results) -> list[dict]:
    """The stale-commit violations naming an accepted commit of a paused holder: a commit by a thread the
    client-pause nemesis paused, on a lease that thread had acquired before the pause began, completed after."""
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    by_index = {o.get("index"): o for o in history}
    conc = json.loads((run / "test.json").read_text())["concurrency"]
    pauses = [(o["time"], o["value"]["thread"]) for o in history if o["process"] == "nemesis"
              and isinstance(o.get("value"), dict) and o["value"].get("fault") == "client-pause"
              and o["value"].get("phase") == "start"]
    acquired = {o["value"]["lease_id"]: o["time"] for o in history if o.get("f") == "acquire"
                and o.get("type") == "ok" and isinstance(o.get("value"), dict)}
    found = []
    for v in results["results"]["stale-commit"].get("violations", []):
        for i in v["ops"]:
            o = by_index.get(i)
            if not (o and o.get("f") == "commit" and o.get("type") == "ok" and isinstance(o["process"], int)):
                continue
            got = acquired.get((o.get("value") or {}).get("lease_id"))
            if got is not None and any(t == o["process"] % conc and got < at < o["time"] for at, t in pauses):
                found.append(v)
    return found


def _kleppmann(tmp_path, seeds: range, enough=None) -> tuple[list[int], list[int]]:
    """Unfenced and fenced fenced-append runs on etcd under client-pause, one pair per seed (13 s runs: two pauses
    of 3 s, longer than etcd's 2 s minimum lease TTL). Every fenced run must be valid with commits; returns the
    seeds whose unfenced run was convicted with a stale commit, and those where a counterexample names the paused
    holder's own commit, on a lease it held when the pause began. `enough(caught, paused_holder)`, if given, ends
    the seeds early once it is true."""
    caught, paused_holder = [], []
    for seed in seeds:
        if enough is not None and enough(caught, paused_holder):
            break
        unfenced, test = _run(tmp_path, f"unfenced-{seed}", seed, ["client-pause"], 13.0, commit_mode="unfenced")
        stale = [v for v in unfenced["results"]["stale-commit"].get("violations", [])
                 if v["type"] in ("token-regression", "commit-after-successor")]
        if unfenced["valid"] is False and stale:
            caught.append(seed)
        if paused_holders_stale_commits(test.run_dir, unfenced):
            paused_holder.append(seed)
        fenced, _ = _run(tmp_path, f"fenced-{seed}", seed, ["client-pause"], 13.0)
        assert fenced["valid"] is True, (seed, {k: v.get("violation_counts") for k, v in fenced["results"].items()})
        assert fenced["results"]["stale-commit"]["commits"]["ok"] > 0
    return caught, paused_holder


@pytest.mark.timeout(900)
def test_unfenced_commits_under_client_pause_are_caught_fenced_are_valid(tmp_path):
    """Kleppmann's stale write on etcd (the five-seed form runs under `make test-slow`): unfenced commits under a
    client pause are judged invalid with a stale commit in the counterexample on at least 2 seeds, the fenced ones
    valid on every seed, and on at least one seed the counterexample names the paused holder's own commit (which
    thread a pause hits, and whether it holds the contended key then, is drawn at random; measured on five seeds:
    the paused holder's own commit on 4). Whether a seed's run convicts depends on timing too (4 of 5 seeds on a
    loaded machine), so the test waits for the condition: seeds 1, 2, 3, ... until both hold, at most 6 seeds."""
    caught, paused_holder = _kleppmann(tmp_path, range(1, 7), enough=lambda c, p: len(c) >= 2 and p)
    assert len(caught) >= 2, f"unfenced stale commits caught on seeds {caught} only"
    assert paused_holder, "the paused holder's own stale commit was caught on no seed"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_unfenced_commits_under_client_pause_are_caught_on_four_of_five_seeds(tmp_path):
    """The same on five seeds: caught on at least 4 of 5, the paused holder's own commit named on at least 2."""
    caught, paused_holder = _kleppmann(tmp_path, range(1, 6))
    assert len(caught) >= 4, f"unfenced stale commits caught on seeds {caught} only"
    assert len(paused_holder) >= 2, f"the paused holder's own stale commit was caught on seeds {paused_holder} only"


def test_nemeses_etcd_cannot_take_are_refused_before_the_run(tmp_path):
    from lab.runner import RunError, validate

    with pytest.raises(RunError, match=r"--nemesis clock cannot apply to SUT 'etcd': it lacks .*libfaketime "
                                       r"cannot reach .*Go binary"):
        validate(Test(workload="fenced-append", extra={"sut": "etcd"}, nemesis=["clock"]))
    with pytest.raises(RunError, match=r"--nemesis netns cannot apply to SUT 'etcd'"):
        validate(Test(workload="fenced-append", extra={"sut": "etcd"}, nemesis=["netns"]))
    with pytest.raises(RunError, match=r"--nemesis valkey-crash cannot apply to SUT 'etcd'"):
        validate(Test(workload="fenced-append", extra={"sut": "etcd"}, nemesis=["valkey-crash"]))
    with pytest.raises(RunError, match=r"--nemesis leader-pause cannot apply to SUT 'reference': it lacks a leader"):
        validate(Test(workload="fenced-append", nemesis=["leader-pause"]))
    with pytest.raises(RunError, match=r"--backend compose places the lab.s own reference stack; another system"):
        validate(Test(workload="fenced-append", extra={"sut": "etcd"}, backend="compose"))
    validate(Test(workload="fenced-append", extra={"sut": "etcd"},
                  nemesis=["pause", "partition", "kill", "client-pause", "latency", "leader-pause"]))
    assert not list(tmp_path.iterdir())  # refused before anything started


def test_url_still_reaches_an_etcd_the_lab_does_not_run(cluster, tmp_path):
    """`--sut etcd --url ...`: the same client against members someone else runs; the lab starts nothing."""
    from lab.runner import run_test
    from lab.sut.target import Kind, target_of

    urls = list(cluster.info["members"].values())
    test = Test(name="etcd-url", workload="lease", time_limit=3.0, concurrency=3, keys=2,
                extra={"sut": "etcd", "urls": urls})
    assert target_of(test).kind is Kind.URL
    results = run_test(test, tmp_path / "store")
    assert results["valid"] is True, {k: v.get("violation_counts") for k, v in results["results"].items()}
    assert not (test.run_dir / "stack" / "logs" / "etcd-1.log").exists()
