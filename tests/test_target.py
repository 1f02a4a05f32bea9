"""The Target (lab.sut.target): one decision of what is tested and where, asked by every layer.

Issue 17: adding a backend or a fault touches its own module and one registry row. The last two tests show it:
they add nothing but a backend row and a fault row, and a real run goes through them end to end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab.runner import RunError, run_test, validate
from lab.stack.local import LocalStack
from lab.sut import get_sut
from lab.sut.processes import LinkSpec, ProcessSpec, SystemProcesses
from lab.sut.registry import register_sut, unregister_sut
from lab.sut.proxy import UrlStack
from lab.sut.target import BACKENDS, Backend, Kind, target_of
from lab.testmap import RUN_KEYS, Test
from nemesis.core import completion
from nemesis.registry import NEMESES, NemesisSpec


def _kv(test: Any) -> SystemProcesses:
    return SystemProcesses(system="kv", processes=(ProcessSpec("kv-1", argv=lambda p: ["true"]),),
                           links=(LinkSpec("clients", "kv-1"),), client_url=lambda a: f"http://{a}")


@pytest.fixture
def kv_sut():
    register_sut("kv-target", lambda test, node, sid: None, processes=_kv)
    yield "kv-target"
    unregister_sut("kv-target")


def test_each_kind_is_decided_once_from_the_test(kv_sut):
    ref = target_of(Test())
    assert ref.kind is Kind.REFERENCE and ref.lab_runs and ref.reads_backend and not ref.external
    assert target_of(Test(backend="compose")).backend.name == "compose"
    system = target_of(Test(sut=kv_sut))
    assert system.kind is Kind.SYSTEM and system.lab_runs and not system.reads_backend
    url = target_of(Test(urls=["http://127.0.0.1:1"]))
    assert url.kind is Kind.URL and url.external
    # the same system behind a URL is a URL: the lab runs nothing of it
    assert target_of(Test(sut=kv_sut, urls=["http://127.0.0.1:1"])).kind is Kind.URL


def test_abilities_follow_the_kind_and_the_placement(kv_sut):
    local, compose = target_of(Test()), target_of(Test(backend="compose"))
    assert {"processes", "links", "partition", "netns", "clocks", "valkey"} <= local.abilities
    assert "netns" not in compose.abilities and "valkey" in compose.abilities
    assert "leader" not in local.abilities  # the reference servers elect nobody
    url = target_of(Test(urls=["http://127.0.0.1:1"]))
    assert url.abilities == {"client", "client-freeze", "client-clock"}
    proxied = target_of(Test(urls=["http://127.0.0.1:1"], proxy_urls=True))
    assert {"links", "partition"} <= proxied.abilities and "processes" not in proxied.abilities
    system = target_of(Test(sut=kv_sut))
    assert {"processes", "partition", "clocks"} <= system.abilities and "netns" not in system.abilities


def test_every_refusal_names_the_fault_and_why(kv_sut):
    assert "cannot run on --backend compose" in target_of(Test(backend="compose")).fault_problem("netns")
    assert "reached directly; add --proxy-urls" in target_of(Test(urls=["http://127.0.0.1:1"])).fault_problem(
        "partition")
    assert "cannot apply to SUT 'kv'" in target_of(Test(sut=kv_sut)).fault_problem("valkey-crash")
    assert "a leader the lab can find" in target_of(Test()).fault_problem("leader-pause")
    for name in NEMESES:  # every fault is answered by the one function, on every kind
        for t in (Test(), Test(urls=["http://127.0.0.1:1"]), Test(sut=kv_sut)):
            problem = target_of(t).fault_problem(name)
            assert problem is None or problem.startswith(f"--nemesis {name}")


class _Heartbeat:
    """A plug-in whose client keeps its session alive from a thread of its own."""

    background = True


class _Frozen(_Heartbeat):
    """The same, with the hooks that stop and restart that thread."""

    def freeze(self) -> None: ...

    def thaw(self) -> None: ...


class _Quiet:
    """A plug-in whose client sends only when called."""

    background = False


@pytest.mark.parametrize("factory, refused", [(_Heartbeat, "declares background activity"),
                                              (lambda test, node, sid: None, "does not say whether"),
                                              (_Frozen, None), (_Quiet, None)],
                         ids=["background", "undeclared", "hooks", "quiet"])
def test_client_pause_needs_a_client_that_stops_whole(factory, refused):
    """client-pause is refused (one line, through the Target) for a system that declares neither `background =
    False` nor freeze()/thaw(): the gate alone would leave its background activity keeping the session alive."""
    register_sut("bg-target", factory, replace=True)
    try:
        target = target_of(Test(sut="bg-target"))
        problem = target.fault_problem("client-pause")
        if refused is None:
            assert problem is None and target.can_take("client-pause")
            return
        assert problem.startswith("--nemesis client-pause: SUT 'bg-target'") and refused in problem
        assert "background = False" in problem and "freeze()/thaw()" in problem and "\n" not in problem
        assert "client-freeze" not in target.abilities and "client" in target.abilities
        with pytest.raises(RunError, match="--nemesis client-pause: SUT 'bg-target'"):
            validate(Test(sut="bg-target", nemesis=["client-pause"]))
    finally:
        unregister_sut("bg-target")


def test_built_in_systems_declare_their_clients_quiet():
    for name in ("reference", "starintel", "etcd", "valkey-lock", "valkey-lock-fenced"):
        assert get_sut(name).background is False, name


def test_commands_agree_on_a_system_the_lab_runs(kv_sut):
    """`test` and `evidence` build their Target the same way: a system the lab runs is not 'external'."""
    from lab.evidence import EvidenceTarget

    ev = EvidenceTarget(sut=kv_sut)
    assert ev.resolve().kind is target_of(Test(sut=kv_sut)).kind is Kind.SYSTEM
    assert ev.describe()["kind"] == "system"
    with pytest.raises(RunError, match="--mutant plants a bug .* SUT 'kv' runs its own processes"):
        validate(Test(sut=kv_sut, mutant="release-any-owner"))


def test_an_external_url_has_a_stack_too(tmp_path):
    """One run path: a URL's stack starts nothing, and says where the clients go."""
    test = Test(urls=["http://127.0.0.1:9"])
    stack = target_of(test).make_stack(test, tmp_path)
    assert isinstance(stack, UrlStack)
    status = stack.up(None)
    assert status.lease_servers == status.client_nodes == ("http://127.0.0.1:9",)
    assert stack.down() == [] and stack.processes == []


