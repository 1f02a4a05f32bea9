"""The Swarm backend without a Swarm: the stack file it generates and the placement file it reads.

What Swarm does with a Compose file as it stands was measured (docs/beyond-one-machine.md, "Swarm"); each test
here holds the generated file to one of those findings. The live runs are tests/test_swarm_live.py.
"""

from __future__ import annotations

import pytest

from lab.stack.compose import COMPOSE_FILE
from lab.stack.errors import StackError
from lab.stack.images import LOCAL_OVERRIDE
from lab.stack.swarm import SwarmOptions, _interpolate, load_placement, stack_file
from lab.runner import RunError, validate
from lab.testmap import Test

ENV = {"FENCELAB_STATE_DIR": "/state", "FENCELAB_UID": "0", "FENCELAB_GID": "0", "COUCHDB_USER": "u",
       "COUCHDB_PASSWORD": "p", "FENCELAB_OWNER": ""}
SERVICES = ["valkey", "store", "toxiproxy", "lease-1", "lease-2"]
NODES = {"valkey": "node1", "store": "node1", "toxiproxy": "node1", "lease-1": "node2", "lease-2": "node3"}


@pytest.fixture(scope="module")
def doc():
    return stack_file([COMPOSE_FILE, LOCAL_OVERRIDE], ENV, SERVICES, NODES)


def test_ports_are_host_mode_on_their_own_numbers_and_services_are_dnsrr(doc):
    """No ingress (it needs IPVS) and no VIPs (they time out without it): host-mode ports, dnsrr endpoints."""
    for name, svc in doc["services"].items():
        assert svc["deploy"]["endpoint_mode"] == "dnsrr", name
        assert all(p["mode"] == "host" for p in svc["ports"]), svc["ports"]
    published = [p["published"] for svc in doc["services"].values() for p in svc["ports"]]
    assert len(published) == len(set(published)), "two services would bind one port on a shared node"
    assert {p["published"] for p in doc["services"]["toxiproxy"]["ports"]} >= {26011, 26012}


def test_each_service_is_pinned_to_its_node_and_what_swarm_ignores_is_gone(doc):
    for name, svc in doc["services"].items():
        assert svc["deploy"]["placement"]["constraints"] == [f"node.hostname == {NODES[name]}"]
        assert not {"build", "restart", "depends_on"} & set(svc), name
    assert set(doc["services"]) == set(SERVICES)
    assert doc["networks"] == {"front": {"driver": "overlay"}, "back": {"driver": "overlay"}}


def test_values_are_literal_and_the_override_replaces_healthchecks(doc):
    """The lab interpolates (Swarm's CLI reads `${X:?a-b}` as a default) and merges (Swarm's CLI concatenates
    two files' healthcheck lists): the local image's check replaces the official one."""
    text = repr(doc)
    assert "${" not in text
    assert doc["services"]["valkey"]["healthcheck"]["test"] == ["CMD", "valkey-ping"]
    assert doc["services"]["lease-1"]["image"] == "fencelab/lease-server:trixie"
    assert "/state/principals:/fencelab/principals:ro" in doc["services"]["lease-1"]["volumes"]


def test_interpolation_reads_a_dash_in_a_message_as_a_message():
    assert _interpolate("${A:?set A-first}", {"A": "x"}) == "x"
    assert _interpolate("${A:-d-e}", {}) == "d-e"
    with pytest.raises(StackError, match="set A-first"):
        _interpolate("${A:?set A-first}", {})


def test_the_default_placement_puts_lease_servers_on_workers():
    opts = SwarmOptions(servers=3, place={"store": "node2"})
    assert opts.placement(["node1"], ["node2", "node3"]) == {
        "valkey": "node1", "store": "node2", "toxiproxy": "node1", "lease-1": "node2", "lease-2": "node3",
        "lease-3": "node2"}


