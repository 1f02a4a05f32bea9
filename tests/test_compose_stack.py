"""ComposeStack against autospecced Docker SDK fakes (this machine has a Docker client but no engine).

`FakeEngine` keeps container states; the SDK objects it hands out are
`create_autospec(DockerClient / ContainerCollection / Container)`, so a call
with a wrong signature raises TypeError. The SDK's `**kwargs` pass-throughs
(`start`, `stop`, `restart`) are bound to the low-level `APIClient` method
they forward to, so a wrong keyword fails too. The Compose CLI is a recording
fake of `subprocess.run` that creates and removes the project's containers.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import stat
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import create_autospec

import docker
import httpx
import pytest
from docker.api.client import APIClient
from docker.models.containers import Container, ContainerCollection

from lab.testmap import RunContext
from lab.stack.compose import (COMPOSE_FILE, ComposeStack, ContainerProcess, compose_command, project_name,
                                stack_backend)
from lab.stack.images import ImageSet
from lab.stack.local import StackError, StackOptions
from lab.stack.process import ManagedProcess, Process, ProcessError, free_port

PORTS = {"valkey": "6379/tcp", "store": "5984/tcp", "toxiproxy": "8474/tcp"}
CLIENT_LINK_PORTS = [26000 + 10 * g + s for g in (1, 2, 3) for s in (1, 2, 3)]


def strict_kwargs(api_method):
    """Side effect for a Container method that forwards **kwargs to `api_method`: a wrong keyword is a TypeError."""
    sig = inspect.signature(api_method)

    def check(**kwargs):
        sig.bind(None, "container-id", **kwargs)
    return check


class FakeEngine:
    """Containers by id with their status; hands out autospecced SDK objects acting on them."""

    def __init__(self, *, refuse_kill_when_paused: bool = False):
        self.containers: dict[str, dict] = {}
        self.objects: dict[str, Container] = {}
        self.refuse_kill_when_paused = refuse_kill_when_paused
        self.next_port = 40000
        self.die_on_start: set[str] = set()
        self.files: dict[str, dict[str, bytes]] = {}  # container id -> path (under /data) -> content

    # -- the engine side ---------------------------------------------------------------
    def create(self, project: str, service: str) -> str:
        cid = f"{service.replace('-', '')}{len(self.containers):04d}" + "0" * 52
        exposed = [PORTS.get(service, "8080/tcp")]
        if service == "toxiproxy":
            exposed += [f"{p}/tcp" for p in CLIENT_LINK_PORTS]
        ports = {}
        for p in exposed:
            self.next_port += 1
            ports[p] = [{"HostIp": "127.0.0.1", "HostPort": str(self.next_port)}]
        status = "exited" if service in self.die_on_start else "running"
        self.containers[cid] = {"service": service, "status": status, "ports": ports, "exit": 1 if status == "exited" else None,
                                "labels": {"com.docker.compose.project": project, "com.docker.compose.service": service}}
        return cid

    def remove_project(self, project: str) -> None:
        for cid in [c for c, d in self.containers.items() if d["labels"]["com.docker.compose.project"] == project]:
            del self.containers[cid]

    def _status(self, cid: str, status: str, exit_code: int | None = None) -> None:
        self.containers[cid].update(status=status, exit=exit_code)

    # -- the SDK side ------------------------------------------------------------------
    def client(self):
        client = create_autospec(docker.DockerClient, instance=True)
        client.containers = create_autospec(ContainerCollection, instance=True)
        client.containers.get.side_effect = self._get
        client.containers.list.side_effect = self._list
        return client

    def _list(self, all=False, before=None, filters=None, limit=-1, since=None, sparse=False, ignore_removed=False):
        import builtins  # `all` is the SDK's parameter name here

        labels = (filters or {}).get("label", [])
        labels = [labels] if isinstance(labels, str) else labels
        # Docker's label filter: "key=value" matches the value, a bare "key" any container carrying the key
        wanted = [tuple(lbl.split("=", 1)) if "=" in lbl else (lbl, None) for lbl in labels]
        return [self._get(cid) for cid, d in self.containers.items()
                if builtins.all(k in d["labels"] and (v is None or d["labels"][k] == v) for k, v in wanted)]

    def _get(self, container_id):
        if container_id not in self.containers:
            raise docker.errors.NotFound(f"No such container: {container_id}")
        if container_id not in self.objects:
            self.objects[container_id] = self._container(container_id)
        c = self.objects[container_id]
        self._refresh(c)
        return c

    def _refresh(self, c) -> None:
        if c.id not in self.containers:
            raise docker.errors.NotFound(f"No such container: {c.id}")
        d = self.containers[c.id]
        c.status = d["status"]
        c.ports = d["ports"] if d["status"] in ("running", "paused") else {}
        c.attrs = {"State": {"Status": d["status"], "Pid": 4242 if d["status"] == "running" else 0,
                             "ExitCode": d["exit"]}}

    def _container(self, cid: str):
        c = create_autospec(Container, instance=True)
        c.id = cid
        c.reload.side_effect = lambda: self._refresh(c)

        def kill(signal=None):
            if self.containers[cid]["status"] == "paused" and self.refuse_kill_when_paused:
                raise docker.errors.APIError(f"Container {cid} is paused. Unpause the container before stopping")
            self._status(cid, "exited", 137)

        def pause():
            self._status(cid, "paused")

        def unpause():
            self._status(cid, "running")

        def start(**kwargs):
            strict_kwargs(APIClient.start)(**kwargs)
            self._status(cid, "running")

        def stop(**kwargs):
            strict_kwargs(APIClient.stop)(**kwargs)
            self._status(cid, "exited", 0)

        def restart(**kwargs):
            strict_kwargs(APIClient.restart)(**kwargs)
            self._status(cid, "running")

        def logs(**kwargs):
            return f"log of {self.containers[cid]['service']}\n".encode()

        def get_archive(path, chunk_size=None, encode_stream=False):
            """A tar of `path` (its basename as the top directory) in two chunks, plus the stat dict, as the SDK returns."""
            buf = io.BytesIO()
            top = path.rstrip("/").rsplit("/", 1)[-1]
            with tarfile.open(fileobj=buf, mode="w") as tar:
                d = tarfile.TarInfo(top)
                d.type = tarfile.DIRTYPE
                tar.addfile(d)
                for rel, data in self.files.get(cid, {}).items():
                    info = tarfile.TarInfo(f"{top}/{rel}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            raw = buf.getvalue()
            return iter([raw[:512], raw[512:]]), {"name": top, "mode": 0o40755}

        for name, fn in dict(kill=kill, pause=pause, unpause=unpause, start=start, stop=stop,
                             restart=restart, logs=logs, get_archive=get_archive).items():
            getattr(c, name).side_effect = fn
        return c


class FakeCompose:
    """A recording `subprocess.run` for the Compose CLI: `up` creates the services' containers, `down` removes them."""

    def __init__(self, engine: FakeEngine, *, fail_up: str | None = None):
        self.engine, self.fail_up = engine, fail_up
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, argv, *, env=None, cwd=None, capture_output=False, text=False, timeout=None):
        self.calls.append((list(argv), dict(env or {})))
        project = argv[argv.index("-p") + 1]
        verb = argv[argv.index("-p") + 2]
        if verb == "up":
            if self.fail_up:
                return subprocess.CompletedProcess(argv, 1, "", f"Building lease-1\n{self.fail_up}\n")
            for service in [a for a in argv[argv.index("up") + 1:] if not a.startswith("-")]:
                self.engine.create(project, service)
        elif verb == "down":
            self.engine.remove_project(project)
        return subprocess.CompletedProcess(argv, 0, "done\n", "")

    def verbs(self) -> list[str]:
        return [argv[argv.index("-p") + 2] for argv, _ in self.calls]


