"""Project-wide fixtures: how big the session's lab stack is (the plugin's `lab_stack_options`, overridden)."""

import pytest


@pytest.fixture(scope="session")
def lab_stack_options():
    """Two lease servers over one Valkey; no document store (these tests make no fenced commits)."""
    from lab.stack.local import StackOptions

    return StackOptions(servers=2, store=False)