@pytest.mark.parametrize("text, words", [
    ('[engines]\nnode1 = "unix:///x"\n[place]\nvalkey = "node9"\n', "node9.*no such node"),
    ('[engines]\nnode1 = "unix:///x"\n[place]\nredis = "node1"\n', "'redis' is not a service"),
    ('nodes = ["a"]\n', "unknown key 'nodes'"),
    ('manager = "unix:///x"\n', "`engines` must map"),
])
def test_a_bad_placement_is_one_line(tmp_path, text, words):
    path = tmp_path / "place.toml"
    path.write_text(text)
    with pytest.raises(StackError, match=words):
        load_placement(path)
    with pytest.raises(RunError, match=words):
        validate(Test(workload="fenced-append", backend="swarm", hosts_file=str(path)))


def test_the_swarm_backend_refuses_what_it_cannot_do(tmp_path):
    path = tmp_path / "place.toml"
    path.write_text('[engines]\nnode1 = "unix:///x"\n')
    with pytest.raises(RunError, match="needs --hosts FILE"):
        validate(Test(workload="fenced-append", backend="swarm"))
    with pytest.raises(RunError, match="--nemesis valkey-crash cannot run on --backend swarm"):
        validate(Test(workload="fenced-append", backend="swarm", hosts_file=str(path), nemesis=["valkey-crash"]))
    validate(Test(workload="fenced-append", backend="swarm", hosts_file=str(path), nemesis=["partition", "kill",
                                                                                              "pause"]))
    for clock in ("clock", "server-clock"):  # offsets written inside each task (lab.stack.swarm.TaskClock)
        validate(Test(workload="fenced-append", backend="swarm", hosts_file=str(path), nemesis=[clock]))


def test_a_campaign_evidence_and_mutants_place_cells_on_a_swarm_with_its_placement(tmp_path):
    """The backend axis takes swarm with its placement file (and refuses one without the other), as it takes ssh."""
    import tomllib

    from click.testing import CliRunner

    from lab.campaign import CampaignError, expand
    from lab.campaign.spec import parse_spec
    from lab.cli import main

    place = tmp_path / "place.toml"
    place.write_text('[engines]\nnode1 = "unix:///x"\n')

    def spec(impl: str):
        return parse_spec(tomllib.loads(f'name = "s"\nworkloads = ["fenced-append"]\nnemeses = ["kill"]\n'
                                        f'implementations = [{{ name = "sw", sut = "reference", {impl} }}]\n'), "s.toml")

    tests = [r.to_test() for r in expand(spec(f'backend = "swarm", hosts = "{place}"'))]
    assert {(t.backend, t.hosts_file) for t in tests} == {("swarm", str(place))}
    with pytest.raises(CampaignError, match='backend "swarm" and hosts .*beyond-one-machine.md.* go together'):
        spec('backend = "swarm"')
    for cmd in ("evidence", "mutants"):
        res = CliRunner().invoke(main, [cmd, "--backend", "swarm"])
        assert res.exit_code == 2 and "--backend swarm and --hosts FILE go together" in res.output, res.output


class _Container:
    def __init__(self, cid: str):
        self.id, self.status = cid, "running"
        self.attrs = {"State": {"Status": "running", "Pid": 7, "Health": {"Status": "healthy"}}}

    def reload(self):
        self.attrs["State"]["Status"] = self.status

    def kill(self, signal=None):
        self.status = "exited"


class _Engine:
    """A node's engine and the manager in one: containers by id, the service's tasks."""

    def __init__(self):
        self.by_id = {"old": _Container("old")}
        self.running: list[dict] = []
        self.containers = self
        self.api = self

    def get(self, cid):
        return self.by_id[cid]

    def tasks(self, filters):
        return self.running

    def close(self):
        pass


def test_a_killed_task_is_not_restarted_by_the_lab_but_swarms_replacement_is_awaited_and_recorded(tmp_path,
                                                                                                   monkeypatch):
    """`docker start` of a task's container fails on Swarm: after the lab's kill, `start` awaits the task Swarm
    starts instead, binds to it and records it (what the kill's completion carries)."""
    from lab.stack import swarm
    from lab.stack.swarm import SwarmTask

    engine = _Engine()
    monkeypatch.setattr(swarm, "_engine", lambda url: engine)
    task = SwarmTask(name="lease-1", log_path=tmp_path / "l.log", service="lease-1", container_id="old",
                     container_port="8080/tcp", client=engine, manager="unix:///m", service_id="svc", node="node2")
    assert task.alive() and task.healthy()
    task.kill()
    assert not task.alive(), "a task the lab killed is dead until the lab restarts it"
    task.start(wait=False)
    assert task.alive() and not task.healthy(), "no replacement yet"
    engine.by_id["new"] = _Container("new")
    engine.running.append({"ID": "t2", "Status": {"State": "running", "ContainerStatus": {"ContainerID": "new"}}})
    assert task.healthy() and task.container_id == "new"
    [rec] = task.replacements
    assert (rec["old_container"], rec["new_container"], rec["node"], rec["task"]) == ("old", "new", "node2", "t2")