class StoreRecorder:
    """An httpx MockTransport standing in for CouchDB's HTTP API."""

    def __init__(self):
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(201, json={"ok": True})


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def store_http():
    rec = StoreRecorder()
    client = httpx.Client(transport=httpx.MockTransport(rec))
    yield rec, client
    client.close()


def make_stack(tmp_path, engine, store_http=None, *, compose_cmd=("docker", "compose"), runner=None, **kw):
    runner = runner or FakeCompose(engine)
    client = engine.client()
    stack = ComposeStack(name=kw.pop("name", "t1"), home=tmp_path, docker_factory=lambda: client, run=runner,
                         compose_cmd=list(compose_cmd), probe=lambda proc: proc.status() == "running",
                         http=store_http[1] if store_http else None,
                         image_set=kw.pop("image_set", lambda log: ImageSet("official", [COMPOSE_FILE])), **kw)
    return stack, runner, client


def up_argv_prefix(stack):
    return ["docker", "compose", "-f", str(COMPOSE_FILE.resolve()), "-p", project_name(stack.name)]


# -- up ------------------------------------------------------------------------------------------
def test_up_runs_compose_and_describes_the_stack(tmp_path, engine, store_http):
    stack, runner, _ = make_stack(tmp_path, engine, store_http)
    status = stack.up(StackOptions(servers=2, client_groups=2, persistence="always", fake_clocks=True))

    argv, env = runner.calls[0]
    assert argv == [*up_argv_prefix(stack), "up", "-d", "--remove-orphans", "--build", "--wait",
                    "valkey", "store", "toxiproxy", "lease-1", "lease-2"]
    assert env["FENCELAB_STATE_DIR"] == str(stack.dir.resolve())
    assert (env["VALKEY_APPENDONLY"], env["VALKEY_APPENDFSYNC"], env["FENCELAB_FAKETIME"]) == ("yes", "always", "1")
    admin = json.loads(stack.store_admin_file.read_text())
    assert env["COUCHDB_PASSWORD"] == admin["password"] and admin["password"] not in " ".join(argv)

    assert status.up and status.backend == "compose"
    assert [p.name for p in status.processes] == ["valkey", "store", "toxiproxy", "lease-1", "lease-2"]
    lease1 = status.processes[3]
    assert lease1.pid == 4242 and lease1.alive and lease1.log.startswith("docker logs ")
    assert list(lease1.ports) == ["8080/tcp"] and status.lease_servers[0].endswith(f":{lease1.ports['8080/tcp']}")
    assert stack_backend("t1", tmp_path) == "compose"
    assert all(u.startswith("http://127.0.0.1:") for u in status.lease_servers) and len(status.lease_servers) == 2
    assert status.valkey.startswith("redis://127.0.0.1:") and status.toxiproxy.startswith("http://127.0.0.1:")
    topo = status.topology
    assert sorted(topo) == sorted(["c1_lease-1", "c1_lease-2", "c2_lease-1", "c2_lease-2", "lease-1_valkey",
                                   "lease-2_valkey", "lease-1_store", "lease-2_store"])
    assert topo["lease-2_valkey"] == {"from": "lease-2", "to": "valkey", "listen": "toxiproxy:26102", "upstream": "valkey:6379"}
    assert topo["c2_lease-1"]["upstream"] == "lease-1:8080" and topo["c2_lease-1"]["listen"].startswith("127.0.0.1:")
    assert list(status.client_nodes) == [f"http://{topo[n]['listen']}" for n in ("c1_lease-1", "c1_lease-2", "c2_lease-1", "c2_lease-2")]
    assert sorted(status.clocks) == ["lease-1", "lease-2", "valkey"]
    assert all(Path(p).read_text().strip() == "+0" for p in status.clocks.values())

    # hashes only in the mounted principals file; the keys and the admin stay on the host, 0600
    principals = (stack.dir / "principals" / "principals.json").read_text()
    keys = [c["api_key"] for c in json.loads(stack.credentials_file.read_text())]
    assert keys and not any(k in principals for k in keys)
    for f in (stack.credentials_file, stack.store_admin_file, stack.dir / "principals" / "principals.json"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert admin["password"] not in json.dumps(status.as_dict()) and admin["password"] not in stack.state_file.read_text()
    # CouchDB's system databases were created with the stack's admin
    assert [(r.method, r.url.path) for r in store_http[0].requests] == [("PUT", "/_users"), ("PUT", "/_replicator")]
    assert all(r.headers["authorization"] == httpx.BasicAuth(admin["user"], admin["password"])._auth_header
               for r in store_http[0].requests)
    assert stack.store_url(with_credentials=True).startswith(f"http://{admin['user']}:{admin['password']}@127.0.0.1:")


def test_compose_v1_gets_no_wait_flag_and_the_store_runs_even_for_a_workload_without_documents(
        tmp_path, engine, store_http):
    """Every lease server's --store-url is in the compose file: the recovery rule keeps its epoch in the store,
    so the store runs even when the workload writes no documents (a server without it fails closed)."""
    stack, runner, _ = make_stack(tmp_path, engine, store_http, compose_cmd=["/usr/bin/docker-compose"])
    status = stack.up(StackOptions(servers=1, client_groups=1, store=False))
    argv = runner.calls[0][0]
    assert argv[0] == "/usr/bin/docker-compose" and "--wait" not in argv
    assert argv[-4:] == ["valkey", "store", "toxiproxy", "lease-1"]
    assert status.store is not None
    assert sorted(status.topology) == ["c1_lease-1", "lease-1_store", "lease-1_valkey"]


def test_missing_engine_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # the real docker.from_env() fails
    calls = []
    stack = ComposeStack(name="t1", home=tmp_path, run=lambda *a, **k: calls.append(a), compose_cmd=["docker", "compose"])
    with pytest.raises(StackError) as e:
        stack.up(StackOptions())
    msg = str(e.value)
    assert "\n" not in msg and "Docker engine" in msg and "no-engine.sock" in msg
    assert calls == [] and not stack.dir.exists()


def test_engine_error_from_the_factory_is_one_line(tmp_path):
    factory = create_autospec(docker.from_env, side_effect=docker.errors.DockerException(
        "Error while fetching server API version: ('Connection aborted.',\n FileNotFoundError(2, 'No such file'))"))
    stack = ComposeStack(name="t1", home=tmp_path, docker_factory=factory, run=create_autospec(subprocess.run))
    with pytest.raises(StackError, match=r"^cannot reach a Docker engine .*No such file.*running Docker engine$"):
        stack.up(StackOptions())
    factory.assert_called_once_with()
    stack.run.assert_not_called()
    assert not stack.dir.exists()


@pytest.mark.parametrize("opts, message", [
    (StackOptions(servers=4), r"--servers 4: the compose stack defines lease-1..lease-3"),
    (StackOptions(client_groups=5), r"5 client groups: .* c1..c3 only"),
    (StackOptions(persistence="sometimes"), r"--persistence must be one of"),
])
def test_bad_options_fail_before_docker_is_touched(tmp_path, opts, message):
    factory = create_autospec(docker.from_env)
    stack = ComposeStack(name="t1", home=tmp_path, docker_factory=factory)
    with pytest.raises(StackError, match=message):
        stack.up(opts)
    factory.assert_not_called()


def test_compose_failure_is_reported_and_cleaned_up(tmp_path, engine):
    runner = FakeCompose(engine, fail_up="ERROR: pull access denied for fencelab/valkey-faketime")
    stack, _, _ = make_stack(tmp_path, engine, runner=runner)
    with pytest.raises(StackError) as e:
        stack.up(StackOptions(servers=1, client_groups=1))
    msg = str(e.value)
    assert "`compose up" in msg and "pull access denied" in msg and "compose.log" in msg
    assert runner.verbs() == ["up", "down"] and not stack.state_file.exists()
    assert "pull access denied" in (stack.dir / "logs" / "compose.log").read_text()


def test_a_service_dying_at_start_fails_up_and_downs_the_project(tmp_path, engine, store_http):
    engine.die_on_start.add("lease-2")
    stack, runner, _ = make_stack(tmp_path, engine, store_http)
    with pytest.raises(ProcessError, match=r"lease-2 .* exited during start-up \(exit 1\).*\n.*log of lease-2"):
        stack.up(StackOptions(servers=2, client_groups=1))
    assert runner.verbs() == ["up", "down"] and engine.containers == {} and not stack.state_file.exists()


def test_up_twice_is_refused(tmp_path, engine, store_http):
    stack, runner, _ = make_stack(tmp_path, engine, store_http)
    stack.up(StackOptions(servers=1, client_groups=1))
    again, _, _ = make_stack(tmp_path, engine, store_http, runner=runner)
    with pytest.raises(StackError, match="already up"):
        again.up(StackOptions(servers=1, client_groups=1))
    assert runner.verbs() == ["up"]


def test_a_stale_project_is_taken_down_before_a_new_up(tmp_path, engine, store_http):
    stack, runner, _ = make_stack(tmp_path, engine, store_http)
    stack.up(StackOptions(servers=1, client_groups=1))
    for d in engine.containers.values():  # the engine restarted: the containers exist, stopped
        d.update(status="exited", exit=0)
    again, _, _ = make_stack(tmp_path, engine, store_http, runner=runner)
    assert again.up(StackOptions(servers=1, client_groups=1)).up
    assert runner.verbs() == ["up", "down", "up"] and len(engine.containers) == 4


# -- down --------------------------------------------------------------------------------------------
def test_down_removes_what_up_created(tmp_path, engine, store_http):
    stack, runner, _ = make_stack(tmp_path, engine, store_http)
    stack.up(StackOptions(servers=2, client_groups=2))
    assert len(engine.containers) == 5
    # another command, later: a fresh handle finds the project through state.json
    later, _, _ = make_stack(tmp_path, engine, store_http, runner=runner)
    assert later.down() == ["valkey", "store", "toxiproxy", "lease-1", "lease-2"]
    up_argv, up_env = runner.calls[0]
    down_argv, down_env = runner.calls[1]
    assert down_argv == [*up_argv_prefix(stack), "down", "-v", "--remove-orphans"]
    assert up_argv[:6] == down_argv[:6]
    assert {k: down_env[k] for k in ("FENCELAB_STATE_DIR", "COUCHDB_USER", "COUCHDB_PASSWORD")} == \
           {k: up_env[k] for k in ("FENCELAB_STATE_DIR", "COUCHDB_USER", "COUCHDB_PASSWORD")}
    assert engine.containers == {} and not later.state_file.exists() and stack_backend("t1", tmp_path) is None
    assert (later.dir / "logs" / "lease-2.log").read_text() == "log of lease-2\n"
    assert later.down() == []  # nothing left: a second down does nothing


def test_state_of_another_backend_is_refused(tmp_path, engine):
    stack, _, _ = make_stack(tmp_path, engine)
    stack.dir.mkdir(parents=True)
    stack.state_file.write_text(json.dumps({"name": "t1", "processes": []}))
    assert stack_backend("t1", tmp_path) == "local"
    with pytest.raises(StackError, match="belongs to the local backend"):
        stack.down()


def test_status_without_an_engine_reports_instead_of_raising(tmp_path, engine, store_http):
    stack, _, _ = make_stack(tmp_path, engine, store_http)
    stack.up(StackOptions(servers=1, client_groups=1))
    gone = ComposeStack(name="t1", home=tmp_path, docker_factory=create_autospec(
        docker.from_env, side_effect=docker.errors.DockerException("connection refused")))
    gone.load_state()
    status = gone.status()
    assert status.up is False and "cannot reach a Docker engine" in status.error
    assert status.lease_servers == stack.status().lease_servers


# -- the containers, through the SDK's documented calls ------------------------------------------------
@pytest.fixture
def running(tmp_path, engine, store_http):
    stack, _, client = make_stack(tmp_path, engine, store_http)
    stack.up(StackOptions(servers=2, client_groups=1))
    return stack, client


def sdk(client, proc: ContainerProcess):
    """The autospecced Container behind `proc`."""
    return client.containers.get(proc.container_id)


def test_kill_pause_resume_start_stop_restart_call_the_documented_api(running):
    stack, client = running
    proc = stack.process("lease-1")
    c = sdk(client, proc)
    client.containers.get.assert_called_with(proc.container_id)

    proc.pause()
    c.pause.assert_called_once_with()
    assert proc.alive() and proc.paused() and not proc.healthy()
    proc.resume()
    c.unpause.assert_called_once_with()
    assert proc.healthy()

    proc.kill()
    c.kill.assert_called_once_with(signal="SIGKILL")
    assert not proc.alive() and proc.returncode() == 137

    proc.start(timeout=5)
    c.start.assert_called_once_with()
    assert proc.alive() and proc.pid == 4242

    proc.restart(timeout=3)
    c.restart.assert_called_once_with(timeout=3)

    proc.stop(timeout=2.5)
    c.stop.assert_called_once_with(timeout=3)
    assert proc.returncode() == 0
    proc.stop()  # a stopped container: nothing more is sent
    assert c.stop.call_count == 1


def test_stopping_a_paused_container_unpauses_it_first(running):
    stack, client = running
    proc = stack.process("valkey")
    c = sdk(client, proc)
    proc.pause()
    proc.stop()
    assert [call[0] for call in c.method_calls if call[0] in ("pause", "unpause", "stop")] == ["pause", "unpause", "stop"]


def test_kill_of_a_paused_container_on_an_engine_that_refuses(tmp_path, store_http):
    engine = FakeEngine(refuse_kill_when_paused=True)
    stack, _, client = make_stack(tmp_path, engine, store_http)
    stack.up(StackOptions(servers=1, client_groups=1))
    proc = stack.process("lease-1")
    c = sdk(client, proc)
    proc.pause()
    proc.kill()
    assert [call for call in c.method_calls if call[0] in ("kill", "unpause")] == [
        ("kill", (), {"signal": "SIGKILL"}), ("unpause", (), {}), ("kill", (), {"signal": "SIGKILL"})]
    assert not proc.alive()


def test_wrong_calls_fail_instead_of_passing_silently(running):
    """The fakes are strict: a misspelt keyword, even through **kwargs, is a TypeError."""
    stack, client = running
    c = sdk(client, stack.process("lease-1"))
    with pytest.raises(TypeError):
        c.kill(sig="SIGKILL")
    with pytest.raises(TypeError):
        c.restart(time=3)
    with pytest.raises(TypeError):
        c.stop(t=3)
    with pytest.raises(TypeError):
        client.containers.get()


def test_errors_from_the_engine_are_one_line_process_errors(running, engine):
    stack, _ = running
    proc = stack.process("lease-2")
    with pytest.raises(ProcessError, match="lease-2 is not paused"):
        proc.resume()
    engine.remove_project(stack.project)
    assert proc.status() == "missing" and not proc.alive()
    with pytest.raises(ProcessError, match=r"lease-2: container \w+: .*No such container"):
        proc.container()


def test_unknown_process_names_the_known_ones(running):
    stack, _ = running
    with pytest.raises(StackError, match=r"no process 'lease-9'.*'lease-2'"):
        stack.process("lease-9")


# -- the existing nemeses over a compose stack ----------------------------------------------------------
def test_process_nemesis_primitives_drive_containers(running):
    from nemesis.process_faults import kill_process, restart_process, stack_targets

    stack, client = running
    targets = stack_targets(stack)
    assert list(targets) == ["valkey", "store", "lease-1", "lease-2"]  # toxiproxy is never a target
    # each is a Process (the nemeses' protocol), and none is a host-pid ManagedProcess
    assert all(isinstance(p, Process) and not isinstance(p, ManagedProcess) for p in targets.values())
    proc = targets["lease-2"]
    c = sdk(client, proc)

    async def crash_and_restart():
        pid = await kill_process(proc)
        dead = proc.alive()
        restarted = await restart_process(proc, timeout_s=5)
        return pid, dead, restarted

    pid, dead, restarted = asyncio.run(crash_and_restart())
    assert pid == 4242 and dead is False and restarted == {"pid": 4242, "ready": True}
    c.kill.assert_called_once_with(signal="SIGKILL")
    c.start.assert_called_once_with()


def test_network_nemeses_accept_the_compose_topology(running):
    from nemesis.registry import ToxiproxyNemeses

    stack, _ = running
    info = stack.status()
    nem = ToxiproxyNemeses(info.toxiproxy, info.topology, ["partition", "latency"], seed=7)
    assert {"start-partition", "stop-partition", "start-latency", "stop-latency"} <= set(nem.fs)
    assert nem.topology.servers == ["lease-1", "lease-2"] and nem.topology.clients == ["c1"]


# -- the Compose CLI ------------------------------------------------------------------------------------------
# -- valkey-crash on the Valkey container ---------------------------------------------------------------
@pytest.fixture
def everysec(tmp_path, engine, store_http, valkey):
    """A compose stack with AOF everysec whose Valkey container publishes the session's real Valkey (3 keys)."""
    import redis

    stack, _, client = make_stack(tmp_path, engine, store_http)
    stack.up(StackOptions(servers=1, client_groups=1, persistence="everysec"))
    proc = stack.process("valkey")
    engine.containers[proc.container_id]["ports"] = {"6379/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(valkey.port)}]}
    engine.files[proc.container_id] = {"appendonlydir/appendonly.aof.1.base.rdb": b"R" * 88,
                                       "appendonlydir/appendonly.aof.manifest": b"m" * 20}
    r = redis.Redis(host="127.0.0.1", port=valkey.port)
    r.mset({"a": 1, "b": 2, "c": 3})
    r.close()
    return stack, client, valkey


def test_the_valkey_container_carries_persistence_port_and_data_dir(everysec):
    stack, _, valkey = everysec
    proc = stack.process("valkey")
    assert (proc.persistence, proc.host, proc.port, proc.data_dir) == ("everysec", "127.0.0.1", valkey.port, "/data")
    lease = stack.process("lease-1")
    assert lease.persistence is None and lease.data_dir == ""
    reloaded = ComposeStack(name=stack.name, home=stack.home, docker_factory=stack.docker_factory)
    reloaded.load_state()  # `fencelab test` / a later command finds the mode again in state.json
    assert reloaded.process("valkey").persistence == "everysec" and reloaded.process("valkey").data_dir == "/data"


def test_valkey_crash_kills_and_starts_the_valkey_container(everysec):
    from nemesis.valkey import valkey_crash

    stack, client, _ = everysec
    proc = stack.process("valkey")
    c = sdk(client, proc)
    nem = valkey_crash(proc, restart_timeout_s=5)

    async def run():
        await nem.setup(None)
        start = await nem.invoke(None, {"type": "invoke", "f": "start-valkey-crash", "value": None, "process": "nemesis"})
        dead = proc.alive()
        stop = await nem.invoke(None, {"type": "invoke", "f": "stop-valkey-crash", "value": None, "process": "nemesis"})
        await nem.teardown(None)
        return start, dead, stop

    start, dead, stop = asyncio.run(run())
    assert dead is False
    c.kill.assert_called_once_with(signal="SIGKILL")
    c.start.assert_called_once_with()
    c.get_archive.assert_called_once_with(path="/data")
    assert start["type"] == "info" and start["value"] == {
        "fault": "valkey-crash", "target": "valkey", "persistence": "everysec", "phase": "start",
        "signal": "SIGKILL", "pid": 4242, "keys_before": 3, "restart_after_s": None}
    assert stop["type"] == "info" and "error" not in stop
    # what the fake can show: the calls and the record's shape. Whether the keys survive is the real engine's to
    # say (tests/test_compose_live.py crashes a real Valkey container): the fake keeps its keys whatever happens
    assert {k: v for k, v in stop["value"].items() if k != "keys_after"} == {
        "fault": "valkey-crash", "target": "valkey", "persistence": "everysec", "phase": "end",
        "restarted": {"pid": 4242, "ready": True, "by": "stop"}, "keys_before": 3,
        "files": {"appendonlydir/appendonly.aof.1.base.rdb": 88, "appendonlydir/appendonly.aof.manifest": 20}}
    assert isinstance(stop["value"]["keys_after"], int)


def test_valkey_crash_records_an_unreadable_data_dir_and_still_restarts(everysec):
    import docker

    from nemesis.valkey import valkey_crash

    stack, client, _ = everysec
    proc = stack.process("valkey")
    c = sdk(client, proc)
    c.get_archive.side_effect = docker.errors.APIError("Could not find the file /data in container")
    nem = valkey_crash(proc, restart_timeout_s=5)

    async def run():
        await nem.invoke(None, {"type": "invoke", "f": "start-valkey-crash", "value": None, "process": "nemesis"})
        return await nem.invoke(None, {"type": "invoke", "f": "stop-valkey-crash", "value": None, "process": "nemesis"})

    stop = asyncio.run(run())
    assert stop["value"]["files"] is None and stop["value"]["restarted"]["ready"] is True
    assert stop["value"]["files_error"].startswith("valkey: docker get_archive failed: ")
    c.start.assert_called_once_with()


def test_the_registry_builds_valkey_crash_and_valkey_restore_on_compose(running):
    from nemesis.registry import build
    from nemesis.valkey import ValkeyCrashNemesis, ValkeyRestoreNemesis, valkey_crash, valkey_restore

    stack, _ = running
    test = SimpleNamespace(live=RunContext(stack=stack), concurrency=1, time_limit=5.0)
    nemesis, _ = build(test, ["valkey-crash", "valkey-restore"], interval_s=1.0, seed=3)
    assert {"start-valkey-crash", "start-valkey-restore", "stop-valkey-restore"} <= nemesis.fs
    assert isinstance(valkey_crash(stack.process("valkey")), ValkeyCrashNemesis)
    assert isinstance(valkey_restore(stack.process("valkey"), stack.dir / "snaps"), ValkeyRestoreNemesis)
    with pytest.raises(ValueError, match=r"^valkey-restore needs Valkey's data directory: .*got str$"):
        valkey_restore("valkey", stack.dir / "snaps")
    with pytest.raises(ValueError, match=r"valkey.persistence must be one of none, everysec, always, got None "
                                         r"\(is 'lease-1' the stack's Valkey\?\)"):
        valkey_crash(stack.process("lease-1"))


def test_compose_command_prefers_the_v2_plugin(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    ok = create_autospec(subprocess.run, return_value=subprocess.CompletedProcess([], 0, "v2.29", ""))
    assert compose_command(ok) == ["docker", "compose"]
    ok.assert_called_once_with(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
    no_plugin = create_autospec(subprocess.run, return_value=subprocess.CompletedProcess([], 1, "", "unknown command"))
    assert compose_command(no_plugin) == ["/usr/bin/docker-compose"]


def test_compose_command_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(StackError, match="neither `docker compose` nor `docker-compose` is installed"):
        compose_command(create_autospec(subprocess.run))


# -- the default health probes, over a real Valkey and a real HTTP server --------------------------------------
def probe_target(engine, service: str, container_port: str, host_port: int) -> ContainerProcess:
    """A ContainerProcess whose (fake) container publishes `container_port` on `host_port`."""
    cid = engine.create("probe", service)
    engine.containers[cid]["ports"] = {container_port: [{"HostIp": "127.0.0.1", "HostPort": str(host_port)}]}
    return ContainerProcess(name=service, log_path=Path("unused.log"), service=service,
                            container_id=cid, container_port=container_port, client=engine.client())


def test_default_probe_pings_valkey_on_the_published_port(valkey, engine):
    proc = probe_target(engine, "valkey", "6379/tcp", valkey.port)
    assert proc.host_port() == valkey.port and proc.healthy()
    proc.pause()
    assert proc.alive() and not proc.healthy()  # a frozen container does not count as answering
    closed = probe_target(engine, "valkey", "6379/tcp", free_port())
    assert not closed.healthy()


def test_default_probe_asks_a_lease_server_for_healthz(engine):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert probe_target(engine, "lease-1", "8080/tcp", server.server_port).healthy()
        # the same server is not a Toxiproxy (no /version) nor a CouchDB (no /_up)
        assert not probe_target(engine, "toxiproxy", "8474/tcp", server.server_port).healthy()
        assert not probe_target(engine, "store", "5984/tcp", server.server_port).healthy()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_server_wheels_are_downloaded_once_per_pin_set_and_never_half(tmp_path, monkeypatch):
    """The lease-server image's wheels: one `pip download` per set of pins (cached under .tools/cache), copied
    into every build context; a download that fails leaves nothing a later build would take for the set."""
    from lab import paths
    from lab.stack import images

    monkeypatch.setattr(paths, "TOOLS", tmp_path / "tools")
    calls = []

    def pip(argv, **kw):
        calls.append(argv)
        dest = Path(argv[argv.index("-d") + 1])
        if len(calls) == 1:
            (dest / "half.whl").write_bytes(b"x")
            return subprocess.CompletedProcess(argv, 1, "", "ERROR: network is unreachable")
        (dest / "starlette-1.0-py3-none-any.whl").write_bytes(b"wheel")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(images.subprocess, "run", pip)
    with pytest.raises(StackError, match=r"^downloading the lease server image's wheels failed: ERROR: network"):
        images._download_wheels(tmp_path / "ctx0")
    assert not any((tmp_path / "tools" / "cache" / "server-wheels").iterdir())
    for ctx in ("ctx1", "ctx2"):
        images._download_wheels(tmp_path / ctx)
        assert sorted(p.name for p in (tmp_path / ctx).iterdir()) == ["starlette-1.0-py3-none-any.whl"]
    assert len(calls) == 2
