"""Every placement implements the one `Stack` protocol the runner and the nemesis registry use, and every stack
reports a `StackStatus`."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lab.stack.base import ProcessRow, Stack, StackStatus
from lab.stack.compose import ComposeStack
from lab.stack.lifecycle import ProcessStack
from lab.stack.local import LocalStack
from lab.stack.ssh import SshStack
from lab.sut.processes import LinkSpec, ProcessSpec, SutStack, SystemProcesses
from lab.sut.proxy import ProxiedUrls, UrlStack
from lab.sut.target import target_of
from lab.testmap import Test

# what `fencelab status --json` has printed for every backend (the JSON keeps them all)
STATUS_KEYS = {"name", "backend", "up", "lease_servers", "valkey", "store", "client_nodes", "credentials", "dir",
               "processes", "toxiproxy", "topology", "clocks", "netns", "system", "members", "project", "store_admin",
               "nodes", "error"}


def _decl() -> SystemProcesses:
    return SystemProcesses(system="kv", processes=(ProcessSpec("kv-1", argv=lambda p: ["true"]),),
                           links=(LinkSpec("clients", "kv-1"),), client_url=lambda a: f"http://{a}")


def every_stack(tmp_path):
    """One of each stack, not started."""
    root = tmp_path / "stack"
    return [LocalStack(name="p", root=root), ComposeStack(name="p", root=root), SshStack(name="p", root=root),
            SutStack(_decl(), root=root, name="p"), ProxiedUrls(["http://127.0.0.1:1"], root, name="p"),
            UrlStack(["http://127.0.0.1:1"], root, name="p")]


@pytest.mark.parametrize("i", range(6))
def test_each_stack_is_a_stack_with_a_typed_status(i, tmp_path):
    stack = every_stack(tmp_path)[i]
    assert isinstance(stack, Stack), stack
    assert stack.dir == tmp_path / "stack" and stack.name == "p"
    if isinstance(stack, ComposeStack):  # a compose stack's status asks the engine (test_compose_stack fakes one)
        return
    st = stack.status()
    assert isinstance(st, StackStatus) and st.name == "p" and st.dir == str(tmp_path / "stack")
    assert st.up is False  # nothing started yet
    assert set(json.loads(json.dumps(st.as_dict()))) == STATUS_KEYS


def test_the_process_owning_stacks_share_one_lifecycle():
    """Local processes, SSH nodes, containers and a system's own processes: one base owns start, record, stop."""
    for cls in (LocalStack, SshStack, ComposeStack, SutStack, ProxiedUrls):
        assert issubclass(cls, ProcessStack), cls
    for cls in (LocalStack, SutStack, SshStack, ProxiedUrls):  # the lifecycle is the base's, not a copy
        assert "down" not in vars(cls) and "status" not in vars(cls) and "_start" not in vars(cls), cls


def test_a_status_is_frozen_and_its_sequences_are_tuples(tmp_path):
    st = StackStatus(name="s", backend="local", dir=str(tmp_path), lease_servers=["http://a"],
                     processes=[ProcessRow(name="valkey", pid=1, alive=True, ports={"valkey": 1}, log="x")])
    assert st.lease_servers == ("http://a",) and isinstance(st.processes, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.up = True  # type: ignore[misc]
    assert st.as_dict()["processes"][0] == {"name": "valkey", "pid": 1, "alive": True, "ports": {"valkey": 1},
                                            "log": "x", "node": None, "host": None, "status": None, "container": None}


def test_a_url_stack_reports_the_given_urls_and_starts_nothing(tmp_path):
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    stack = UrlStack(urls, tmp_path, store="http://127.0.0.1:3")
    st = stack.up()
    assert st.up and st.backend == "external" and st.lease_servers == st.client_nodes == tuple(urls)
    assert st.store == "http://127.0.0.1:3" and st.valkey is None and st.credentials is None and not st.processes
    assert stack.processes == [] and stack.down() == [] and not stack.status().up
    with pytest.raises(Exception, match="runs no process 'valkey'"):
        stack.process("valkey")
    assert UrlStack([], tmp_path).up().client_nodes == ()  # an in-process system: no URL at all


@pytest.mark.parametrize("backend, cls", [("local", LocalStack), ("compose", ComposeStack), ("ssh", SshStack)])
def test_the_runner_places_each_backend(backend, cls, tmp_path):
    test = Test(backend=backend, run_dir=tmp_path / "20261201T000000.000000Z")
    stack = target_of(test).make_stack(test, tmp_path / "stack")
    assert isinstance(stack, cls) and isinstance(stack, Stack)


def test_remote_and_container_processes_are_processes_not_managed_processes():
    """The two placements whose pid is not a local child implement the small Process protocol themselves
    (issue 12: no subclass overriding nearly all of ManagedProcess)."""
    from pathlib import PurePosixPath

    from lab.stack.compose import ContainerProcess
    from lab.stack.process import ManagedProcess, Process
    from lab.stack.remote import RemoteLeaseServer, RemoteProcess, remote_process

    for cls in (RemoteProcess, RemoteLeaseServer, ContainerProcess):
        assert not issubclass(cls, ManagedProcess), cls
    proc = remote_process("lease", name="lease-1", argv=["python", "-m", "lab.server"], remote=object(),
                          log_path=PurePosixPath("/tmp/x/lease-1.log"), ports={"http": 8080}, host="10.0.0.2")
    assert isinstance(proc, Process) and isinstance(proc, RemoteLeaseServer)
    assert proc.serves_leases and proc.url == "http://10.0.0.2:8080"
    plain = remote_process("valkey", name="valkey", argv=["valkey-server"], remote=object(),
                           log_path=PurePosixPath("/tmp/x/valkey.log"))
    assert isinstance(plain, Process) and not getattr(plain, "serves_leases", False)