# -- --swarm URL: the manager named on the command line ---------------------------------------------------------
def _placement(tmp_path, manager: str = "unix:///from-file.sock"):
    path = tmp_path / "place.toml"
    path.write_text(f'manager = "{manager}"\n[engines]\nnode1 = "unix:///x"\n')
    return path


def test_swarm_names_the_manager_over_the_placement_and_is_kept_in_test_json_and_the_replay(tmp_path):
    from lab.runner import replay_command
    from lab.sut.target import target_of

    place = _placement(tmp_path)
    test = Test(workload="fenced-append", backend="swarm", hosts_file=str(place), swarm="tcp://10.0.0.1:2375")
    validate(test)
    opts = target_of(test).stack_options(test, store=True)
    assert (opts.manager, opts.manager_from) == ("tcp://10.0.0.1:2375", "--swarm")
    plain = Test(workload="fenced-append", backend="swarm", hosts_file=str(place))
    opts = target_of(plain).stack_options(plain, store=True)
    assert (opts.manager, opts.manager_from) == ("unix:///from-file.sock", "the placement's `manager`")
    assert test.to_json()["swarm"] == "tcp://10.0.0.1:2375" and "swarm" not in plain.to_json()
    assert "--swarm tcp://10.0.0.1:2375" in replay_command(test)
    assert "--swarm" not in replay_command(plain)


@pytest.mark.parametrize("args, words", [
    (["--swarm", "nowhere"], "--swarm: 'nowhere' is not a Docker engine URL"),
    (["--swarm", "tcp://"], "--swarm: 'tcp://' is not a Docker engine URL"),
    (["--swarm", "unix:///m.sock", "--backend", "compose"], "--swarm names the Swarm manager's engine: it goes with "
                                                             "--backend swarm"),
])
def test_a_bad_swarm_option_is_one_line_for_test_evidence_and_mutants(tmp_path, args, words):
    from click.testing import CliRunner

    from lab.cli import main

    place = _placement(tmp_path)
    base = ["--backend", "swarm", "--hosts", str(place)]
    if "--backend" in args:
        base = []
    for cmd in (["test", "--workload", "fenced-append", "--store-dir", str(tmp_path / "s")], ["evidence"],
                ["mutants", "--fast"]):
        res = CliRunner().invoke(main, [*cmd, *base, *args])
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and lines[-1].startswith("fencelab: error:") and words in lines[-1], (cmd, res.output)


def test_a_placement_engine_that_is_not_a_url_is_one_line(tmp_path):
    path = tmp_path / "place.toml"
    path.write_text('manager = "node1:2375"\n[engines]\nnode1 = "unix:///x"\n')
    with pytest.raises(StackError, match="manager: 'node1:2375' is not a Docker engine URL"):
        load_placement(path)
    path.write_text('[engines]\nnode1 = "10.0.0.1"\n')
    with pytest.raises(StackError, match=r"\[engines\] node1: '10.0.0.1' is not a Docker engine URL"):
        load_placement(path)


def test_a_campaign_implementation_names_the_manager_with_swarm(tmp_path):
    import tomllib

    from lab.campaign import CampaignError, expand
    from lab.campaign.spec import parse_spec

    place = _placement(tmp_path)

    def spec(impl: str):
        return parse_spec(tomllib.loads(f'name = "s"\nworkloads = ["fenced-append"]\nnemeses = ["kill"]\n'
                                        f'implementations = [{{ name = "sw", sut = "reference", {impl} }}]\n'), "s.toml")

    tests = [r.to_test() for r in expand(spec(f'backend = "swarm", hosts = "{place}", swarm = "unix:///m.sock"'))]
    assert {t.swarm for t in tests} == {"unix:///m.sock"}
    with pytest.raises(CampaignError, match='swarm is the Swarm manager'):
        spec(f'backend = "ssh", hosts = "{place}", swarm = "unix:///m.sock"')


