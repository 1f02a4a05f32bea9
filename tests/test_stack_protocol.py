"""Every placement implements the one `Stack` protocol the runner and the nemesis registry use."""

from __future__ import annotations

import pytest

from lab.runner import placement_stack
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
    stack = placement_stack(test, tmp_path / "stack")
    assert isinstance(stack, cls) and isinstance(stack, Stack)
