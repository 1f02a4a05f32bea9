"""Systems that bring their own processes (lab.sut.processes): declared, started, owned, faulted and refused.

A two-member toy system (two real valkey-server processes, `kv-1` and `kv-2`)
stands in for a third-party system: the lab owns its processes (pids, logs,
data dirs), puts a Toxiproxy proxy on each declared link, and the existing
nemeses (kill, pause, partition) act on them through the stack interface.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import redis

from lab import paths
from lab.testmap import RunContext
from lab.stack.local import StackOptions
from lab.sut import SutError, register_sut, unregister_sut
from lab.sut.processes import LinkSpec, ProcessSpec, SutStack, SystemProcesses, check_test
from lab.sut.registry import SutEntry
from lab.sut.target import BACKENDS, Kind, Target, target_of
from lab.testmap import Test


def _kv_argv(name):
    return lambda p: [str(paths.valkey_server()), "--port", str(p.port(name)), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no", "--dir", str(p.data_dir(name))]


def kv_system(fake_clock: bool = True) -> SystemProcesses:
    names = ("kv-1", "kv-2")
    return SystemProcesses(
        system="kv", install="run `make install`",
        processes=tuple(ProcessSpec(n, argv=_kv_argv(n), fake_clock=fake_clock, clock_note="a toy says no")
                        for n in names),
        links=tuple(LinkSpec("clients", n) for n in names) + (LinkSpec("peers", "kv-2"),),
        client_url=lambda a: f"redis://{a}/0")


@pytest.fixture
def kv_stack(tmp_path):
    stack = SutStack(kv_system(), root=tmp_path / "stack", die_with_parent=True)
    yield stack
    stack.down()


def _ping(url: str, timeout: float = 1.0) -> bool:
    try:
        return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout).ping()
    except redis.RedisError:
        return False


def test_declared_processes_are_owned_and_proxied(kv_stack):
    status = kv_stack.up(StackOptions(store=True, toxiproxy=True))
    names = [p.name for p in kv_stack.processes]
    assert names == ["store", "toxiproxy", "kv-1", "kv-2"]
    for p in kv_stack.processes:
        assert p.alive() and p.pid and p.log_path.parent == kv_stack.dir / "logs"
    # two client groups x two members, each through its own proxy; every client group has a link to the store
    assert sorted(status.topology) == ["c1_kv-1", "c1_kv-2", "c1_store", "c2_kv-1", "c2_kv-2", "c2_store",
                                          "peers_kv-2"]
    assert len(status.client_nodes) == 4 and all(_ping(u) for u in status.client_nodes)
    # group 1's node for each member, then group 2's: docs/plugging-in-a-system.md slices a group's members out
    # of this order for a client that takes a list of them
    assert list(status.client_nodes) == [f"redis://{status.topology[link]['listen']}/0"
                                         for link in ("c1_kv-1", "c1_kv-2", "c2_kv-1", "c2_kv-2")]
    real = {p.name: p.ports["client"] for p in kv_stack.processes if p.name.startswith("kv-")}
    for node in status.client_nodes:
        assert not any(str(port) in node for port in real.values())  # nodes are proxied addresses
    assert set(kv_stack.info["node_store"]) == set(status.client_nodes)
    state = kv_stack.read_state_file()
    assert {p["name"] for p in state["processes"]} == set(names)
    pids = [p.pid for p in kv_stack.processes]
    kv_stack.down()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not kv_stack.state_file.exists()


def test_existing_nemeses_act_on_declared_processes(kv_stack):
    from nemesis import network, process_faults
    from nemesis.core import invocation
    from lab.stack.topology import Topology
    from lab.stack.toxiproxy_api import ToxiproxyClient

    status = kv_stack.up(StackOptions(store=False, toxiproxy=True))
    targets = process_faults.stack_targets(kv_stack)
    assert list(targets) == ["kv-1", "kv-2"]  # members are targets; Toxiproxy never is
    kv1 = kv_stack.process("kv-1")
    node = next(n for n in status.client_nodes if n == f"redis://{status.topology['c1_kv-1']['listen']}/0")

    async def scenario():
        kill = process_faults.kill(targets, rng=1)
        await kill.setup(None)
        old = kv1.pid
        done = await kill.invoke(None, invocation("start-kill", {"targets": ["kv-1"]}))
        assert done["value"]["killed"]["kv-1"]["pid"] == old and not kv1.alive()
        assert not _ping(node)
        done = await kill.invoke(None, invocation("stop-kill"))
        assert done["value"]["restarted"]["kv-1"]["ready"] and kv1.alive() and kv1.pid != old
        assert await asyncio.to_thread(_ping, node)

        pause = process_faults.pause(targets, rng=1)
        await pause.invoke(None, invocation("start-pause", {"targets": ["kv-1"]}))
        assert process_faults.is_stopped(kv1)
        assert not await asyncio.to_thread(_ping, node, 0.5)
        await pause.invoke(None, invocation("stop-pause"))
        assert await asyncio.to_thread(_ping, node)

        topo = Topology.from_description(ToxiproxyClient(kv_stack.info["toxiproxy"]), kv_stack.info["topology"])
        part = network.partition(topo, rng=1)
        await part.setup(None)
        done = await part.invoke(None, invocation("start-partition", {"grudge": "isolate-server",
                                                                       "target": "kv-1"}))
        assert "c1_kv-1" in done["value"]["links"] and "c2_kv-1" in done["value"]["links"]
        assert not await asyncio.to_thread(_ping, node, 0.5)  # a partitioned member's requests time out
        await part.invoke(None, invocation("stop-partition"))
        assert await asyncio.to_thread(_ping, node)
        await part.teardown(None)
        await topo.client.aclose()

    asyncio.run(scenario())


def test_clock_nemesis_fakes_declared_clocks(kv_stack):
    kv_stack.up(StackOptions(store=False, fake_clocks=True))
    clocks = kv_stack.info["clocks"]
    assert sorted(clocks) == ["kv-1", "kv-2"]
    for p in kv_stack.processes:
        assert p.env and p.env["FAKETIME_TIMESTAMP_FILE"] == clocks[p.name]


def check_nemeses(decl: SystemProcesses, names) -> None:
    """What the Target of a system declaring `decl` says of `names` (it raises the first refusal)."""
    entry = SutEntry(name=decl.system, factory=lambda test, node, sid: None, capabilities=frozenset(),
                     background=False)  # its client runs nothing between calls: client-pause stops it whole
    Target(kind=Kind.SYSTEM, sut=entry, backend=BACKENDS["local"], decl=decl).check_faults(names)


def test_nemeses_that_cannot_apply_are_refused_naming_system_and_ability():
    with pytest.raises(SutError, match=r"--nemesis clock cannot apply to SUT 'kv': it lacks .*clocks.*a toy says no"):
        check_nemeses(kv_system(fake_clock=False), ["kill", "clock"])
    with pytest.raises(SutError, match=r"--nemesis netns cannot apply to SUT 'kv'.*network namespaces"):
        check_nemeses(kv_system(), "netns")
    with pytest.raises(SutError, match=r"--nemesis valkey-crash cannot apply to SUT 'kv'.*Valkey process"):
        check_nemeses(kv_system(), "valkey-crash")
    check_nemeses(kv_system(), "partition,latency,kill,pause,client-pause,clock")  # all apply


def test_bad_declarations_are_one_line_errors():
    base = kv_system()
    with pytest.raises(SutError, match="no process 'kv-3'"):
        SystemProcesses(system="kv", processes=base.processes, links=(LinkSpec("clients", "kv-3"),),
                        client_url=base.client_url).validate()
    with pytest.raises(SutError, match="has no port 'peer'"):
        SystemProcesses(system="kv", processes=base.processes, links=(LinkSpec("clients", "kv-1", "peer"),),
                        client_url=base.client_url).validate()
    with pytest.raises(SutError, match="is the lab's own"):
        SystemProcesses(system="kv", processes=(ProcessSpec("store", argv=lambda p: ["x"]),),
                        links=(LinkSpec("clients", "store"),), client_url=base.client_url).validate()
    with pytest.raises(SutError, match="no link from the clients"):
        SystemProcesses(system="kv", processes=base.processes, links=(), client_url=base.client_url).validate()


def test_run_validation_uses_the_declaration(tmp_path):
    from lab.runner import RunError, validate

    def missing():
        raise FileNotFoundError("kv-server not found at /nowhere")

    register_sut("kv-test", lambda test, node, sid: None, processes=lambda test: kv_system())
    register_sut("kv-missing", lambda test, node, sid: None,
                 processes=lambda test: SystemProcesses(**{**kv_system().__dict__, "check_installed": missing}))
    try:
        t = Test(workload="lease", extra={"sut": "kv-test"}, nemesis=["kill", "partition"])
        assert target_of(t).kind is Kind.SYSTEM and target_of(t).lab_runs  # the lab runs it
        validate(t)
        assert target_of(Test(workload="lease", extra={"sut": "kv-test", "urls": ["http://127.0.0.1:1"]})).external
        with pytest.raises(RunError, match="--nemesis netns cannot apply to SUT 'kv'"):
            validate(Test(workload="lease", extra={"sut": "kv-test"}, nemesis=["netns"]))
        with pytest.raises(RunError, match="--mutant .* SUT 'kv' runs its own processes"):
            validate(Test(workload="lease", extra={"sut": "kv-test", "mutant": "x"}))
        with pytest.raises(RunError, match=r"SUT 'kv': kv-server not found at /nowhere; run `make install`"):
            check_test_or_run_error(Test(workload="lease", extra={"sut": "kv-missing"}))
    finally:
        unregister_sut("kv-test")
        unregister_sut("kv-missing")


def check_test_or_run_error(test):
    from lab.runner import RunError

    try:
        check_test(test)
    except SutError as e:
        raise RunError(str(e)) from None


def test_kill_by_pid_only_reaches_our_process(kv_stack):
    kv_stack.up(StackOptions(store=False))
    kv1 = kv_stack.process("kv-1")
    pid = kv1.pid
    kv1.signal(signal.SIGSTOP)
    kv1.resume()
    kv1.kill()
    assert not kv1.alive() and kv_stack.process("kv-2").alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_not_claimed_checkers_are_neither_run_nor_judged():
    from checkers.core import compose
    from lab.sut.registry import claimed_checker, claims

    ran = []

    class Judge:
        def __init__(self, name, valid):
            self.name, self.valid = name, valid

        def check(self, test, history, opts):
            ran.append(self.name)
            return {"valid": self.valid}

    register_sut("kv-claims", lambda test, node, sid: None, processes=lambda test: kv_system(),
                 not_claimed={"idempotency": "no request ids"})
    try:
        t = Test(workload="lease", extra={"sut": "kv-claims"})
        assert not claims(t, "idempotency") and claims(t, "fencing")
        checker = claimed_checker(t, compose({"fencing": Judge("fencing", True),
                                              "idempotency": Judge("idempotency", False)}))
        history = [{"process": 0, "type": "invoke", "f": "acquire", "index": 0, "time": 0}]
        res = checker.check(t.to_json(), history, {})
        assert ran == ["fencing"] and res["valid"] is True
        assert res["not_claimed"] == {"idempotency": "no request ids"} and "idempotency" not in res["results"]
        # a system that claims everything keeps every checker (and a failing one still fails the run)
        ran.clear()
        full = claimed_checker(Test(workload="lease"), compose({"fencing": Judge("fencing", True),
                                                                "idempotency": Judge("idempotency", False)}))
        assert full.check({}, history, {})["valid"] is False and ran == ["fencing", "idempotency"]
    finally:
        unregister_sut("kv-claims")


def test_leader_pause_is_refused_on_a_stack_whose_system_names_no_leader(tmp_path):
    """nemesis.registry asks the stack for its leader nemesis (no import of the SUT layer): a stack without the
    method, or a system that declares no leader, is one clear ValueError."""
    from types import SimpleNamespace

    from nemesis.registry import build

    for stack in (SimpleNamespace(info={}, processes=[]),
                  SimpleNamespace(info={}, processes=[], leader_nemesis=lambda rng: (_ for _ in ()).throw(
                      ValueError("--nemesis leader-pause: the system under test declares no leader")))):
        test = SimpleNamespace(live=RunContext(stack=stack), concurrency=1, time_limit=5.0)
        with pytest.raises(ValueError, match=r"^--nemesis leader-pause: the system under test declares no leader$"):
            build(test, ["leader-pause"], interval_s=1.0, seed=1)