def test_a_manager_that_is_not_one_is_named_by_where_it_came_from(tmp_path, monkeypatch):
    """`--swarm` at a worker's engine: the refusal names --swarm (not the placement, which named another)."""
    from lab.stack import swarm
    from lab.stack.swarm import SwarmStack

    class Worker:
        def info(self):
            return {"Swarm": {"ControlAvailable": False, "LocalNodeState": "active"}}

        def close(self):
            pass

    monkeypatch.setattr(swarm, "_engine", lambda url: Worker())
    stack = SwarmStack(name="t", root=tmp_path)
    opts = SwarmOptions(servers=1, manager="unix:///w.sock", manager_from="--swarm", engines={"node1": "unix:///x"})
    with pytest.raises(StackError, match=r"unix:///w.sock \(from --swarm\) is not a Swarm manager .* in --swarm$"):
        stack.up(opts)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with pytest.raises(StackError, match="needs the Swarm manager: --swarm URL"):
        stack.up(SwarmOptions(servers=1, engines={"node1": "unix:///x"}))


# -- clocks inside each task --------------------------------------------------------------------------------------
def test_each_task_keeps_its_clock_file_in_its_own_tmpfs(doc):
    """A real Swarm's node does not have the lab's files: no bind mount of the lab's clocks/ directory; the
    clock wrapper starts the file at +0 in the task's tmpfs and the lab writes it by docker exec."""
    for name in ("valkey", "lease-1", "lease-2"):
        vols = doc["services"][name]["volumes"]
        assert {"type": "tmpfs", "target": "/fencelab/clocks"} in vols, vols
        assert not any(isinstance(v, str) and "/fencelab/clocks" in v for v in vols), vols


class _ExecApi:
    """A node engine's exec API: a file system per container, a container that may be paused."""

    def __init__(self):
        self.files: dict[str, dict[str, str]] = {"c1": {}, "c2": {}}
        self.paused: set[str] = set()
        self.runs: dict[str, tuple[str, list[str]]] = {}
        self.api = self

    def inspect_container(self, cid):
        return {"Config": {"Labels": {"com.docker.swarm.task.id": f"task-of-{cid}"}}}

    def exec_create(self, cid, argv, user=None):
        from lab.stack.docker_api import docker_module

        assert user == "0", "the offset is written as root (the lease server runs as another user)"
        if cid in self.paused:
            raise docker_module().errors.APIError(f"Container {cid} is paused, unpause the container before exec")
        self.runs[str(len(self.runs))] = (cid, argv)
        return {"Id": str(len(self.runs) - 1)}

    def exec_start(self, run_id):
        cid, argv = self.runs[run_id]
        if argv[0] == "cat":
            return self.files[cid].get(argv[1], "").encode()
        text, path = argv[3], argv[4]  # sh -c WRITE text path
        self.files[cid][path] = text + "\n"
        return b""

    def exec_inspect(self, run_id):
        return {"ExitCode": 0}

    def close(self):
        pass


