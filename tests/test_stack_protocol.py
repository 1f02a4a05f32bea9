"""Every placement implements the one `Stack` protocol the runner and the nemesis registry use."""

from __future__ import annotations

import pytest

from lab.sut.target import target_of
from lab.stack.base import Stack
from lab.stack.compose import ComposeStack
from lab.stack.local import LocalStack
from lab.stack.ssh import SshStack
from lab.testmap import Test

STATUS_KEYS = {"name", "backend", "up", "lease_servers", "valkey", "store", "client_nodes", "credentials", "dir",
               "processes"}


@pytest.mark.parametrize("cls", [LocalStack, ComposeStack, SshStack])
def test_each_backend_is_a_stack(cls, tmp_path):
    stack = cls(name="p", root=tmp_path / "stack")
    assert isinstance(stack, Stack)
    assert stack.dir == tmp_path / "stack"
    if cls is not ComposeStack:  # a compose stack's status asks the engine; the keys are checked where one runs
        assert STATUS_KEYS <= set(stack.status())


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