# -- a new backend and a new fault: one row each ------------------------------------------------------------------
class MarkFault:
    """A fault that acts on nothing: it only says it started and ended (enough to follow it through a run)."""

    fs = frozenset({"start-mark", "stop-mark"})

    def __init__(self, stack: Any):
        self.stack = stack

    async def setup(self, test: Any) -> None:
        return None

    async def invoke(self, test: Any, op: dict) -> dict:
        phase = "start" if op["f"] == "start-mark" else "end"
        return completion(op, {"fault": "mark", "phase": phase, "stack": type(self.stack).__name__})

    async def teardown(self, test: Any) -> None:
        return None


def test_a_fake_backend_and_a_fake_fault_are_one_row_each(tmp_path, monkeypatch):
    made: list[Path] = []

    def make(test: Test, root: Path) -> Any:
        made.append(root)
        return LocalStack(name="stack", root=root, die_with_parent=True)

    monkeypatch.setitem(BACKENDS, "fake", Backend("fake", "local processes, by another name", make,
                                                  lambda name, home: LocalStack(name=name, home=home),
                                                  lacks={"processes": "nothing to kill (a fake placement)"}))
    monkeypatch.setitem(NEMESES, "mark", NemesisSpec("mark", "marks a window", ("start-mark",), "stop-mark",
                                                     "mark", lambda ctx, names: MarkFault(ctx.stack),
                                                     frozenset({"client"})))
    # the new row's refusal comes from the one function, naming the new backend
    with pytest.raises(RunError, match="--nemesis kill cannot run on --backend fake: it needs nothing to kill"):
        validate(Test(backend="fake", nemesis=["kill"]))
    test = Test(name="fake-backend", workload="lease", backend="fake", nemesis=["mark"], nemesis_interval=0.5,
                time_limit=4.0, concurrency=2, keys=1, rate=20.0, ttl_ms=500)
    given = {k: v for k, v in test.to_json().items() if k not in RUN_KEYS}
    results = run_test(test, tmp_path / "store")
    assert made == [test.run_dir / "stack"]
    # the run went on a new spec: the caller's Test is as given but for where the run landed (issue 17 item 4)
    assert {k: v for k, v in test.to_json().items() if k not in RUN_KEYS} == given
    recorded = json.loads((test.run_dir / "test.json").read_text())
    assert recorded["run_salt"] and "nemesis_schedule" in recorded["extra"] and not test.run_salt
    verdicts = {name: r.get("valid") for name, r in results["results"].items()}
    # the new fault fired through the new backend (the fault-coverage checker saw its window), and no checker
    # convicts the reference servers; a checker with nothing to compare on a loaded machine may say unknown
    assert verdicts["faults"] is True, verdicts
    assert False not in verdicts.values(), verdicts
    from lab.history import read_history

    marks = [op for op in read_history(test.run_dir / "history.jsonl") if op.get("f") in MarkFault.fs
             and op["type"] == "info" and isinstance(op.get("value"), dict) and "phase" in op["value"]]
    assert {op["value"]["phase"] for op in marks} == {"start", "end"}
    assert {op["value"]["stack"] for op in marks} == {"LocalStack"}