def test_a_task_clock_writes_the_newest_offset_inside_its_container_through_pauses_and_replacements(tmp_path,
                                                                                                     monkeypatch):
    from lab.stack import swarm
    from lab.stack.swarm import SwarmTask, TaskClock

    api = _ExecApi()
    monkeypatch.setattr(swarm, "_engine", lambda url: api)
    task = SwarmTask(name="lease-1", log_path=tmp_path / "l.log", service="lease-1", container_id="c1",
                     node="node2", engine="unix:///node2")
    clock = TaskClock(task, "/fencelab/clocks/lease-1.rc")
    monkeypatch.setattr(TaskClock, "RETRY_S", 0.05)
    try:
        clock.set_offset(2.5)
        rec = clock.flush(5)
        assert rec == {"node": "node2", "container": "c1", "task": "task-of-c1", "offset_s": 2.5, "written": True}
        assert api.files["c1"]["/fencelab/clocks/lease-1.rc"] == "+2.500\n" and clock.read() == 2.5
        api.paused.add("c1")  # no exec into a paused container: the write waits for the resume
        clock.set_offset(-1)
        rec = clock.flush(0.3)
        assert not rec["written"] and "paused" in rec["pending"], rec
        api.paused.clear()
        assert clock.flush(5)["written"] and api.files["c1"]["/fencelab/clocks/lease-1.rc"] == "-1.000\n"
        task.container_id = "c2"  # Swarm's replacement task (the kill nemesis rebinds the task to it)
        rec = clock.flush(5)
        assert (rec["container"], rec["task"], rec["written"]) == ("c2", "task-of-c2", True), rec
        assert api.files["c2"]["/fencelab/clocks/lease-1.rc"] == "-1.000\n", "a replacement task gets the offset again"
        clock.reset()
    finally:
        clock.close()
    assert api.files["c2"]["/fencelab/clocks/lease-1.rc"] == "+0\n", "close writes what is pending"
    with pytest.raises(ValueError, match="closed"):
        clock.set_offset(1)


# -- placement by node labels -------------------------------------------------------------------------------------
def test_a_node_label_constraint_places_a_service_on_the_nodes_that_carry_the_label():
    """`[place] lease-1 = "node.labels.zone==a"`: the stack file carries the constraint, and keeps the task off
    the Swarm's nodes whose engines the lab was not given (kill and pause go through the task's node engine)."""
    nodes = {**NODES, "lease-1": "node.labels.zone==a"}
    doc = stack_file([COMPOSE_FILE, LOCAL_OVERRIDE], ENV, SERVICES, nodes, ["node9"])
    assert doc["services"]["lease-1"]["deploy"]["placement"]["constraints"] == [
        "node.labels.zone==a", "node.hostname != node9"]
    assert doc["services"]["lease-2"]["deploy"]["placement"]["constraints"] == ["node.hostname == node3"]


def test_a_placement_may_name_a_label_constraint_and_it_must_match_a_node(tmp_path):
    from lab.stack.swarm import SwarmStack

    path = tmp_path / "place.toml"
    path.write_text('[engines]\nnode1 = "unix:///x"\n[place]\nlease-1 = "node.labels.zone==a"\n'
                    'valkey = "node.labels.disk != hdd"\n')
    assert load_placement(path)["place"]["lease-1"] == "node.labels.zone==a"
    path.write_text('[engines]\nnode1 = "unix:///x"\n[place]\nlease-1 = "node.role==worker"\n')
    with pytest.raises(StackError, match="a constraint is a node label's, node.labels.KEY==VALUE"):
        load_placement(path)
    labels = {"node1": {}, "node2": {"zone": "a"}, "node3": {"zone": "a"}}
    chosen = {"valkey": "node1", "lease-1": "node.labels.zone==a", "lease-2": "node.labels.zone!=a"}
    assert SwarmStack._candidates(chosen, labels) == {"valkey": ["node1"], "lease-1": ["node2", "node3"],
                                                      "lease-2": ["node1"]}
    with pytest.raises(StackError, match=r"lease-1 = 'node.labels.zone==b' matches no node of \[engines\]"):
        SwarmStack._candidates({"lease-1": "node.labels.zone==b"}, labels)
    with pytest.raises(StackError, match="valkey = 'node.labels.zone==a' matches node2, node3: valkey keeps"):
        SwarmStack._candidates({"valkey": "node.labels.zone==a"}, labels)


def test_a_replacement_on_another_node_moves_the_task_to_that_nodes_engine(tmp_path, monkeypatch):
    """A label constraint that matches several nodes lets Swarm restart a killed lease server elsewhere: the task
    follows it (its engine and address) and the record says where from."""
    from lab.stack import swarm
    from lab.stack.swarm import SwarmTask

    engine = _Engine()
    monkeypatch.setattr(swarm, "_engine", lambda url: engine)
    task = SwarmTask(name="lease-1", log_path=tmp_path / "l.log", service="lease-1", container_id="old",
                     container_port="8080/tcp", client=engine, manager="unix:///m", service_id="svc", node="node2",
                     engine="unix:///n2", host="10.0.0.2",
                     where={"id2": ["node2", "unix:///n2", "10.0.0.2"], "id3": ["node3", "unix:///n3", "10.0.0.3"]})
    task.kill()
    task.start(wait=False)
    engine.by_id["new"] = _Container("new")
    engine.running.append({"ID": "t2", "NodeID": "id3",
                           "Status": {"State": "running", "ContainerStatus": {"ContainerID": "new"}}})
    assert task.healthy()
    assert (task.node, task.engine, task.host) == ("node3", "unix:///n3", "10.0.0.3")
    [rec] = task.replacements
    assert (rec["old_node"], rec["node"]) == ("node2", "node3")
    assert SwarmTask.from_state(task.state()).where == task.where


def test_the_swarm_clock_nemesis_records_where_each_offset_went(tmp_path, monkeypatch):
    """server-clock as the registry builds it, over a Swarm stack's tasks: a bump's completion names each
    target's node, task and container with its offset; the reset's names every clock back at 0."""
    import asyncio

    from lab.stack import swarm
    from lab.stack.swarm import SwarmTask, TaskClock
    from nemesis.swarm import swarm_clock
    from nemesis.clock import clock

    api = _ExecApi()
    api.files = {"c1": {"/fencelab/clocks/lease-1.rc": "+0\n"}, "c2": {"/fencelab/clocks/lease-2.rc": "+0\n"}}
    monkeypatch.setattr(swarm, "_engine", lambda url: api)
    tasks = {f"lease-{i}": SwarmTask(name=f"lease-{i}", log_path=tmp_path / "l.log", container_id=f"c{i}",
                                     node=f"node{i + 1}", engine="unix:///n") for i in (1, 2)}

    class Stack:
        def clocks(self):
            return {n: TaskClock(t, f"/fencelab/clocks/{n}.rc") for n, t in tasks.items()}

    inner = clock({n: f"/fencelab/clocks/{n}.rc" for n in tasks}, rng=1, targets=list(tasks))
    nem = swarm_clock(Stack(), inner)

    async def run():
        await nem.setup(None)
        bump = await nem.invoke(None, {"f": "bump-clock", "type": "invoke", "process": "nemesis",
                                       "value": {"targets": ["lease-2"], "delta_s": 4.25}})
        reset = await nem.invoke(None, {"f": "reset-clock", "type": "invoke", "process": "nemesis", "value": None})
        await nem.teardown(None)
        return bump["value"], reset["value"]

    bump, reset = asyncio.run(run())
    assert bump["swarm_clocks"] == {"lease-2": {"node": "node3", "container": "c2", "task": "task-of-c2",
                                                "offset_s": 4.25, "written": True}}
    assert {n: (r["offset_s"], r["written"]) for n, r in reset["swarm_clocks"].items()} == {
        "lease-1": (0.0, True), "lease-2": (0.0, True)}
    assert api.files["c2"]["/fencelab/clocks/lease-2.rc"] == "+0\n"


def test_a_service_log_that_never_ends_is_cut_and_does_not_block_the_teardown():
    """The manager's log stream of a service whose task was killed can stall forever (a 60 s run's teardown
    blocked on it for over 10 minutes, 2026-12-04): what came is kept, with a line saying where it was cut."""
    import threading

    from lab.stack.swarm import _read_log

    release = threading.Event()

    class Stalled:
        name = "fencelab_store"

        def logs(self, **kw):
            yield b"2026-12-04T12:33:00Z started\n"
            release.wait()  # the stream sends nothing more
            yield b"never\n"

    class Done:
        name = "fencelab_valkey"

        def logs(self, **kw):
            return iter([b"a\n", b"b\n"])

    try:
        out = _read_log(Stalled(), 0.5)
        assert out.startswith(b"2026-12-04T12:33:00Z started\n") and b"log cut" in out and b"never" not in out, out
        assert _read_log(Done(), 5.0) == b"a\nb\n"
    finally:
        release.set()