class _Host:
    """An SSH host stand-in that records what was written where (RemoteFakeClock writes over SFTP)."""

    def __init__(self, name: str, writes: list):
        self.name, self.writes = name, writes

    def write_file(self, path: str, text: str) -> None:
        self.writes.append((self.name, path, text.strip()))

    def read_file(self, path: str) -> bytes:
        return b"0"


class _SshStackStandIn:
    """What the ssh placement's clock builders read of an SshStack: info's offset files and their hosts."""

    def __init__(self, tmp_path: Path, writes: list):
        names = ("valkey", "lease-1", "lease-2")
        self.info = {"clocks": {n: str(tmp_path / "remote" / f"{n}.rc") for n in names},
                     "clock_nodes": {n: f"node-{n}" for n in names}}
        self.hosts = {f"node-{n}": _Host(f"node-{n}", writes) for n in names}

    def clocks(self):
        from lab.stack.remote import RemoteFakeClock

        return {n: RemoteFakeClock(self.hosts[self.info["clock_nodes"][n]], p) for n, p in self.info["clocks"].items()}


@pytest.mark.parametrize("fault", ["clock", "server-clock"])
async def test_the_ssh_placement_moves_clocks_on_their_hosts(fault, tmp_path):
    """Both clock faults, as the registry draws them, write each offset on its own host (found by the Swarm work:
    server-clock fell back to the local builder, which wrote files on this machine and moved no remote clock)."""
    from nemesis.registry import build

    writes: list = []
    test = Test(workload="lease", nemesis=[fault], time_limit=5)
    test.live.stack = _SshStackStandIn(tmp_path, writes)
    nem, _ = build(test, [fault], interval_s=1.0, seed=0, builders=BACKENDS["ssh"].builders)
    await nem.setup(test)
    done = await nem.invoke(test, {"type": "info", "process": "nemesis", "f": "bump-clock",
                                   "value": {"targets": ["lease-1"], "delta_s": -1.5}})
    assert done["value"]["offsets"] == {"lease-1": -1.5}, done
    assert ("node-lease-1", str(tmp_path / "remote" / "lease-1.rc"), "-1.500") in writes, writes
    assert not (tmp_path / "remote").exists()  # nothing written on this machine
